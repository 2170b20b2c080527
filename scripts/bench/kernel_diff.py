"""Two profiler traces of the same step, kernel by kernel: which kernels ran more often or longer.

    python -m scripts.bench.kernel_diff BASE_TRACE OTHER_TRACE [--top 25] [--out docs/results/NAME]

Each trace is a torch profiler chrome trace (e.g. ``scripts.bench.e2e --profile`` leaves
``outputs/e2e/<variant>/traces/iteration_<N>/rank0_trace.json``); only the kernels launched inside its
``ProfilerStep`` count (:func:`scripts.bench.common.trace_kernel_diff`). The same calls with one
common mean-time ratio across kernels points at the GPU's clock, not at the code.
"""

from __future__ import annotations

import argparse
import statistics

from scripts.bench.common import env_info, print_table, trace_kernel_diff, write_results

COLUMNS = ["kernel", "bucket", "base_calls", "base_ms", "base_mean_us", "other_calls", "other_ms", "other_mean_us",
           "mean_ratio"]


def summary(rows: list[dict]) -> dict:
    """Totals, and the spread of the per-kernel mean ratio over kernels called equally often in both."""
    same = [r["mean_ratio"] for r in rows if r["base_calls"] == r["other_calls"] and r["mean_ratio"]]
    return {"base_ms": sum(r["base_ms"] for r in rows), "other_ms": sum(r["other_ms"] for r in rows),
            "kernels": len(rows), "same_calls": len(same),
            "median_mean_ratio": statistics.median(same) if same else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base")
    p.add_argument("other")
    p.add_argument("--top", type=int, default=25, help="rows printed and written")
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    a = p.parse_args()
    rows = trace_kernel_diff(a.base, a.other)
    total = summary(rows)
    if a.out:
        meta = {**env_info("cpu"), "base": a.base, "other": a.other}
        write_results(a.out, rows[:a.top], meta, "Kernel by kernel: two traces of the same step", columns=COLUMNS,
                      sections=[("Totals", [total], None)])
    print_table(rows[:a.top], COLUMNS)
    print_table([total])


if __name__ == "__main__":
    main()
