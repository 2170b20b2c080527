"""FSDP2's reduce-scatter copy-in as one foreach copy (boost_titan/parallel/fsdp_copy_in.py) against
FSDP2's own (``fsdp::chunk_cat``): the same reduce-scatter input, bit for bit, in one ``_foreach_copy_``.
The end-to-end effect (FSDP layouts matching tp 1) is in test_mixed_precision / test_torchtitan_e2e,
which run with it installed."""

import pytest
import torch
from torch.distributed.fsdp._fully_shard._fsdp_collectives import foreach_reduce_scatter_copy_in

from boost_titan.parallel.fsdp_copy_in import foreach_copy_in

from conftest import DispatchedOps


def _both(shapes, world_size, dtype=torch.bfloat16, reduce_dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(s, generator=gen).to(device, dtype) for s in shapes]
    padded = sum(-(-s[0] // world_size) * world_size * torch.Size(s[1:]).numel() for s in shapes)
    theirs = torch.full((padded,), float("nan"), dtype=reduce_dtype, device=device)
    ours = theirs.clone()
    foreach_reduce_scatter_copy_in(list(grads), theirs, world_size)
    ops = DispatchedOps()
    with ops:
        foreach_copy_in(list(grads), ours, world_size, fallback=foreach_reduce_scatter_copy_in)
    return theirs, ours, ops.names


CUDA = pytest.param("cuda", marks=[pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
                                   pytest.mark.gpu])


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_one_foreach_copy_gives_chunk_cats_bytes(world_size, device):
    shapes = [(8, 12), (4,), (16, 4, 2), (12, 3), (4096, 96)]  # every dim 0 divisible by 1, 2 and 4
    theirs, ours, ops = _both(shapes, world_size, device=device)
    assert torch.equal(theirs, ours)  # the cast bf16 -> fp32 included; no NaN left unwritten
    assert ops.count("_foreach_copy_") == 1 and "chunk_cat" not in ops and "copy_" not in ops


def test_same_dtype_copy_in():
    theirs, ours, _ = _both([(6, 5), (2,)], 2, dtype=torch.float32)
    assert torch.equal(theirs, ours)


def test_gradients_that_need_padding_keep_fsdps_copy_in():
    theirs, ours, ops = _both([(6, 5), (3, 2)], 2)  # 3 rows over 2 ranks: FSDP pads
    assert torch.equal(theirs, ours)
    assert "chunk_cat" in ops and "_foreach_copy_" not in ops
