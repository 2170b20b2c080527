"""The private torch APIs the library reaches (boost_titan.compat) all resolve on the installed torch.

A release that moves one must fail here, loudly, instead of silently sending the library down a
slower fallback (the batched 1-rank unshard would quietly become FSDP's per-parameter path).
"""

import pytest
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


def test_every_patch_target_exists_and_only_listed_patches_apply(monkeypatch):
    """torchtitan_ext/patches.py: every required target resolves on the installed releases (checked at
    import); a missing one fails naming the patch; an unlisted name or an instance patch without its
    object is refused."""
    import types

    from torchtitan_ext import patches

    patches.check()
    for name, patch in patches.PATCHES.items():
        assert patch.versions and patch.why and patch.upstream, name
        assert patches.available(name) or not patch.required, name
    monkeypatch.setitem(patches.PATCHES, "gone", patches.Patch("torchtitan.train:Trainer.no_such_method", "x", "y", "z"))
    with pytest.raises(RuntimeError, match="patch 'gone' .* cannot find torchtitan.train:Trainer.no_such_method"):
        patches.check()
    with pytest.raises(KeyError):
        patches.apply("not_listed", None)
    with pytest.raises(ValueError, match="pass owner="):
        patches.apply("hf_save_writes_config", None)
    holder = types.SimpleNamespace(dcp_save="before")
    assert patches.apply("hf_save_writes_config", "after", owner=holder) == "before" and holder.dcp_save == "after"


# swaps of a class or method on one object that are not torch's or torchtitan's behaviour
OWN_SWAPS = {"boost_titan/parallel/base.py": "a Projection becomes its sharded subclass (our own module)"}


def test_every_swap_in_the_code_is_a_listed_patch():
    """Every per-instance replacement in the code (an object's ``__class__`` or a bound method set on
    it) is in ``patches.PATCHES``: made through ``apply`` or named by a patch's ``by``; ``setattr``
    of torch or torchtitan attributes happens only inside ``apply``."""
    import re

    from torchtitan_ext import patches

    from conftest import ROOT

    listed = {p.by for p in patches.PATCHES.values() if p.by}
    assert all((ROOT / f).is_file() for f in listed), listed
    swap = re.compile(r"\.__class__ = |= types\.MethodType\(")
    found = set()
    for folder in ("boost_titan", "torchtitan_ext", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if swap.search(path.read_text()):
                found.add(path.relative_to(ROOT).as_posix())
    assert found - set(OWN_SWAPS) == listed, (found, listed)
