"""Full-rank Megatron tensor parallelism with sequence parallelism, for the dense ``_fullrank`` twins.

torchtitan's llama3 plan on our Projection modules: q|k|v and gate|up column-parallel, o and down
row-parallel; between blocks the residual stream is sharded on the sequence, so each column-parallel
projection all-gathers its (normalised) input and each row-parallel one reduce-scatters its output.

==========================  ================  =============  ======================================
style                       W                 pre-norm γ     activations in → out
==========================  ================  =============  ======================================
DenseColwiseParallel        Shard(1): d_out   Replicate      seq-sharded → ``[.., d_out/t]``
DenseRowwiseParallel        Shard(2): d_in    —              ``[.., d_in/t]`` → seq-sharded
==========================  ================  =============  ======================================
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from boost_titan.models.args import TransformerArgs
from boost_titan.ops import comm

from .base import ProjectionParallel, ShardedProjection, Strategy, embedding, lm_head

STREAM = Shard(1)  # sequence parallel



class DenseColwiseProjection(ShardedProjection):
    """Column-parallel W's (q|k|v, gate|up); with ``sequence_dim`` set the input is a sequence shard."""

    sequence_dim: int | None  # None: replicated input (no sequence parallelism)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        _, ws = self.local_weights()
        x = self.replicated_norm(x, self.sequence_dim is not None)  # full d per token: exact
        # all-gather (SP) or copy; the backward reduce-scatter / all-reduce overlaps the dW GEMM
        sync = (comm.copy_sync(self.tp_mesh) if self.sequence_dim is None
                else comm.gather_sync(self.sequence_dim, self.tp_mesh))
        return self.dense(x, ws, sync)


class DenseRowwiseProjection(ShardedProjection):
    """Row-parallel W's (o, down): partial outputs all-reduced, or reduce-scattered to a sequence shard."""

    sequence_dim: int | None

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        _, ws = self.local_weights()
        if self.sequence_dim is None:
            return [comm.reduce(y, self.tp_mesh) for y in self.dense(x, ws)]
        return [comm.scatter_sum(y, self.sequence_dim, self.tp_mesh) for y in self.dense(x, ws)]


class DenseColwiseParallel(ProjectionParallel):
    """Dense Megatron column-parallel; ``sequence_dim`` set: the input is sequence-sharded (SP)."""

    projection = DenseColwiseProjection
    b_placement = Shard(1)
    lowrank = False

    def __init__(self, sequence_dim: int | None = 1):
        super().__init__()
        self.sequence_dim = sequence_dim

    def configure(self, module) -> None:
        module.sequence_dim = self.sequence_dim


class DenseRowwiseParallel(DenseColwiseParallel):
    """Dense Megatron row-parallel; ``sequence_dim`` set: the output is reduce-scattered on it (SP)."""

    projection = DenseRowwiseProjection
    b_placement = Shard(2)


def plan(args: TransformerArgs, rmsnorm: str = "online", loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    seq = STREAM.dim
    return {
        "tok_embeddings": embedding(STREAM),
        "layers.*.attention.qkv": DenseColwiseParallel(sequence_dim=seq),
        "layers.*.attention.o": DenseRowwiseParallel(sequence_dim=seq),
        "layers.*.feed_forward.gate_up": DenseColwiseParallel(sequence_dim=seq),
        "layers.*.feed_forward.down": DenseRowwiseParallel(sequence_dim=seq),
        "norm": SequenceParallel(),
        "output": lm_head(loss_parallel, input_layouts=STREAM),
    }


STRATEGY = Strategy("fullrank", lowrank=False, stream=STREAM, plan=plan)
