"""The optimizer step and gradient clipping on local shards (boost_titan.parallel.local_shards) against
the same computations on whole tensors and through DTensor's dispatcher, on a 2 × 2 mesh of gloo ranks
with every kind of layout a parameter can have (sharded on one dim, on both, replicated)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torchtitan.distributed import utils as dist_utils

from boost_titan.parallel.local_shards import LocalShardAdamW, clip_grad_norm_, step_on_local_shards

from conftest import run_distributed

LAYOUTS = [((8, 6), [Shard(0), Shard(1)]), ((6, 4), [Replicate(), Shard(0)]), ((4, 10), [Shard(1), Replicate()]),
           ((5,), [Replicate(), Replicate()]), ((4, 2, 6), [Shard(2), Shard(0)])]


def _tensors(seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(shape, generator=g) for shape, _ in LAYOUTS]


def _dtensor_params(mesh, values) -> list[torch.nn.Parameter]:
    # clone: a replicated DTensor may share its source's storage, and two sets of parameters must not
    return [torch.nn.Parameter(distribute_tensor(v.clone(), mesh, placements)) for v, (_, placements) in zip(values, LAYOUTS)]


def _clip(rank, world_size):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    weights, grads = _tensors(0), _tensors(1, scale=3.0)
    ours, theirs = _dtensor_params(mesh, weights), _dtensor_params(mesh, weights)
    for p, q, g, (_, placements) in zip(ours, theirs, grads, LAYOUTS):
        p.grad, q.grad = distribute_tensor(g.clone(), mesh, placements), distribute_tensor(g.clone(), mesh, placements)
    # fp64 reference on the whole tensors
    whole = torch.cat([g.double().flatten() for g in grads]).norm()
    coef = min(1.0, 1.0 / (whole.item() + 1e-6))
    norm = clip_grad_norm_(ours, 1.0, foreach=True, fallback=dist_utils.clip_grad_norm_)
    assert not isinstance(norm, DTensor)
    assert norm.item() == pytest.approx(whole.item(), rel=1e-6), (norm, whole)
    reference = dist_utils.clip_grad_norm_(theirs, 1.0, foreach=True)  # torchtitan's, through DTensor
    assert norm.item() == pytest.approx(reference.item(), rel=1e-6)
    assert coef < 0.5  # the gradients were really scaled
    for p, q, g in zip(ours, theirs, grads):
        torch.testing.assert_close(p.grad.full_tensor(), (g.double() * coef).float(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(p.grad.to_local(), q.grad.to_local(), rtol=1e-6, atol=0)


def test_clip_grad_norm_on_local_shards_matches_whole_tensors_and_dtensor_dispatch():
    run_distributed(_clip, 4)


def _adamw(rank, world_size, fused):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    weights = _tensors(0)
    ours, theirs = _dtensor_params(mesh, weights), _dtensor_params(mesh, weights)
    plain = [torch.nn.Parameter(w.clone()) for w in weights]
    kwargs = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=fused, foreach=not fused)
    opt_ours = torch.optim.AdamW(ours, **kwargs)
    assert step_on_local_shards(opt_ours) and isinstance(opt_ours, LocalShardAdamW)
    opt_theirs, opt_plain = torch.optim.AdamW(theirs, **kwargs), torch.optim.AdamW(plain, **kwargs)
    seen = []
    opt_ours.register_step_post_hook(lambda *a, **k: seen.append(1))  # hooks survive the class change
    for step in range(3):
        grads = _tensors(10 + step)
        for p, q, r, g, (_, placements) in zip(ours, theirs, plain, grads, LAYOUTS):
            p.grad, q.grad, r.grad = (distribute_tensor(g.clone(), mesh, placements),
                                      distribute_tensor(g.clone(), mesh, placements), g.clone())
        opt_ours.step()
        opt_theirs.step()
        opt_plain.step()
    assert seen == [1, 1, 1]
    for p, q, r in zip(ours, theirs, plain):
        assert torch.equal(p.to_local(), q.to_local())  # the same elementwise kernels on the same shard
        torch.testing.assert_close(p.full_tensor(), r.detach(), rtol=1e-6, atol=1e-7)
        assert torch.equal(p.full_tensor(), r.detach()) or not fused  # fused: per-element, no reductions
        state, ref = opt_ours.state[p], opt_theirs.state[q]
        assert isinstance(state["exp_avg"], DTensor) and state["exp_avg"].placements == p.placements  # checkpointable
        assert torch.equal(state["exp_avg_sq"].to_local(), ref["exp_avg_sq"].to_local())
        assert float(state["step"]) == 3.0
    # a gradient laid out unlike its parameter (a whole gradient of a sharded embedding) steps on its
    # own part, as through DTensor
    grad = torch.randn(8, 6, generator=torch.Generator().manual_seed(5))
    ours[0].grad = distribute_tensor(grad.clone(), mesh, [Replicate(), Replicate()])
    theirs[0].grad = distribute_tensor(grad.clone(), mesh, [Replicate(), Replicate()])
    before = ours[0].to_local().clone()
    opt_ours.step()
    opt_theirs.step()
    assert torch.equal(ours[0].to_local(), theirs[0].to_local()) and not torch.equal(ours[0].to_local(), before)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_adamw_on_local_shards_matches_dtensor_and_whole_tensor_steps(fused):
    run_distributed(_adamw, 4, fused)
