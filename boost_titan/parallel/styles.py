"""Tensor-parallel styles for :class:`~boost_titan.models.model.Projection`.

Each style (a ``ParallelStyle``, usable in ``parallelize_module`` plans) does two things:

1. turns the projection's weights into DTensors on the tp mesh with the placements below, so that
   optimizers, grad clipping, FSDP2 and DCP see ordinary sharded parameters;
2. swaps the module's class to a subclass whose ``forward`` runs on the local shards and issues the
   strategy's collectives (``boost_titan.ops.comm``) at exactly the places the method prescribes.

Weights are stacked ``[c, d_out, d_in]`` (A: ``[c, r, d_in]``, B: ``[c, d_out, r]``):

==========================  ================  ================  =============  =====================
style                       A factor          B factors / W     pre-norm γ     activations in → out
==========================  ================  ================  =============  =====================
BottleneckParallel (btp)    Shard(2): d_in    Shard(1): d_out   Shard(0)       ``[.., d_in/t]`` → ``[.., d_out/t]``
VanillaLowRankParallel      Shard(1): r       Shard(2): r       Replicate      replicated → replicated
ColwiseProjection (dense)   —                 Shard(1): d_out   Replicate      seq-sharded → ``[.., d_out/t]``
RowwiseProjection (dense)   —                 Shard(2): d_in    —              ``[.., d_in/t]`` → seq-sharded
==========================  ================  ================  =============  =====================
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from boost_titan.models.model import Projection
from boost_titan.ops import comm
from boost_titan.ops.rmsnorm import online_rms_norm_linear, rms_norm, sync_rms_norm


def _local(p: torch.Tensor) -> torch.Tensor:
    # isinstance, not hasattr(p, "to_local"): under torch.compile dynamo answers hasattr on a DTensor
    # parameter with False, which left the DTensor in the local-tensor math.
    return p.to_local() if isinstance(p, DTensor) else p


class _ShardedProjection(Projection):
    """Base of the class-swapped projections: local weights + the tp mesh."""

    tp_mesh: DeviceMesh
    d_in: int  # full input width; the weights may be plain local shards here (LocalShardCompiled)

    def local_weights(self):
        a = _local(self.a.weight) if self.a is not None else None
        return a, [_local(blk.weight) for blk in self.b]

    def local_norm_weight(self):
        return _local(self.norm.weight) if self.norm is not None else None

    def replicated_norm(self, x, sequence_sharded: bool = False):
        """Full-width RMSNorm with a replicated γ. On a sequence shard each rank sees only some
        tokens, so γ's gradient is partial: ``copy`` all-reduces it."""
        if self.norm is None:
            return x
        w = self.local_norm_weight()
        if sequence_sharded:
            w = comm.copy(w, self.tp_mesh)
        return rms_norm(x, w, self.norm.eps)


class BTPProjection(_ShardedProjection):
    """Bottleneck-aware TP: input sharded on d_in, the rank-r activations all-reduced and replicated,
    outputs sharded on d_out (heads / ffn / d). r is never sharded."""

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
        # σ runs redundantly on every rank; `copy` all-reduces the B factors' input gradient.
        return self.up([comm.copy(F.silu(t), mesh) for t in h], b_ws)


class VanillaProjection(_ShardedProjection):
    """Megatron column→row applied to each low-rank pair: A shards r, B's outputs are all-reduced."""

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        a_w, b_ws = self.local_weights()
        x = comm.copy(self.replicated_norm(x), self.tp_mesh)
        zs = [F.silu(h) for h in self.down(x, a_w)]
        return [comm.reduce(y, self.tp_mesh) for y in self.up(zs, b_ws)]


class ColwiseProjectionImpl(_ShardedProjection):
    """Dense column-parallel (q|k|v, gate|up), with sequence parallelism on the input."""

    sequence_dim: int | None  # None: replicated input (no sequence parallelism)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        _, ws = self.local_weights()
        x = self.replicated_norm(x, self.sequence_dim is not None)  # full d per token: exact
        if self.sequence_dim is None:
            x = comm.copy(x, self.tp_mesh)
        else:
            x = comm.gather(x, self.sequence_dim, self.tp_mesh)
        return self.dense(x, ws)


class RowwiseProjectionImpl(_ShardedProjection):
    """Dense row-parallel (o, down): partial outputs reduce-scattered to a sequence shard."""

    sequence_dim: int | None

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        _, ws = self.local_weights()
        if self.sequence_dim is None:
            return [comm.reduce(y, self.tp_mesh) for y in self.dense(x, ws)]
        return [comm.scatter_sum(y, self.sequence_dim, self.tp_mesh) for y in self.dense(x, ws)]


class _ProjectionStyle(ParallelStyle):
    """Distribute a Projection's parameters and swap in its sharded implementation."""

    impl: type[_ShardedProjection]
    a_placement: Placement | None = None
    b_placement: Placement = Replicate()
    norm_placement: Placement = Replicate()

    def __init__(self, **attrs):
        super().__init__()
        self.attrs = attrs

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, Projection):
            raise TypeError(f"{type(self).__name__} applies to Projection modules, got {type(module).__name__}")
        self.check(module)
        d_in = (module.a if module.a is not None else module.b[0]).weight.shape[-1]
        placements = {"a": self.a_placement, "norm": self.norm_placement}
        for sub_name, sub in module.named_children():
            placement = placements.get(sub_name, self.b_placement)
            for mod in ([sub] if sub_name != "b" else list(sub)):
                for p_name, p in list(mod.named_parameters(recurse=False)):
                    dt = distribute_tensor(p.data, device_mesh, [placement], src_data_rank=None)
                    mod.register_parameter(p_name, nn.Parameter(dt, requires_grad=p.requires_grad))
        module.__class__ = self.impl
        module.tp_mesh, module.d_in = device_mesh, d_in
        for k, v in self.attrs.items():
            setattr(module, k, v)
        return module

    def check(self, module: Projection) -> None:
        pass


class BottleneckParallel(_ProjectionStyle):
    """btp: ``[.., d_in/t]`` in, all-reduce of ``[.., c·r]`` (+ norm statistic), ``[.., d_out/t]`` out.

    ``rmsnorm``: "online" (statistic packed into the bottleneck all-reduce) or "sync" (its own small
    all-reduce before the A GEMM); both exact. Ignored for projections without a pre-norm.
    """

    impl = BTPProjection
    a_placement, b_placement, norm_placement = Shard(2), Shard(1), Shard(0)

    def __init__(self, rmsnorm: str = "online"):
        if rmsnorm not in ("online", "sync"):
            raise ValueError(f"rmsnorm={rmsnorm!r}: btp supports 'online' or 'sync' (both exact)")
        super().__init__(rmsnorm=rmsnorm)

    def check(self, module):
        if module.a is None:
            raise ValueError("BottleneckParallel needs a low-rank projection (rank > 0)")


class VanillaLowRankParallel(_ProjectionStyle):
    """vanilla: replicated in/out; A column-parallel on r, B row-parallel on r, outputs all-reduced."""

    impl = VanillaProjection
    a_placement, b_placement = Shard(1), Shard(2)

    def check(self, module):
        if module.a is None:
            raise ValueError("VanillaLowRankParallel needs a low-rank projection (rank > 0)")


class ColwiseProjection(_ProjectionStyle):
    """Dense Megatron column-parallel; ``sequence_dim`` set: input is sequence-sharded (SP)."""

    impl = ColwiseProjectionImpl
    b_placement = Shard(1)

    def __init__(self, sequence_dim: int | None = 1):
        super().__init__(sequence_dim=sequence_dim)

    def check(self, module):
        if module.a is not None:
            raise ValueError("ColwiseProjection is for dense projections (rank 0)")


class RowwiseProjection(ColwiseProjection):
    """Dense Megatron row-parallel; ``sequence_dim`` set: output reduce-scattered on it (SP)."""

    impl = RowwiseProjectionImpl
    b_placement = Shard(2)
