"""Causal self-attention with a choice of kernel: PyTorch SDPA or flash-attn.

Every backend takes and returns the layout the projections produce, ``[batch, seq, heads, head_dim]``
(heads local under tensor parallelism, fewer k/v heads under GQA):

* ``"sdpa"``  — ``F.scaled_dot_product_attention`` (PyTorch picks cuDNN / flash / efficient / math);
  it wants ``[b, h, s, d]``, so q, k, v and the output are transposed (views) around it.
* ``"flash"`` — flash-attn-4 (``flash_attn.cute``, CuTe DSL, Hopper/Blackwell) where importable on an
  SM90+ GPU, otherwise flash-attn 2 (``flash_attn.flash_attn_func``). Both read ``[b, s, h, d]``
  directly: no transpose, no copy. flash-attn-4's forward and backward are wrapped here as torch
  custom ops (``boost_titan::flash_attn4_fwd`` / ``_bwd``), the way torch wraps its own flash kernels, so
  ``torch.compile`` traces them as single opaque nodes and selective activation checkpointing can
  name the forward in its save list (:func:`save_for_backward_ops`). flash-attn 2 (≥ 2.7) already
  registers its kernels as torch custom ops.

Nothing is imported until a backend is used: CPU machines have neither library.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

BACKENDS = ("sdpa", "flash")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "sdpa") -> torch.Tensor:
    """Causal attention of ``[b, s, h, d]`` q and ``[b, s, h_kv, d]`` k, v; returns ``[b, s, h, d]``."""
    if backend == "sdpa":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2)
    if backend == "flash":
        return (_loaded_flash or flash_kernel(q.device))(q, k, v)
    raise ValueError(f"attention={backend!r} is unknown; choose one of {BACKENDS}")


def check_backend(backend: str, device: torch.device | str | None = None) -> str:
    """Fail early, with one line naming what is missing, if ``backend`` cannot run on ``device``.

    Returns a short description of the kernel that will run (for the log).
    """
    if backend not in BACKENDS:
        raise ValueError(f"attention={backend!r} is unknown; choose one of {BACKENDS}")
    if backend == "sdpa":
        return "PyTorch scaled_dot_product_attention"
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    flash_kernel(device)
    return _flash_choice(device.type, _capability(device))[1]


_loaded_flash = None  # set by check_backend / flash_kernel, so compiled code reads a plain global


def flash_kernel(device: torch.device):
    """The flash-attn function for ``device``: ``f(q, k, v) -> out``, all ``[b, s, h, d]``, causal.

    Loading (imports, custom-op registration) happens here, once, in eager code: call it (or
    :func:`check_backend`) before ``torch.compile`` traces a model that uses ``attention='flash'``.
    """
    global _loaded_flash
    _loaded_flash = _flash_choice(device.type, _capability(device))[0]
    return _loaded_flash


def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


@functools.cache
def _flash_choice(device_type: str, capability: tuple[int, int] | None):
    if device_type != "cuda":
        raise RuntimeError(f"attention='flash' needs a CUDA GPU (flash-attn has no {device_type} kernels); "
                           "use attention='sdpa' here")
    missing = []
    if capability[0] >= 9:
        try:
            import flash_attn.cute  # noqa: F401  flash-attn-4

            _register_flash_attn4_ops()
            return _flash_attn4, f"flash-attn-4 (flash_attn.cute, SM{capability[0]}{capability[1]})"
        except ImportError as e:
            missing.append(f"flash-attn-4 ({e})")
    else:
        missing.append(f"flash-attn-4 (needs SM90+, this GPU is SM{capability[0]}{capability[1]})")
    try:
        from flash_attn import flash_attn_func  # flash-attn 2
    except ImportError as e:
        missing.append(f"flash-attn 2 ({e})")
        raise RuntimeError("attention='flash' but no flash-attn kernel can be loaded: "
                           + "; ".join(missing) + ". Install flash-attn-4 (Hopper) or flash-attn, or use attention='sdpa'"
                           ) from None
    return functools.partial(flash_attn_func, causal=True), "flash-attn 2 (flash_attn.flash_attn_func)"


# ---- flash-attn-4 as torch custom ops -----------------------------------------------------------
def _flash_attn4(q, k, v):
    return torch.ops.boost_titan.flash_attn4_fwd(q, k, v, 1.0 / math.sqrt(q.shape[-1]))[0]


@functools.cache
def _register_flash_attn4_ops() -> None:
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    @torch.library.custom_op("boost_titan::flash_attn4_fwd", mutates_args=(), device_types="cuda")
    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse, *_ = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True)
        return out, lse

    @fwd.register_fake
    def _(q, k, v, scale):
        b, s, h, _ = q.shape
        return q.new_empty(b, s, h, v.shape[-1]), q.new_empty(b, h, s, dtype=torch.float32)

    @torch.library.custom_op("boost_titan::flash_attn4_bwd", mutates_args=(), device_types="cuda")
    def bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = _flash_attn_bwd(q, k, v, out, dout.contiguous(), lse, softmax_scale=scale, causal=True)
        return dq, dk, dv

    @bwd.register_fake
    def _(dout, q, k, v, out, lse, scale):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.scale = scale

    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        return (*torch.ops.boost_titan.flash_attn4_bwd(dout, q, k, v, out, lse, ctx.scale), None)

    fwd.register_autograd(backward, setup_context=setup_context)


def save_for_backward_ops() -> set:
    """Attention ops that selective activation checkpointing should save rather than recompute
    (added to torchtitan's op list): the flash-attn-4 forward once it has been registered."""
    ops = set()
    if hasattr(torch.ops.boost_titan, "flash_attn4_fwd"):
        ops.add(torch.ops.boost_titan.flash_attn4_fwd.default)
    return ops
