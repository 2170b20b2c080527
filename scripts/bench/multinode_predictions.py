"""PREDICTED multi-node rows (CPU, seconds): the layout planner on clusters of H200 nodes.

    python -m scripts.bench.multinode_predictions [--global-batch 128] [--out docs/results/multinode_predicted_h200]

1. BOOST's 7B training layout (``train_btp_cola_7b_polaris.sh``: 16 nodes × 4 GPUs, tp 4 × dp 16, micro-batch
   2) for BTP, vanilla and the dense twin (Megatron + SP), on 4-GPU H200 nodes; BOOST published no timings
   for it.
2. BOOST's 13B Fig. 5 row (tp 4 × pp 2, micro-batch 4, 16 sequences per step: on Polaris two 4-GPU
   nodes, one stage each), beside BOOST's A100 seconds.
3. Strong scaling: 7B / 13B / 30B on 2, 4 and 8 nodes of 8 H200s at a fixed global batch — the best
   fitting layout of each family (FSDP, HSDP sharded inside the node, pipeline stages, gradient
   accumulation, each with and without the step graph where it applies) and the best BTP layout with
   tp > 1; in brackets the dimensions whose collectives cross the network.

Everything is predicted by ``boost_titan.planner`` (emulated per-rank rates, α–β NVLink and InfiniBand
model, memory model, and the host's time beside the GPU's: a measured host time per block, or per
step under the step graph; ``python -m boost_titan.planner --help`` says how each term is made).
"""

from __future__ import annotations

import argparse

from boost_titan.models import FLAVORS
from boost_titan.planner import predict as plan
from boost_titan.planner.comm_model import Cluster
from boost_titan.planner.costs import measured_constants
from scripts.bench.results import BOOST_FIG5_A100, env_info, print_table, write_results


def _row(flavor, layout, batch, seq, cluster, microbatch=1, **extra):
    args = FLAVORS[flavor].replace(max_seq_len=seq)
    t = plan.step_time(args, layout, batch, seq, microbatch=microbatch, cluster=cluster)
    mem = plan.memory(args, layout, batch, seq, microbatch)
    return {"flavor": flavor, "nodes": f"{cluster.nodes} x {cluster.gpus_per_node}", "strategy": layout.strategy,
            "layout": f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp}", "ac": layout.ac, "batch": batch,
            "step_s": round(t["step_s"], 3), "tokens_per_s_gpu": round(batch * seq * layout.dp / t["step_s"] / cluster.gpus),
            "mem_gib": round(mem["total_bytes"] / plan.GiB, 1),
            "fits": mem["total_bytes"] <= measured_constants()["memory_headroom"]["value"] * 139 * plan.GiB,
            "crosses": ",".join(cluster.crossing(layout.tp, layout.dp, layout.pp)) or "-", **extra}


def boost_layouts(seq: int) -> list[dict]:
    rows = []
    c16 = Cluster(nodes=16, gpus_per_node=4)
    for strategy, flavor in (("btp", "7B"), ("vanilla", "7B"), ("fullrank", "7B_fullrank")):
        rows.append(_row(flavor, plan.Layout(strategy, 4, 1, 16, "none"), 2, seq, c16, boost_a100_s="not published"))
    c2 = Cluster(nodes=2, gpus_per_node=4)
    for strategy, flavor in (("btp", "13B"), ("vanilla", "13B"), ("fullrank", "13B_fullrank")):
        rows.append(_row(flavor, plan.Layout(strategy, 4, 2, 1, "none"), 16, seq, c2, microbatch=4,
                         boost_a100_s=BOOST_FIG5_A100["13B"][2][strategy]))
    return rows


def strong_scaling(global_batch: int, seq: int) -> list[dict]:
    rows = []
    for flavor in ("7B", "13B", "30B"):
        for nodes in (2, 4, 8):
            cola = [r for r in plan.plan(flavor, 8, nodes=nodes, global_batch=global_batch, seq=seq) if r["fits"]]
            dense = [r for r in plan.plan(f"{flavor}_fullrank", 8, nodes=nodes, global_batch=global_batch, seq=seq)
                     if r["fits"]]
            btp_tp = [r for r in cola if r["strategy"] == "btp" and r["tp"] > 1]

            def name(r):
                hsdp = f" (HSDP {r['rep']}x{r['dp'] // r['rep']})" if r["rep"] > 1 else ""
                return f"{r['strategy']} tp{r['tp']} pp{r['pp']} dp{r['dp']}{hsdp} {r['ac']} b{r['batch']}" + \
                    (f" x{r['accum']} accumulated" if r["accum"] > 1 else "") + f" [{r['crosses']}]"

            rows.append({
                "flavor": flavor, "nodes": f"{nodes} x 8",
                "best_cola": name(cola[0]) if cola else "none fits",
                "cola_tok_s_gpu": round(cola[0]["tokens_per_s_gpu"]) if cola else None,
                "best_btp_tp_gt_1": name(btp_tp[0]) if btp_tp else "none fits",
                "btp_tok_s_gpu": round(btp_tp[0]["tokens_per_s_gpu"]) if btp_tp else None,
                "best_dense": name(dense[0]) if dense else "none fits",
                "dense_tok_s_gpu": round(dense[0]["tokens_per_s_gpu"]) if dense else None,
                "cola_vs_dense": round(cola[0]["tokens_per_s_gpu"] / dense[0]["tokens_per_s_gpu"], 2)
                if cola and dense else None})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--global-batch", type=int, default=128, help="sequences per step for the strong-scaling rows")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    boost, scaling = boost_layouts(a.seq), strong_scaling(a.global_batch, a.seq)
    print_table(boost)
    print_table(scaling)
    if a.out:
        import shlex
        import sys

        meta = {**env_info("cpu"), "command": shlex.join(["python", "-m", "scripts.bench.multinode_predictions",
                                                          *(sys.argv[1:] if argv is None else argv)])}
        write_results(a.out, boost + scaling, meta,
                      "PREDICTED: BTP on several H200 nodes (400 Gb/s InfiniBand per GPU)",
                      sections=[("BOOST's multi-node layouts on H200 nodes of 4 GPUs", boost, None),
                                (f"Strong scaling at a global batch of {a.global_batch} x {a.seq} tokens, nodes of "
                                 "8 H200s (best fitting layout; [dims crossing the network])", scaling, None)],
                      notes=__doc__.split("\n\n", 2)[2])


if __name__ == "__main__":
    main()
