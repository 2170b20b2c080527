"""Differentiable tensor-parallel collectives on local shards (functional collectives: traceable by
torch.compile, counted by CommDebugMode).

Megatron's f/g pairs, named by what they do in forward:

=====================  ========================  ==========================
function               forward                   backward
=====================  ========================  ==========================
``reduce``             all-reduce (sum)          identity
``copy``               identity                  all-reduce (sum)
``gather(dim)``        all-gather along dim      reduce-scatter along dim
``scatter_sum(dim)``   reduce-scatter along dim  all-gather along dim
``sum_partials``       all-reduce (sum)          all-reduce (sum)
=====================  ========================  ==========================

``reduce`` is for partial sums consumed identically on every rank; ``copy`` for a replicated tensor
that feeds rank-local (sharded) computation; ``sum_partials`` for partial sums whose consumers are
rank-local (so the gradient is partial too: a norm statistic over a sharded dim).

``copy`` and ``gather`` usually feed one GEMM. A :data:`Sync` (``copy_sync`` / ``gather_sync``) names
that collective so the GEMM can apply it itself (``boost_titan.ops.gemm.matmul_nt``): forward the same,
backward issued between the input- and the weight-gradient GEMM and waited for after it, so the
collective overlaps the weight gradient. :func:`synced` applies a Sync the plain way, for GEMMs that
cannot (float8, several consumers).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

# The ``_c10d_functional`` ops are what ``torch.distributed._functional_collectives`` lowers to, under
# the same names and signatures on every torch this package supports (2.11 … 2.14). The Python
# wrappers are not: torch 2.11 has no ``all_gather_single`` / ``reduce_scatter_single``, and its
# ``all_gather_tensor`` calls ``torch._utils._maybe_view_chunk_cat``, which dynamo refuses to trace.
# Collectives along a dim other than 0 move that dim through dim 0 with one chunk/cat, as the
# wrappers do.
_ops = torch.ops._c10d_functional


def _all_reduce(x, group):
    name, _ = group
    return _ops.wait_tensor(_ops.all_reduce(x.contiguous(), "sum", name))


def _all_gather(x, dim, group):
    name, size = group
    out = _ops.wait_tensor(_ops.all_gather_into_tensor(x.contiguous(), size, name))
    return out if dim == 0 else torch.cat(out.chunk(size, dim=0), dim=dim)


def _issue_reduce_scatter(x, dim, group):
    """The reduce-scatter issued, not waited for (``wait_tensor`` on the result completes it)."""
    name, size = group
    if dim != 0:
        x = torch.cat(x.chunk(size, dim=dim), dim=0)
    return _ops.reduce_scatter_tensor(x.contiguous(), "sum", size, name)


def _reduce_scatter(x, dim, group):
    return _ops.wait_tensor(_issue_reduce_scatter(x, dim, group))


def _group(mesh: DeviceMesh | tuple[str, int]) -> tuple[str, int]:
    """(process-group name, size): plain values are all the autograd functions keep (a DeviceMesh
    saved on ctx breaks AOTAutograd inside selective-checkpoint regions under torch.compile)."""
    if isinstance(mesh, tuple):
        return mesh
    return mesh.get_group().group_name, mesh.size()


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _SumPartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _AlongDim(torch.autograd.Function):
    """All-gather ↔ reduce-scatter along ``dim``: each is the other's backward."""

    @staticmethod
    def forward(ctx, x, dim, group, gather: bool):
        ctx.dim, ctx.group, ctx.gather = dim, group, gather
        return _all_gather(x, dim, group) if gather else _reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, g):
        dx = _reduce_scatter(g, ctx.dim, ctx.group) if ctx.gather else _all_gather(g, ctx.dim, ctx.group)
        return dx, None, None, None


# ---- a GEMM input's collective, applied by the GEMM (forward, then backward in two halves) -------
Sync = tuple  # (kind: "copy" | "gather", dim, process-group name, size): plain values, see _group


def copy_sync(mesh: DeviceMesh) -> Sync:
    """Forward identity, backward all-reduce (``copy``)."""
    return ("copy", 0, *_group(mesh))


def gather_sync(dim: int, mesh: DeviceMesh) -> Sync:
    """Forward all-gather along ``dim``, backward reduce-scatter along it (``gather``)."""
    return ("gather", dim, *_group(mesh))


def sync_forward(x: torch.Tensor, sync: Sync) -> torch.Tensor:
    kind, dim, *group = sync
    return x if kind == "copy" else _all_gather(x, dim % x.dim(), group)


def sync_backward_start(g: torch.Tensor, sync: Sync) -> torch.Tensor:
    """Issue the backward collective of ``sync`` on ``g``, a fresh gradient it may overwrite (the
    all-reduce sums in place: the out-of-place op would copy it first); the result is valid after
    :func:`sync_backward_finish`."""
    kind, dim, name, size = sync
    if kind == "copy":
        return _ops.all_reduce_(g.contiguous(), "sum", name)
    return _issue_reduce_scatter(g, dim % g.dim(), (name, size))


def sync_backward_finish(pending: torch.Tensor) -> torch.Tensor:
    return _ops.wait_tensor(pending)


def synced(x: torch.Tensor, sync: Sync) -> torch.Tensor:
    """``sync`` as its own differentiable step (``copy`` or ``gather``): nothing overlaps its backward."""
    kind, dim, *group = sync
    return copy(x, tuple(group)) if kind == "copy" else gather(x, dim, tuple(group))


def reduce(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _Reduce.apply(x, _group(mesh))


def copy(x: torch.Tensor, mesh: DeviceMesh | tuple[str, int]) -> torch.Tensor:
    return _Copy.apply(x, _group(mesh))


def sum_partials(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _SumPartials.apply(x, _group(mesh))


def gather(x: torch.Tensor, dim: int, mesh: DeviceMesh | tuple[str, int]) -> torch.Tensor:
    return _AlongDim.apply(x, dim % x.dim(), _group(mesh), True)


def scatter_sum(x: torch.Tensor, dim: int, mesh: DeviceMesh) -> torch.Tensor:
    return _AlongDim.apply(x, dim % x.dim(), _group(mesh), False)
