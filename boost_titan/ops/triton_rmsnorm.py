"""Fused local part of the online RMSNorm: ``y = x ⊙ γ`` and ``S = Σ x²`` in one pass (GPU: Triton).

Forward reads x once and writes the GEMM input y (x's dtype) and the fp32 row statistic; backward
``dx = γ ⊙ dy + 2 x ⊙ dS``, ``dγ = Σ_rows x ⊙ dy`` is one pass over x and dy plus a small reduction
of per-block partial dγ's. On CPU, or for tensors Triton cannot take, the same math runs in torch.
"""

from __future__ import annotations

import torch

from boost_titan.ops.precision import upcast

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None


def scale_and_statistic_reference(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xf = upcast(x)
    return (xf * upcast(weight)).to(x.dtype), xf.pow(2).sum(-1, keepdim=True)


if triton is not None:

    @triton.jit
    def _fwd_kernel(X, W, Y, S, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * n_cols + cols, (x * w).to(Y.dtype.element_ty), mask=mask)
        tl.store(S + row, tl.sum(x * x, axis=0))

    @triton.jit
    def _bwd_kernel(X, W, DY, DS, DX, DW_PARTIAL, n_rows, n_cols, ROWS_PER_PROGRAM: tl.constexpr,
                    BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(ROWS_PER_PROGRAM):
            row = pid * ROWS_PER_PROGRAM + i
            if row < n_rows:
                x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                ds = tl.load(DS + row).to(tl.float32)
                tl.store(DX + row * n_cols + cols, (w * dy + 2.0 * x * ds).to(DX.dtype.element_ty), mask=mask)
                dw += x * dy
        tl.store(DW_PARTIAL + pid * n_cols + cols, dw, mask=mask)


def _use_triton(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda and x.is_contiguous() and x.shape[-1] <= 65536


class _ScaleAndStatistic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        n = x.shape[-1]
        x2 = x.reshape(-1, n)
        y = torch.empty_like(x2)
        s = torch.empty(x2.shape[0], 1, device=x.device, dtype=torch.float32)
        _fwd_kernel[(x2.shape[0],)](x2, weight, y, s, n, BLOCK=triton.next_power_of_2(n))
        return y.view_as(x), s.view(*x.shape[:-1], 1)

    @staticmethod
    def backward(ctx, dy, ds):
        x, weight = ctx.saved_tensors
        n = x.shape[-1]
        x2, dy2 = x.reshape(-1, n), dy.contiguous().reshape(-1, n)
        ds2 = ds.contiguous().reshape(-1).float()
        rows = x2.shape[0]
        per_program = max(1, triton.cdiv(rows, 4 * torch.cuda.get_device_properties(x.device).multi_processor_count))
        programs = triton.cdiv(rows, per_program)
        dx = torch.empty_like(x2)
        dw_partial = torch.empty(programs, n, device=x.device, dtype=torch.float32)
        _bwd_kernel[(programs,)](x2, weight, dy2, ds2, dx, dw_partial, rows, n,
                                 ROWS_PER_PROGRAM=per_program, BLOCK=triton.next_power_of_2(n))
        return dx.view_as(x), dw_partial.sum(0).to(weight.dtype)


def scale_and_statistic(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x ⊙ γ, Σ x² [..., 1] fp32)``, fused on GPU, autograd-aware; torch math elsewhere."""
    if _use_triton(x) and not torch.compiler.is_compiling():
        return _ScaleAndStatistic.apply(x, weight)
    return scale_and_statistic_reference(x, weight)
