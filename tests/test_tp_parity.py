"""TP-t equals TP-1 (same seed, full weights): init, logits, loss, every gradient, one AdamW step.

Runs on gloo CPU ranks. The reference is the unsharded model built and run on every rank. Logits,
loss and gradients are compared in fp32 (≤ 1e-5 relative). The post-AdamW parameters are compared
in fp64: Adam's first step is ``lr · g / (|g| + eps)`` per entry, which turns the fp32 rounding
noise of near-zero gradient entries into updates of order ``lr`` (a property of Adam, not of the
plan); in fp64 that noise is ~1e-16 and the comparison is again a tight test of the plan.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from boost_titan.models import Transformer
from boost_titan.parallel import apply_tp

from conftest import TINY, run_distributed

BASE = TINY

CASES = {  # name: (strategy, rmsnorm, args)
    "btp-online": ("btp", "online", BASE),
    "btp-sync": ("btp", "sync", BASE),
    "btp-online-ungrouped": ("btp", "online", BASE.replace(grouped=False)),
    "btp-gqa-tied": ("btp", "online", BASE.replace(n_kv_heads=4, tie_embeddings=True, attn_rank=24, mlp_rank=8)),
    "btp-odd-ranks": ("btp", "online", BASE.replace(attn_rank=9, mlp_rank=13)),  # btp never shards r
    "vanilla": ("vanilla", "online", BASE),
    "vanilla-gqa": ("vanilla", "online", BASE.replace(n_kv_heads=4)),
    "fullrank": ("fullrank", "online", BASE.replace(attn_rank=0, mlp_rank=0, swiglu=True)),
    "fullrank-gqa": ("fullrank", "online", BASE.replace(attn_rank=0, mlp_rank=0, swiglu=True, n_kv_heads=4)),
}
RTOL = 1e-5


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _assert_close(actual, expected, what):
    err = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert err <= RTOL * max(scale, 1e-12), f"{what}: max err {err:.3g} vs scale {scale:.3g}"


def _one_step(model, tokens, labels, sharded):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=False)
    logits = model(tokens)
    if sharded:
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
    else:
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        loss.backward()
    grads = {n: _full(p.grad) for n, p in model.named_parameters()}
    opt.step()
    params = {n: _full(p.detach()) for n, p in model.named_parameters()}
    return _full(logits.detach()), loss.detach(), grads, params


def _build(strategy, rmsnorm, args, mesh, dtype):
    ref = Transformer(args)
    ref.init_weights(torch.device("cpu"))
    with torch.device("meta"):
        model = Transformer(args)
    apply_tp(model, mesh, strategy, args, rmsnorm=rmsnorm)
    model.to_empty(device="cpu")
    model.init_weights(torch.device("cpu"))
    return ref.to(dtype), model.to(dtype)


def _worker(rank, world_size, case_names):
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    tokens = torch.randint(0, BASE.vocab_size, (2, 16))
    labels = torch.randint(0, BASE.vocab_size, (2, 16))
    for name in case_names:
        strategy, rmsnorm, args = CASES[name]
        ref, model = _build(strategy, rmsnorm, args, mesh, torch.float32)
        ref_params = dict(ref.named_parameters())
        assert [n for n, _ in model.named_parameters()] == list(ref_params), name
        for n, p in model.named_parameters():
            assert isinstance(p, DTensor), f"{name}: {n} is not a DTensor"
            assert torch.equal(_full(p.detach()), ref_params[n]), f"{name}: init of {n} depends on the layout"
        want = _one_step(ref, tokens, labels, sharded=False)
        got = _one_step(model, tokens, labels, sharded=True)
        _assert_close(got[0], want[0], f"{name} logits")
        _assert_close(got[1], want[1], f"{name} loss")
        for n in want[2]:
            _assert_close(got[2][n], want[2][n], f"{name} grad {n}")

        ref, model = _build(strategy, rmsnorm, args, mesh, torch.float64)
        want, got = _one_step(ref, tokens, labels, False), _one_step(model, tokens, labels, True)
        for n in want[3]:
            _assert_close(got[3][n], want[3][n], f"{name} param after AdamW {n}")


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_matches_tp1(tp):
    run_distributed(_worker, tp, list(CASES))
