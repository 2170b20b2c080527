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
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh


def _all_reduce(x, group: str):
    return funcol.wait_tensor(funcol.all_reduce(x.contiguous(), "sum", group))


def _all_gather(x, dim, group: str):
    return funcol.wait_tensor(funcol.all_gather_single(x.contiguous(), dim, group))


def _reduce_scatter(x, dim, group: str):
    return funcol.wait_tensor(funcol.reduce_scatter_single(x.contiguous(), "sum", dim, group))


def _group(mesh: DeviceMesh | str) -> str:
    """The process group's name: a plain string is all the autograd functions keep (a DeviceMesh
    saved on ctx breaks AOTAutograd inside selective-checkpoint regions under torch.compile)."""
    return mesh if isinstance(mesh, str) else mesh.get_group().group_name


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


def reduce(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _Reduce.apply(x, _group(mesh))


def copy(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _Copy.apply(x, _group(mesh))


def sum_partials(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _SumPartials.apply(x, _group(mesh))


def gather(x: torch.Tensor, dim: int, mesh: DeviceMesh) -> torch.Tensor:
    return _AlongDim.apply(x, dim % x.dim(), _group(mesh), True)


def scatter_sum(x: torch.Tensor, dim: int, mesh: DeviceMesh) -> torch.Tensor:
    return _AlongDim.apply(x, dim % x.dim(), _group(mesh), False)
