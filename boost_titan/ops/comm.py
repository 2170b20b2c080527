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


def _all_reduce(x, mesh):
    return funcol.wait_tensor(funcol.all_reduce(x.contiguous(), "sum", (mesh, 0)))


def _all_gather(x, dim, mesh):
    return funcol.wait_tensor(funcol.all_gather_single(x.contiguous(), dim, (mesh, 0)))


def _reduce_scatter(x, dim, mesh):
    return funcol.wait_tensor(funcol.reduce_scatter_single(x.contiguous(), "sum", dim, (mesh, 0)))


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mesh):
        return _all_reduce(x, mesh)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mesh):
        ctx.mesh = mesh
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.mesh), None


class _SumPartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mesh):
        ctx.mesh = mesh
        return _all_reduce(x, mesh)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.mesh), None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, mesh):
        ctx.dim, ctx.mesh = dim, mesh
        return _all_gather(x, dim, mesh)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.dim, ctx.mesh), None, None


class _ScatterSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, mesh):
        ctx.dim, ctx.mesh = dim, mesh
        return _reduce_scatter(x, dim, mesh)

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.dim, ctx.mesh), None, None


def reduce(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _Reduce.apply(x, mesh)


def copy(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _Copy.apply(x, mesh)


def sum_partials(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _SumPartials.apply(x, mesh)


def gather(x: torch.Tensor, dim: int, mesh: DeviceMesh) -> torch.Tensor:
    return _Gather.apply(x, dim % x.dim(), mesh)


def scatter_sum(x: torch.Tensor, dim: int, mesh: DeviceMesh) -> torch.Tensor:
    return _ScatterSum.apply(x, dim % x.dim(), mesh)
