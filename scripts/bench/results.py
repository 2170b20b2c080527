"""What every benchmark writes: the environment record (:func:`env_info`: date, hardware, versions,
commit, exact command), markdown tables, ``<out>.json`` + ``<out>.md`` (:func:`write_results`), plots.

Every benchmark (``python -m scripts.bench.<name>``) records :func:`env_info` in its meta, writes
through :func:`write_results` and prints a short table last.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence

import torch

from boost_titan.planner.table import format_table

__all__ = ["format_table"]  # re-exported: the benchmarks' tables are the planner's

# BOOST's published end-to-end step times (its README, Fig. 5: A100 80GB, micro-batch 4, seq 4096, its
# own code), s per step: flavor -> (tp, pp, {strategy: seconds}); what our rows stand beside
BOOST_FIG5_A100 = {"1B": (1, 1, {"fullrank": 0.85, "vanilla": 0.56, "btp": 0.59}),
                   "3B": (2, 1, {"fullrank": 1.14, "vanilla": 1.41, "btp": 0.78}),
                   "7B": (4, 1, {"fullrank": 1.06, "vanilla": 1.64, "btp": 0.72}),
                   "13B": (4, 2, {"fullrank": 2.07, "vanilla": 2.42, "btp": 1.30})}


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


def print_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> None:
    print(format_table(rows, columns), end="", flush=True)


def write_results(
    out_prefix: str,
    rows: list[dict],
    meta: dict,
    title: str,
    columns: Sequence[str] | None = None,
    sections: Iterable[tuple] = (),
    notes: str = "",
) -> tuple[str, str]:
    """Write ``<out_prefix>.json`` and ``<out_prefix>.md``; returns both paths.

    ``sections`` are extra ``(heading, rows, columns)`` or ``(heading, rows, columns, note)`` tables placed
    before the full ``rows`` table (in the JSON under ``sections``, by heading; a note is markdown printed
    under its heading); ``notes`` is free markdown placed after the meta block.
    """
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    json_path, md_path = out_prefix + ".json", out_prefix + ".md"
    sections = list(sections)
    data = {"title": title, "meta": meta, "rows": rows}
    if sections:
        data["sections"] = {heading: list(sec_rows) for heading, sec_rows, *_ in sections}
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1, default=str)
    md = [f"# {title}", ""]
    md += [f"- **{k}**: `{v}`" if k == "command" else f"- **{k}**: {v}" for k, v in meta.items()]
    md.append("")
    if notes:
        md += [notes.strip(), ""]
    for heading, sec_rows, sec_cols, *sec_note in sections:
        md += [f"## {heading}", ""] + [n.strip() + "\n" for n in sec_note] + [format_table(sec_rows, sec_cols)]
    md += ["## All rows", "", format_table(rows, columns)]
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    return json_path, md_path


def doc_notes(doc: str) -> str:
    """A script's docstring minus its title line and its indented usage lines: the notes of its results."""
    paragraphs = doc.strip().split("\n\n")[1:]
    return "\n\n".join(p for p in paragraphs if not p.startswith("    "))


def pyplot():
    """``matplotlib.pyplot`` with the file-only Agg backend, or None (with a note) where it is missing."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib not importable: skipping the plot", file=sys.stderr)
        return None
    return plt
