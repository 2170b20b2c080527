"""Rank parallel layouts for a flavor on one node by PREDICTED throughput, among those that fit in memory.

    python -m boost_titan.plan --flavor 7B --gpus 8 [--gpu-mem 139] [--batch 4] [--microbatch 1] [--seq 4096] [--top 12]
    python -m boost_titan.plan --flavor 13B --gpus-per-node 8 --nodes 4 --global-batch 128

Several nodes (``--nodes``): a tp group stays inside a node; each collective runs on what its group
spans, NVLink inside a node or the InfiniBand NICs of its ranks across nodes (``comm_model.Cluster``:
ranks tp-innermost, then dp, then pp), and the column ``crosses`` names the dimensions that cross the
network. ``--global-batch`` fixes the sequences per step (strong scaling): each layout's local batch is
``global / dp``.

A layout is strategy × tp × pp × dp × activation checkpointing (``none`` | ``budget`` | ``lowrank`` | ``full``), with
``gpus = tp · pp · dp``; ``--batch`` is the local batch (sequences per data-parallel rank, BOOST's 4) and
``--microbatch`` the pipeline layouts' microbatch (sequences; it divides the local batch).
Every number printed is a prediction from three parts, each stated here so it can be checked:

* **Compute** = the rank's model FLOPs (``flops_per_token`` × tokens / (tp · pp)) at a per-rank rate that
  was *measured* (emulated, compiled, bf16, b 4 × s 4096, ``docs/results/emulate_*.md``) for that strategy
  and tp; a tp that was not measured takes the nearest measured one (column ``rate`` says which).
  Activation checkpointing multiplies the compute time: ``budget`` (torchtitan's ``memory_budget`` mode
  at 0.9: Inductor recomputes elementwise outputs, no GEMM) by 1.027 for CoLA and 1.011 for full rank
  (measured at 1B, b 4: 91.1K → 88.7K and 56.1K → 55.5K tokens/s, ``e2e_mb_s11.md``), ``lowrank`` by
  1.21 (measured at 1B: 85K → 70.5K tokens/s, ``e2e_1gpu_ablation.md``), ``full`` by 4/3 (one more
  forward).
* **Communication** (``boost_titan.bench.comm_model``, α–β, NVLink SHARP off): the layer's TP collectives
  counted from the real model on the meta device, exposed except what the weight-gradient GEMMs in
  flight beside a backward collective hide (``comm_model.tp_seconds``); FSDP's traffic overlapped with compute
  (only the excess is exposed); 1F1B pipelines take ``m + p − 1`` slots of one microbatch (``m`` =
  batch / microbatch) plus one activation send each way per slot. The slot comes from the b 4 rate,
  so it leaves out the host time of a one-sequence microbatch: at 13B tp 4 × pp 2 each stage's rank,
  emulated inside the schedule at microbatch 1, took as long for btp as for full rank (0.31 / 0.38 vs
  0.37 / 0.36 s per step, ``docs/results/emulate_13b_s8.md``), so btp's pipeline rows at microbatch 1
  and tp ≥ 4 are optimistic. At microbatch 4 (BOOST's) the stage ranks ran faster than the b 4 rate
  assumes (``emulate_13b_mb4_s9.md``: btp 0.60 / 0.62 s per 4 microbatches of 4, ≈ 540 TFLOP/s against
  the 480 of the 7B rows), so those rows are conservative.
* **Memory** per rank, of the fullest pipeline stage: 16 B per parameter (fp32 weight, gradient, two
  AdamW moments) sharded over dp by FSDP2, plus 10 B per parameter when dp = 1 under TP or PP (the
  1-rank mixed-precision wrapper's bf16 weights and its end-of-backward gradient reduction,
  ``ONE_RANK_WRAPPER_BYTES``); activations per token and layer ``(A_sh / tp + A_rep) · d``
  bytes, with (A_sh, A_rep) fitted per strategy to the peaks measured on one H200 (tp > 1: emulated; below), times the stage's
  layers and, under 1F1B, the ``min(pp, m)`` microbatches the first stage keeps; ``budget`` keeps 0.71
  (CoLA) / 0.68 (full rank) of that (1B, b 4: peaks 41.3 → 31.6 and 46.3 → 37.6 GiB measured,
  ``e2e_mb_s11.md``, above this model's 8.1 / 19.0 GiB of model states; under TP and FSDP assumed the
  same: a compiled btp tp 2 block on the CPU saves 0.70 of its bytes with it, as one at tp 1 does,
  ``tests/test_activation_checkpoint.py``), ``lowrank`` keeps 0.20 of that (1B, compiled: peak 44.0 → 15.1 GiB, i.e. activations 35.9 → 7.0 GiB above 8.1 GiB of
  model states; ``e2e_1gpu_ablation.md``), ``full`` keeps each layer's input plus one layer's
  activations. A layout fits if that is at most 92% of ``--gpu-mem`` (allocator headroom).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from boost_titan.models import FLAVORS, TransformerArgs
from boost_titan.models.args import flops_per_token, linear_params_per_layer
from boost_titan.parallel import STRATEGIES, check_tp, stream_shape

GiB = 2**30
# Per-rank model TFLOP/s, emulated on one H200 (compiled, bf16, local batch 4 x 4096; session 10, with the
# backward collectives overlapped, emulate_fig5_s10.md): CoLA tp 1 = 556.2, the mean of 565.8 (7B) and
# 546.5 (3B), FSDP over 2; tp 2 from the 3B rows, tp 4 from the 7B rows. Full rank tp 1 = 567: 7B_fullrank,
# tp 1, dp 2, as issue 17 reports it (emulated the same way; not re-run for a results file).
MEASURED_TFLOPS = {
    "btp": {1: 556.2, 2: 529.0, 4: 503.4},
    "vanilla": {1: 556.2, 2: 429.9, 4: 316.5},
    "fullrank": {1: 567.0, 2: 634.3, 4: 595.5},
}
# The 1-rank FSDP2 wrapper that gives TP-only / PP-only layouts mixed precision keeps a bf16 copy of the
# weights (2 bytes per parameter) and, as one group for the whole model, reduces all gradients at the end
# of backward: the bf16 gradients, the reduction's bf16 input and its fp32 output (2 + 2 + 4 bytes) are
# alive together. Measured peaks of session 8 (emulate_fig5_s8.md, 3B tp 2 and 7B tp 4, all strategies)
# agree with this within 6%.
ONE_RANK_WRAPPER_BYTES = 2 + 8
# Activation bytes per token and layer, in units of d: (A_sh, A_rep) with A_sh / tp + A_rep, fitted to
# the measured peaks minus the model states (compiled, no AC, b 4 x 4096): CoLA tp 1 46.9 d (1B, 43.29 GiB,
# e2e_kernels.md) and 49.4 d (7B, FSDP 2, 118.9 GiB, emulate_7b_b4.md), taken as 48.2; from emulate_7b_b4.md, 7B tp 4: btp 17.3 d, vanilla 39.1 d, fullrank 12.2 d (all of it
# sharded under sequence parallelism). Checked on the 3B tp 2 rows, which were not fitted (tests).
ACTIVATION_D = {"btp": (41.2, 7.0), "vanilla": (12.2, 36.0), "fullrank": (48.8, 0.0)}
AC_TIME = {"none": 1.0, "lowrank": 1.21, "full": 4 / 3}
LOWRANK_KEEP = 0.20
# ac = "budget" (memory_budget 0.9), per family: (activations kept, compute time factor); see the docstring
BUDGET = {"cola": (0.71, 1.027), "fullrank": (0.68, 1.011)}
# how to ask torchtitan for each ac value (every rate above was measured compiled)
AC_FLAGS = {"none": [], "budget": ["--activation_checkpoint.mode", "memory_budget",
                                   "--activation_checkpoint.memory_budget", "0.9"],
            "lowrank": ["--boost.lowrank_checkpoint"], "full": ["--activation_checkpoint.mode", "full"]}
HEADROOM = 0.92


@dataclass(frozen=True)
class Layout:
    strategy: str
    tp: int
    pp: int
    dp: int  # data-parallel ranks in all (FSDP: dp shards; HSDP: dp / rep shards, each replicated rep times)
    ac: str
    rep: int = 1  # HSDP: replicas (torchtitan's data_parallel_replicate_degree), sharded inside a node

    @property
    def shard(self) -> int:
        return self.dp // self.rep


def layouts(args: TransformerArgs, gpus: int, max_tp: int = 8, gpus_per_node: int | None = None) -> list[Layout]:
    # max_tp: the GPUs of one node (a tp group never spans nodes: every TP collective would cross the network).
    # gpus_per_node below gpus (several nodes): each FSDP layout without pipeline stages also as HSDP,
    # sharded over the node's GPUs and replicated across the nodes
    """Every valid layout: the strategy fits the family, tp divides what it shards, pp divides the layers."""
    out = []
    lowrank = args.attn_rank > 0
    for strategy in STRATEGIES:
        for tp in (t for t in (1, 2, 4, 8, 16) if t <= max_tp and gpus % t == 0):
            if tp == 1 and strategy == "vanilla":  # without TP the two CoLA strategies are one layout
                continue
            try:
                check_tp(strategy, args, tp)
            except ValueError:
                continue
            for pp in (p for p in (1, 2, 4, 8, 16) if (gpus // tp) % p == 0 and args.n_layers % p == 0):
                dp = gpus // (tp * pp)
                shard = (gpus_per_node or gpus) // tp
                reps = [1] + ([dp // shard] if pp == 1 and shard > 1 and dp > shard and dp % shard == 0 else [])
                for ac in ("none", "budget", "lowrank", "full") if lowrank else ("none", "budget", "full"):
                    out += [Layout(strategy, tp, pp, dp, ac, rep) for rep in reps]
    return out


def stage_params(args: TransformerArgs, tp: int, pp: int) -> int:
    """Parameters of the fullest pipeline stage on one rank (its TP shards, before FSDP); at tp = pp = 1
    the whole model (``count_params``)."""
    layer = linear_params_per_layer(args) + 2 * args.dim
    table = args.vocab_size * args.dim
    # pp > 1: the last stage holds the lm_head (a tied one mirrors the embedding) and the final norm
    ends = table * (1 if args.tie_embeddings else 2) + args.dim if pp == 1 else table + args.dim
    return (args.n_layers // pp * layer + ends) // tp


def microbatch_of(layout: Layout, batch: int, microbatch: int) -> int:
    """Sequences per forward: the pipeline microbatch under pp > 1, else the whole local batch."""
    if layout.pp == 1:
        return batch
    if microbatch < 1 or batch % microbatch:
        raise ValueError(f"microbatch={microbatch} must be a positive divisor of the local batch {batch}")
    return microbatch


def memory(args: TransformerArgs, layout: Layout, batch: int, seq: int, microbatch: int = 1) -> dict:
    """Predicted peak bytes on one rank of the fullest stage: model states and activations."""
    params = stage_params(args, layout.tp, layout.pp)
    # dp = 1 under TP or PP: the 1-rank FSDP2 wrapper (mixed precision, ONE_RANK_WRAPPER_BYTES); one GPU
    # alone uses torchtitan's autocast, which keeps no copies
    wrapped = layout.dp == 1 and (layout.tp > 1 or layout.pp > 1)
    states = 16 * params / layout.shard + (ONE_RANK_WRAPPER_BYTES * params if wrapped else 0)
    microbatch = microbatch_of(layout, batch, microbatch)
    inflight = min(layout.pp, batch // microbatch) if layout.pp > 1 else 1
    tokens = microbatch * seq
    a_sh, a_rep = ACTIVATION_D[layout.strategy]
    per_layer = (a_sh / layout.tp + a_rep) * args.dim * tokens
    layers = args.n_layers // layout.pp
    if layout.ac == "none":
        acts = per_layer * layers * inflight
    elif layout.ac == "budget":
        acts = _budget(layout)[0] * per_layer * layers * inflight
    elif layout.ac == "lowrank":
        acts = LOWRANK_KEEP * per_layer * layers * inflight
    else:  # full: each layer's bf16 input (the stream in the strategy's layout) + one layer recomputed
        stream = math.prod(stream_shape(layout.strategy, microbatch, seq, args.dim, layout.tp))
        acts = 2 * stream * layers * inflight + per_layer
    return {"params": params, "states_bytes": states, "activation_bytes": acts, "total_bytes": states + acts}


def train_command(flavor: str, layout: Layout, batch: int, seq: int, microbatch: int = 1, nodes: int = 1) -> str:
    """The ``scripts/run_train.sh`` command that runs ``layout`` (compiled, as the rates were measured);
    on several nodes, the command each node runs (``scripts/multinode_trainer.slurm`` sets the variables)."""
    flags = ["--model.flavor", flavor, "--boost.tp_strategy", layout.strategy,
             "--parallelism.tensor_parallel_degree", str(layout.tp),
             "--parallelism.pipeline_parallel_degree", str(layout.pp),
             "--parallelism.data_parallel_shard_degree", str(layout.shard),
             *(["--parallelism.data_parallel_replicate_degree", str(layout.rep)] if layout.rep > 1 else []),
             "--training.local_batch_size", str(batch), "--training.seq_len", str(seq), "--compile.enable",
             *AC_FLAGS[layout.ac]]
    if layout.pp > 1:
        flags += ["--parallelism.pipeline_parallel_microbatch_size", str(microbatch_of(layout, batch, microbatch))]
    gpus = layout.tp * layout.pp * layout.dp
    if nodes == 1:
        return f"NGPU={gpus} ./scripts/run_train.sh " + " ".join(flags)
    return (f"NNODES={nodes} NODE_RANK=<0..{nodes - 1}> RDZV_ENDPOINT=<node 0>:29500 NGPU={gpus // nodes} "
            "./scripts/run_train.sh " + " ".join(flags))


def _budget(layout: Layout) -> tuple[float, float]:
    return BUDGET["fullrank" if layout.strategy == "fullrank" else "cola"]


_CALLS: dict = {}


def _layer_tp_calls(strategy: str, args: TransformerArgs, tp: int, microbatch: int, seq: int):
    """One layer's TP collectives, counted from the real layer (cached: the same for every pp / dp / ac)."""
    from boost_titan.bench.comm_volume import layer_collectives

    key = (strategy, repr(args), tp, microbatch, seq)
    if key not in _CALLS:
        _CALLS[key] = layer_collectives(strategy, args, tp, microbatch, seq)
    return _CALLS[key]


def step_time(args: TransformerArgs, layout: Layout, batch: int, seq: int, link=None, microbatch: int = 1,
              cluster=None) -> dict:
    """Predicted seconds per step on one rank: compute, exposed communication, pipeline bubble.
    ``link``: one interconnect for every collective; ``cluster`` (comm_model.Cluster): each group's own
    (NVLink inside a node, the network across nodes)."""
    from boost_titan.bench import comm_model

    if cluster is not None:
        tp_link = cluster.link(layout.tp, 1)
        dp_link = cluster.link(layout.shard, layout.tp)
        rep_link = cluster.link(layout.rep, layout.tp * layout.shard)
        pp_link = cluster.p2p_link(layout.pp, layout.tp * layout.dp)
    else:
        tp_link = dp_link = pp_link = rep_link = link or comm_model.H200_NODE
    rates = MEASURED_TFLOPS[layout.strategy]
    rate_tp = min(rates, key=lambda t: (abs(t - layout.tp), -t))  # nearest measured tp
    tflops = rates[rate_tp] * 1e12
    microbatch = microbatch_of(layout, batch, microbatch)
    m = batch // microbatch
    mb_compute = flops_per_token(args, seq) * microbatch * seq / (layout.tp * layout.pp) / tflops
    mb_compute *= _budget(layout)[1] if layout.ac == "budget" else AC_TIME[layout.ac]
    calls = _layer_tp_calls(layout.strategy, args.replace(n_layers=1), layout.tp, microbatch, seq)
    mb_comm = comm_model.tp_seconds(list(calls), layout.tp, tp_link) * (args.n_layers // layout.pp)
    if layout.pp > 1:
        p2p = 2 * math.prod(stream_shape(layout.strategy, microbatch, seq, args.dim, layout.tp))  # bf16
        step = comm_model.pipeline_step_seconds(mb_compute + mb_comm, m, layout.pp, p2p, pp_link)
    else:
        step = m * (mb_compute + mb_comm)
    compute = m * mb_compute
    fsdp = comm_model.fsdp_seconds(stage_params(args, layout.tp, layout.pp), layout.shard, dp_link,
                                   groups=args.n_layers // layout.pp + 2)
    if layout.rep > 1:  # HSDP: the reduce-scattered fp32 gradient shard all-reduced across the replicas
        fsdp += comm_model.collective_seconds("all_reduce", 4 * stage_params(args, layout.tp, layout.pp)
                                              / layout.shard, layout.rep, rep_link)
    step += max(0.0, fsdp - compute)
    return {"compute_s": compute, "tp_comm_s": m * mb_comm, "fsdp_s": fsdp, "step_s": step,
            "rate": f"tp{rate_tp}" + ("" if rate_tp == layout.tp else " (nearest)")}


def plan(flavor: str, gpus: int, gpu_mem_gib: float = 139.0, batch: int = 4, seq: int = 4096,
         microbatch: int = 1, nodes: int = 1, global_batch: int | None = None) -> list[dict]:
    """All valid layouts with their predictions, fitting ones first, each group by predicted throughput
    (tokens/s per GPU: layouts with more data parallelism process more tokens per step).

    ``gpus`` per node, on ``nodes`` nodes (a tp group stays inside a node; the column ``crosses`` names
    the dimensions whose collectives cross the network). ``global_batch`` (sequences per step): each
    layout's local batch is ``global_batch / dp`` (strong scaling; a layout whose dp does not divide it,
    or whose local batch a pipeline microbatch does not divide, is left out) instead of ``batch``."""
    from boost_titan.bench.comm_model import Cluster

    cluster = Cluster(nodes=nodes, gpus_per_node=gpus)
    args = FLAVORS[flavor].replace(max_seq_len=seq)
    rows = []
    for layout in layouts(args, cluster.gpus, max_tp=gpus, gpus_per_node=gpus if nodes > 1 else None):
        local = batch if global_batch is None else global_batch // layout.dp
        if global_batch is not None and (global_batch % layout.dp or (layout.pp > 1 and local % microbatch)):
            continue
        mem = memory(args, layout, local, seq, microbatch)
        t = step_time(args, layout, local, seq, microbatch=microbatch, cluster=cluster)
        rows.append({"strategy": layout.strategy, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp,
                     "ac": layout.ac, "rep": layout.rep, "batch": local, "mem_gib": mem["total_bytes"] / GiB,
                     "fits": mem["total_bytes"] <= HEADROOM * gpu_mem_gib * GiB, "step_s": t["step_s"],
                     "tokens_per_s_gpu": local * seq * layout.dp / t["step_s"] / cluster.gpus,
                     "compute_s": t["compute_s"], "tp_comm_s": t["tp_comm_s"], "fsdp_s": t["fsdp_s"],
                     "crosses": ",".join(cluster.crossing(layout.tp, layout.shard, layout.pp, layout.rep)) or "-",
                     "rate": t["rate"]})
    return sorted(rows, key=lambda r: (not r["fits"], -r["tokens_per_s_gpu"]))


def main(argv=None) -> None:
    from boost_titan.bench.common import print_table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="7B")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (--gpus-per-node is the same option)")
    p.add_argument("--gpus-per-node", type=int, dest="gpus")
    p.add_argument("--nodes", type=int, default=1, help="nodes, joined by 400 Gb/s InfiniBand (comm_model.NDR_IB)")
    p.add_argument("--gpu-mem", type=float, default=139.0, help="GiB per GPU (H200: 139 usable)")
    p.add_argument("--batch", type=int, default=4, help="local batch: sequences per data-parallel rank")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per step over all ranks (strong scaling): each layout's local batch is "
                        "global / dp, instead of --batch")
    p.add_argument("--microbatch", type=int, default=1,
                   help="pipeline layouts: sequences per microbatch (BOOST: 4); must divide --batch")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", default=None, help="also write <out>.json and <out>.md (every layout)")
    a = p.parse_args(argv)
    if a.microbatch < 1 or (a.global_batch is None and a.batch % a.microbatch):
        p.error(f"--microbatch {a.microbatch} must be a positive divisor of --batch {a.batch}")
    if a.nodes < 1 or a.gpus < 1:
        p.error(f"--nodes {a.nodes} and --gpus {a.gpus} must be positive")
    rows = plan(a.flavor, a.gpus, a.gpu_mem, a.batch, a.seq, a.microbatch, a.nodes, a.global_batch)
    fitting = [r for r in rows if r["fits"]]
    pipe = f", pipeline microbatch {a.microbatch}" if a.microbatch > 1 else ""
    where = f"{a.gpus} GPUs" if a.nodes == 1 else f"{a.nodes} nodes x {a.gpus} GPUs"
    batch = f"local batch {a.batch}" if a.global_batch is None else f"global batch {a.global_batch}"
    title = f"{a.flavor} on {where} of {a.gpu_mem:g} GiB, {batch} x {a.seq}{pipe}"
    print(f"{title}: {len(fitting)} of {len(rows)} layouts fit; PREDICTED (see python -m boost_titan.plan --help)")
    cols = ["strategy", "tp", "pp", "dp", "rep", "ac", "batch", "mem_gib", "step_s", "tokens_per_s_gpu", "tp_comm_s",
            "crosses", "rate"]
    rounded = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    if a.out:
        import shlex
        import sys

        from boost_titan.bench.common import env_info, write_results

        meta = {**env_info("cpu"), "command": shlex.join(["python", "-m", "boost_titan.plan", *(sys.argv[1:] if argv is None else argv)])}
        write_results(a.out, rounded, meta, f"PREDICTED layouts: {title}", columns=cols + ["fits"],
                      notes="Every number is a prediction; how it is made: `python -m boost_titan.plan --help`.")
    print_table([r for r in rounded if r["fits"]][:a.top], cols)
    if fitting:
        best = Layout(*(fitting[0][k] for k in ("strategy", "tp", "pp", "dp", "ac", "rep")))
        print(f"run the first one (add a config file and the job's other settings):\n  "
              f"{train_command(a.flavor, best, fitting[0]['batch'], a.seq, a.microbatch, a.nodes)}")
        if a.nodes > 1:
            print("  or: sbatch --nodes", a.nodes, "--gpus-per-task", a.gpus, "scripts/multinode_trainer.slurm <the flags>")


if __name__ == "__main__":
    main()
