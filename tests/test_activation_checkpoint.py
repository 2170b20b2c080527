"""Activation checkpointing changes no gradient (fp32): the low-rank one at tp 1 and under btp tp 2,
eager and under torch.compile; torchtitan's compiled ``memory_budget`` mode on either family's block."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from boost_titan.compat import SDPA_IS_RNG_OP, ActivationWrapper
from boost_titan.models import Transformer
from boost_titan.parallel import apply_tp
from boost_titan.parallel.activation_checkpoint import apply_lowrank_checkpoint
from boost_titan.parallel.compile import compile_on_local_shards
from boost_titan.parallel.local_shards import local_tensor

from conftest import TINY, run_distributed

ARGS = TINY


def _grads(tp_mesh, lowrank: bool, args=ARGS, backend=None):
    """One step's parameter gradients; ``backend``: compile the blocks as torchtitan_ext does under
    tp + checkpointing."""
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
        assert all(isinstance(block, ActivationWrapper) for block in model.layers.values())
    if backend is not None:
        compile_on_local_shards(model, backend)
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


def _compiled_tp_worker(rank, world_size):
    mesh = init_device_mesh("cpu", (world_size,))
    graphs = {}

    def keep(phase):
        def compiler(gm, example_inputs):
            graphs[phase] = gm
            return make_boxed_func(gm.forward)  # runs the graph as traced; inductor's partitioner
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=min_cut_rematerialization_partition)
    plain, ckpt = _grads(mesh, False), _grads(mesh, True, backend=backend)
    for name, g in plain.items():
        assert isinstance(ckpt[name], DTensor), name
        torch.testing.assert_close(ckpt[name].full_tensor(), g.full_tensor(), rtol=1e-5, atol=1e-7, msg=name)

    def nodes(phase, op):
        return [node for node in graphs[phase].graph.nodes if node.target is op]

    # one graph for both blocks. btp online: the 4 bottleneck all-reduces forward, the 4 B-input
    # all-reduces backward (each inside the B GEMMs' backward op, ops/gemm.py) and no replayed one ...
    all_reduce = torch.ops._c10d_functional.all_reduce.default
    synced_backward = torch.ops.boost_titan.matmul_nt_backward_synced.default
    assert len(nodes("forward", all_reduce)) == 4
    assert (len(nodes("backward", all_reduce)), len(nodes("backward", synced_backward))) == (0, 4)
    # ... although the backward does recompute the block: the attention's forward runs again there
    # (the policy saves only the collectives' outputs). Up to torch 2.13 every SDPA op counted as an
    # RNG op, so the recompute replays the forward's RNG state through run_with_rng_state (the case that
    # failed with DTensor parameters in the compiled region); from 2.14 a dropout-free SDPA is
    # deterministic and recomputed bare (pytorch/pytorch#187985). Either way: exactly once.
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    replayed = [node.args[1] for node in nodes("backward", torch.ops.higher_order.run_with_rng_state)]
    recomputed = nodes("backward", sdpa)
    if SDPA_IS_RNG_OP:
        assert (replayed, recomputed) == ([sdpa], []), (replayed, recomputed)
    else:
        assert (replayed, len(recomputed)) == ([], 1), (replayed, recomputed)


def test_lowrank_checkpoint_compiled_under_btp_tp2():
    """torch.compile + btp tp 2 + low-rank checkpointing, compiled as torchtitan_ext does
    (LocalShardCompiled): the gradients of eager tp 2 without checkpointing, and no collective is
    replayed in the compiled backward."""
    run_distributed(_compiled_tp_worker, 2)


@pytest.mark.parametrize("grouped, expected", [(True, 4), (False, 3 + 1 + 2 + 1)])
def test_tp1_policy_saves_exactly_the_a_gemm_outputs(grouped, expected):
    """Without collectives the policy must recognise the A GEMMs (one per factor group) and nothing else."""
    from torch.utils.checkpoint import CheckpointPolicy

    from boost_titan.parallel.activation_checkpoint import lowrank_policy

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


def _saved_bytes_hooks():
    """Pack hooks that add up the distinct storages a forward saves for backward, weights excluded."""
    seen, total = set(), [0]

    def pack(t):
        t = local_tensor(t)
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t

    def ignore(params):
        seen.update(local_tensor(p).untyped_storage().data_ptr() for p in params)

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ignore, total


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm())


def _block_step(swiglu: bool, mode: str):
    """A block (1B's proportions: r = d/4, f ≈ 2.67 d, head_dim 64) at fp32, ``mode`` "eager", "compiled"
    or "budget" (compiled under ``activation_memory_budget = 0.9``): its input and parameter gradients,
    the bytes it saves for backward (distinct storages) and its backward FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    from boost_titan.models.args import TransformerArgs
    from boost_titan.models.model import TransformerBlock, rope_cos_sin

    torch._dynamo.reset()
    torch.manual_seed(0)
    rank = 0 if swiglu else 64
    args = TransformerArgs(dim=256, n_heads=4, ffn_dim=684, attn_rank=rank, mlp_rank=rank, swiglu=swiglu)
    block = TransformerBlock(args)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.05)
    rope = rope_cos_sin(64, 256, 10000.0)
    x = torch.randn(2, 256, 256, requires_grad=True)
    run = block if mode == "eager" else torch.compile(block)
    hooks, ignore, saved = _saved_bytes_hooks()
    ignore(block.parameters())
    patch = torch._functorch.config.patch(activation_memory_budget=0.9) if mode == "budget" else contextlib.nullcontext()
    with patch, hooks:
        out = run(x, rope)
    with FlopCounterMode(display=False) as flops:
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    grads = [x.grad] + [p.grad for p in block.parameters()]
    return grads, saved[0], flops.get_total_flops()


@pytest.mark.parametrize("swiglu", [False, True], ids=["cola", "dense"])
def test_memory_budget_recomputes_only_elementwise_work(swiglu):
    """torchtitan's ``activation_checkpoint.mode = "memory_budget"`` at 0.9 on a compiled block of either
    family: the eager block's gradients (fp32, ≤ 1e-5 relative in norm per tensor: compiled reductions sum
    in another order) and backward GEMM FLOPs (so no GEMM is
    recomputed), and ≥ 20% fewer activation bytes saved than the same block compiled without a budget:
    inductor recomputes the cheap elementwise outputs (norms, gating product, SiLUs) instead."""
    ref_grads, _, ref_flops = _block_step(swiglu, "eager")
    _, compiled_saved, _ = _block_step(swiglu, "compiled")
    grads, saved, flops = _block_step(swiglu, "budget")
    for g, r in zip(grads, ref_grads):
        assert _rel_err(g, r) <= 1e-5
    # measured here: CoLA 0.70, dense 0.74 (the ratio is in the message when it fails)
    assert saved <= 0.8 * compiled_saved, saved / compiled_saved
    assert flops == ref_flops > 0


def _budget_tp_worker(rank, world_size):
    from boost_titan.models.args import TransformerArgs

    mesh = init_device_mesh("cpu", (world_size,))
    args = TransformerArgs(dim=256, n_layers=1, n_heads=4, ffn_dim=684, attn_rank=64, mlp_rank=64, vocab_size=512)

    def step(mode):
        torch._dynamo.reset()
        torch.manual_seed(0)
        with torch.device("meta"):
            model = Transformer(args)
        apply_tp(model, mesh, "btp", args)
        model.to_empty(device="cpu")
        model.init_weights(torch.device("cpu"))
        if mode != "eager":
            compile_on_local_shards(model, "inductor")  # as torchtitan_ext does under tp + checkpointing
        block = model.layers["0"]
        x = model.tok_embeddings(torch.randint(0, 512, (2, 256), generator=torch.Generator().manual_seed(1)))
        x = x.detach().requires_grad_()
        hooks, ignore, saved = _saved_bytes_hooks()
        ignore(model.parameters())
        patch = torch._functorch.config.patch(activation_memory_budget=0.9) if mode == "budget" else contextlib.nullcontext()
        with patch, hooks:
            out = block(x, model.rope)
        local_tensor(out).square().sum().backward()
        return {n: p.grad for n, p in block.named_parameters()}, saved[0]

    ref, _ = step("eager")
    _, compiled_saved = step("compiled")
    grads, saved = step("budget")
    for name, g in ref.items():
        assert _rel_err(local_tensor(grads[name]), local_tensor(g)) <= 1e-5, name
    assert saved <= 0.8 * compiled_saved, saved / compiled_saved  # measured here: 0.70, as at tp 1


def test_memory_budget_under_btp_tp2():
    """The same under btp tp 2, compiled on local shards as torchtitan_ext does: each rank's gradients
    equal eager tp 2's (as above) and its block saves ≥ 20% fewer bytes (what the planner's ``budget`` layouts assume
    under TP)."""
    run_distributed(_budget_tp_worker, 2)
