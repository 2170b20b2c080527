"""One decoder layer of the real model, sharded by a strategy's plan, on the *meta* device over a fake
process group: per-rank shapes at any size (7B at b = 4, s = 4096 costs nothing), no GPU.

The planner and the benchmarks derive what they count from here rather than from hand-written copies
of each strategy's layout: :mod:`boost_titan.planner.collectives` records the layer's collectives,
``scripts/bench/layer_gemms.py`` its GEMMs (``scripts/bench/gemm_efficiency.py`` times them).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from boost_titan.models import Transformer, TransformerArgs
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
