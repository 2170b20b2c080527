"""Result files of the benchmarks: environment record, markdown tables, ``<out>.json`` + ``<out>.md``.

Every benchmark (``scripts/bench/*`` and :mod:`boost_titan.bench.comm_volume`) records
:func:`env_info` (date, hardware, versions, commit, exact command) in its meta and writes through
:func:`write_results`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Iterable, Sequence

import torch


def _git_rev() -> str | None:
    """``<short sha>[-dirty]`` of the checkout; ``BOOST_GIT_REV`` wins (a run from a ``git archive``
    snapshot has no .git of its own); None when unknown."""
    if os.environ.get("BOOST_GIT_REV"):
        return os.environ["BOOST_GIT_REV"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return rev + ("-dirty" if dirty else "") if rev else None
    except (OSError, subprocess.SubprocessError):
        return None


def env_info(device: torch.device | str | None = None) -> dict:
    """Date, hardware, software versions and the exact command line of this run."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    try:
        import triton  # noqa: PLC0415

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional (absent on CPU wheels)
        triton_version = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "python": platform.python_version(),
        "git": _git_rev(),
        "command": shlex.join(["python", *sys.argv]),
    }


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
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells]
    return "\n".join(out) + "\n"


def print_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> None:
    print(format_table(rows, columns), end="", flush=True)


def write_results(
    out_prefix: str,
    rows: list[dict],
    meta: dict,
    title: str,
    columns: Sequence[str] | None = None,
    sections: Iterable[tuple[str, Sequence[dict], Sequence[str] | None]] = (),
    notes: str = "",
) -> tuple[str, str]:
    """Write ``<out_prefix>.json`` and ``<out_prefix>.md``; returns both paths.

    ``sections`` are extra (heading, rows, columns) tables placed before the full ``rows`` table;
    ``notes`` is free markdown placed after the meta block.
    """
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    json_path, md_path = out_prefix + ".json", out_prefix + ".md"
    with open(json_path, "w") as f:
        json.dump({"title": title, "meta": meta, "rows": rows}, f, indent=1, default=str)
    md = [f"# {title}", ""]
    md += [f"- **{k}**: `{v}`" if k == "command" else f"- **{k}**: {v}" for k, v in meta.items()]
    md.append("")
    if notes:
        md += [notes.strip(), ""]
    for heading, sec_rows, sec_cols in sections:
        md += [f"## {heading}", "", format_table(sec_rows, sec_cols)]
    md += ["## All rows", "", format_table(rows, columns)]
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    return json_path, md_path
