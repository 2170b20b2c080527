"""GEMM throughput, SM clock, power and temperature over a minute of sustained load (one GPU).

Why the GEMM percentages in docs/results depend on how the peak is measured: an H200 at its power
limit lowers its clock, more for the dense 8192³ product than for BTP's skinny GEMMs. Each workload
runs back to back for ``--seconds``; every ``--window`` seconds the script records the achieved
TFLOP/s (CUDA events over the window) and, through NVML, the SM clock, power draw and temperature.
Reads only: it changes no clock or power setting.

    python -m scripts.bench.clocks --out docs/results/clocks_h200
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from scripts.bench.results import doc_notes, env_info, print_table, pyplot, write_results
from scripts.bench.timing import PeakGemm


def nvml_reader():
    """A function returning (sm_clock_mhz, power_w, temp_c) for GPU 0, or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception as e:  # no NVML: throughput only
        print(f"NVML unavailable ({type(e).__name__}): clocks not recorded", file=sys.stderr)
        return lambda: (None, None, None)
    return lambda: (pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                    pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))


def skinny_gemm(m: int = 16384, k: int = 1024, n: int = 1024):
    """BTP's B_o forward at 7B tp 4, b 4: [m, r] · [r, d/t]."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    fn = lambda: torch.mm(x, w.t(), out=y)  # noqa: E731
    return fn, 2 * m * k * n


def run(name: str, fn, flops: int, seconds: float, window: float, read) -> list[dict]:
    rows, t_start = [], time.time()
    while time.time() - t_start < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls, t0 = 0, time.time()
        start.record()
        while time.time() - t0 < window:
            for _ in range(20):
                fn()
            calls += 20
            if calls % 200 == 0:
                torch.cuda.synchronize()  # keep the host close to the GPU so windows mean time
        end.record()
        torch.cuda.synchronize()
        clock, power, temp = read()
        ms = start.elapsed_time(end)
        rows.append({"workload": name, "t_s": round(time.time() - t_start, 1),
                     "tflops": calls * flops / (ms * 1e-3) / 1e12, "sm_clock_mhz": clock,
                     "power_w": power, "temp_c": temp})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0, help="per workload")
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--rest", type=float, default=20.0, help="idle seconds before each workload")
    ap.add_argument("--out", default="docs/results/clocks_h200")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("clocks.py needs a CUDA GPU")
    read = nvml_reader()
    peak = PeakGemm("cuda")
    workloads = {"8192^3 mm": (peak, peak.flops), "B_o fwd 16384x1024x1024": skinny_gemm()}
    rows = []
    for name, (fn, flops) in workloads.items():
        time.sleep(a.rest)
        idle = read()
        print(f"{name}: idle clock {idle[0]} MHz, {idle[1]} W, {idle[2]} C", flush=True)
        rows += run(name, fn, flops, a.seconds, a.window, read)
    summary = []
    for name in workloads:
        sel = [r for r in rows if r["workload"] == name]
        first, last = sel[0], sel[-1]
        summary.append({"workload": name, "first_tflops": first["tflops"], "last_tflops": last["tflops"],
                        "drop_pct": 100 * (1 - last["tflops"] / first["tflops"]),
                        "first_clock": first["sm_clock_mhz"], "last_clock": last["sm_clock_mhz"],
                        "last_power_w": last["power_w"], "last_temp_c": last["temp_c"]})
    meta = env_info()
    meta.update({"seconds": a.seconds, "window_s": a.window, "rest_s": a.rest})
    write_results(a.out, rows, meta, "GEMM throughput and clocks under sustained load",
                  sections=[("First vs last window", summary, None)], notes=doc_notes(__doc__))
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
        for name in workloads:
            sel = [r for r in rows if r["workload"] == name]
            axes[0].plot([r["t_s"] for r in sel], [r["tflops"] for r in sel], label=name)
            axes[1].plot([r["t_s"] for r in sel], [r["sm_clock_mhz"] or 0 for r in sel], label=name)
        axes[0].set(xlabel="s", ylabel="TFLOP/s")
        axes[1].set(xlabel="s", ylabel="SM clock (MHz)")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.out + ".png", dpi=110)
    print_table(summary)


if __name__ == "__main__":
    main()
