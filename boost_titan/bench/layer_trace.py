"""One decoder layer of the real model, sharded by a strategy's plan, on the *meta* device over a fake
process group: per-rank shapes at any size (7B at b = 4, s = 4096 costs nothing), no GPU.

The benchmarks derive what they measure from here rather than from hand-written copies of each
strategy's layout: :mod:`boost_titan.bench.comm_volume` records the layer's collectives and
:func:`layer_gemms` its GEMMs (``scripts/bench/gemm_efficiency.py`` times them).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode

from boost_titan.models import Transformer, TransformerArgs
from boost_titan.models.model import Projection
from boost_titan.parallel import apply_tp, stream_shape


@contextlib.contextmanager
def fake_world(world_size: int, device_type: str = "cpu"):
    """A single-process fake process group of ``world_size`` ranks (collectives are no-ops); yields its
    1-D device mesh."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("fake_world needs a process without a default process group")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh(device_type, (world_size,))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def meta_model(strategy: str, args: TransformerArgs, tp: int, *, rmsnorm: str = "online",
               dtype: torch.dtype = torch.bfloat16):
    """Yields the model on the meta device, sharded by ``strategy``'s plan over a fake ``tp``-rank group."""
    with fake_world(tp) as mesh:
        with torch.device("meta"):
            model = Transformer(args).to(dtype)
        apply_tp(model, mesh, strategy, args, rmsnorm=rmsnorm)
        yield model


@contextlib.contextmanager
def one_layer(strategy: str, args: TransformerArgs, tp: int, batch: int, seq: int, *, rmsnorm: str = "online",
              dtype: torch.dtype = torch.bfloat16, prepare=None):
    """Yields ``(block, x, rope)``: layer 0 of a one-layer model under ``strategy`` at degree ``tp`` and
    a rank's input to it, in the layout the strategy keeps the residual stream in between blocks.
    ``prepare(model)`` runs after the plan is applied (e.g. activation checkpointing)."""
    args = args.replace(n_layers=1, max_seq_len=seq)
    with meta_model(strategy, args, tp, rmsnorm=rmsnorm, dtype=dtype) as model:
        if prepare is not None:
            prepare(model)
        x = torch.empty(stream_shape(strategy, batch, seq, args.dim, tp), device="meta", dtype=dtype,
                        requires_grad=True)
        yield model.layers["0"], x, torch.empty(seq, args.head_dim, device="meta")


@dataclass(frozen=True)
class GemmShape:
    """``y[c, m, n] = x[c, m, k] · w[c, n, k]ᵀ`` of one projection (c = 1: a plain mm), per rank."""

    part: str  # "attn" | "mlp"
    name: str  # dense: qkv, o, gate_up, down; low-rank: A_qkv, B_qkv, ..., A_gu, B_gu, A_dn, B_dn
    c: int
    m: int
    k: int
    n: int


_SHORT = {"qkv": "qkv", "o": "o", "gate_up": "gu", "down": "dn"}
_MM = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


class _GemmRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.projection, self.calls = None, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _MM and self.projection is not None:  # attention's own GEMMs are not projections
            x, w = args[-2], args[-1]
            c = x.shape[0] if x.dim() == 3 else 1
            self.calls.append((self.projection, c, x.shape[-2], x.shape[-1], w.shape[-1]))
        return func(*args, **(kwargs or {}))


def layer_gemms(strategy: str, args: TransformerArgs, tp: int, tokens: int) -> list[GemmShape]:
    """The forward GEMMs one rank runs in one layer (m = its ``tokens``, b·s), in execution order.

    Recorded from the real model under the strategy's plan; backward runs dX = dY·W and dW = dYᵀ·X
    of each. Under sequence parallelism the stream holds ``tokens / tp`` tokens and is gathered first.
    """
    recorder = _GemmRecorder()
    with one_layer(strategy, args, tp, 1, tokens) as (block, x, rope):
        for path, module in block.named_modules():
            if isinstance(module, Projection):
                name = path.split(".")[-1]
                module.register_forward_pre_hook(lambda m, a, name=name: setattr(recorder, "projection", name))
                module.register_forward_hook(lambda m, a, o: setattr(recorder, "projection", None))
        with recorder, torch.no_grad():
            block(x, rope)
    out, seen = [], {}
    for proj, c, m, k, n in recorder.calls:
        i = seen[proj] = seen.get(proj, -1) + 1
        lowrank = (args.attn_rank if proj in ("qkv", "o") else args.mlp_rank) > 0
        name = proj if not lowrank else f"{'A' if i == 0 else 'B'}_{_SHORT[proj]}"
        if lowrank and i > 1:  # GQA: q's B and the k|v B's are two batched GEMMs
            name += str(i)
        out.append(GemmShape("attn" if proj in ("qkv", "o") else "mlp", name, c, m, k, n))
    return out
