"""The GEMMs one rank runs in one decoder layer under a strategy's plan, recorded from the real model
on the meta device (:func:`boost_titan.planner.trace.one_layer`); ``gemm_efficiency.py`` times them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from boost_titan.models import TransformerArgs
from boost_titan.models.model import Projection
from boost_titan.planner.trace import one_layer


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
