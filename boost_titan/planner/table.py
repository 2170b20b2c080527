"""The planner's and the benchmarks' one table format: markdown, right-aligned columns."""

from __future__ import annotations

from collections.abc import Sequence


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "nan"
        if v == 0 or 0.01 <= abs(v) < 1e5:
            return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
        return f"{v:.3g}"
    return "" if v is None else str(v)


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """Markdown table (pipes, aligned) of ``rows`` restricted to ``columns``."""
    if isinstance(columns, str):  # a lone string would make one column per character
        raise TypeError(f"format_table: columns must be a sequence of names, got the string {columns[:40]!r}")
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells]
    return "\n".join(out) + "\n"
