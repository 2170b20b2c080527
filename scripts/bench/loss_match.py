"""Does a kernel choice change training? The same run twice (default: the 60M quality config on the
corpus, bf16), differing only in the overrides each ``--runs`` entry names, losses compared step by step.

bf16 (or float8) kernels differ in rounding, so the curves are not identical; the question is whether
the candidate's deviation from the baseline stays at the level of the run's own step-to-step noise.
Reported: the mean loss over the last ``--window`` steps of each run, their difference, the largest
per-step difference, and the step-to-step noise (std of the baseline loss minus its 9-step moving
average over the window).

    python -m scripts.bench.loss_match --steps 300 --out docs/results/attention_quality_60m \
        --runs "sdpa=--boost.attention sdpa" "flash=--boost.attention flash"
    python -m scripts.bench.loss_match --steps 500 --out docs/results/float8_quality_60m \
        --runs "bf16=" "fp8=--boost.float8 rowwise"
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from scripts.bench.e2e import run_train
from scripts.bench.results import env_info, print_table, write_results


def compare(baseline: list[float], candidate: list[float], window: int) -> dict:
    """Last-window means, their difference, the largest per-step difference and the baseline's step noise."""
    tail = slice(-window, None)
    smooth = [statistics.mean(baseline[max(0, i - 4):i + 5]) for i in range(len(baseline))]
    return {"steps": len(baseline), "baseline_last_mean": statistics.mean(baseline[tail]),
            "candidate_last_mean": statistics.mean(candidate[tail]),
            "diff_last_mean": statistics.mean(candidate[tail]) - statistics.mean(baseline[tail]),
            "max_step_diff": max(abs(c - b) for c, b in zip(candidate, baseline)),
            "step_noise_std": statistics.pstdev([x - m for x, m in zip(baseline[tail], smooth[tail])])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs=2, metavar="NAME=OVERRIDES", required=True,
                   help='baseline then candidate, e.g. "bf16=" "fp8=--boost.float8 rowwise"')
    p.add_argument("--config", default="train_configs/quality_60m.toml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--extra", default="", help='more overrides for both runs, e.g. --extra="--compile.enable"')
    p.add_argument("--out", required=True)
    a = p.parse_args()
    logs = Path(a.out + "_logs")
    logs.mkdir(parents=True, exist_ok=True)
    curves, commands = {}, {}
    for entry in a.runs:
        name, _, own = entry.partition("=")
        overrides = ["--training.steps", str(a.steps), "--lr_scheduler.total_steps", str(a.steps),
                     "--validation.no-enable", "--metrics.log_freq", "1", *own.split(), *a.extra.split()]
        run = run_train(a.config, overrides, 1, logs / f"{name}.log")
        if not run["ok"]:
            raise SystemExit(f"the {name} run failed: see {logs / f'{name}.log'}")
        curves[name] = {r["step"]: r["loss"] for r in run["steps"]}
        commands[name] = run["command"]
    base, cand = curves
    steps = sorted(set(curves[base]) & set(curves[cand]))
    row = {"baseline": base, "candidate": cand,
           **compare([curves[base][s] for s in steps], [curves[cand][s] for s in steps], a.window)}
    meta = {**env_info(), "commands": commands, "window": a.window}
    rows = [{"step": s, base: curves[base][s], cand: curves[cand][s]} for s in steps]
    write_results(a.out, [row], meta, f"Training loss: {cand} vs {base} (same run otherwise)",
                  sections=[("Per-step losses", rows, None)],
                  notes=f"Means over the last {a.window} steps; step noise = std of the {base} loss around its "
                        "9-step moving average over that window.")
    print_table([row])


if __name__ == "__main__":
    main()
