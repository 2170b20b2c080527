"""Apply a strategy's plan to a model (or a pipeline stage of it)."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module

from boost_titan.models.args import TransformerArgs

from .plans import tp_plan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, strategy: str, args: TransformerArgs,
             rmsnorm: str = "online", loss_parallel: bool = True) -> nn.Module:
    """``parallelize_module`` with the strategy's plan; keeps a tied embedding / lm_head tied.

    Both ends are sharded on the vocabulary (``Shard(0)``), so after distributing them the lm_head
    simply points at the embedding's DTensor again.
    """
    plan = tp_plan(strategy, args, tp_mesh.size(), rmsnorm=rmsnorm, loss_parallel=loss_parallel)
    parallelize_module(model, tp_mesh, {k: v for k, v in plan.items() if _exists(model, k)})
    model.tie_weights()
    return model


def _exists(model: nn.Module, path: str) -> bool:
    """Pipeline stages lack some top-level modules (set to None); skip their plan entries quietly."""
    head = path.split(".")[0]
    return getattr(model, head, None) is not None
