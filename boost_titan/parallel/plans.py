"""The strategies by name, the check that a model can be sharded, and applying a plan.

Usage (user code)::

    plan = tp_plan("btp", args, tp=mesh.size())
    parallelize_module(model, mesh, plan)        # or apply_tp(model, mesh, "btp", args)

A strategy is a :class:`~boost_titan.parallel.base.Strategy` (its name, the family it applies to,
the residual stream's layout, its plan, what it divides by tp), stated as ``STRATEGY`` in its own
file. Adding one: write its file and add it to :data:`STRATEGIES`; ``[boost] tp_strategy`` accepts
any registered name, and the planner any that has costs in ``boost_titan.planner.costs.COSTS``.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from boost_titan.models.args import TransformerArgs

from . import btp, megatron, vanilla
from .base import Strategy

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (btp.STRATEGY, vanilla.STRATEGY, megatron.STRATEGY)}


def stream_shape(strategy: str, batch: int, seq: int, dim: int, tp: int) -> list[int]:
    """One rank's part of the residual stream ``[batch, seq, dim]`` between blocks, in the strategy's
    ``STREAM`` layout (btp: d sharded; fullrank: the sequence; vanilla: replicated)."""
    shape = [batch, seq, dim]
    stream = STRATEGIES[strategy].stream
    if isinstance(stream, Shard):
        shape[stream.dim] //= tp
    return shape


def check_tp(strategy: str, args: TransformerArgs, tp: int) -> None:
    """Fail early with one clear message for a plan that cannot shard this model (also at tp = 1:
    a strategy for the other family)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"tp_strategy={strategy!r} is unknown; choose one of {tuple(STRATEGIES)}")
    lowrank = args.attn_rank > 0 and args.mlp_rank > 0
    dense = args.attn_rank == 0 and args.mlp_rank == 0
    names = {kind: tuple(n for n, s in STRATEGIES.items() if s.lowrank == kind) for kind in (True, False)}
    if not STRATEGIES[strategy].lowrank and not dense:
        raise ValueError(f"tp_strategy={strategy!r} is for the dense '_fullrank' flavors (attn_rank = mlp_rank = 0); "
                         f"use one of {names[True]} for CoLA models")
    if STRATEGIES[strategy].lowrank and not lowrank:
        raise ValueError(f"tp_strategy={strategy!r} needs a low-rank model (attn_rank > 0 and mlp_rank > 0); "
                         f"use one of {names[False]} for the '_fullrank' flavors")
    for name, value in STRATEGIES[strategy].sharded_sizes(args).items():
        if value % tp:
            raise ValueError(f"{name}={value} is not divisible by the tensor-parallel degree {tp} "
                             f"(tp_strategy={strategy!r} shards it)")


def tp_plan(strategy: str, args: TransformerArgs, tp: int | None = None, rmsnorm: str = "online",
            loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """The checked plan for ``parallelize_module(model, tp_mesh, plan)``.

    ``strategy``: "btp" (bottleneck-aware: residual stream sharded on d, all-reduces of ``[b,s,k·r]``),
    "vanilla" (Megatron on each low-rank pair), "fullrank" (Megatron + sequence parallel, dense).
    ``rmsnorm``: btp's pre-norm statistic, "online" or "sync". ``loss_parallel``: leave the logits
    vocab-sharded (DTensor) for torchtitan's loss-parallel CE; otherwise they are gathered.
    """
    check_tp(strategy, args, tp or 1)
    return STRATEGIES[strategy].plan(args, rmsnorm=rmsnorm, loss_parallel=loss_parallel)


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, strategy: str, args: TransformerArgs,
             rmsnorm: str = "online", loss_parallel: bool = True) -> nn.Module:
    """``parallelize_module`` with the strategy's plan; keeps a tied embedding / lm_head tied.

    Both ends are sharded on the vocabulary (``Shard(0)``), so after distributing them the lm_head
    simply points at the embedding's DTensor again. Pipeline stages lack some top-level modules (set
    to None): their plan entries are skipped.
    """
    plan = tp_plan(strategy, args, tp_mesh.size(), rmsnorm=rmsnorm, loss_parallel=loss_parallel)
    parallelize_module(model, tp_mesh, {k: v for k, v in plan.items() if getattr(model, k.split(".")[0], None) is not None})
    model.tie_weights()
    return model
