"""Where BTP pays (PREDICTED): the winning layout over cluster size × global batch, per flavor.

For each flavor, on nodes of 8 H200s (1 → 128 nodes) and global batches of 64 → 2048 sequences of
4096 tokens, ``boost_titan.planner`` ranks every layout that fits; this table keeps the winner, the best
layout without tensor parallelism (tp 1: FSDP / HSDP, pipeline stages, gradient accumulation), the
best BTP layout with tp > 1 and the best vanilla-TP layout, and BTP's margin over each. A margin above 1
means BTP is predicted faster.

    python -m scripts.bench.btp_map --out docs/results/btp_map_h200_predicted
"""

from __future__ import annotations

import argparse
import shlex
import sys

from boost_titan.planner import predict
from scripts.bench.results import env_info, print_table, pyplot, write_results

FLAVORS = ("7B", "13B", "30B")
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
GLOBAL_BATCHES = (64, 128, 256, 512, 1024, 2048)


def name(r: dict | None) -> str:
    if r is None:
        return "none fits"
    accum = f"x{r['accum']}" if r["accum"] > 1 else ""
    hsdp = f" hsdp{r['rep']}" if r["rep"] > 1 else ""
    return f"{r['strategy']} tp{r['tp']} pp{r['pp']} dp{r['dp']}{hsdp} {r['ac']} b{r['batch']}{accum}"


def cell(flavor: str, nodes: int, global_batch: int, seq: int) -> dict:
    rows = [r for r in predict.plan(flavor, 8, nodes=nodes, global_batch=global_batch, seq=seq) if r["fits"]]
    first = lambda keep: next((r for r in rows if keep(r)), None)  # noqa: E731  (rows: fastest first)
    best, tp1 = first(lambda r: True), first(lambda r: r["tp"] == 1)
    btp, vanilla = first(lambda r: r["strategy"] == "btp" and r["tp"] > 1), first(lambda r: r["strategy"] == "vanilla")
    tok = lambda r: r["tokens_per_s_gpu"] if r else None  # noqa: E731
    ratio = lambda a, b: round(a["tokens_per_s_gpu"] / b["tokens_per_s_gpu"], 3) if a and b else None  # noqa: E731
    return {"flavor": flavor, "nodes": nodes, "global_batch": global_batch, "winner": name(best),
            "winner_tok_s_gpu": round(tok(best)) if best else None,
            "best_tp1": name(tp1), "best_btp_tp_gt_1": name(btp), "best_vanilla": name(vanilla),
            "btp_vs_tp1": ratio(btp, tp1), "btp_vs_vanilla": ratio(btp, vanilla)}


def _plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(FLAVORS), figsize=(5.2 * len(FLAVORS), 4.6), squeeze=False)
    for ax, flavor in zip(axes[0], FLAVORS):
        grid = [[next(r for r in rows if (r["flavor"], r["nodes"], r["global_batch"]) == (flavor, n, g))
                 for n in NODES] for g in GLOBAL_BATCHES]
        values = [[c["btp_vs_tp1"] if c["btp_vs_tp1"] is not None else float("nan") for c in line] for line in grid]
        image = ax.imshow(values, cmap="RdBu", vmin=0.5, vmax=1.5, origin="lower", aspect="auto")
        for y, line in enumerate(grid):
            for x, c in enumerate(line):
                tp = c["winner"].split(" ")[1] if c["winner"] != "none fits" else "-"
                label = f"{c['btp_vs_tp1']:.2f}\n{tp}" if c["btp_vs_tp1"] is not None else f"-\n{tp}"
                ax.text(x, y, label, ha="center", va="center", fontsize=6)
        ax.set_xticks(range(len(NODES)), [str(n) for n in NODES])
        ax.set_yticks(range(len(GLOBAL_BATCHES)), [str(g) for g in GLOBAL_BATCHES])
        ax.set(xlabel="nodes of 8 H200s", title=f"{flavor}: BTP (tp > 1) / best tp 1 layout")
    axes[0][0].set_ylabel("global batch (sequences of 4096)")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="BTP's margin (>1: BTP faster); text: the winner's tp")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    rows = [cell(f, n, g, a.seq) for f in FLAVORS for n in NODES for g in GLOBAL_BATCHES]
    print_table(rows)
    if a.out:
        meta = {**env_info("cpu"), "command": shlex.join(["python", "-m", "scripts.bench.btp_map",
                                                          *(sys.argv[1:] if argv is None else argv)])}
        write_results(a.out, rows, meta, "PREDICTED: where BTP pays, nodes of 8 H200s x global batch",
                      notes=__doc__.split("\n\n")[1] + "\n\nEvery number is a prediction: "
                      "`python -m boost_titan.planner --help` says how each is made.")
        _plot(rows, a.out + ".png")


if __name__ == "__main__":
    main()
