"""Quality: CoLA vs its dense twin on real text at equal tokens (train_configs/quality_60m.toml).

Trains each flavor through torchtitan's loop on the corpus built by ``scripts/build_corpus.py``
(held-out validation split), then reports train/validation curves, the final validation loss and
perplexity, tokens/s, and the training time at which each run first reaches the full-rank run's final
validation loss.

    python scripts/build_corpus.py        # once, where the registries are reachable
    # fixed learning rates:
    python -m scripts.bench.quality --pairs 60M:3e-3,60M_fullrank:3e-3 --steps 1500 --out docs/results/quality_60m
    # LR sweep per family (short runs, up to --parallel at once on the one GPU), then the full-length
    # pair at each family's best LR (run one at a time, so their tokens/s are comparable):
    python -m scripts.bench.quality --sweep "60M:1e-3,3e-3,6e-3;60M_fullrank:1e-3,3e-3,6e-3" \\
        --sweep-steps 300 --parallel 3 --steps 1500 --out docs/results/quality_60m
    # (``--sweep-only`` stops after the sweep and prints the ``--pairs`` to run next, for two sessions)
    # best-mode speed: pass torchtitan overrides with "=", since they start with "--":
    python -m scripts.bench.quality --extra="--compile.enable" --out docs/results/quality_60m_compiled
    # curves only (the pair trains at once, sharing the GPU, so no speed is reported):
    python -m scripts.bench.quality --steps 3600 --concurrent --out docs/results/quality_60m_3600

Every run validates on the whole held-out split (``--val-steps -1``; boost_titan's validator rewinds
it, so every point sees the same text) about ``--val-points`` times, at steps that are multiples of
the logging interval so that no training tokens/s window contains a validation. The warm-up is
``--warmup-frac`` of the run; ``--extra`` overrides go last, to every run. Outputs: ``<out>.{json,md,png}``
(final runs, curves in the JSON), ``<out>_sweep.{json,md,png}`` and the logs in ``<out>_logs/``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scripts.bench.common import env_info, print_table, pyplot, write_results
from scripts.bench.e2e import ROOT, run_train

CONFIG = "train_configs/quality_60m.toml"
CORPUS_STATS = ROOT / "data" / "corpus" / "stats.json"


def validation_freq(steps: int, points: int, log_freq: int) -> int:
    """The divisor of ``steps`` nearest ``steps / points`` that is a multiple of ``log_freq``.

    A divisor, so the last step is validated; a multiple of the logging interval, so validation time
    never falls inside a logged tokens/s window (torchtitan restarts that clock after validating).
    """
    target = max(1, steps / max(1, points))
    candidates = [f for f in range(1, steps + 1) if steps % f == 0 and f % log_freq == 0] or [steps]
    return min(candidates, key=lambda f: (abs(f - target), f))


def train_overrides(flavor: str, lr: str, steps: int, a: argparse.Namespace, tag: str) -> list[str]:
    return ["--model.flavor", flavor, "--optimizer.lr", lr, "--training.steps", str(steps),
            "--boost.tp_strategy", "fullrank" if flavor.endswith("_fullrank") else "btp",
            "--lr_scheduler.warmup_steps", str(max(1, round(a.warmup_frac * steps))),
            "--metrics.log_freq", str(a.log_freq),
            "--validation.freq", str(validation_freq(steps, a.val_points, a.log_freq)),
            "--validation.steps", str(a.val_steps),
            "--job.dump_folder", f"./outputs/quality/{tag}",
            *a.extra.split()]


def run(flavor: str, lr: str, steps: int, a: argparse.Namespace, log_dir: Path, prefix: str = "") -> dict:
    tag = f"{prefix}{flavor}_lr{lr}"
    out = run_train(a.config, train_overrides(flavor, lr, steps, a, tag), 1, log_dir / f"{tag}.log")
    out["train_s"] = _training_seconds(out)
    return out


def _training_seconds(run: dict) -> dict[int, float]:
    """Seconds of training (validation excluded) up to each logged step, from the logged tokens/s.

    torchtitan's tokens/s covers one logging window and restarts after a validation, so summing
    window tokens / tokens/s gives the time spent training, step 1's start-up included.
    """
    out, prev, total = {}, 0, 0.0
    for r in run["steps"]:
        if r["tps"] > 0:
            total += (r["step"] - prev) * run["tokens_per_step"] / r["tps"]
        prev = r["step"]
        out[r["step"]] = total
    return out


def _time_to_reach(run: dict, target: float | None) -> tuple[int | None, float | None]:
    """First validated step with loss <= target, and the training seconds at which the validation
    curve (linear between points) crosses the target."""
    if target is None:
        return None, None
    t_of, prev = run["train_s"], None
    for step, loss in run["validation"]:
        if loss <= target:
            if prev is None or prev[1] == loss or prev[0] not in t_of or step not in t_of:
                return step, t_of.get(step)
            frac = (prev[1] - target) / (prev[1] - loss)
            return step, t_of[prev[0]] + frac * (t_of[step] - t_of[prev[0]])
        prev = (step, loss)
    return None, None


def _median_tps(run: dict) -> float:
    timed = run["steps"][len(run["steps"]) // 4:] or run["steps"]
    return statistics.median(r["tps"] for r in timed)


def _final_val(run: dict) -> float:
    return run["validation"][-1][1] if run["ok"] and run["validation"] else math.inf


def parse_sweep(spec: str) -> dict[str, list[str]]:
    """``"60M:1e-3,3e-3;60M_fullrank:1e-3"`` -> {flavor: [lr, ...]}."""
    families = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        flavor, _, lrs = part.partition(":")
        families[flavor.strip()] = [lr.strip() for lr in lrs.split(",") if lr.strip()]
        if not families[flavor.strip()]:
            raise SystemExit(f"--sweep: no learning rates for {flavor!r}")
    return families


def sweep(a: argparse.Namespace, log_dir: Path, meta: dict) -> dict[str, str]:
    """Short runs for every (family, LR), ``--parallel`` at a time; returns {flavor: best lr}."""
    families = parse_sweep(a.sweep)
    jobs = [(flavor, lr) for flavor, lrs in families.items() for lr in lrs]
    print(f"sweep: {len(jobs)} runs of {a.sweep_steps} steps, {a.parallel} at a time", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
        results = list(pool.map(lambda job: run(*job, a.sweep_steps, a, log_dir, "sweep_"), jobs))
    runs = {f"{flavor}:{lr}": r for (flavor, lr), r in zip(jobs, results)}
    best = {}
    for flavor in families:
        scored = [(_final_val(runs[f"{flavor}:{lr}"]), lr) for lr in families[flavor]]
        loss, lr = min(scored, key=lambda x: x[0])
        if math.isinf(loss):
            raise SystemExit(f"sweep: no run of {flavor} finished with a validation loss; see {log_dir}")
        best[flavor] = lr
    rows = []
    for (flavor, lr), r in zip(jobs, results):
        steps = r["steps"]
        rows.append({"family": flavor, "lr": lr, "ok": r["ok"], "chosen": best[flavor] == lr,
                     "tokens": steps[-1]["step"] * r["tokens_per_step"] if steps else 0,
                     "final_train_loss": steps[-1]["loss"] if steps else None,
                     "final_val_loss": r["validation"][-1][1] if r["validation"] else None,
                     "val_curve": r["validation"], "command": r["command"]})
    cols = ["family", "lr", "chosen", "tokens", "final_train_loss", "final_val_loss"]
    write_results(a.out + "_sweep", rows, meta, "Quality: learning-rate sweep per family", columns=cols,
                  notes=f"{a.sweep_steps} steps per run (cosine schedule over the short run, warm-up "
                        f"{a.warmup_frac:.0%}), up to {a.parallel} runs at once on one device, so no "
                        "speed is reported here. The chosen LR has the lowest final validation loss "
                        "(whole held-out split).")
    _plot(runs, a.out + "_sweep.png", wall_clock=False)
    print_table(rows, cols)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default="60M:3e-3,60M_fullrank:1e-3",
                   help="flavor:lr,... (without --sweep; default: the LRs the 60M sweep chose)")
    p.add_argument("--sweep", default="", help='"flavor:lr,lr,...;flavor:lr,..." - pick each family\'s LR first')
    p.add_argument("--sweep-steps", type=int, default=300)
    p.add_argument("--parallel", type=int, default=1, help="sweep runs at once (the final runs go one by one)")
    p.add_argument("--sweep-only", action="store_true",
                   help="stop after the sweep table (then run the pair with --pairs at the chosen LRs)")
    p.add_argument("--steps", type=int, default=1500, help="steps of the final runs")
    p.add_argument("--warmup-frac", type=float, default=0.1, help="linear warm-up, as a fraction of each run")
    p.add_argument("--val-points", type=int, default=15, help="about this many validations per run")
    p.add_argument("--val-steps", type=int, default=-1, help="validation batches per point; -1 = whole split")
    p.add_argument("--log-freq", type=int, default=10)
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--concurrent", action="store_true",
                   help="train the final runs at once on the one device: curves only, no speed columns")
    p.add_argument("--extra", default="",
                   help='more CLI overrides for every run (last, so they win); write --extra="--a.b c"')
    p.add_argument("--out", default="docs/results/quality_60m")
    a = p.parse_args()
    log_dir = Path(a.out + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    meta = env_info()
    corpus = json.loads(CORPUS_STATS.read_text()) if CORPUS_STATS.is_file() else None
    if corpus:
        meta["corpus"] = (f"train {corpus['train']['tokens'] / 1e6:.1f}M GPT-2 tokens "
                          f"({corpus['train']['mb']:.0f} MB), validation {corpus['validation']['tokens'] / 1e6:.2f}M")

    if a.sweep:
        best = sweep(a, log_dir, meta)
        if a.sweep_only:
            print("chosen: --pairs " + ",".join(f"{f}:{lr}" for f, lr in best.items()))
            return
        pairs = list(best.items())
        meta["lr_sweep"] = f"{a.out}_sweep.md: " + ", ".join(f"{f}={lr}" for f, lr in pairs)
    else:
        pairs = [tuple(item.split(":")) for item in a.pairs.split(",")]
    with ThreadPoolExecutor(max_workers=len(pairs) if a.concurrent else 1) as pool:
        results = list(pool.map(lambda pair: run(*pair, a.steps, a, log_dir), pairs))
    runs = {f"{flavor}:{lr}": r for (flavor, lr), r in zip(pairs, results)}

    full = [k for k in runs if "_fullrank" in k and runs[k]["validation"]]
    target = runs[full[-1]]["validation"][-1][1] if full else None
    rows = []
    for name, r in runs.items():
        steps, val = r["steps"], r["validation"]
        if not steps or not val:
            rows.append({"run": name, "ok": False, "command": r["command"]})
            continue
        reach_step, reach_s = _time_to_reach(r, target)
        tokens = steps[-1]["step"] * r["tokens_per_step"]
        t_of = {s["step"]: s["t"] for s in steps}
        rows.append({"run": name, "ok": r["ok"], "tokens": tokens,
                     "epochs": tokens / corpus["train"]["tokens"] if corpus else None,
                     "final_train_loss": steps[-1]["loss"], "final_val_loss": val[-1][1],
                     "val_ppl": math.exp(val[-1][1]), "tokens_per_s": _median_tps(r),
                     "train_s": r["train_s"][steps[-1]["step"]], "wall_s": steps[-1]["t"],
                     "step_reaching_fullrank_val": reach_step, "train_s_to_fullrank_val": reach_s,
                     "wall_s_to_fullrank_val": t_of.get(reach_step) if reach_step else None,
                     "train_curve": [(s["step"], s["loss"]) for s in steps], "val_curve": val,
                     "command": r["command"]})
    cols = ["run", "tokens", "epochs", "final_train_loss", "final_val_loss", "val_ppl", "tokens_per_s",
            "train_s", "wall_s", "step_reaching_fullrank_val", "train_s_to_fullrank_val"]
    speed_cols = {"tokens_per_s", "train_s", "wall_s", "train_s_to_fullrank_val"}
    if a.concurrent:  # runs sharing one device: their speeds say nothing
        rows = [{k: v for k, v in row.items() if k not in speed_cols} for row in rows]
        cols = [c for c in cols if c not in speed_cols]
    speed_note = ("The runs trained at once on one device (--concurrent), so no speed is reported."
                  if a.concurrent else
                  "tokens_per_s: median of the last 3/4 of the logged windows. train_s: training time from "
                  "the logged tokens/s (validation excluded); wall_s: log timestamps (validation and "
                  "start-up included). train_s_to_fullrank_val interpolates the validation curve linearly. "
                  "The final runs ran one at a time.")
    write_results(a.out, rows, meta, "Quality: CoLA vs full rank at equal tokens", columns=cols,
                  notes=f"Validation loss on the whole held-out corpus split; target = the full-rank run's "
                        f"final validation loss ({target}). " + speed_note)
    _plot(runs, a.out + ".png", wall_clock=not a.concurrent)
    print_table(rows, cols)


def _plot(runs: dict, path: str, wall_clock: bool = True) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2 if wall_clock else 1, figsize=(11 if wall_clock else 6, 4), squeeze=False)
    axes = axes[0]
    for name, r in runs.items():
        if not r["steps"]:
            continue
        tok = r["tokens_per_step"]
        axes[0].plot([s["step"] * tok / 1e6 for s in r["steps"]], [s["loss"] for s in r["steps"]],
                     alpha=0.5, label=f"{name} train")
        axes[0].plot([s * tok / 1e6 for s, _ in r["validation"]], [v for _, v in r["validation"]], "o-",
                     label=f"{name} val")
        if wall_clock:
            axes[1].plot([r["train_s"].get(s, float("nan")) for s, _ in r["validation"]],
                         [v for _, v in r["validation"]], "o-", label=f"{name} val")
    axes[0].set(xlabel="tokens (M)", ylabel="loss", title="equal tokens")
    if wall_clock:
        axes[1].set(xlabel="training time (s, validation excluded)", ylabel="validation loss",
                    title="equal training time")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
