"""The private torch APIs the library reaches (boost_titan.compat) all resolve on the installed torch.

A release that moves one must fail here, loudly, instead of silently sending the library down a
slower fallback (the batched 1-rank unshard would quietly become FSDP's per-parameter path).
"""

import torch

from boost_titan import compat


def test_every_private_api_resolves():
    assert callable(compat.checkpoint_wrapper) and isinstance(compat.ActivationWrapper, type)
    assert callable(compat.unsafe_preserve_version_counter)
    assert compat.ShardedState is not None and callable(compat.alloc_storage)
    assert compat.FSDPParamGroup is not None
    assert compat.fsdp_one_rank_unshard_available(), \
        f"torch {torch.__version__} moved an FSDP2 internal of the batched 1-rank unshard: update boost_titan/compat.py"


def test_version_dependent_behaviour_is_detected_as_documented():
    # pytorch/pytorch#187985 (torch 2.14): a dropout-free SDPA is no longer an RNG op for the partitioner
    assert compat.SDPA_IS_RNG_OP == (compat.TORCH_VERSION < (2, 14)), (torch.__version__, compat.SDPA_IS_RNG_OP)
    # the param group's own wait on the all-gather streams: until 2.14; from 2.15 its comm_ctx's
    assert compat._WAIT_ON_GROUP == (compat.TORCH_VERSION < (2, 15))


def test_version_counter_guard_keeps_the_version():
    t = torch.zeros(3)
    before = t._version
    with compat.unsafe_preserve_version_counter((t,)):
        t.add_(1)
    assert t._version == before and t.tolist() == [1, 1, 1]
