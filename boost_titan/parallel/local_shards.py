"""The optimizer step and gradient clipping on the local shards of DTensor parameters.

Under tensor parallelism (and FSDP2) every parameter, gradient and optimizer state is a DTensor, so
torch's AdamW and ``clip_grad_norm_`` go through DTensor's dispatcher: sharding propagation for foreach
ops over hundreds of tensors, and one dispatch per norm to stack, while the GPU waits for the host
(docs/design.md, "Host time"). Both are elementwise per shard,
except the norm's sum over shards, which needs one all-reduce per mesh dim the gradients are sharded on,
so running them on ``_local_tensor`` gives the same numbers without the dispatch. The optimizer's state
stays DTensors (what distributed checkpoints save and reshard); only the step's tensor lists are local.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def local_tensor(t):
    """A DTensor's local shard (no autograd op: for optimizer-side code), a plain tensor itself."""
    return t._local_tensor if isinstance(t, DTensor) else t


class _LocalShardStep:
    """Mixin for torch.optim.Adam / AdamW: ``_init_group`` (which builds the per-group tensor lists the
    functional step consumes) hands over the local shards of parameters, gradients and states."""

    def _init_group(self, group, params, grads, *state_lists):
        has_complex = super()._init_group(group, params, grads, *state_lists)
        for i, (p, g) in enumerate(zip(params, grads)):
            if isinstance(p, DTensor) and g.placements != p.placements:
                # e.g. a whole (Replicate) gradient of a vocab-sharded embedding: take this rank's part,
                # as DTensor's dispatch of the step would
                grads[i] = g.redistribute(p.device_mesh, p.placements)
        for tensors in (params, grads, *state_lists):
            tensors[:] = [local_tensor(t) for t in tensors]
        return has_complex


class LocalShardAdam(_LocalShardStep, torch.optim.Adam):
    pass


class LocalShardAdamW(_LocalShardStep, torch.optim.AdamW):
    pass


_LOCAL_CLASSES = {torch.optim.Adam: LocalShardAdam, torch.optim.AdamW: LocalShardAdamW}


def step_on_local_shards(optimizer: torch.optim.Optimizer) -> bool:
    """Make an Adam / AdamW instance (built by someone else, e.g. torchtitan) step on local shards;
    returns whether it could (other optimizers are left as they are)."""
    local = _LOCAL_CLASSES.get(type(optimizer))
    if local is None:
        return False
    optimizer.__class__ = local
    optimizer._patch_step_function()  # the step hooks, as Optimizer.__init__ installs them per class
    return True


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None, pp_mesh=None, ep_enabled: bool = False, *, fallback):
    """torchtitan's ``dist_utils.clip_grad_norm_`` (same signature and result) on local shards.

    The squared L2 norm of each group of gradients sharded on the same mesh dims is summed locally and
    all-reduced over those dims (a replicated dim holds the whole value already), then over the pipeline
    stages; every local shard is scaled by ``min(1, max_norm / (norm + 1e-6))`` as torch does. Anything
    else (other norms, expert parallelism, Partial gradients, no DTensor at all) goes to ``fallback``,
    the function this one stands in for (called with the same arguments).
    """
    with torch.profiler.record_function("boost::clip_grad_norm"):  # a named host cost in profiler traces
        return _clip_local(parameters, max_norm, norm_type, error_if_nonfinite, foreach, pp_mesh, ep_enabled, fallback)


def _clip_local(parameters, max_norm, norm_type, error_if_nonfinite, foreach, pp_mesh, ep_enabled, fallback):
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    dtensors = [g for g in grads if isinstance(g, DTensor)]
    if (norm_type != 2.0 or ep_enabled or error_if_nonfinite or not dtensors
            or any(pl.is_partial() for g in dtensors for pl in g.placements)):
        return fallback(parameters, max_norm, norm_type, error_if_nonfinite, foreach, pp_mesh, ep_enabled)
    groups = defaultdict(list)  # (mesh, sharded mesh dims) -> local gradients
    for g in grads:
        if isinstance(g, DTensor):
            groups[(g.device_mesh, tuple(i for i, pl in enumerate(g.placements) if pl.is_shard()))].append(g._local_tensor)
        else:
            groups[(None, ())].append(g)
    squares = []
    for (mesh, dims), local in groups.items():
        square = torch.stack(torch._foreach_norm(local)).float().square().sum()
        for dim in dims:
            dist.all_reduce(square, group=mesh.get_group(dim))
        squares.append(square)
    total_square = torch.stack(squares).sum()
    if pp_mesh is not None:
        dist.all_reduce(total_square, group=pp_mesh.get_group())
    total_norm = total_square.sqrt()
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    by_dtype = defaultdict(list)
    for local in groups.values():
        for g in local:
            by_dtype[g.dtype].append(g)
    for dtype, tensors in by_dtype.items():
        torch._foreach_mul_(tensors, coef.to(dtype))
    return total_norm
