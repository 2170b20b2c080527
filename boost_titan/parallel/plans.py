"""Whole-model tensor-parallel plans: ``module path -> ParallelStyle``, one per strategy.

Usage (user code)::

    plan = tp_plan("btp", args, tp=mesh.size())
    parallelize_module(model, mesh, plan)
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
)
from torchtitan.distributed import NoParallel

from boost_titan.models.args import TransformerArgs

from .styles import (
    BottleneckParallel,
    ColwiseProjection,
    RowwiseProjection,
    VanillaLowRankParallel,
)

STRATEGIES = ("btp", "vanilla", "fullrank")


class EmbeddingParallel(RowwiseParallel):
    """RowwiseParallel (vocab-parallel lookup) whose output collective is synchronous.

    The stock style redistributes with ``async_op=True``, so ``to_local()`` hands the first block an
    ``AsyncCollectiveTensor``. When that block is ``torch.compile``d, torch 2.13's AOTAutograd unwraps
    the ACT input without its ``requires_grad`` (pytorch#191113) and the gradient path back into the
    embedding is lost (per-block compile then crashed in backward). The first block waits on this
    collective immediately anyway, so nothing overlaps that would be lost.
    """

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        if outputs.placements != output_layouts:
            outputs = outputs.redistribute(placements=output_layouts, async_op=False)
        return outputs.to_local() if use_local_output else outputs


def check_tp(strategy: str, args: TransformerArgs, tp: int) -> None:
    """Fail early with one clear message for a plan that cannot shard this model."""
    if strategy not in STRATEGIES:
        raise ValueError(f"tp_strategy={strategy!r} is unknown; choose one of {STRATEGIES}")
    lowrank = args.attn_rank > 0 and args.mlp_rank > 0
    if strategy == "fullrank" and (args.attn_rank or args.mlp_rank):
        raise ValueError("tp_strategy='fullrank' is for the dense '_fullrank' flavors (attn_rank = mlp_rank = 0); "
                         "use 'btp' or 'vanilla' for CoLA models")
    if strategy != "fullrank" and not lowrank:
        raise ValueError(f"tp_strategy={strategy!r} needs a low-rank model (attn_rank > 0 and mlp_rank > 0); "
                         "use 'fullrank' for the '_fullrank' flavors")
    sizes = {"dim": args.dim, "n_heads": args.n_heads, "n_kv_heads": args.kv_heads,
             "ffn_dim": args.ffn_dim, "vocab_size": args.vocab_size}
    if strategy == "vanilla":  # vanilla shards the ranks themselves
        sizes |= {"attn_rank": args.attn_rank, "mlp_rank": args.mlp_rank}
    for name, value in sizes.items():
        if value % tp:
            raise ValueError(f"{name}={value} is not divisible by the tensor-parallel degree {tp} "
                             f"(tp_strategy={strategy!r} shards it)")


def tp_plan(strategy: str, args: TransformerArgs, tp: int | None = None, rmsnorm: str = "online",
            loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """The plan for ``parallelize_module(model, tp_mesh, plan)``.

    ``strategy``: "btp" (bottleneck-aware: residual stream sharded on d, all-reduces of ``[b,s,k·r]``),
    "vanilla" (Megatron on each low-rank pair), "fullrank" (Megatron + sequence parallel, dense).
    ``loss_parallel``: leave the logits vocab-sharded (DTensor) for torchtitan's loss-parallel CE;
    otherwise they are gathered to a replicated local tensor.
    """
    check_tp(strategy, args, tp or 1)

    def head(input_layouts=Replicate()):  # vocab-parallel lm_head
        return ColwiseParallel(input_layouts=input_layouts, output_layouts=Shard(-1) if loss_parallel else Replicate(),
                               use_local_output=not loss_parallel)

    if strategy == "btp":
        # embedding: vocab-parallel lookup, then reduce-scattered straight to the d-sharded stream
        # (exact: each token's row is non-zero on one rank only).
        return {
            "tok_embeddings": EmbeddingParallel(input_layouts=Replicate(), output_layouts=Shard(-1)),
            "layers.*.attention.qkv": BottleneckParallel(rmsnorm),
            "layers.*.attention.o": BottleneckParallel(rmsnorm),
            "layers.*.feed_forward.gate_up": BottleneckParallel(rmsnorm),
            "layers.*.feed_forward.down": BottleneckParallel(rmsnorm),
            # the last block's d-shards are gathered once, before the (replicated) final norm
            "norm": NoParallel(input_layout=Shard(-1), output_layout=Replicate(), use_local_output=False),
            "output": head(),
        }
    if strategy == "vanilla":
        return {
            "tok_embeddings": EmbeddingParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "layers.*.attention.qkv": VanillaLowRankParallel(),
            "layers.*.attention.o": VanillaLowRankParallel(),
            "layers.*.feed_forward.gate_up": VanillaLowRankParallel(),
            "layers.*.feed_forward.down": VanillaLowRankParallel(),
            "norm": NoParallel(use_local_output=False),
            "output": head(),
        }
    # fullrank: torchtitan's llama3 plan (sequence parallel between blocks, loss parallel)
    return {
        "tok_embeddings": EmbeddingParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "layers.*.attention.qkv": ColwiseProjection(sequence_dim=1),
        "layers.*.attention.o": RowwiseProjection(sequence_dim=1),
        "layers.*.feed_forward.gate_up": ColwiseProjection(sequence_dim=1),
        "layers.*.feed_forward.down": RowwiseProjection(sequence_dim=1),
        "norm": SequenceParallel(),
        "output": head(input_layouts=Shard(1)),
    }
