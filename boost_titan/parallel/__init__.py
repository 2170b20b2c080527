"""Tensor-parallel strategies for the CoLA / full-rank family as DTensor ParallelStyles."""

from .plans import STRATEGIES, check_tp, tp_plan
from .styles import (
    BottleneckParallel,
    ColwiseProjection,
    RowwiseProjection,
    VanillaLowRankParallel,
)
from .tensor_parallel import apply_tp

__all__ = [
    "STRATEGIES",
    "BottleneckParallel",
    "ColwiseProjection",
    "RowwiseProjection",
    "VanillaLowRankParallel",
    "apply_tp",
    "check_tp",
    "tp_plan",
]
