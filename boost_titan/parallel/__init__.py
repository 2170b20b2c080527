"""Tensor-parallel strategies for the CoLA / full-rank family as DTensor ParallelStyles, one file each:
``btp`` (bottleneck-aware), ``vanilla`` (Megatron on each low-rank pair), ``megatron`` (full rank + SP);
``base`` holds what they share, ``plans`` the registry. Beside them: ``activation_checkpoint``
(low-rank checkpointing), ``compile`` (compiling blocks on local shards), ``pipeline`` (tied
embeddings across stages)."""

from .btp import BottleneckParallel, BottleneckProjection
from .megatron import DenseColwiseParallel, DenseColwiseProjection, DenseRowwiseParallel, DenseRowwiseProjection
from .plans import STRATEGIES, apply_tp, check_tp, stream_shape, tp_plan
from .vanilla import VanillaLowRankParallel, VanillaLowRankProjection

__all__ = [
    "STRATEGIES",
    "BottleneckParallel",
    "BottleneckProjection",
    "DenseColwiseParallel",
    "DenseColwiseProjection",
    "DenseRowwiseParallel",
    "DenseRowwiseProjection",
    "VanillaLowRankParallel",
    "VanillaLowRankProjection",
    "apply_tp",
    "check_tp",
    "stream_shape",
    "tp_plan",
]
