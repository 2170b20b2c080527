"""Rank parallel layouts for a flavor by PREDICTED throughput, among those that fit in memory.

    python -m boost_titan.planner --flavor 7B --gpus 8 [--gpu-mem 139] [--batch 4] [--microbatch 1] [--seq 4096] [--top 12]
    python -m boost_titan.planner --flavor 13B --gpus-per-node 8 --nodes 4 --global-batch 128

A layout is strategy × tp × pp × dp × activation checkpointing (``none`` | ``budget`` | ``lowrank`` |
``full``) with ``gpus = tp · pp · dp``; ``--batch`` is the local batch, ``--microbatch`` the pipeline
layouts' microbatch, ``--global-batch`` fixes the sequences per step (strong scaling). A tp group
stays inside a node; each collective runs on what its group spans (``comm_model.Cluster``), and the
column ``crosses`` names the dimensions that cross the network.

Every number is a prediction from stated parts (docs/design.md, "How the planner composes a step",
gives each term, its assumptions and the measurements behind its constants):

* **compute**: the rank's model FLOPs at the strategy's measured per-rank rate (``costs.COSTS``; a tp
  not measured takes the nearest, column ``rate``), times activation checkpointing's factor;
* **communication** (``comm_model``): TP's collectives counted from the real model, exposed except what
  the weight-gradient GEMMs beside them hide; FSDP's traffic hidden phase by phase; HSDP's replica
  all-reduces; 1F1B pipelines paced by their last stage;
* **memory** per rank of the fullest stage: optimizer states sharded over dp, the 1-rank wrapper's or a
  pipeline stage's unsharded copies, activations ``(A_sh / tp + A_rep) · d`` bytes per token and layer;
* **host**: the step is the larger of the host's time (per block and pass, or a fixed time per step
  under the step graph) and the GPU's; every layout without pipeline stages is ranked with and
  without ``[boost] step_cudagraph``.

Columns: ``tokens_per_s_gpu`` (TP's backward collectives hidden where GEMMs run beside them, FSDP
hidden phase by phase), ``tokens_per_s_gpu_tp_not_hidden`` (none of TP's hidden; FSDP as before),
``fsdp_exposed_s`` (what of FSDP's traffic compute cannot hide). The measured constants live in
``measured_h200.json`` beside this file (docs/design.md lists where each comes from).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from boost_titan.models import FLAVORS, TransformerArgs
from boost_titan.models.args import flops_per_token, linear_params_per_layer
from boost_titan.parallel import STRATEGIES, check_tp, stream_shape
from boost_titan.planner import comm_model
from boost_titan.planner.costs import COSTS, StrategyCosts, host_per_block, measured_constants

GiB = 2**30
# how to ask torchtitan for each ac value (every rate was measured compiled)
AC_FLAGS = {"none": [], "budget": ["--activation_checkpoint.mode", "memory_budget",
                                   "--activation_checkpoint.memory_budget", "0.9"],
            "lowrank": ["--boost.lowrank_checkpoint"], "full": ["--activation_checkpoint.mode", "full"]}


def costs(strategy: str) -> StrategyCosts:
    """The strategy's planner parameters (``COSTS[strategy]``)."""
    if strategy not in COSTS:
        raise ValueError(f"tp_strategy={strategy!r} has no planner parameters: add COSTS[{strategy!r}] = "
                         "StrategyCosts(...) in boost_titan.planner.costs")
    return COSTS[strategy]


def ac_factors(strategy: str, ac: str) -> tuple[float, float]:
    """(share of the activations kept, compute-time factor) of activation checkpointing ``ac``."""
    if ac == "none":
        return 1.0, 1.0
    entry = measured_constants()["activation_checkpointing"][ac]
    if ac == "budget":  # measured per family
        entry = entry["cola" if STRATEGIES[strategy].lowrank else "fullrank"]
    return entry.get("keep", 1.0), entry["time"]


@dataclass(frozen=True)
class Layout:
    strategy: str
    tp: int
    pp: int
    dp: int  # data-parallel ranks in all (FSDP: dp shards; HSDP: dp / rep shards, each replicated rep times)
    ac: str
    rep: int = 1  # HSDP: replicas (torchtitan's data_parallel_replicate_degree), sharded inside a node
    units: str = "block"  # FSDP across ranks: one unit per block ("block") or the whole stage ("stage")
    step_graph: bool = False  # [boost] step_cudagraph (pp = 1): the step replayed as one CUDA graph

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
            if tp == 1 and costs(strategy).same_layout_at_tp1:  # listed once, under the other strategy
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
                    for rep in reps:
                        # FSDP across ranks: per-block units, or one unit (fewer host hooks, nothing overlapped)
                        units = ("block", "stage") if dp // rep > 1 else ("block",)
                        out += [Layout(strategy, tp, pp, dp, ac, rep, u) for u in units]
    return out


def stage_params(args: TransformerArgs, tp: int, pp: int) -> int:
    """Parameters of the fullest pipeline stage on one rank (its TP shards, before FSDP); at tp = pp = 1
    the whole model (``count_params``)."""
    layer = linear_params_per_layer(args) + 2 * args.dim
    table = args.vocab_size * args.dim
    # pp > 1: the last stage holds the lm_head (a tied one mirrors the embedding) and the final norm
    ends = table * (1 if args.tie_embeddings else 2) + args.dim if pp == 1 else table + args.dim
    return (args.n_layers // pp * layer + ends) // tp


MEASURED_MAX_DIM = 4096
"""The per-rank rates were measured on the 3B and 7B (d 3072 / 4096); a larger model takes them as
they are, and its rows say so (column ``rate``)."""

PIPELINE_FSDP_UNSHARDED_BYTES = 6
"""Pipeline stages under FSDP: torch's pipelining turns resharding and gradient sync off between
microbatches (``torch/distributed/pipelining/stage.py``), so the stage's bf16 weights (2 B) and its
unreduced fp32 gradients (4 B) stay whole for the step."""


def stage_flops_per_token(args: TransformerArgs, seq: int, pp: int) -> float:
    """Training FLOPs per token of the slowest pipeline stage, the last: its blocks and the lm_head
    (at pp = 1 the whole model's ``flops_per_token``)."""
    head = 6 * args.vocab_size * args.dim
    per_block = (flops_per_token(args, seq) - head) / args.n_layers
    return per_block * (args.n_layers // pp) + head


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
    # dp = 1 under TP or PP: the 1-rank FSDP2 wrapper (mixed precision, one_rank_wrapper_bytes_per_param); one GPU
    # alone uses torchtitan's autocast, which keeps no copies
    # FSDP with one unit per stage holds the stage's whole bf16 weights and gradients the same way (7B tp 4 x
    # FSDP 2: +7.6 GiB over per-block units, 12 B per parameter, 7b_tp4_fsdp_units_emulated_h200.md)
    wrapped = (layout.dp == 1 and (layout.tp > 1 or layout.pp > 1)) or (layout.units == "stage" and layout.shard > 1)
    wrapper_bytes = measured_constants()["one_rank_wrapper_bytes_per_param"]["value"]
    states = 16 * params / layout.shard + (wrapper_bytes * params if wrapped else 0)
    if layout.pp > 1 and layout.shard > 1:  # torch's pipelining keeps the stage unsharded between microbatches
        states += PIPELINE_FSDP_UNSHARDED_BYTES * params
    microbatch = microbatch_of(layout, batch, microbatch)
    inflight = min(layout.pp, batch // microbatch) if layout.pp > 1 else 1
    tokens = microbatch * seq
    a_sh, a_rep = costs(layout.strategy).activation_d
    per_layer = (a_sh / layout.tp + a_rep) * args.dim * tokens
    layers = args.n_layers // layout.pp
    if layout.ac != "full":
        acts = ac_factors(layout.strategy, layout.ac)[0] * per_layer * layers * inflight
    else:  # full: each layer's bf16 input (the stream in the strategy's layout) + one layer recomputed
        stream = math.prod(stream_shape(layout.strategy, microbatch, seq, args.dim, layout.tp))
        acts = 2 * stream * layers * inflight + per_layer
    pool = measured_constants()["step_graph"]["pool_gib"] * GiB if layout.step_graph else 0.0
    return {"params": params, "states_bytes": states, "activation_bytes": acts + pool, "total_bytes": states + acts + pool}


def train_command(flavor: str, layout: Layout, batch: int, seq: int, microbatch: int = 1, nodes: int = 1,
                  accum: int = 1) -> str:
    """The ``scripts/run_train.sh`` command that runs ``layout`` (compiled, as the rates were measured);
    on several nodes, the command each node runs (``scripts/multinode_trainer.slurm`` sets the variables).
    ``accum`` > 1: gradient accumulation up to a global batch of ``batch · dp · accum`` sequences."""
    flags = ["--model.flavor", flavor, "--boost.tp_strategy", layout.strategy,
             "--parallelism.tensor_parallel_degree", str(layout.tp),
             "--parallelism.pipeline_parallel_degree", str(layout.pp),
             "--parallelism.data_parallel_shard_degree", str(layout.shard),
             *(["--parallelism.data_parallel_replicate_degree", str(layout.rep)] if layout.rep > 1 else []),
             "--training.local_batch_size", str(batch), "--training.seq_len", str(seq), "--compile.enable",
             *AC_FLAGS[layout.ac]]
    if accum > 1:
        flags += ["--training.global_batch_size", str(batch * layout.dp * accum)]
    if layout.units == "stage" and layout.shard > 1:
        flags += ["--boost.fsdp_blocks_per_unit", str(FLAVORS[flavor].n_layers // layout.pp)]
    if layout.step_graph:
        flags += ["--boost.step_cudagraph"]
    if layout.pp > 1:
        flags += ["--parallelism.pipeline_parallel_microbatch_size", str(microbatch_of(layout, batch, microbatch))]
    gpus = layout.tp * layout.pp * layout.dp
    if nodes == 1:
        return f"NGPU={gpus} ./scripts/run_train.sh " + " ".join(flags)
    return (f"NNODES={nodes} NODE_RANK=<0..{nodes - 1}> RDZV_ENDPOINT=<node 0>:29500 NGPU={gpus // nodes} "
            "./scripts/run_train.sh " + " ".join(flags))


_CALLS: dict = {}


def _layer_tp_calls(strategy: str, args: TransformerArgs, tp: int, microbatch: int, seq: int):
    """One layer's TP collectives, counted from the real layer (cached: the same for every pp / dp / ac)."""
    from boost_titan.planner.collectives import layer_collectives

    key = (strategy, repr(args), tp, microbatch, seq)
    if key not in _CALLS:
        _CALLS[key] = layer_collectives(strategy, args, tp, microbatch, seq)
    return _CALLS[key]


def step_time(args: TransformerArgs, layout: Layout, batch: int, seq: int, link=None, microbatch: int = 1,
              cluster=None, accum: int = 1) -> dict:
    """Predicted seconds per step on one rank: compute, exposed communication, pipeline bubble.
    ``link``: one interconnect for every collective; ``cluster`` (comm_model.Cluster): each group's own
    (NVLink inside a node, the network across nodes). ``accum``: gradient accumulation, ``accum``
    forward + backward passes of ``batch`` sequences per optimizer step (torchtitan's
    ``training.global_batch_size``); each pass gathers and reduce-scatters FSDP's units again
    (torchtitan keeps gradient sync on in every microstep)."""
    if cluster is not None:
        tp_link = cluster.link(layout.tp, 1)
        dp_link = cluster.link(layout.shard, layout.tp)
        rep_link = cluster.link(layout.rep, layout.tp * layout.shard)
        pp_link = cluster.p2p_link(layout.pp, layout.tp * layout.dp)
    else:
        tp_link = dp_link = pp_link = rep_link = link or comm_model.H200_NODE
    rate_tp, tflops = costs(layout.strategy).rate(layout.tp)
    scale = cluster.rate_scale if cluster is not None else 1.0  # another GPU than the H200 measured on
    tflops *= 1e12 * scale
    microbatch = microbatch_of(layout, batch, microbatch)
    m = batch // microbatch
    mb_compute = stage_flops_per_token(args, seq, layout.pp) * microbatch * seq / layout.tp / tflops
    mb_compute *= ac_factors(layout.strategy, layout.ac)[1]
    calls = list(_layer_tp_calls(layout.strategy, args.replace(n_layers=1), layout.tp, microbatch, seq))
    compute = m * mb_compute
    host = host_seconds(args, layout, m * accum)
    one_unit = layout.units == "stage"
    # one unit is the root's group, which FSDP keeps unsharded from forward into backward: one all-gather
    groups = 1 if one_unit else args.n_layers // layout.pp + 2
    params = stage_params(args, layout.tp, layout.pp)
    if layout.pp > 1:  # torch's pipelining: gathered once, reduce-scattered whole after the last backward
        fsdp = comm_model.fsdp_seconds(params, layout.shard, dp_link, groups=groups, regather_in_backward=False)
        fsdp_exposed = comm_model.pipeline_fsdp_exposed_seconds(params, layout.shard, mb_compute, dp_link, groups)
    else:
        fsdp = comm_model.fsdp_seconds(params, layout.shard, dp_link, groups=groups, regather_in_backward=not one_unit)
        fsdp_exposed = comm_model.fsdp_exposed_seconds(params, layout.shard, compute, dp_link, groups=groups)
    if layout.rep > 1:  # HSDP: each unit's reduce-scattered fp32 gradient shard all-reduced across the replicas
        replicas = comm_model.replica_all_reduce_seconds(params / layout.shard, layout.rep, rep_link, groups)
        fsdp += replicas
        fsdp_exposed += comm_model.replica_all_reduce_exposed_seconds(params / layout.shard, layout.rep, compute,
                                                                      rep_link, groups)
    fsdp, fsdp_exposed = accum * fsdp, accum * fsdp_exposed  # every microstep's own

    def step_with(overlap_rate: float) -> tuple[float, float, float]:
        """(step, exposed TP communication, the GPU's time) with the backward collectives hidden behind
        the dW GEMMs at ``overlap_rate`` (0: nothing hidden)."""
        mb_comm = comm_model.tp_seconds(calls, layout.tp, tp_link, overlap_rate) * (args.n_layers // layout.pp)
        if layout.pp > 1:
            p2p = 2 * math.prod(stream_shape(layout.strategy, microbatch, seq, args.dim, layout.tp))  # bf16
            step = comm_model.pipeline_step_seconds(mb_compute + mb_comm, m, layout.pp, p2p, pp_link)
        else:
            step = m * (mb_compute + mb_comm)
        # the GPU's time: compute, exposed TP collectives and what of FSDP's traffic compute cannot hide;
        # the host issues the step while the GPU runs it, so the step is the larger of the two
        gpu = accum * step + fsdp_exposed
        return max(gpu, host), accum * m * mb_comm, gpu

    step, tp_comm, gpu = step_with(comm_model.OVERLAP_GEMM_FLOPS * scale)
    step_no_overlap, tp_comm_no_overlap, _ = step_with(0.0)
    return {"compute_s": accum * compute, "host_s": host, "tp_comm_s": tp_comm, "fsdp_s": fsdp,
            "fsdp_exposed_s": fsdp_exposed, "step_s": step,
            "tp_comm_no_overlap_s": tp_comm_no_overlap, "step_no_overlap_s": step_no_overlap,
            "bound": "host" if host > gpu else "gpu",
            "rate": f"tp{rate_tp}" + ("" if rate_tp == layout.tp else " (nearest)")
            + (" (measured at 3B/7B)" if args.dim > MEASURED_MAX_DIM else "")}


def host_seconds(args: TransformerArgs, layout: Layout, passes: int = 1) -> float:
    """The host's least time per step (Python, hooks, dispatch, launches), from the measured host time
    per block at the layout's tp (``measured_h200.json`` ``host_per_block_s``; a tp not measured takes
    the nearest):

    * without pipeline stages: per block and forward + backward pass, by kind (FSDP across ranks with
      per-block units or one unit, or the 1-rank mixed-precision wrapper), times the rank's blocks and
      the passes (gradient accumulation); the step's fixed part (optimizer, clipping) is spread over
      the blocks as it was measured, and so charged again in each accumulation pass (an upper bound);
    * with pipeline stages: the stage's blocks times (a fixed part per block and step + a part per
      block and microbatch), the two measured apart (1F1B at two microbatch counts).

    A step replayed as one CUDA graph (``layout.step_graph``) costs the host a fixed time per step
    instead (``step_graph`` ``host_s``)."""
    if layout.step_graph:
        return measured_constants()["step_graph"]["host_s"]
    blocks = args.n_layers // layout.pp
    if layout.pp > 1:
        return blocks * (host_per_block("pipeline_step", layout.tp) + host_per_block("pipeline_pass", layout.tp) * passes)
    if layout.shard == 1:
        kind = "one_rank"
    else:
        kind = "fsdp_one_unit" if layout.units == "stage" else "fsdp"
    return host_per_block(kind, layout.tp) * blocks * passes


def accumulation_steps(local: int) -> list[int]:
    """Gradient-accumulation steps that split ``local`` sequences into equal passes (1: one pass)."""
    return [k for k in range(1, local + 1) if local % k == 0]


def plan(flavor: str, gpus: int, gpu_mem_gib: float | None = None, batch: int = 4, seq: int = 4096,
         microbatch: int = 1, nodes: int = 1, global_batch: int | None = None,
         step_graph: bool | None = None, gpu: str = "h200") -> list[dict]:
    """All valid layouts with their predictions, fitting ones first, each group by predicted throughput
    (tokens/s per GPU: layouts with more data parallelism process more tokens per step).

    ``gpus`` per node, on ``nodes`` nodes (a tp group stays inside a node; the column ``crosses`` names
    the dimensions whose collectives cross the network). ``global_batch`` (sequences per step): each
    layout's local batch is ``global_batch / dp`` (strong scaling; a layout whose dp does not divide it,
    or whose local batch a pipeline microbatch does not divide, is left out) instead of ``batch``; a
    layout without pipeline stages may run it as gradient accumulation (column ``accum``: passes of
    ``batch`` sequences), whichever fits and is fastest.
    ``step_graph``: None ranks every layout without pipeline stages with and without ``[boost]
    step_cudagraph`` (column ``step_graph``); True: with it only; False: without it.
    ``gpu``: the machine (``comm_model.GPUS``: its links, its rate against the H200's, its memory,
    which ``gpu_mem_gib`` overrides)."""
    cluster = comm_model.cluster_of(gpu, nodes, gpus)
    gpu_mem_gib = comm_model.GPUS[gpu]["mem_gib"] if gpu_mem_gib is None else gpu_mem_gib
    args = FLAVORS[flavor].replace(max_seq_len=seq)
    headroom = measured_constants()["memory_headroom"]["value"]
    rows = []
    graphs = (False, True) if step_graph is None else (step_graph,)
    candidates = [replace(layout, step_graph=graph)
                  for layout in layouts(args, cluster.gpus, max_tp=gpus, gpus_per_node=gpus if nodes > 1 else None)
                  for graph in (graphs if layout.pp == 1 else (False,))]
    for layout in candidates:
        local = batch if global_batch is None else global_batch // layout.dp
        if global_batch is not None and (global_batch % layout.dp or (layout.pp > 1 and local % microbatch)):
            continue
        options = []  # (fits, prediction, memory, accum): the local batch in one pass, or in equal smaller ones
        for accum in accumulation_steps(local) if global_batch is not None and layout.pp == 1 else (1,):
            mem = memory(args, layout, local // accum, seq, microbatch)
            t = step_time(args, layout, local // accum, seq, microbatch=microbatch, cluster=cluster, accum=accum)
            options.append((mem["total_bytes"] <= headroom * gpu_mem_gib * GiB, t, mem, accum))
        fits, t, mem, accum = min(options, key=lambda o: (not o[0], _ranked(o[1]["step_s"])))
        rows.append({"strategy": layout.strategy, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp,
                     "ac": layout.ac, "rep": layout.rep, "units": layout.units if layout.shard > 1 else "-",
                     "step_graph": layout.step_graph,
                     "batch": local // accum, "accum": accum, "mem_gib": mem["total_bytes"] / GiB,
                     "fits": fits, "step_s": t["step_s"],
                     "tokens_per_s_gpu": local * seq * layout.dp / t["step_s"] / cluster.gpus,
                     "tokens_per_s_gpu_tp_not_hidden": local * seq * layout.dp / t["step_no_overlap_s"] / cluster.gpus,
                     "host_s": t["host_s"], "bound": t["bound"],
                     "compute_s": t["compute_s"], "tp_comm_s": t["tp_comm_s"], "fsdp_s": t["fsdp_s"],
                     "crosses": ",".join(cluster.crossing(layout.tp, layout.shard, layout.pp, layout.rep)) or "-",
                     "rate": t["rate"]})
    return sorted(rows, key=ranking)


def ranking(row: dict) -> tuple:
    """Sort key of ``plan``'s rows: the layouts that fit, fastest first."""
    return not row["fits"], -_ranked(row["tokens_per_s_gpu"])


def _ranked(seconds_or_rate: float) -> float:
    """The value a ranking compares: equal predictions (a checkpointing mode that changes nothing, a
    host-bound step) can differ in the last bit between Python versions (3.12's ``sum`` compensates), so
    they compare at 12 digits and keep the candidates' order, the simpler layout first."""
    return float(f"{seconds_or_rate:.12g}")
