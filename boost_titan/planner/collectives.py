"""Collectives of one decoder layer, counted from the real model (BOOST Fig. 7, the volume half).

The layer runs forward and backward on the *meta* device over a fake process group of ``tp`` ranks
(:mod:`boost_titan.planner.trace`), so 7B shapes at b = 4, s = 4096 cost nothing; a dispatch
mode records every functional collective (op, shape, dtype, phase). No GPU needed.

Payload convention (docs/design.md, "Communication volume"): the tensor an all-reduce sums; an all-gather or
reduce-scatter counts half its full (unsharded) tensor, since an AG+RS pair moves what one
all-reduce moves — so sequence-parallel full-rank TP and plain Megatron report the same volume.

The planner costs these collectives (:mod:`boost_titan.planner.comm_model`);
``python -m scripts.bench.comm_volume`` writes the per-layer table to ``docs/results/``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from boost_titan.models import TransformerArgs
from boost_titan.ops import gemm
from boost_titan.planner.trace import meta_model, one_layer

_C10D = torch.ops._c10d_functional
_KINDS = {_C10D.all_reduce.default: "all_reduce", _C10D.all_reduce_.default: "all_reduce",
          _C10D.all_gather_into_tensor.default: "all_gather",
          _C10D.reduce_scatter_tensor.default: "reduce_scatter"}
_GEMMS = (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm)
_SYNCED_BACKWARD = torch.ops.boost_titan.matmul_nt_backward_synced.default
MiB = 2**20


@dataclasses.dataclass
class Collective:
    phase: str  # "forward" | "backward"
    kind: str
    shape: tuple[int, ...]  # the full tensor: all-reduce input, all-gather output, reduce-scatter input
    itemsize: int
    overlap_flops: int = 0  # GEMM FLOPs issued while it was in flight (between issue and wait)

    @property
    def payload_bytes(self) -> float:
        n = self.itemsize
        for s in self.shape:
            n *= s
        return n if self.kind == "all_reduce" else n / 2


class CollectiveRecorder(TorchDispatchMode):
    """Records functional collectives; ``phase`` is set by the caller around forward / backward.

    A functional collective is issued by its op and waited for by ``wait_tensor`` on its output; the
    GEMMs dispatched in between are what it can overlap (``Collective.overlap_flops``), read from the
    code's real order rather than assumed."""

    def __init__(self, world_size: int):
        super().__init__()
        self.world_size, self.phase, self.calls = world_size, "forward", []
        self._in_flight: dict[int, tuple[torch.Tensor, Collective]] = {}  # id(output) -> (output, record)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _SYNCED_BACKWARD:  # opaque to compilers; here its ops run under this mode, to be seen
            with self:
                return gemm.synced_backward(*args[:3], tuple(args[3:]))
        out = func(*args, **(kwargs or {}))
        kind = _KINDS.get(func)
        if kind is not None:
            shape = tuple(args[0].shape)
            if kind == "all_gather":
                shape = (shape[0] * self.world_size, *shape[1:])  # gathered along dim 0 by funcol
            self.calls.append(Collective(self.phase, kind, shape, args[0].element_size()))
            self._in_flight[id(out)] = (out, self.calls[-1])
        elif func is _C10D.wait_tensor.default:
            self._in_flight.pop(id(args[0]), None)
        elif self._in_flight and func._overloadpacket in _GEMMS:  # torch's FLOP formulas (FlopCounterMode's)
            flops = flop_registry[func._overloadpacket](*args, **(kwargs or {}), out_val=out)
            for _, call in self._in_flight.values():
                call.overlap_flops += flops
        return out


def layer_collectives(strategy: str, args: TransformerArgs, tp: int, batch: int, seq: int, *,
                      rmsnorm: str = "online", dtype: torch.dtype = torch.bfloat16,
                      lowrank_checkpoint: bool = False) -> list[Collective]:
    """Forward + backward collectives of one decoder layer under ``strategy`` at degree ``tp``."""
    from boost_titan.parallel import activation_checkpoint

    prepare = (lambda model: activation_checkpoint.apply_lowrank_checkpoint(model, args, tensor_parallel=tp > 1)
               ) if lowrank_checkpoint else None
    recorder = CollectiveRecorder(tp)
    with one_layer(strategy, args, tp, batch, seq, rmsnorm=rmsnorm, dtype=dtype, prepare=prepare) as (block, x, rope):
        with recorder:
            y = block(x, rope)
            recorder.phase = "backward"
            y.backward(torch.empty_like(y))
    return recorder.calls


def model_collectives(strategy: str, args: TransformerArgs, tp: int, batch: int, seq: int, *,
                      rmsnorm: str = "online", dtype: torch.dtype = torch.bfloat16) -> tuple[list[Collective], int]:
    """Forward + backward TP collectives of the whole model (embedding, every layer, final norm, lm_head
    and loss-parallel cross-entropy) on one rank, and that rank's parameter count (its TP shards).

    The small loss-parallel all-reduces of ``[b·s]`` statistics go through c10d rather than the
    functional ops and are not in the list (three per step, a few tens of KiB each).
    """
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    args = args.replace(max_seq_len=seq)
    with meta_model(strategy, args, tp, rmsnorm=rmsnorm, dtype=dtype) as model:
        local_params = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
        tokens = torch.empty(batch, seq, dtype=torch.long, device="meta")
        recorder = CollectiveRecorder(tp)
        with recorder:
            logits = model(tokens)
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
                recorder.phase = "backward"
                loss.backward()
    return recorder.calls, local_params


def summarize(calls: list[Collective]) -> dict:
    out = {}
    for phase in ("forward", "backward"):
        sel = [c for c in calls if c.phase == phase]
        out[phase] = {"count": len(sel), "payload_MiB": sum(c.payload_bytes for c in sel) / MiB,
                      "ops": [f"{c.kind}{list(c.shape)}" for c in sel]}
    return out
