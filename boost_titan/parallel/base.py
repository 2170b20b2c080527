"""What every tensor-parallel strategy shares: the :class:`Strategy` record, the sharded-projection
base module, the base ``ParallelStyle`` that installs it, the vocabulary-parallel embedding and
lm_head, and the style of the replicated final norm.

A strategy (``btp.py``, ``vanilla.py``, ``megatron.py``) is one file: the :class:`ShardedProjection`
subclass(es) that compute on local shards and issue the strategy's collectives, the
:class:`ProjectionParallel` style(s) that distribute a :class:`~boost_titan.models.model.Projection`'s
weights and install that subclass, its ``plan(args, rmsnorm, loss_parallel)`` (the whole-model
``module path -> ParallelStyle`` dict) and ``STRATEGY``, the :class:`Strategy` that names them.
``plans.py`` holds the registry of strategies.

Weights are stacked ``[c, d_out, d_in]`` (A: ``[c, r, d_in]``, B: ``[c, d_out, r]``), so a style
shards any of d_out / d_in / r by choosing ``Shard(1)`` or ``Shard(2)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from boost_titan.models.args import TransformerArgs
from boost_titan.models.model import Projection
from boost_titan.ops import comm
from boost_titan.ops.rmsnorm import rms_norm


@dataclass(frozen=True)
class Strategy:
    """A tensor-parallel strategy as the registry, the checks and the planner see it.

    ``lowrank``: for CoLA models (True) or the dense ``_fullrank`` twins (False). ``stream``: the
    residual stream's layout between blocks. ``plan(args, rmsnorm, loss_parallel)``: the whole-model
    ``module path -> ParallelStyle`` dict. ``shards_rank``: the strategy also divides the low-rank
    dimension r by tp (vanilla TP does; BTP never does).
    """

    name: str
    lowrank: bool
    stream: Placement
    plan: Callable[..., dict[str, ParallelStyle]]
    shards_rank: bool = False

    def sharded_sizes(self, args: TransformerArgs) -> dict[str, int]:
        """The sizes this strategy divides by tp (each must be divisible)."""
        sizes = {"dim": args.dim, "n_heads": args.n_heads, "n_kv_heads": args.kv_heads, "ffn_dim": args.ffn_dim,
                 "vocab_size": args.vocab_size}
        if self.shards_rank:
            sizes.update(attn_rank=args.attn_rank, mlp_rank=args.mlp_rank)
        return sizes


def local(p: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor parameter; a plain tensor as it is."""
    # isinstance, not hasattr(p, "to_local"): under torch.compile dynamo answers hasattr on a DTensor
    # parameter with False, which left the DTensor in the local-tensor math.
    return p.to_local() if isinstance(p, DTensor) else p


class ShardedProjection(Projection):
    """Base of the projections a style installs: local weights, the tp mesh, the full input width."""

    tp_mesh: DeviceMesh
    d_in: int  # full input width; the weights may be plain local shards here (LocalShardCompiled)

    def local_weights(self):
        a = local(self.a.weight) if self.a is not None else None
        return a, [local(blk.weight) for blk in self.b]

    def local_norm_weight(self):
        return local(self.norm.weight) if self.norm is not None else None

    def replicated_norm(self, x, sequence_sharded: bool = False):
        """Full-width RMSNorm with a replicated γ. On a sequence shard each rank sees only some
        tokens, so γ's gradient is partial: ``copy`` all-reduces it."""
        if self.norm is None:
            return x
        w = self.local_norm_weight()
        if sequence_sharded:
            w = comm.copy(w, self.tp_mesh)
        return rms_norm(x, w, self.norm.eps)


class ProjectionParallel(ParallelStyle):
    """Distribute a Projection's parameters (placements below) and install ``projection``, a
    :class:`ShardedProjection` subclass, as its class. Subclasses set the class attributes, take their
    settings as constructor arguments and copy them onto the module in :meth:`configure`."""

    projection: type[ShardedProjection]
    a_placement: Placement | None = None  # the A factor [c, r, d_in]
    b_placement: Placement = Replicate()  # the B factors [c, d_out, r], or the dense W's [c, d_out, d_in]
    norm_placement: Placement = Replicate()  # the pre-norm's γ [d_in]
    lowrank: bool = True  # applies to CoLA projections (rank > 0); False: to dense ones

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, Projection):
            raise TypeError(f"{type(self).__name__} applies to Projection modules, got {type(module).__name__}")
        if (module.a is not None) != self.lowrank:
            raise ValueError(f"{type(self).__name__} is for {'low-rank (rank > 0)' if self.lowrank else 'dense (rank 0)'} "
                             "projections")
        d_in = (module.a if module.a is not None else module.b[0]).weight.shape[-1]
        placements = {"a": self.a_placement, "norm": self.norm_placement}
        for sub_name, sub in module.named_children():
            placement = placements.get(sub_name, self.b_placement)
            for mod in ([sub] if sub_name != "b" else list(sub)):
                for p_name, p in list(mod.named_parameters(recurse=False)):
                    dt = distribute_tensor(p.data, device_mesh, [placement], src_data_rank=None)
                    mod.register_parameter(p_name, nn.Parameter(dt, requires_grad=p.requires_grad))
        module.__class__ = self.projection
        module.tp_mesh, module.d_in = device_mesh, d_in
        self.configure(module)
        return module

    def configure(self, module: ShardedProjection) -> None:
        """Copy this style's settings onto the installed module (none by default)."""


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


def embedding(stream: Placement) -> EmbeddingParallel:
    """Vocab-parallel lookup whose output takes the residual stream's layout ``stream``."""
    return EmbeddingParallel(input_layouts=Replicate(), output_layouts=stream)


def lm_head(loss_parallel: bool, input_layouts: Placement = Replicate()) -> ColwiseParallel:
    """Vocab-parallel lm_head: logits left vocab-sharded (DTensor) for loss-parallel cross-entropy,
    or gathered to a replicated local tensor."""
    return ColwiseParallel(input_layouts=input_layouts, output_layouts=Shard(-1) if loss_parallel else Replicate(),
                           use_local_output=not loss_parallel)


class ReplicatedParallel(ParallelStyle):
    """Replicate a module's parameters and run it on the whole activation (the final norm).

    The input, a local tensor in ``input_layout``, is gathered to replicated first; the output stays a
    replicated DTensor, the input layout the lm_head's :class:`ColwiseParallel` expects.
    """

    def __init__(self, input_layout: Placement = Replicate()):
        super().__init__()
        self.input_layout = input_layout

    def _prepare_input(self, mod, inputs, device_mesh):
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, device_mesh, (self.input_layout,), run_check=False)
        if x.placements != (Replicate(),):
            x = x.redistribute(placements=(Replicate(),), async_op=True)
        return (x, *inputs[1:])

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, self._prepare_input)
