"""Communication-free low-rank activation checkpointing (boost_design §6).

A selective-checkpoint policy per block: the outputs of the collectives (under btp: the all-reduced
rank-r bottleneck activations, with the online norm's statistics packed in them) are **saved**;
everything else — σ, every B GEMM, RoPE, attention, gating, the local norms and A GEMMs — is
recomputed in backward. Because every tensor a collective produced is restored from the cache
instead of recomputed, the recomputation issues no collective at all, unlike full or op-selective
AC, which replay the block's all-reduces.

Without tensor parallelism there is no collective to key on, so the policy saves the A GEMMs'
outputs instead (recognised by their width ``c·r``), the same rank-r tensors.

:class:`LocalShardCompiled` compiles a checkpointed block under tensor parallelism (any policy,
torchtitan's full / selective AC included); see its docstring for why ``torch.compile(block)``
cannot be used there.
"""

from __future__ import annotations

from torch import nn
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper, checkpoint_wrapper
from torch.distributed.tensor import DTensor
from torch.func import functional_call
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from boost_titan.models.args import TransformerArgs

_COLLECTIVES = {
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.wait_tensor.default,
}
_GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


def bottleneck_widths(args: TransformerArgs, grouped: bool) -> set[int]:
    """Widths of the A GEMM outputs: c·r grouped (3r_a, r_a, 2r_m, r_m), r each otherwise."""
    ra, rm = args.attn_rank, args.mlp_rank
    widths = {3 * ra, ra, 2 * rm, rm} if grouped else {ra, rm}
    return {w for w in widths if w > 0}


def lowrank_policy(args: TransformerArgs, tensor_parallel: bool):
    widths = bottleneck_widths(args, args.grouped)

    def policy(ctx, func, *op_args, **kwargs):
        if func in _COLLECTIVES:
            return CheckpointPolicy.MUST_SAVE
        if not tensor_parallel and func in _GEMMS and op_args[-1].shape[-1] in widths:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_lowrank_checkpoint(model: nn.Module, args: TransformerArgs, tensor_parallel: bool) -> None:
    """Wrap every block of ``model.layers`` in a checkpoint with :func:`lowrank_policy`."""
    policy = lowrank_policy(args, tensor_parallel)
    for layer_id, block in model.layers.named_children():
        wrapped = checkpoint_wrapper(block, context_fn=lambda: create_selective_checkpoint_contexts(policy),
                                     preserve_rng_state=False)
        model.layers.register_module(layer_id, wrapped)


# ---- torch.compile of a checkpointed block under tensor parallelism ----------------------------
def _call(module: nn.Module, params: dict[str, torch.Tensor], args: tuple, kwargs: dict):
    return functional_call(module, params, args, kwargs)


class LocalShardCompiled(ActivationWrapper):
    """``torch.compile`` of a (checkpoint-wrapped) tp block whose compiled region sees local shards only.

    Why not ``torch.compile(block)``: torch 2.13 flattens each DTensor parameter into its local
    tensor *and its DeviceMesh* (an opaque graph input), and the backward graph needs that mesh
    to rebuild the DTensor gradients, so the forward saves it as an opaque object. When the
    region is checkpointed, the partitioner also functionalizes the RNG of the recomputed random
    op (SDPA on CPU: ``_scaled_dot_product_flash_attention_for_cpu`` carries the
    ``nondeterministic_seeded`` tag): on devices without graph-safe RNG (CPU) it appends the RNG
    state to the forward outputs *after* the opaque objects, while the runtime slices saved
    values assuming opaque objects (and symints) come last. The mesh lands in the tensor slice:
    "expected all tensors_saved_with_vc_check to be Tensors ... DeviceMesh".

    Here the DTensor → local conversion (``to_local``, differentiable: its backward turns the
    local gradient back into the DTensor parameter's) runs in eager, before the compiled region;
    the region runs the block through ``functional_call`` with those plain tensors. The tp
    projections compute on local shards anyway (``styles.py``), so the math — gradients and
    collectives included — is unchanged. All blocks share one compiled graph.

    The block stays ``_checkpoint_wrapped_module`` (the ActivationWrapper convention), so
    state-dict keys and DCP's FQNs are those of the plain block, as with ``checkpoint_wrapper``.
    FSDP2 wraps this module like any block: its unsharded parameters are the tp DTensors read here.
    """

    def __init__(self, module: nn.Module, backend="inductor"):
        super().__init__(module)
        self._compiled = torch.compile(_call, backend=backend, fullgraph=True)

    def forward(self, *args, **kwargs):
        block = self._checkpoint_wrapped_module
        local = {name: p.to_local() for name, p in block.named_parameters() if isinstance(p, DTensor)}
        return self._compiled(block, local, args, kwargs)


def compile_on_local_shards(model: nn.Module, backend="inductor") -> None:
    """Wrap every block of ``model.layers`` in :class:`LocalShardCompiled` (instead of torchtitan's
    per-block ``torch.compile``)."""
    for layer_id, block in model.layers.named_children():
        model.layers.register_module(layer_id, LocalShardCompiled(block, backend))
