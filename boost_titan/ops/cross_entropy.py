"""Fused lm_head + cross-entropy: the loss of ``hidden @ weightᵀ`` without materialising the logits.

At the 1B benchmark shape (16K tokens × 32000 vocab) the logits, their fp32 upcast and their
gradient are ~6 GiB of short-lived memory. Both implementations here walk the tokens in chunks and
compute, per chunk, the logits, the loss and — in the same pass — the gradients of the hidden states
and of the weight, so backward only scales them by the incoming gradient:

* liger-kernel's ``liger_fused_linear_cross_entropy`` (Triton) on CUDA where it is installed;
* :class:`ChunkedLinearCrossEntropy`, plain PyTorch, everywhere else (CPU tests, GPUs without liger).

Same value as torchtitan's ``cross_entropy_loss``: the *sum* over tokens whose label is not
``ignore_index`` (the trainer divides by the global token count), computed in fp32 (or wider).
"""

from __future__ import annotations

import functools

import torch

IGNORE_INDEX = -100  # the label that loaders and losses skip (torch's default; torchtitan's IGNORE_INDEX)


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                             ignore_index: int = IGNORE_INDEX, implementation: str | None = None) -> torch.Tensor:
    """``sum_i CE(hidden_i · weightᵀ, labels_i)`` over valid labels; hidden ``[..., d]``, weight ``[V, d]``.

    Under autocast both operands are cast to the autocast dtype first (as ``F.linear`` would be), so
    the GEMMs run in bf16 while fp32 master weights receive their gradient through the cast.
    ``implementation``: "liger" | "torch" | None (liger on CUDA when importable, else torch).
    """
    dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) else None
    hidden, labels = hidden.flatten(0, -2), labels.flatten()
    if dtype is not None:
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    else:
        hidden = hidden.to(weight.dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        if (implementation or _default(hidden.device.type)) == "liger":
            from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

            return liger_fused_linear_cross_entropy(hidden, weight, labels, ignore_index=ignore_index,
                                                    reduction="sum", accum_dtype=torch.float32).float()
        return ChunkedLinearCrossEntropy.apply(hidden, weight, labels, ignore_index)


@functools.cache
def _default(device_type: str) -> str:
    if device_type != "cuda":
        return "torch"
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError:
        return "torch"
    return "liger"


def implementation_name(device_type: str) -> str:
    return {"liger": "liger-kernel's fused linear cross-entropy",
            "torch": "boost_titan's chunked linear cross-entropy (PyTorch)"}[_default(device_type)]


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Chunked fused linear + cross-entropy in PyTorch; gradients computed in forward (see module doc).

    Peak extra memory: one chunk's ``[chunk, V]`` logits in fp32 plus ``grad_weight`` in fp32.
    """

    CHUNK_BYTES = 256 * 2**20  # fp32 logits of one chunk

    @staticmethod
    def forward(ctx, hidden, weight, labels, ignore_index):
        n, vocab = hidden.shape[0], weight.shape[0]
        chunk = max(1, min(n, ChunkedLinearCrossEntropy.CHUNK_BYTES // (4 * vocab)))
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 softmax and sums (fp64 stays fp64)
        grad_weight = torch.zeros_like(weight, dtype=acc) if ctx.needs_input_grad[1] else None
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, n, chunk):
            h, y = hidden[start:start + chunk], labels[start:start + chunk]
            logits = (h @ weight.T).to(acc)
            valid = y != ignore_index
            target = torch.where(valid, y, 0)
            lse = torch.logsumexp(logits, dim=-1)
            loss += ((lse - logits.gather(1, target[:, None]).squeeze(1)) * valid).sum()
            if not needs_grad:
                continue
            grad_logits = torch.exp(logits.sub_(lse[:, None]))  # softmax, in place of the logits
            grad_logits[torch.arange(len(y), device=y.device), target] -= 1.0
            grad_logits = (grad_logits * valid[:, None]).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start:start + chunk] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ h).to(acc)
        ctx.save_for_backward(grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = lambda g: None if g is None else g * grad_loss.to(g.dtype)  # noqa: E731
        return scale(grad_hidden), scale(grad_weight), None, None
