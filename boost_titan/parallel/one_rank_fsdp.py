"""One batched weight cast per step for FSDP2 groups on a 1-rank shard mesh.

TP-only and PP-only layouts get their mixed precision from FSDP2 on the 1-rank shard mesh (see
``torchtitan_ext.parallelize``). On such a mesh FSDP2 skips the all-gather, and its
``FSDPParamGroup.wait_for_unshard`` instead casts and copies each parameter on its own: two kernels
and its Python per parameter, before the forward can start (7B btp tp 4: 322 parameters, 643 idle
gaps in the traced step, the largest host cost left, ``docs/results/emulate_7b_gaps_after_bmm.md``).

:func:`batch_one_rank_unshard` gives such groups a ``wait_for_unshard`` that writes every
parameter's compute copy with one ``torch._foreach_copy_`` (fp32 → ``param_dtype``) into the same
buffers, then runs FSDP's own remaining steps (unsharded parameter views, state, events). The values
are identical (the same elementwise cast). Groups it cannot serve keep FSDP's method: a shard mesh of
more than one rank, parameters with FSDP tensor-subclass extensions (e.g. torchao's float8
all-gather), CPU offloading, or parameters not in the plain sharded state.

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


def batch_one_rank_unshard(model: nn.Module) -> int:
    """Give every supported 1-rank FSDP2 group under ``model`` the batched unshard; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, FSDPModule) and supported(group := _group_of(module)):
            group.wait_for_unshard = types.MethodType(_wait_for_unshard_batched, group)
            count += 1
    return count
