"""Does the attention kernel change training? The same run (default: the 60M quality config on the
corpus, compiled, bf16) with ``[boost] attention`` = sdpa and = flash, losses compared step by step.

bf16 kernels differ in rounding, so the curves are not identical; the question is whether the flash
run's deviation from the SDPA run stays at the level of the run's own step-to-step noise. Reported:
the mean loss over the last ``--window`` steps of each run, their difference, the largest per-step
difference, and the step-to-step noise (std of the loss minus its 9-step moving average, SDPA run).

    python -m scripts.bench.attention_quality --steps 300 --out docs/results/attention_quality_60m
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from boost_titan.bench.common import env_info, print_table, write_results
from scripts.bench.e2e import run_train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="train_configs/quality_60m.toml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--extra", default="--compile.enable", help='more overrides for both runs, e.g. --extra="--a.b c"')
    p.add_argument("--out", default="docs/results/attention_quality_60m")
    a = p.parse_args()
    logs = Path(a.out + "_logs")
    logs.mkdir(parents=True, exist_ok=True)
    curves, commands = {}, {}
    for backend in ("sdpa", "flash"):
        overrides = ["--training.steps", str(a.steps), "--lr_scheduler.total_steps", str(a.steps),
                     "--validation.no-enable", "--metrics.log_freq", "1", "--boost.attention", backend, *a.extra.split()]
        run = run_train(a.config, overrides, 1, logs / f"{backend}.log")
        if not run["ok"]:
            raise SystemExit(f"the {backend} run failed: see {logs / f'{backend}.log'}")
        curves[backend] = {r["step"]: r["loss"] for r in run["steps"]}
        commands[backend] = run["command"]
    steps = sorted(set(curves["sdpa"]) & set(curves["flash"]))
    sdpa, flash = [curves["sdpa"][s] for s in steps], [curves["flash"][s] for s in steps]
    tail = slice(-a.window, None)
    smooth = [statistics.mean(sdpa[max(0, i - 4):i + 5]) for i in range(len(sdpa))]
    noise = statistics.pstdev([x - m for x, m in zip(sdpa[tail], smooth[tail])])
    row = {"steps": len(steps), "sdpa_last_mean": statistics.mean(sdpa[tail]),
           "flash_last_mean": statistics.mean(flash[tail]),
           "diff_last_mean": statistics.mean(flash[tail]) - statistics.mean(sdpa[tail]),
           "max_step_diff": max(abs(f - s) for f, s in zip(flash, sdpa)), "step_noise_std": noise}
    meta = {**env_info(), "commands": commands, "window": a.window}
    rows = [{"step": s, "sdpa": curves["sdpa"][s], "flash": curves["flash"][s]} for s in steps]
    write_results(a.out, [row], meta, "Training loss: flash-attn vs SDPA (same run otherwise)",
                  sections=[("Per-step losses", rows, None)],
                  notes=f"Means over the last {a.window} steps; step noise = std of the SDPA loss around its "
                        "9-step moving average over that window.")
    print_table([row])


if __name__ == "__main__":
    main()
