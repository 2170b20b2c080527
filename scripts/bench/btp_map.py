"""Where BTP pays (PREDICTED): the winning layout over cluster size × global batch, per flavor and machine.

For each flavor, on 1 → 128 nodes of 8 H200s, and of 4 A100s (BOOST's published setting), at global
batches of 64 → 2048 sequences of 4096 tokens, ``boost_titan.planner`` ranks every layout that fits;
this table keeps the winner, the best layout without tensor parallelism (tp 1: FSDP / HSDP, pipeline
stages, gradient accumulation), the best BTP layout with tp > 1 and the best vanilla-TP layout, and
BTP's margin over each. A margin above 1 means BTP is predicted faster. The A100's rates are the
H200's scaled by peak (``comm_model.GPUS``); a section sets the planner's A100 step times beside
BOOST's published ones (its Fig. 5, its own code) as a check of that scale.

    python -m scripts.bench.btp_map --out docs/results/btp_map_predicted
"""

from __future__ import annotations

import argparse
import shlex
import sys

from boost_titan.planner import predict
from boost_titan.planner.comm_model import GPUS, cluster_of
from scripts.bench.results import BOOST_FIG5_A100, env_info, print_table, pyplot, write_results

FLAVORS = ("7B", "13B", "30B")
MACHINES = ("h200", "a100")
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
GLOBAL_BATCHES = (64, 128, 256, 512, 1024, 2048)


def name(r: dict | None) -> str:
    if r is None:
        return "none fits"
    accum = f"x{r['accum']}" if r["accum"] > 1 else ""
    hsdp = f" hsdp{r['rep']}" if r["rep"] > 1 else ""
    return f"{r['strategy']} tp{r['tp']} pp{r['pp']} dp{r['dp']}{hsdp} {r['ac']} b{r['batch']}{accum}"


def cell(gpu: str, flavor: str, nodes: int, global_batch: int, seq: int) -> dict:
    per_node = GPUS[gpu]["gpus_per_node"]
    rows = [r for r in predict.plan(flavor, per_node, nodes=nodes, global_batch=global_batch, seq=seq, gpu=gpu)
            if r["fits"]]
    first = lambda keep: next((r for r in rows if keep(r)), None)  # noqa: E731  (rows: fastest first)
    best, tp1 = first(lambda r: True), first(lambda r: r["tp"] == 1)
    btp, vanilla = first(lambda r: r["strategy"] == "btp" and r["tp"] > 1), first(lambda r: r["strategy"] == "vanilla")
    tok = lambda r: r["tokens_per_s_gpu"] if r else None  # noqa: E731
    ratio = lambda a, b: round(a["tokens_per_s_gpu"] / b["tokens_per_s_gpu"], 3) if a and b else None  # noqa: E731
    return {"gpu": gpu, "flavor": flavor, "nodes": nodes, "global_batch": global_batch, "winner": name(best),
            "winner_tok_s_gpu": round(tok(best)) if best else None,
            "best_tp1": name(tp1), "best_btp_tp_gt_1": name(btp), "best_vanilla": name(vanilla),
            "btp_vs_tp1": ratio(btp, tp1), "btp_vs_vanilla": ratio(btp, vanilla)}


def boost_check(seq: int) -> list[dict]:
    """The planner's step time of BOOST's Fig. 5 layouts on A100s (one node, no data parallelism, local
    batch 4) beside BOOST's published ones."""
    out = []
    for flavor, (tp, pp, published) in BOOST_FIG5_A100.items():
        if pp > 1:  # one node only
            continue
        for strategy, boost_s in published.items():
            if tp == 1 and strategy == "vanilla":  # without TP the planner lists vanilla as btp
                continue
            args = predict.FLAVORS[flavor + ("_fullrank" if strategy == "fullrank" else "")].replace(max_seq_len=seq)
            t = predict.step_time(args, predict.Layout(strategy, tp, 1, 1, "none"), 4, seq, cluster=cluster_of("a100", 1, tp))
            out.append({"flavor": flavor, "tp": tp, "strategy": strategy, "planner_s": round(t["step_s"], 3),
                        "boost_s": boost_s, "boost_over_planner": round(boost_s / t["step_s"], 2)})
    return out


def _plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(len(MACHINES), len(FLAVORS), figsize=(5.2 * len(FLAVORS), 4.6 * len(MACHINES)),
                             squeeze=False)
    for (gpu, flavor), ax in zip([(g, f) for g in MACHINES for f in FLAVORS], axes.flat):
        grid = [[next(r for r in rows if (r["gpu"], r["flavor"], r["nodes"], r["global_batch"]) == (gpu, flavor, n, g))
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
        ax.set(xlabel=f"nodes of {GPUS[gpu]['gpus_per_node']} {gpu.upper()}s",
               title=f"{flavor} on {gpu.upper()}s")
    for row in axes:
        row[0].set_ylabel("global batch (sequences of 4096)")
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8,
                 label="BTP (tp > 1) / the best tp 1 layout (>1: BTP faster); text: the winner's tp")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    rows = [cell(gpu, f, n, g, a.seq) for gpu in MACHINES for f in FLAVORS for n in NODES for g in GLOBAL_BATCHES]
    check = boost_check(a.seq)
    print_table(rows)
    print_table(check)
    if a.out:
        meta = {**env_info("cpu"), "command": shlex.join(["python", "-m", "scripts.bench.btp_map",
                                                          *(sys.argv[1:] if argv is None else argv)])}
        write_results(a.out, rows, meta, "PREDICTED: where BTP pays, nodes of 8 H200s or 4 A100s x global batch",
                      sections=[("The A100 scale checked: the planner's step times of BOOST's Fig. 5 layouts beside "
                                 "BOOST's published ones (its code, A100 80GB)", check, None)],
                      notes=__doc__.split("\n\n")[1] + "\n\nEvery number is a prediction: "
                      "`python -m boost_titan.planner --help` says how each is made.")
        _plot(rows, a.out + ".png")


if __name__ == "__main__":
    main()
