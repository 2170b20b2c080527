"""Communication-free low-rank activation checkpointing (docs/design.md, "Activation checkpointing").

A selective-checkpoint policy per block: the outputs of the collectives (under btp: the all-reduced
rank-r bottleneck activations, with the online norm's statistics packed in them) are **saved**;
everything else — σ, every B GEMM, RoPE, attention, gating, the local norms and A GEMMs — is
recomputed in backward. Because every tensor a collective produced is restored from the cache
instead of recomputed, the recomputation issues no collective at all, unlike full or op-selective
AC, which replay the block's all-reduces.

Without tensor parallelism there is no collective to key on, so the policy saves the A GEMMs'
outputs instead (recognised by their width ``c·r``), the same rank-r tensors.

Not to be confused with DCP checkpoints (saving training state), which torchtitan handles.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from boost_titan.compat import checkpoint_wrapper
from boost_titan.models.args import TransformerArgs

_COLLECTIVES = {
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.wait_tensor.default,
}
# GEMM ops -> position of the right-hand operand, whose last dim is the output width
# (_scaled_mm: the float8 GEMMs of boost_titan.ops.float8 on a GPU)
_GEMMS = {torch.ops.aten.mm.default: 1, torch.ops.aten.addmm.default: 2, torch.ops.aten._scaled_mm.default: 1}


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
        if not tensor_parallel and func in _GEMMS and op_args[_GEMMS[func]].shape[-1] in widths:
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
