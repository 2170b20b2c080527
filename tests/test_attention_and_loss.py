"""The attention kernels (``boost_titan.ops.attention``) and the fused lm_head + cross-entropy
(``boost_titan.ops.cross_entropy``) against plain fp64 reference math."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from boost_titan.models import FLAVORS, Transformer
from boost_titan.models.model import HeadInput
from boost_titan.ops import attention as attn
from boost_titan.ops.cross_entropy import ChunkedLinearCrossEntropy, linear_cross_entropy_sum


def reference_attention(q, k, v):
    """Causal softmax attention written out, [b, s, h, d] layout, GQA by repeating k/v heads."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = q.shape[1]
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_backend_is_causal_attention_in_bshd_layout(kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 7, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 7, kv_heads, 8, generator=g, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(attn.attention(q, k, v, "sdpa"), reference_attention(q, k, v), rtol=1e-10, atol=1e-12)


def test_backend_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"attention='nope' is unknown; choose one of \('sdpa', 'flash'\)"):
        attn.check_backend("nope")
    with pytest.raises(RuntimeError, match="attention='flash' needs a CUDA GPU"):
        attn.check_backend("flash", "cpu")
    with pytest.raises(ValueError, match="attention='nope' must be 'sdpa' or 'flash'"):
        FLAVORS["tiny"].replace(attention="nope").validate()


def _reference_loss(hidden, weight, labels):
    logits = hidden.double() @ weight.double().T
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum", ignore_index=-100)


@pytest.mark.parametrize("chunk_rows", [1, 5, 64])
def test_chunked_linear_cross_entropy_matches_reference(monkeypatch, chunk_rows):
    vocab, dim = 37, 16
    monkeypatch.setattr(ChunkedLinearCrossEntropy, "CHUNK_BYTES", 4 * vocab * chunk_rows)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 9, dim, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (3, 9), generator=g)
    labels[0, :4] = -100  # ignored positions contribute neither loss nor gradient
    loss = linear_cross_entropy_sum(hidden, weight, labels, implementation="torch")
    (2.5 * loss).backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref = _reference_loss(ref_h, ref_w, labels)
    (2.5 * ref).backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(hidden.grad, ref_h.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(weight.grad, ref_w.grad, rtol=1e-10, atol=1e-12)
    assert hidden.grad[0, :4].abs().max() == 0


def test_chunked_linear_cross_entropy_without_grad_and_under_autocast():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(64, 32, generator=g)
    weight = torch.randn(50, 32, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (64,), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy_sum(hidden, weight, labels, implementation="torch").double(),
                                   _reference_loss(hidden, weight, labels), rtol=1e-5, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy_sum(hidden, weight, labels, implementation="torch")
    loss.backward()
    assert weight.grad.dtype == torch.float32  # the fp32 master weight gets its gradient through the cast
    reference = _reference_loss(hidden.bfloat16(), weight.detach().bfloat16(), labels)
    torch.testing.assert_close(loss.double(), reference, rtol=1e-3, atol=0)  # bf16 operands, fp32 softmax


def test_deferred_lm_head_gives_the_same_loss_and_gradients():
    args = FLAVORS["tiny"].replace(n_layers=1)
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights()
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    labels = torch.randint(0, args.vocab_size, (2, 16))
    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum").backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.defer_lm_head = True
    out = model(tokens)
    assert isinstance(out, HeadInput) and out.weight is model.output.weight
    linear_cross_entropy_sum(out.hidden, out.weight, labels).backward()
    for name, p in model.named_parameters():
        # fp32: the two orders of summation agree to ~1e-6 of each gradient's largest entry
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=2e-6 * expected[name].abs().max().item(),
                                   msg=name)


needs_flash = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8, reason="needs a CUDA GPU")


@needs_flash
@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_flash_matches_sdpa_forward_and_backward(compiled):
    try:
        name = attn.check_backend("flash")
    except RuntimeError as e:
        pytest.skip(str(e))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 512, 8, 64, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 512, 2, 64, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
            for _ in range(2))
    dout = torch.randn(2, 512, 8, 64, device="cuda", dtype=torch.bfloat16, generator=g)

    def run(fn, *qkv):
        qkv = [t.detach().clone().requires_grad_() for t in qkv]
        out = fn(*qkv)
        out.backward(dout.to(out.dtype))
        return [out.float()] + [t.grad.float() for t in qkv]

    reference = run(reference_attention, q.float(), k.float(), v.float())  # fp32 math, bf16 inputs
    fn = torch.compile(attn.attention, fullgraph=True) if compiled else attn.attention
    flash, sdpa = (run(lambda *t, b=b: fn(*t, b), q, k, v) for b in ("flash", "sdpa"))
    # flash-attn's own test criterion: its error against fp32 math within twice that of PyTorch's bf16 kernel
    for what, f, s, r in zip(["out", "dq", "dk", "dv"], flash, sdpa, reference):
        err_flash, err_sdpa = (f - r).abs().max().item(), (s - r).abs().max().item()
        assert err_flash <= 2 * err_sdpa + 1e-3, f"{name}: {what} error {err_flash:.2e} vs SDPA's {err_sdpa:.2e}"
