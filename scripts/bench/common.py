"""Shared helpers for the BOOST benchmark scripts (timing, ceilings, environment, result files).

Every benchmark script writes ``<out>.json`` (``{"meta": ..., "rows": [...]}``) and ``<out>.md``
through :func:`write_results`, records :func:`env_info` in its meta, and prints a short table last.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterable, Sequence

import torch

H200_DATASHEET_BF16_TFLOPS = 989.0  # dense bf16, no sparsity


def _sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def cuda_time_ms(
    fn: Callable[[], object],
    warmup: int = 5,
    repeats: int = 20,
    use_graph: bool = False,
    device: torch.device | str | None = None,
) -> float:
    """Median wall time of ``fn()`` in milliseconds; the warm-up calls are excluded.

    On CUDA each repeat is bracketed by a pair of CUDA events. With ``use_graph=True`` the calls in
    ``fn`` are captured once into a CUDA graph and the graph is replayed, so that the time is the
    GPU's time alone (no Python/launch overhead between small kernels). ``fn`` must then be
    capturable (fixed shapes, preallocated outputs, no host syncs). On CPU (or when CUDA is absent)
    it times with ``time.perf_counter``.
    """
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda":
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    run = fn
    graph = None
    if use_graph:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up (cuBLAS handles, workspaces) before capture
            for _ in range(max(warmup, 1)):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    for _ in range(warmup):
        run()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    torch.cuda.synchronize(device)
    for start, end in zip(starts, ends):
        start.record()
        run()
        end.record()
    torch.cuda.synchronize(device)
    del graph
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def measured_bf16_peak_tflops(
    device: torch.device | str = "cuda", n: int = 8192, warmup: int = 5, repeats: int = 20
) -> float:
    """Measured matmul ceiling in TFLOP/s: median time of an ``n³`` product on random data.

    bf16 on CUDA (n=8192 by default, the reference roofline); on CPU fp32 with n capped at 1024
    (only to give the smoke test a meaningful denominator).
    """
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type != "cuda":
        n = min(n, 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    ms = cuda_time_ms(lambda: torch.mm(a, b, out=out), warmup, repeats, device=device)
    del a, b, out
    return 2 * n**3 / (ms * 1e-3) / 1e12


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
