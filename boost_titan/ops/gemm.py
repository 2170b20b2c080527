"""The projections' GEMMs: :func:`gemm` is the one entry point the model calls, ``x wᵀ`` for a weight
``[n, k]`` (a linear map of ``x [..., k]``) or a stacked weight ``[c, n, k]`` (c GEMMs of ``x [c, m, k]``,
one batched GEMM), given the collective its input needs and the precision recipe; it picks the kernel.

bf16 / fp32 GEMMs with a collective, and every batched one, run :func:`matmul_nt`, with a hand-written
backward, for two reasons:

* **Weight gradient in the weight's layout.** ``torch.bmm(z, w.transpose(1, 2))`` differentiates to
  the transpose of a ``[c, k, n]`` product, which breaks AccumulateGrad's layout contract: autograd
  then copies every such gradient into the parameter's layout (one extra launch and copy per B factor
  per block per step, seen in the tp 4 traces as ``AccumulateGrad > aten::copy_``).
* **The input gradient's collective overlaps the weight gradient** (``sync``). Under tensor
  parallelism the GEMM input is often made whole by a collective (``comm.copy``: replicated, so its
  gradient is a partial sum to all-reduce; ``comm.gather``: all-gathered, so its gradient is
  reduce-scattered). Autograd would run both backward GEMMs and only then that collective. Here the
  collective is issued right after the input-gradient GEMM and waited for after the weight-gradient
  GEMM, which does not need it — Megatron-LM's "async grad all-reduce" — for BTP's bottleneck
  all-reduces, vanilla's and full rank's alike. The three steps are one custom op, opaque to
  ``torch.compile``, so the order holds in compiled code too (``tests/test_overlap.py``).

Under autocast (torchtitan's single-device bf16 path) forward's GEMM runs in the autocast dtype;
backward, which autocast does not reach, runs in the gradient's dtype and returns each gradient in its
input's dtype, as autocast's own casts would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from boost_titan.ops import comm
from boost_titan.ops.float8 import float8_linear


def gemm(x: torch.Tensor, w: torch.Tensor, sync: comm.Sync | None = None, float8: str = "none") -> torch.Tensor:
    """``x wᵀ``: ``[..., k] × [n, k] → [..., n]``, or ``[c, m, k] × [c, n, k] → [c, m, n]`` for a stacked weight.

    ``sync``: the collective that makes ``x`` whole (``comm.copy_sync`` / ``comm.gather_sync``), or None.
    ``float8``: a torchao recipe (:mod:`boost_titan.ops.float8`) or "none".

    Without float8 the sync is fused into the GEMM (:func:`matmul_nt`: its backward collective overlaps
    the weight-gradient GEMM). float8 GEMMs are torchao's autograd function, which cannot take it: the
    sync runs first on its own (``comm.synced``), and a stacked weight runs one float8 GEMM per slice
    (torchao has no batched one), stacked into the batched result.
    """
    if float8 == "none":
        return F.linear(x, w) if sync is None and w.dim() == 2 else matmul_nt(x, w, sync)
    if sync is not None:
        x = comm.synced(x, sync)
    if w.dim() == 2:
        return float8_linear(x, w, float8)
    return torch.stack([float8_linear(x[j], w[j], float8) for j in range(w.shape[0])])


def gemm_each(x: torch.Tensor, ws: list[torch.Tensor], sync: comm.Sync | None = None, float8: str = "none",
              grouped: bool = True) -> list[torch.Tensor]:
    """``[x W_jᵀ for each stacked w [c, d_out, d_in] in ws, for each of its c slices]``: one GEMM per
    stacked weight if ``grouped``, else one per slice. Where several GEMMs read ``x`` (q and k|v under
    GQA, or ungrouped slices), its ``sync`` runs once on its own; a single GEMM applies it itself."""
    if sync is not None and (len(ws) > 1 or not grouped):
        x, sync = comm.synced(x, sync), None
    if grouped:
        return [y for w in ws for y in gemm(x, w.flatten(0, 1), sync, float8).split(w.shape[1], dim=-1)]
    return [gemm(x, w[j], sync, float8) for w in ws for j in range(w.shape[0])]


def _flat(t: torch.Tensor, batched: bool) -> torch.Tensor:
    """Batched operands as they are; a linear map's leading dims flattened into one."""
    return t if batched else t.reshape(-1, t.shape[-1])


def _input_grad(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    batched = w.dim() == 3
    mm = torch.bmm if batched else torch.mm
    return mm(_flat(grad, batched), w.to(grad.dtype)).view(x.shape).to(x.dtype)


def _weight_grad(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    batched = w.dim() == 3
    mm = torch.bmm if batched else torch.mm
    return mm(_flat(grad, batched).transpose(-2, -1), _flat(x, batched).to(grad.dtype)).to(w.dtype)


def synced_backward(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, sync: comm.Sync):
    """dX GEMM, its collective issued, dW GEMM, the collective waited for."""
    pending = comm.sync_backward_start(_input_grad(grad, x, w), sync)  # in flight during the dW GEMM
    dw = _weight_grad(grad, x, w)
    return comm.sync_backward_finish(pending), dw


@torch.library.custom_op("boost_titan::matmul_nt_backward_synced", mutates_args=())
def matmul_nt_backward_synced(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, kind: str, dim: int,
                              group: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`synced_backward` as one op opaque to ``torch.compile``, so that no compiler pass can move
    the wait before the dW GEMM. (Inductor's peak-memory reordering does exactly that to a
    reduce-scatter left in the graph, whose input buffer the wait frees.)"""
    return synced_backward(grad, x, w, (kind, dim, group, size))


@matmul_nt_backward_synced.register_fake
def _(grad, x, w, kind, dim, group, size):
    shape = list(x.shape)
    if kind == "gather":
        shape[dim % x.dim()] //= size
    return x.new_empty(shape), w.new_empty(w.shape)


class _MatmulNT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, sync: comm.Sync | None) -> torch.Tensor:
        x = comm.sync_forward(x, sync) if sync is not None else x
        ctx.save_for_backward(x, w)
        ctx.sync = sync
        return torch.matmul(x, w.transpose(-2, -1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[:2]
        if ctx.sync is not None and need_dx and need_dw:
            return (*matmul_nt_backward_synced(grad, x, w, *ctx.sync), None)
        dx = _input_grad(grad, x, w) if need_dx else None
        if dx is not None and ctx.sync is not None:
            dx = comm.sync_backward_finish(comm.sync_backward_start(dx, ctx.sync))
        return dx, _weight_grad(grad, x, w) if need_dw else None, None


def matmul_nt(x: torch.Tensor, w: torch.Tensor, sync: comm.Sync | None = None) -> torch.Tensor:
    """``x wᵀ``: ``[..., k] × [n, k] → [..., n]`` or ``[c, m, k] × [c, n, k] → [c, m, n]``.

    ``sync``: the collective that makes ``x`` whole (``comm.copy_sync`` / ``comm.gather_sync``), applied
    here so that its backward half overlaps the weight-gradient GEMM; ``None``: a plain GEMM.
    """
    return _MatmulNT.apply(x, w, sync)
