"""Sharded RMSNorm → A GEMM (sync and online) equals Linear(RMSNorm(x)) on the full width."""

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from boost_titan.ops.rmsnorm import online_rms_norm_linear, pack_statistic, sync_rms_norm, unpack_statistic

from conftest import run_distributed


def _reference(x, gamma, w, eps):
    x, gamma, w = (t.detach().double().requires_grad_() for t in (x, gamma, w))
    y = (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma) @ w.T
    return y, (x, gamma, w)


def _sharded(mode, x, gamma, w, eps, mesh, rank, tp):
    """Rank-local inputs (d-slice of x, γ and of W's input dim) → replicated output, local grads."""
    d = x.shape[-1]
    sl = slice(rank * d // tp, (rank + 1) * d // tp)
    xi, gi, wi = (t.detach()[..., sl].clone().requires_grad_() for t in (x, gamma, w))
    if mode == "online":
        (y,) = online_rms_norm_linear(xi, gi, lambda t: [t @ wi.T], eps, d, mesh)
    else:
        from boost_titan.ops import comm

        y = comm.reduce(sync_rms_norm(xi, gi, eps, d, mesh) @ wi.T, mesh)
    return y, (xi, gi, wi), sl


def _check(rank, tp):
    mesh = init_device_mesh("cpu", (tp,))
    for d_per_rank, eps, mode in [(21, 1e-6, "online"), (21, 1e-2, "online"), (17, 1e-6, "sync"), (17, 1e-2, "sync")]:
        d = d_per_rank * tp
        torch.manual_seed(d + int(eps * 100))
        x = torch.randn(3, 5, d) * 3 + 0.5
        gamma, w = torch.rand(d) + 0.5, torch.randn(13, d) / d**0.5
        g_out = torch.randn(3, 5, 13)
        y_ref, (xr, gr, wr) = _reference(x, gamma, w, eps)
        (y_ref * g_out.double()).sum().backward()
        y, (xi, gi, wi), sl = _sharded(mode, x, gamma, w, eps, mesh, rank, tp)
        (y * g_out).sum().backward()
        for what, got, want in [("y", y, y_ref), ("dx", xi.grad, xr.grad[..., sl]),
                                ("dgamma", gi.grad, gr.grad[sl]), ("dW", wi.grad, wr.grad[..., sl])]:
            torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5 * want.abs().max().item(),
                                       msg=lambda m, what=what, mode=mode, eps=eps: f"{mode} tp={tp} eps={eps} {what}: {m}")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sharded_norm_linear_matches_full_reference_fp32(tp):
    run_distributed(_check, tp)


def _check_bf16(rank, tp):
    """bf16 online error stays within 2× the error of an unsharded bf16 Linear(RMSNorm(x))."""
    mesh = init_device_mesh("cpu", (tp,))
    d, eps = 256 * tp, 1e-6
    torch.manual_seed(0)
    x, gamma, w = torch.randn(4, 64, d) * 4, torch.rand(d) + 0.5, torch.randn(96, d) / d**0.5
    y_ref, _ = _reference(x, gamma, w, eps)
    xb, gb, wb = x.bfloat16(), gamma.bfloat16(), w.bfloat16()
    unsharded = (torch.nn.functional.rms_norm(xb.float(), (d,), gb.float(), eps).bfloat16() @ wb.T).double()
    y, _, _ = _sharded("online", xb, gb, wb, eps, mesh, rank, tp)
    err_online = ((y.double() - y_ref) / y_ref.abs().max()).abs().max().item()
    err_plain = ((unsharded - y_ref) / y_ref.abs().max()).abs().max().item()
    assert y.dtype == torch.bfloat16
    assert err_online <= 2 * err_plain, (err_online, err_plain)


@pytest.mark.parametrize("tp", [2, 4])
def test_online_bf16_is_as_accurate_as_unsharded_bf16(tp):
    run_distributed(_check_bf16, tp)


def test_packed_statistic_keeps_16_mantissa_bits_in_bf16():
    s = torch.rand(1000, 1, dtype=torch.float32) * 1e4 + 1
    packed = pack_statistic(s, torch.bfloat16)
    assert packed.dtype == torch.bfloat16 and packed.shape == (1000, 2)
    rel = ((unpack_statistic(packed) - s) / s).abs().max().item()
    one_word = ((s.bfloat16().float() - s) / s).abs().max().item()
    assert rel < 2**-15 < one_word  # two bf16 words: ~2^-17, one word: ~2^-9
    assert torch.equal(unpack_statistic(pack_statistic(s, torch.float32)), s)
