"""``torch.compile`` of checkpointed blocks under tensor parallelism, on the local shards.

A workaround, kept in this one place: torch ≤ 2.13 cannot compile a checkpointed block whose parameters
are tp DTensors (see :class:`LocalShardCompiled`). From 2.14 a dropout-free SDPA no longer trips it
(it is not an RNG op for the partitioner any more, pytorch#187985), but any RNG op in the region
would; the module serves every supported torch, so one code path runs on all of them.
``torchtitan_ext.cola_llama.parallelize`` uses it instead of
torchtitan's per-block ``torch.compile`` exactly when tp, compile and any activation checkpointing
meet; once upstream fixes the DeviceMesh-in-saved-tensors bug this module can go (pytorch#173270,
which reworks how AOTAutograd handles DTensor meshes at runtime, is the place to watch).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.func import functional_call

from boost_titan.compat import ActivationWrapper


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

    def __init__(self, module: nn.Module, backend="inductor", cudagraphs: bool = False):
        super().__init__(module)
        self._compiled = torch.compile(_call, backend=backend, fullgraph=True, options=compile_options(cudagraphs))

    def forward(self, *args, **kwargs):
        block = self._checkpoint_wrapped_module
        local = {name: p.to_local() for name, p in block.named_parameters() if isinstance(p, DTensor)}
        return self._compiled(block, local, args, kwargs)


def compile_options(cudagraphs: bool) -> dict | None:
    """inductor options of a compiled block: ``cudagraphs`` replays it as a CUDA graph (torch.compile's
    cudagraph trees, what ``mode="reduce-overhead"`` selects): one launch per block's forward and
    backward instead of one per kernel."""
    return {"triton.cudagraphs": True} if cudagraphs else None


def compile_blocks(model: nn.Module, backend="inductor", cudagraphs: bool = False) -> None:
    """torchtitan's ``apply_compile``: ``torch.compile`` of each block of ``model.layers`` (the blocks
    repeat, so one graph serves them all), with :func:`compile_options`."""
    for layer_id, block in model.layers.named_children():
        compiled = torch.compile(block, backend=backend, fullgraph=True, options=compile_options(cudagraphs))
        model.layers.register_module(layer_id, compiled)


def compile_on_local_shards(model: nn.Module, backend="inductor", cudagraphs: bool = False) -> None:
    """Wrap every block of ``model.layers`` in :class:`LocalShardCompiled` (instead of
    :func:`compile_blocks`)."""
    for layer_id, block in model.layers.named_children():
        model.layers.register_module(layer_id, LocalShardCompiled(block, backend, cudagraphs))
