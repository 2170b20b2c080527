"""Bottleneck-aware tensor parallelism (BOOST): shard the large dims, never the rank r.

The residual stream stays sharded on d between blocks. In each projection the A factor is sharded on
its input (``d_in``), so ``A x`` is a partial sum that one all-reduce of the small ``[b, s, c·r]``
activations completes (with the pre-norm's statistic packed into it: online RMSNorm); σ runs on the
replicated result and the B factors, sharded on their outputs (heads / ffn / d), produce the next
shard with no further collective. Per layer: 4 forward all-reduces of ``[b, s, c·r]``.

==========================  ================  ================  =============  =====================
style                       A factor          B factors         pre-norm γ     activations in → out
==========================  ================  ================  =============  =====================
BottleneckParallel          Shard(2): d_in    Shard(1): d_out   Shard(0)       ``[.., d_in/t]`` → ``[.., d_out/t]``
==========================  ================  ================  =============  =====================
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ParallelStyle

from boost_titan.models.args import TransformerArgs
from boost_titan.ops import comm
from boost_titan.ops.rmsnorm import online_rms_norm_linear, sync_rms_norm

from .base import ProjectionParallel, ReplicatedParallel, ShardedProjection, Strategy, embedding, lm_head

STREAM = Shard(-1)  # the residual stream between blocks: sharded on d



class BottleneckProjection(ShardedProjection):
    """Input sharded on d_in, the rank-r activations all-reduced and replicated, outputs sharded on d_out."""

    rmsnorm: str  # "online" | "sync"

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        a_w, b_ws = self.local_weights()
        mesh, d_in = self.tp_mesh, self.d_in
        if self.norm is None:
            h = [comm.reduce(p, mesh) for p in self.down(x, a_w)]
        elif self.rmsnorm == "online":
            h = online_rms_norm_linear(x, self.local_norm_weight(), lambda y: self.down(y, a_w),
                                       self.norm.eps, d_in, mesh)
        else:
            y = sync_rms_norm(x, self.local_norm_weight(), self.norm.eps, d_in, mesh)
            h = [comm.reduce(p, mesh) for p in self.down(y, a_w)]
        # σ runs redundantly on every rank; the B factors' input gradient is all-reduced (copy), the
        # collective overlapping their weight-gradient GEMM.
        return self.up([F.silu(t) for t in h], b_ws, comm.copy_sync(mesh))


class BottleneckParallel(ProjectionParallel):
    """``[.., d_in/t]`` in, all-reduce of ``[.., c·r]`` (+ norm statistic), ``[.., d_out/t]`` out.

    ``rmsnorm``: "online" (statistic packed into the bottleneck all-reduce) or "sync" (its own small
    all-reduce before the A GEMM); both exact. Ignored for projections without a pre-norm.
    """

    projection = BottleneckProjection
    a_placement, b_placement, norm_placement = Shard(2), Shard(1), Shard(0)

    def __init__(self, rmsnorm: str = "online"):
        super().__init__()
        if rmsnorm not in ("online", "sync"):
            raise ValueError(f"rmsnorm={rmsnorm!r}: btp supports 'online' or 'sync' (both exact)")
        self.rmsnorm = rmsnorm

    def configure(self, module: BottleneckProjection) -> None:
        module.rmsnorm = self.rmsnorm


def plan(args: TransformerArgs, rmsnorm: str = "online", loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    return {
        # vocab-parallel lookup, reduce-scattered straight to the d-sharded stream (exact: each
        # token's row is non-zero on one rank only)
        "tok_embeddings": embedding(STREAM),
        "layers.*.attention.qkv": BottleneckParallel(rmsnorm),
        "layers.*.attention.o": BottleneckParallel(rmsnorm),
        "layers.*.feed_forward.gate_up": BottleneckParallel(rmsnorm),
        "layers.*.feed_forward.down": BottleneckParallel(rmsnorm),
        # the last block's d-shards are gathered once, before the (replicated) final norm
        "norm": ReplicatedParallel(input_layout=STREAM),
        "output": lm_head(loss_parallel),
    }


STRATEGY = Strategy("btp", lowrank=True, stream=STREAM, plan=plan)
