"""Every private torch API the library reaches, in one place, detected on the installed torch.

pyproject allows torch 2.11 ≤ v < 2.15. Each entry below says which releases have what it reaches
and what happens where it is missing. Code elsewhere imports these names, never torch's private
modules, so a release that moves one breaks here, where ``tests/test_compat.py`` checks that every
entry resolves on the installed torch (a silent fallback would otherwise only show as lost speed).
"""

from __future__ import annotations

import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

# ---- activation checkpointing wrappers (torch.distributed.algorithms._checkpoint, 2.0 – 2.15) -----
# torchtitan 0.2.2 wraps blocks with the same ``checkpoint_wrapper``; we must recognise its wrapper.
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402  (re-exported)
    ActivationWrapper as ActivationWrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    checkpoint_wrapper as checkpoint_wrapper,
)

# ---- autograd: write into a saved buffer without bumping its version (2.1 – 2.15) ----------------
unsafe_preserve_version_counter = torch.autograd._unsafe_preserve_version_counter

# ---- FSDP2 internals for the batched 1-rank unshard (boost_titan.parallel.one_rank_fsdp) ---------
# ``FSDPParam``'s states and storage helper (2.6 – 2.15). Missing: that module keeps FSDP's own path.
try:
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState, alloc_storage
except ImportError:
    ShardedState = alloc_storage = None

try:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
except ImportError:
    FSDPParamGroup = None

# The mesh info of a group whose gradients are all-reduced (DDP, HSDP; 2.6 – 2.15). Missing: the
# batched 1-rank gradient cast is never used (its check needs to rule HSDP out).
try:
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo
except ImportError:
    DDPMeshInfo = None

# Making the default stream wait for the (here: no-op) all-gather: a method of the param group up to
# torch 2.14, of its ``comm_ctx`` (FSDPCommContext) from 2.15.
_WAIT_ON_GROUP = FSDPParamGroup is not None and hasattr(FSDPParamGroup, "_wait_all_gather_streams_on_event")


def wait_all_gather_streams_on_event(group, event) -> None:
    """``FSDPParamGroup``'s wait of the all-gather streams on ``event``, wherever this torch keeps it."""
    if _WAIT_ON_GROUP:
        group._wait_all_gather_streams_on_event(event)
    else:
        group.comm_ctx.wait_all_gather_streams_on_event(event)


def fsdp_one_rank_unshard_available() -> bool:
    """Whether this torch has every FSDP2 internal the batched 1-rank unshard uses."""
    if alloc_storage is None or FSDPParamGroup is None:
        return False
    if _WAIT_ON_GROUP:
        return True
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    return hasattr(getattr(pg, "FSDPCommContext", None), "wait_all_gather_streams_on_event")


# ---- behaviour that changed between releases (read by code and tests that depend on it) ---------
# Up to 2.13 every SDPA op carries ``nondeterministic_seeded`` and AOTAutograd's partitioner treats
# it as an RNG op: a recomputed attention replays the forward's RNG state (``run_with_rng_state``).
# From 2.14 a dropout-free SDPA is recomputed as a plain op (pytorch/pytorch#187985).
def _sdpa_is_rng_op() -> bool:
    from torch._functorch import partitioners

    return not hasattr(partitioners, "is_nonzero_dropout_sdpa")


SDPA_IS_RNG_OP: bool = _sdpa_is_rng_op()
