"""The backward collective of a GEMM input overlaps that GEMM's weight gradient, in compiled code too.

``boost_titan.ops.gemm`` runs dX GEMM → collective issued → dW GEMM → wait as one custom op, so no
compiler pass can reorder it (without it, Inductor's peak-memory reordering moved full rank's
reduce-scatter wait before the dW GEMM: the contrast below). Here a tp 2 block of each strategy is
compiled on gloo: the backward code Inductor generates must call that op for every input-gradient
collective and leave none of those collectives bare, and its gradients, like eager's, must equal the
fp64 block's within fp32 rounding (eager's equal tp 1's: test_tp_parity.py). The op's inner order is read by the
collective recorder
(test_comm_model.py: each backward collective overlaps its dW GEMM's FLOPs).
"""

import copy
import re

import torch
from torch._inductor.utils import run_and_get_code
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from boost_titan.models import Transformer
from boost_titan.ops import comm, gemm
from boost_titan.parallel import apply_tp, stream_shape

from conftest import TINY, assert_fp32_reassociation_close, run_distributed

_OP = re.compile(r"torch\.ops\.boost_titan\.matmul_nt_backward_synced\.default\(.*'(copy|gather)'")
_BARE = re.compile(r"^\s*(?:\w+ = )?torch\.ops\._c10d_functional\."
                   r"(all_reduce_|reduce_scatter_tensor|all_gather_into_tensor)\.default\(")
_WAIT = re.compile(r"_c10d_functional\.wait_tensor\.default\((\w+)")
BATCH, SEQ = 2, 16
_GEMM = re.compile(r"extern_kernels\.(?:bmm|mm|addmm)\(")


def collectives(code: str) -> tuple[list[str], list[str]]:
    """(kinds of the fused backward ops, bare functional collectives) in generated code."""
    fused = [m.group(1) for m in map(_OP.search, code.splitlines()) if m]
    bare = [m.group(1) for m in map(_BARE.search, code.splitlines()) if m]
    return fused, bare


def gemms_before_wait(code: str) -> int:
    """GEMMs between the (only) bare collective and its wait."""
    lines = code.splitlines()
    start = next(i for i, line in enumerate(lines) if _BARE.search(line))
    end = next(i for i in range(start, len(lines)) if _WAIT.search(lines[i]))
    return sum(bool(_GEMM.search(line)) for line in lines[start:end])


def _backward_code(codes: list[str]) -> str:
    (bwd,) = [c for c in codes if "tangents" in c]
    return bwd


def _block_codes(strategy, args, mesh):
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(args)
    apply_tp(model, mesh, strategy, args)
    model.to_empty(device="cpu")
    model.init_weights(torch.device("cpu"))
    block = model.layers["0"]
    x = torch.randn(stream_shape(strategy, BATCH, SEQ, args.dim, mesh.size()), generator=torch.Generator().manual_seed(1))
    rope = model.rope

    def grads(fn):
        module = getattr(fn, "_orig_mod", fn)
        for p in module.parameters():
            p.grad = None
        xx = x.clone().requires_grad_()
        fn(xx, rope).square().sum().backward()
        return [xx.grad] + [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in module.parameters()]

    eager = grads(block)
    compiled = torch.compile(block, fullgraph=True)
    got, codes = run_and_get_code(lambda: grads(compiled))
    # compiled code may reassociate sums: eager and compiled fp32 are each held to the fp32 rounding
    # bound of the same block in fp64, n = the longest reduction (features or tokens)
    block64 = copy.deepcopy(block).double()
    x, rope = x.double(), rope.double()
    ref = grads(block64)
    n = max(args.dim, args.ffn_dim, BATCH * SEQ)
    for i, (g, e, r) in enumerate(zip(got, eager, ref)):
        assert_fp32_reassociation_close(e, r, n, f"{strategy} eager gradient {i}")
        assert_fp32_reassociation_close(g, r, n, f"{strategy} compiled gradient {i}")
    return codes


def _worker(rank, world_size):
    mesh = init_device_mesh("cpu", (world_size,))
    expected = {  # (fused backward ops, bare collectives of those kinds) per block
        "btp": (["copy"] * 4, []),  # the four bottleneck gradients (down, gate|up, o, q|k|v)
        "vanilla": (["copy"] * 4, []),  # the four A inputs' gradients
        # the two column-parallel inputs' gradients (SP); bare: the row-parallel outputs' gradient
        # all-gathers (needed at once) and the two replicated norm weights' gradient all-reduces
        "fullrank": (["gather"] * 2, ["all_gather_into_tensor"] * 2 + ["all_reduce_"] * 2),
    }
    for strategy, (fused, bare) in expected.items():
        args = TINY.replace(n_layers=1, attn_rank=0, mlp_rank=0, swiglu=True) if strategy == "fullrank" else TINY
        got_fused, got_bare = collectives(_backward_code(_block_codes(strategy, args, mesh)))
        assert (got_fused, sorted(got_bare)) == (fused, sorted(bare)), strategy

    # the contrast: the same three steps traced inline instead of as one op; Inductor moves the
    # reduce-scatter's wait before the dW GEMM (if this fails, Inductor no longer does, and the op
    # could go)
    class Inline(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, sync):
            ctx.save_for_backward(x := comm.sync_forward(x, sync), w)
            ctx.sync = sync
            return x @ w.t()

        @staticmethod
        def backward(ctx, grad):
            return (*gemm.synced_backward(grad, *ctx.saved_tensors, ctx.sync), None)

    x = torch.randn(2, 8, 16, requires_grad=True)
    w = torch.randn(12, 16, requires_grad=True)
    compiled = torch.compile(lambda x, w: Inline.apply(x.sigmoid(), w, comm.gather_sync(1, mesh)), fullgraph=True)
    _, codes = run_and_get_code(lambda: compiled(x, w).sum().backward())
    assert gemms_before_wait(_backward_code(codes)) == 0


def test_backward_collectives_overlap_the_weight_gradient_gemm_when_compiled():
    run_distributed(_worker, 2)
