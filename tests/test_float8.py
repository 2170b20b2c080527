"""Float8 projection GEMMs (``[boost] float8``, boost_titan.ops.float8) on the CPU, where torchao runs
its emulation (the same quantisation, the GEMM in fp32), against an fp64 reference that quantises each
operand itself as the rowwise recipe says: e4m3, one power-of-2 scale per row of the contracted dim.
"""

from __future__ import annotations

import pytest
import torch

from boost_titan.models import FLAVORS, Transformer
from boost_titan.models.model import Projection
from boost_titan.ops import float8
from boost_titan.ops import gemm as gemm_module
from boost_titan.ops.gemm import gemm

pytest.importorskip("torchao.float8")

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def quantized(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` after a float8 round trip with one power-of-2 scale per slice along ``dim`` (fp64)."""
    t = t.double()
    amax = t.abs().amax(dim=dim, keepdim=True).clamp(min=1e-12)
    scale = torch.exp2(torch.floor(torch.log2(E4M3_MAX / amax)))
    return (t * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).double() / scale


def test_linear_rowwise_is_three_rowwise_float8_gemms():
    """Output, input gradient and weight gradient each multiply operands quantised along the dim
    that GEMM contracts: y = q(x)·q(w)ᵀ over d_in, dx = q(dy)·q(w) over d_out, dw = q(dy)ᵀ·q(x) over tokens."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 24, 64, generator=g).requires_grad_()
    w = (torch.randn(48, 64, generator=g) * 0.1).requires_grad_()
    dy = torch.randn(2, 24, 48, generator=g)
    y = gemm(x, w, float8="rowwise")
    y.backward(dy)
    x2, dy2 = x.detach().reshape(-1, 64), dy.reshape(-1, 48)
    expected = {
        "y": quantized(x2, -1) @ quantized(w.detach(), -1).T,
        "dx": quantized(dy2, -1) @ quantized(w.detach(), 0),
        "dw": quantized(dy2, 0).T @ quantized(x2, 0),
    }
    got = {"y": y.detach().reshape(-1, 48), "dx": x.grad.reshape(-1, 64), "dw": w.grad}
    for name in expected:
        torch.testing.assert_close(got[name].double(), expected[name], rtol=1e-5, atol=1e-6, msg=name)
    exact = x2 @ w.detach().T  # and float8 really ran: ~3% from the unquantised product
    assert 1e-3 < (y.detach().reshape(-1, 48) - exact).norm() / exact.norm() < 0.1


@pytest.mark.parametrize("rank", [16, 0], ids=["lowrank", "dense"])
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "ungrouped"])
def test_every_projection_gemm_is_float8(rank, grouped, monkeypatch):
    """Each GEMM of a projection (A factors, B factors or dense W's, GQA's unequal outputs included)
    goes through the float8 path, and the outputs equal the fp64 composition of rowwise-quantised GEMMs."""
    calls = []
    monkeypatch.setattr(gemm_module, "float8_linear",
                        lambda x, w, recipe: calls.append(recipe) or float8.float8_linear(x, w, recipe))
    torch.manual_seed(0)
    proj = Projection(64, [64, 32, 32], rank, norm_eps=None, dense_std=0.1, grouped=grouped, float8="rowwise")
    for p in proj.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 16, 64)
    ys = proj(x)
    x2 = x.reshape(-1, 64)
    if rank:
        a = proj.a.weight.detach()  # [3, r, d_in]
        h = torch.cat([quantized(x2, -1) @ quantized(a[j], -1).T for j in range(3)], dim=-1)
        z = torch.nn.functional.silu(h)
        bs = [blk.weight.detach()[j] for blk in proj.b for j in range(blk.weight.shape[0])]
        expected = [quantized(z[:, j * rank:(j + 1) * rank], -1) @ quantized(bs[j], -1).T for j in range(3)]
        n_gemms = (1 if grouped else 3) + 3  # the A's (one grouped GEMM) + one per B (no float8 batched GEMM)
    else:
        ws = [blk.weight.detach()[j] for blk in proj.b for j in range(blk.weight.shape[0])]
        expected = [quantized(x2, -1) @ quantized(w, -1).T for w in ws]
        n_gemms = 2 if grouped else 3  # q | k,v runs of equal width
    assert calls == ["rowwise"] * n_gemms
    for y, e in zip(ys, expected):
        torch.testing.assert_close(y.reshape(-1, y.shape[-1]).double(), e, rtol=1e-4, atol=1e-5)


def _loss_and_grads(args, tokens):
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights(torch.device("cpu"))
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_float8_model_tracks_fp32_and_grouping_is_exact():
    """A whole model in float8: loss and gradients within float8 tolerance of fp32 (and not equal to
    it); grouping changes nothing under rowwise scaling (the A GEMM's scales are per token and per
    weight row either way)."""
    args = FLAVORS["tiny"].replace(vocab_size=128)
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    loss32, g32 = _loss_and_grads(args, tokens)
    loss8, g8 = _loss_and_grads(args.replace(float8="rowwise"), tokens)
    loss8u, g8u = _loss_and_grads(args.replace(float8="rowwise", grouped=False), tokens)
    assert loss8 != loss32 and abs(loss8 - loss32) / loss32 < 1e-2
    torch.testing.assert_close(loss8u, loss8, rtol=1e-5, atol=0)
    # e4m3 keeps 3 mantissa bits (bf16: 7), and each weight gradient here contracts only 64 tokens:
    # the float8 gradients of this tiny model sit 9-24% from fp32 (bf16 would be ~1%)
    for name, g in g32.items():
        rel = (g8[name] - g).norm() / g.norm()
        assert rel < 0.35, f"{name}: float8 gradient {rel:.3f} from fp32"
        torch.testing.assert_close(g8u[name], g8[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise_with_gw_hp"])
def test_other_recipes_track_fp32(recipe):
    """The other recipes run through the same path: loss within float8 tolerance of fp32, not equal to it."""
    args = FLAVORS["tiny"].replace(vocab_size=128)
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    loss32, g32 = _loss_and_grads(args, tokens)
    loss8, g8 = _loss_and_grads(args.replace(float8=recipe), tokens)
    assert loss8 != loss32 and abs(loss8 - loss32) / loss32 < 1e-2
    for name, g in g32.items():
        assert (g8[name] - g).norm() / g.norm() < 0.35, name


def test_compiled_float8_projection_matches_eager():
    torch.manual_seed(0)
    proj = Projection(64, [64, 64], 16, norm_eps=1e-6, dense_std=0.1, float8="rowwise")
    for p in proj.parameters():  # the module's weights are torch.empty until init: garbage, at times nan
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 16, 64)
    eager = proj(x)
    compiled = torch.compile(proj)(x)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_lowrank_checkpoint_saves_the_float8_a_gemm():
    """On a GPU the A GEMMs are ``aten._scaled_mm`` (right operand second): the tp 1 low-rank policy
    must keep saving their [.., c·r] outputs, and recompute a B GEMM's."""
    from torch.utils.checkpoint import CheckpointPolicy

    from boost_titan.parallel.activation_checkpoint import lowrank_policy

    args = FLAVORS["tiny"]
    policy = lowrank_policy(args, tensor_parallel=False)
    scale = torch.ones(1)
    a_gemm = (torch.empty(8, args.dim), torch.empty(args.dim, 3 * args.attn_rank), scale, scale)
    b_gemm = (torch.empty(8, args.attn_rank), torch.empty(args.attn_rank, args.dim), scale, scale)
    scaled_mm = torch.ops.aten._scaled_mm.default
    assert policy(None, scaled_mm, *a_gemm) == CheckpointPolicy.MUST_SAVE
    assert policy(None, scaled_mm, *b_gemm) == CheckpointPolicy.PREFER_RECOMPUTE


def test_boost_section_offers_exactly_the_kernels_the_ops_know():
    """``[boost] float8`` / ``attention`` are typed Literals (tyro lists the choices in --help) while the ops
    keep their own tuples; they must name the same choices."""
    from typing import get_args

    from boost_titan.ops.attention import BACKENDS
    from torchtitan_ext.cola_llama.job_config import Boost

    assert get_args(Boost.__annotations__["float8"]) == float8.RECIPES
    assert get_args(Boost.__annotations__["attention"]) == BACKENDS


def test_errors_name_the_problem(monkeypatch):
    dims = FLAVORS["1B"].gemm_dims()
    with pytest.raises(ValueError, match=r"float8='fp4' is unknown; choose one of \('none', 'tensorwise'"):
        float8.check_float8("fp4", dims)
    with pytest.raises(ValueError, match=r"invalid model args: float8='fp4' must be one of"):
        FLAVORS["tiny"].replace(float8="fp4").validate()
    # 1B's ffn_dim 5472 is 16·342: fine at tp 2, but 5472/4 = 1368 is not a multiple of 16
    with pytest.raises(ValueError, match=r"multiple of 16·tp = 64 .* but ffn_dim=5472"):
        float8.check_float8("rowwise", dims, tp=4, device="cuda")
    assert "emulation on cpu" in float8.check_float8("rowwise", dims, tp=4, device="cpu")
    monkeypatch.setattr(float8, "_loaded", {})
    monkeypatch.setitem(__import__("sys").modules, "torchao.float8.config", None)
    with pytest.raises(RuntimeError, match=r"float8='rowwise' needs torchao \(.*\): pip install torchao"):
        float8.check_float8("rowwise", dims, device="cpu")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 tensor cores: SM89+ GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_gpu_float8_gemms_match_the_emulation(recipe):
    """The real float8 GEMMs (``torch._scaled_mm``) against torchao's emulation of the same quantised
    operands, forward and both gradients, at a CoLA shape (K = r): the quantisation is identical, so
    only accumulation differs (the output GEMM uses fast accumulation in these recipes)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    dy = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
    results = {}
    for emulate in (False, True):
        float8._load(recipe, emulate)
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn, mm_config, config = float8._loaded[recipe, emulate]
        y = fn.apply(xi, wi.t(), mm_config, config)
        y.backward(dy)
        results[emulate] = (y.float(), xi.grad.float(), wi.grad.float())
    for name, real, emulated in zip(("y", "dx", "dw"), results[False], results[True]):
        rel = ((real - emulated).norm() / emulated.norm()).item()
        assert rel < 1e-2, f"{name}: real float8 GEMM {rel:.2e} from the emulation"
    y_linear = gemm(x, w, float8=recipe)  # the public path picks the real kernels on CUDA
    torch.testing.assert_close(y_linear.float(), results[False][0], rtol=0, atol=0)
