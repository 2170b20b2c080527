"""Quality: CoLA vs its dense twin on real text at equal tokens (train_configs/quality_60m.toml).

Trains each flavor through torchtitan's loop on the corpus built by ``scripts/build_corpus.py``
(held-out validation split), then reports the final validation loss and perplexity, tokens/s, and
the wall-clock time at which each run first reaches the full-rank run's final validation loss.

    python scripts/build_corpus.py        # once, where the registries are reachable
    python scripts/bench/quality.py --pairs 60M:3e-3,60M_fullrank:3e-3 --out docs/results/quality_60m
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import env_info, print_table, write_results  # noqa: E402
from e2e import run_train  # noqa: E402

CONFIG = "train_configs/quality_60m.toml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default="60M:3e-3,60M_fullrank:3e-3", help="flavor:lr,...")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--extra", default="")
    p.add_argument("--out", default="docs/results/quality_60m")
    a = p.parse_args()
    log_dir = Path(a.out + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    runs = {}
    for item in a.pairs.split(","):
        flavor, lr = item.split(":")
        overrides = ["--model.flavor", flavor, "--optimizer.lr", lr, "--training.steps", str(a.steps),
                     "--boost.tp_strategy", "fullrank" if flavor.endswith("_fullrank") else "btp", *a.extra.split()]
        runs[item] = run_train(CONFIG, overrides, 1, log_dir / f"{flavor}_lr{lr}.log")

    full = [k for k in runs if "_fullrank" in k and runs[k]["validation"]]
    target = runs[full[-1]]["validation"][-1][1] if full else None
    rows = []
    for name, run in runs.items():
        steps, val = run["steps"], run["validation"]
        if not steps or not val:
            rows.append({"run": name, "ok": False})
            continue
        t_of = {r["step"]: r["t"] for r in steps}
        reach = next((s for s, loss in val if target is not None and loss <= target), None)
        tps = sorted(r["tps"] for r in steps[len(steps) // 4:])[len(steps[len(steps) // 4:]) // 2]
        rows.append({"run": name, "ok": run["ok"], "tokens": steps[-1]["step"] * run["tokens_per_step"],
                     "final_train_loss": steps[-1]["loss"], "final_val_loss": val[-1][1],
                     "val_ppl": math.exp(val[-1][1]), "tokens_per_s": tps, "wall_s": steps[-1]["t"],
                     "step_reaching_fullrank_val": reach,
                     "wall_s_to_fullrank_val": t_of.get(reach) if reach else None, "command": run["command"]})
    cols = ["run", "tokens", "final_train_loss", "final_val_loss", "val_ppl", "tokens_per_s", "wall_s",
            "wall_s_to_fullrank_val"]
    write_results(a.out, rows, env_info(), "Quality: CoLA vs full rank at equal tokens", columns=cols,
                  notes=f"Validation loss on the held-out corpus split; target = the full-rank run's final "
                        f"validation loss ({target}).")
    _plot(runs, a.out + ".png")
    print_table(rows, cols)


def _plot(runs: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in runs.items():
        if not run["steps"]:
            continue
        tok = run["tokens_per_step"]
        axes[0].plot([r["step"] * tok / 1e6 for r in run["steps"]], [r["loss"] for r in run["steps"]],
                     alpha=0.5, label=f"{name} train")
        axes[0].plot([s * tok / 1e6 for s, _ in run["validation"]], [v for _, v in run["validation"]], "o-",
                     label=f"{name} val")
        t_of = {r["step"]: r["t"] for r in run["steps"]}
        axes[1].plot([t_of.get(s, float("nan")) for s, _ in run["validation"]],
                     [v for _, v in run["validation"]], "o-", label=f"{name} val")
    axes[0].set(xlabel="tokens (M)", ylabel="loss", title="equal tokens")
    axes[1].set(xlabel="wall-clock (s)", ylabel="validation loss", title="equal wall-clock")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
