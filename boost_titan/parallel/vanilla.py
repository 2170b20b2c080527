"""Vanilla tensor parallelism for CoLA: Megatron's column → row split applied to each low-rank pair.

A is column-parallel on the rank r, B row-parallel on r, so each B output is a partial sum that is
all-reduced at full width ``[b, s, d_out]``; activations between projections are replicated. This is
what standard TP does to a low-rank model, and what BTP improves on (the baseline).

==========================  ================  ================  =============  =====================
style                       A factor          B factors         pre-norm γ     activations in → out
==========================  ================  ================  =============  =====================
VanillaLowRankParallel      Shard(1): r       Shard(2): r       Replicate      replicated → replicated
==========================  ================  ================  =============  =====================
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle

from boost_titan.models.args import TransformerArgs
from boost_titan.ops import comm

from .base import ProjectionParallel, ReplicatedParallel, ShardedProjection, Strategy, embedding, lm_head

STREAM = Replicate()



class VanillaLowRankProjection(ShardedProjection):
    """Replicated input; A's output sharded on r; B's partial outputs all-reduced."""

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        a_w, b_ws = self.local_weights()
        # the A GEMM's input gradient is all-reduced (copy), overlapping its weight-gradient GEMM
        zs = [F.silu(h) for h in self.down(self.replicated_norm(x), a_w, comm.copy_sync(self.tp_mesh))]
        return [comm.reduce(y, self.tp_mesh) for y in self.up(zs, b_ws)]


class VanillaLowRankParallel(ProjectionParallel):
    """Replicated in/out; A column-parallel on r, B row-parallel on r, outputs all-reduced."""

    projection = VanillaLowRankProjection
    a_placement, b_placement = Shard(1), Shard(2)


def plan(args: TransformerArgs, rmsnorm: str = "online", loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    return {
        "tok_embeddings": embedding(STREAM),
        "layers.*.attention.qkv": VanillaLowRankParallel(),
        "layers.*.attention.o": VanillaLowRankParallel(),
        "layers.*.feed_forward.gate_up": VanillaLowRankParallel(),
        "layers.*.feed_forward.down": VanillaLowRankParallel(),
        "norm": ReplicatedParallel(),
        "output": lm_head(loss_parallel),
    }


STRATEGY = Strategy("vanilla", lowrank=True, stream=STREAM, plan=plan, shards_rank=True)
