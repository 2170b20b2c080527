"""One batched weight cast and one batched gradient cast per step for FSDP2 groups on a 1-rank mesh.

TP-only and PP-only layouts get their mixed precision from FSDP2 on the 1-rank shard mesh (see
``torchtitan_ext.cola_llama.parallelize``). On such a mesh FSDP2 skips the all-gather, and its
``FSDPParamGroup.wait_for_unshard`` instead casts and copies each parameter on its own: two kernels
and its Python per parameter, before the forward can start (docs/design.md, "Host time", has what
this cost in a traced step).

:func:`batch_one_rank_unshard` gives such groups a ``wait_for_unshard`` that writes every
parameter's compute copy with one ``torch._foreach_copy_`` (fp32 → ``param_dtype``) into the same
buffers, then runs FSDP's own remaining steps (unsharded parameter views, state, events). The values
are identical (the same elementwise cast). Groups it cannot serve keep FSDP's method: a shard mesh of
more than one rank, parameters with FSDP tensor-subclass extensions (e.g. torchao's float8
all-gather), CPU offloading, or parameters not in the plain sharded state.

After backward, FSDP2's 1-rank "reduction" (``foreach_reduce``) packs every bf16 gradient into one
fp32 buffer (``fsdp::chunk_cat``), copies that buffer once more as the world-size-1 reduce-scatter
(through a temporary when a divide factor is set, as torchtitan sets 1.0), then views it out per
parameter: about three passes over the fp32 gradients, its streams and events, and Python per
parameter, all at the end of backward where the GPU waits for it. :func:`batch_one_rank_fsdp` also gives such
groups a ``post_backward`` that first writes the gradients itself: one ``torch._foreach_copy_``
(bf16 → fp32) into views of one new fp32 buffer, wrapped as FSDP would (``to_sharded_dtensor``), or
added to the gradients already there (gradient accumulation), then clears the unsharded gradients
and runs FSDP's own ``post_backward``, which then has nothing to reduce and only reshards. The
values are FSDP's: a cast is exact, and FSDP's 1-rank reduction is a copy (a division by a factor of
1.0 included). Anything else keeps FSDP's path for that call: a reduce dtype that rounds (neither the
gradient's nor the master weight's dtype), a divide factor other than 1, HSDP (an all-reduce across
replicas), an all-reduce hook, post-accumulate-grad hooks, gradients accumulated unreduced
(``set_requires_gradient_sync(False)``), or ``reduce_scatter_unused_params``.

This reaches into FSDP2 internals (``FSDPParamGroup``/``FSDPParam`` attributes) through
:mod:`boost_titan.compat`, which detects where the installed torch keeps them (2.11 – 2.15);
:func:`supported` checks they are there and the caller keeps FSDP's path otherwise.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from boost_titan import compat


def _group_of(module: FSDPModule):
    state = module._get_fsdp_state()
    return getattr(state, "_fsdp_param_group", None)


def supported(group) -> bool:
    """Whether ``group`` is a 1-rank FSDP2 param group whose unshard this module can batch."""
    if not compat.fsdp_one_rank_unshard_available() or group is None or not group.fsdp_params:
        return False
    try:
        one_rank = group._all_gather_process_group.size() == 1
    except AttributeError:  # no process group: FSDP treats it as one rank too, but we do not guess
        return False
    return one_rank and all(
        hasattr(fp, "_sharded_param_data") and hasattr(fp, "init_all_gather_outputs")
        and not fp.offload_to_cpu and not hasattr(fp._sharded_local_tensor, "fsdp_pre_all_gather")
        for fp in group.fsdp_params)


def _wait_for_unshard_batched(group) -> None:
    """FSDP2's 1-rank ``wait_for_unshard`` with the per-parameter cast + copy as one foreach copy."""
    if not group._all_gather_result:
        return  # no preceding unshard (FSDP's own early exit)
    params = group.fsdp_params
    if any(fp.sharded_state != compat.ShardedState.SHARDED for fp in params):
        return type(group).wait_for_unshard(group)
    sources = [fp._sharded_param_data for fp in params]  # fp32, 1-D (the whole local tensor on 1 rank)
    targets = []
    for fp, src in zip(params, sources):
        fp.init_all_gather_outputs([src.numel()], [fp.param_dtype or src.dtype], 1, group.device)
        out = fp.all_gather_outputs[0]
        compat.alloc_storage(out)  # freed at the end of the previous backward
        targets.append(out)
    with compat.unsafe_preserve_version_counter(tuple(targets)):
        torch._foreach_copy_(targets, sources)
    for fp in params:
        fp.init_unsharded_param()
    group._to_unsharded()
    event = group.device_handle.Event()
    event.record()
    compat.wait_all_gather_streams_on_event(group, event)
    group._all_gather_result = None


def _reduction_is_a_cast(group) -> bool:
    """Whether FSDP2's post-backward reduction of this 1-rank group is exactly a cast of each gradient to
    its master weight's dtype, so that :func:`_write_sharded_grads` can stand in for it."""
    # getattr with a default that keeps FSDP's path: a torch that renamed one of these only loses speed
    # (tests/test_mixed_precision.py counts the batched path's ops and would say so)
    if compat.DDPMeshInfo is None or isinstance(getattr(group, "mesh_info", None), compat.DDPMeshInfo):
        return False  # HSDP: the gradients are all-reduced across replicas
    if not getattr(group, "reduce_grads", False) or getattr(group, "reduce_scatter_unused_params", False):
        return False
    if getattr(group, "gradient_divide_factor", 0) not in (None, 1.0) or getattr(group, "_all_reduce_hook", 1):
        return False
    orig_dtype = getattr(group, "_orig_dtype", None)
    grad_dtype = group.fsdp_params[0].param_dtype or orig_dtype
    if orig_dtype is None or getattr(group, "_reduce_dtype", 0) not in (None, orig_dtype, grad_dtype):
        return False  # a reduce dtype that rounds between the gradient and the master weight
    return all(fp.unsharded_accumulated_grad is None and not getattr(fp.sharded_param, "_post_accumulate_grad_hooks",
                                                                     None)
               for fp in group.fsdp_params)


def _write_sharded_grads(group) -> None:
    """Each unsharded (compute-dtype) gradient of ``group``, cast to its master weight's dtype, as that
    weight's gradient (new, or added to the one there); the unsharded gradients are cleared."""
    fresh, fresh_grads, accumulate, accumulate_grads = [], [], [], []
    for fp in group.fsdp_params:
        if not hasattr(fp, "_unsharded_param") or fp.unsharded_param.grad is None:
            continue
        grad = fp.unsharded_grad_data  # the local tensor (a tp DTensor's shard)
        fp.unsharded_param.grad = None
        if fp.sharded_param.grad is None:
            fresh.append(fp)
            fresh_grads.append(grad)
        else:
            accumulate.append(fp)
            accumulate_grads.append(grad)
    if fresh:
        flat = torch.empty(sum(g.numel() for g in fresh_grads), dtype=group._orig_dtype, device=group.device)
        views = [v.view(fp.sharded_size) for v, fp in zip(flat.split([g.numel() for g in fresh_grads]), fresh)]
        torch._foreach_copy_(views, fresh_grads)  # one kernel for every gradient (the cast included)
        for fp, view in zip(fresh, views):
            fp.sharded_param.grad = fp.to_sharded_dtensor(view)
    if accumulate:
        torch._foreach_add_([fp.sharded_param.grad._local_tensor for fp in accumulate], accumulate_grads)


def _post_backward_batched(group, *args, **kwargs):
    """FSDP2's 1-rank ``post_backward`` with the gradient reduction as one foreach cast."""
    if _reduction_is_a_cast(group):
        with torch.profiler.record_function("boost::one_rank_grads"):
            _write_sharded_grads(group)
    return type(group).post_backward(group, *args, **kwargs)  # reshards; nothing left to reduce


def batch_one_rank_fsdp(model: nn.Module) -> int:
    """Give every supported 1-rank FSDP2 group under ``model`` the batched unshard and gradient cast;
    returns how many groups."""
    count = 0
    for module in model.modules():
        if isinstance(module, FSDPModule) and supported(group := _group_of(module)):
            group.wait_for_unshard = types.MethodType(_wait_for_unshard_batched, group)
            group.post_backward = types.MethodType(_post_backward_batched, group)
            count += 1
    return count
