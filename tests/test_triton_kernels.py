"""The fused online-norm kernel against its torch reference (GPU only; skipped on CPU)."""

import pytest
import torch

from boost_titan.ops.triton_rmsnorm import _use_triton, scale_and_statistic

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"), pytest.mark.gpu]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(3, 5, 96), (2, 513, 1024), (1, 7, 1368)])
def test_scale_and_statistic_matches_reference(shape, dtype, tol):
    """Against plain torch math written here: y = x⊙γ, s = Σx² over the last dim (fp32)."""
    pytest.importorskip("triton")
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda") * 3).to(dtype).requires_grad_()
    w = (torch.rand(shape[-1], device="cuda") + 0.5).to(dtype).requires_grad_()
    dy, ds = torch.randn(shape, device="cuda").to(dtype), torch.randn(*shape[:-1], 1, device="cuda")
    assert _use_triton(x)  # else the kernel under test would be the torch fallback

    def plain(x, w):
        return (x.float() * w.float()).to(x.dtype), x.float().pow(2).sum(-1, keepdim=True)

    outs = []
    for fn in (scale_and_statistic, plain):
        xx, ww = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y, s = fn(xx, ww)
        torch.autograd.backward([y, s], [dy, ds])
        outs.append((y, s, xx.grad, ww.grad))
    for got, want in zip(*outs):
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.float().abs().max().item())
