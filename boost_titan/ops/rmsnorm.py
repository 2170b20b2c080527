"""RMSNorm over a last dim that is sharded across tensor-parallel ranks, computed exactly.

Notation (docs/design.md, "Online RMSNorm"): rank i holds ``x_i [..., d/t]`` and ``γ_i``; ``S_i = Σ x_i²`` (fp32),
``S = Σ_i S_i``, ``rms = sqrt(S/d + eps)``; the reference is ``x / rms ⊙ γ`` on the full ``d``.

* :func:`sync_rms_norm` — the statistic is all-reduced *before* the GEMM that consumes the norm
  (one ``[..., 1]`` all-reduce forward, one backward).
* online — ``Linear(RMSNorm(x)) = ((x ⊙ γ) Wᵀ) / rms``: rank i multiplies its un-normalised
  ``x_i ⊙ γ_i`` by its weight shard and the global ``S`` rides in the same all-reduce as the
  partial GEMM output (:func:`pack_statistic`), so the norm costs no collective of its own and its
  backward none either. BOOST normalises locally first and rescales by the local rms after the GEMM;
  that scaling cancels exactly and, in bf16, only changes *which* values get rounded (bf16 has fp32's
  exponent range, so there is no overflow to avoid) — we skip it and save two elementwise passes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from boost_titan.ops import comm
from boost_titan.ops.precision import upcast
from boost_titan.ops.triton_rmsnorm import scale_and_statistic


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain RMSNorm over the full last dim (the reference; also used where x is not d-sharded)."""
    return F.rms_norm(upcast(x), (x.shape[-1],), upcast(weight), eps).type_as(x)


def local_statistic(x: torch.Tensor) -> torch.Tensor:
    """``S_i = Σ_j x_ij²`` over the local last dim (≥ fp32), shape ``[..., 1]``."""
    return upcast(x).pow(2).sum(-1, keepdim=True)


def sync_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dim: int, mesh) -> torch.Tensor:
    """Exact RMSNorm of a d-sharded ``x`` (full width ``dim``): one ``[..., 1]`` all-reduce each way.

    The statistic's consumers are rank-local (each rank normalises its own slice), so its gradient
    is a partial sum as well: :func:`comm.sum_partials` all-reduces it in backward.
    """
    s = comm.sum_partials(local_statistic(x), mesh)
    return (upcast(x) * torch.rsqrt(s / dim + eps) * upcast(weight)).type_as(x)


# ---- online: the statistic travels inside the bottleneck all-reduce ----------------------------
def pack_statistic(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Encode the fp32 statistic as extra columns of a ``dtype`` buffer, summed by the same all-reduce.

    fp32/fp64: one column, exact. bf16/fp16: two columns ``hi = round(S_i)``, ``lo = round(S_i − hi)``
    (a 16-bit-mantissa value: the encoding error is ~2⁻¹⁷ relative instead of bf16's 2⁻⁹) so the
    buffer keeps the partials' width instead of being promoted to fp32. What remains is the
    rounding of the bf16 *sum* itself: each reduction step rounds hi by ≤ 2⁻⁹ of S, and since every
    S_i ≥ 0 this cannot cancel, so S's relative error is ≤ (t−1)·2⁻⁹ and rms's half of that — below
    the rounding of the partial GEMM outputs in the same buffer, whose sum *can* cancel.
    """
    if dtype in (torch.float32, torch.float64):
        return s.to(dtype)
    hi = s.to(dtype)
    lo = (s - upcast(hi)).to(dtype)
    return torch.cat([hi, lo], dim=-1)


def unpack_statistic(cols: torch.Tensor) -> torch.Tensor:
    return upcast(cols).sum(-1, keepdim=True)


def online_rms_norm_linear(x, weight, linear, eps: float, dim: int, mesh) -> list[torch.Tensor]:
    """``[reduce(linear(RMSNorm(x)))]`` over a d-sharded x with ONE collective per A GEMM.

    ``linear(y)`` returns the local partial GEMM outputs (a list: one grouped tensor, or one per
    ungrouped factor); the statistic is packed into the first one's all-reduce.
    """
    y, s_local = scale_and_statistic(x, weight)  # one fused pass on GPU
    partials = linear(y)
    first = partials[0]
    n = first.shape[-1]
    packed = comm.reduce(torch.cat([first, pack_statistic(s_local, first.dtype)], dim=-1), mesh)
    reduced = [packed[..., :n], *(comm.reduce(p, mesh) for p in partials[1:])]
    inv_rms = torch.rsqrt(unpack_statistic(packed[..., n:]) / dim + eps)
    return [(upcast(h) * inv_rms).type_as(h) for h in reduced]
