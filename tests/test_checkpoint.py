"""Low-rank activation checkpointing changes no gradient (fp32), at tp 1 and under btp tp 2."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from boost_titan.models import Transformer, TransformerArgs
from boost_titan.parallel import apply_tp
from boost_titan.parallel.checkpoint import apply_lowrank_checkpoint

from dist import run_distributed

ARGS = TransformerArgs(dim=64, n_layers=2, n_heads=8, ffn_dim=96, vocab_size=128, attn_rank=16, mlp_rank=24)


def _grads(tp_mesh, lowrank: bool, args=ARGS):
    torch.manual_seed(0)
    tokens, labels = torch.randint(0, args.vocab_size, (2, 16)), torch.randint(0, args.vocab_size, (2, 16))
    with torch.device("meta"):
        model = Transformer(args)
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, "btp", args)
    model.to_empty(device="cpu")
    model.init_weights(torch.device("cpu"))
    if lowrank:
        apply_lowrank_checkpoint(model, args, tensor_parallel=tp_mesh is not None)
    logits = model(tokens)
    ctx = loss_parallel() if tp_mesh is not None else contextlib.nullcontext()
    with ctx:
        F.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
    return {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("args", [ARGS, ARGS.replace(grouped=False), ARGS.replace(attn_rank=0, mlp_rank=0)],
                         ids=["grouped", "ungrouped", "dense"])
def test_lowrank_checkpoint_keeps_gradients_tp1(args):
    plain, ckpt = _grads(None, False, args), _grads(None, True, args)
    for name, g in plain.items():
        torch.testing.assert_close(ckpt[name], g, rtol=1e-6, atol=0, msg=name)


def _tp_worker(rank, world_size):
    mesh = init_device_mesh("cpu", (world_size,))
    plain, ckpt = _grads(mesh, False), _grads(mesh, True)
    for name, g in plain.items():
        torch.testing.assert_close(ckpt[name].full_tensor(), g.full_tensor(), rtol=1e-6, atol=0, msg=name)


def test_lowrank_checkpoint_keeps_gradients_btp_tp2():
    run_distributed(_tp_worker, 2)


@pytest.mark.parametrize("grouped, expected", [(True, 4), (False, 3 + 1 + 2 + 1)])
def test_tp1_policy_saves_exactly_the_a_gemm_outputs(grouped, expected):
    """Without collectives the policy must recognise the A GEMMs (one per factor group) and nothing else."""
    from torch.utils.checkpoint import CheckpointPolicy

    from boost_titan.parallel.checkpoint import lowrank_policy

    args = ARGS.replace(grouped=grouped, n_layers=1)
    policy, saved = lowrank_policy(args, tensor_parallel=False), []

    def counting(ctx, func, *a, **k):
        decision = policy(ctx, func, *a, **k)
        if decision == CheckpointPolicy.MUST_SAVE and not ctx.is_recompute:
            saved.append(func)
        return decision

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    model = Transformer(args)
    model.init_weights(torch.device("cpu"))
    x = torch.randn(2, 8, args.dim, requires_grad=True)
    y = checkpoint(model.layers["0"], x, model.rope, use_reentrant=False,
                   context_fn=lambda: create_selective_checkpoint_contexts(counting))
    y.sum().backward()
    assert len(saved) == expected, saved
