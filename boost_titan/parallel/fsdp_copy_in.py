"""FSDP2's reduce-scatter copy-in as one foreach copy.

Before each reduce-scatter FSDP2 packs the unsharded gradients into the reduce-scatter input:
rank ``r``'s row holds the ``r``-th dim-0 chunk of every gradient, back to back, cast to the reduce
dtype (``foreach_reduce_scatter_copy_in``: one ``fsdp::chunk_cat``). Its CUDA kernel is one launch,
but its host side builds metadata with one entry per 2 KiB block of the output and copies it to the
device through pinned memory: host time that grows with the gradients' bytes, not their count,
while the GPU may wait (docs/design.md, "Host time").

:func:`foreach_copy_in` writes the same bytes with one ``torch._foreach_copy_``: targets are views
of the rows (one ``split`` per row), sources the dim-0 chunks of each gradient (a view and an index
per gradient and rank), so its host time is per gradient and does not grow with their size. It
handles what needs no padding (every gradient contiguous, its dim 0 divisible by the world size, as
the shipped flavors' are); anything else goes to FSDP's own copy-in. ``torchtitan_ext.cola_llama.parallelize``
installs it in place of FSDP2's function (``torchtitan_ext/patches.py`` ``fsdp_foreach_copy_in``).
"""

from __future__ import annotations

import torch


def foreach_copy_in(unsharded_grads: list[torch.Tensor], reduce_scatter_input: torch.Tensor, world_size: int,
                    *, fallback) -> None:
    """FSDP2's ``foreach_reduce_scatter_copy_in(unsharded_grads, reduce_scatter_input, world_size)``
    (same result), as one foreach copy; ``fallback``: FSDP2's function, for inputs that need padding."""
    sizes = [g.numel() // world_size for g in unsharded_grads]
    if (not unsharded_grads or sum(sizes) * world_size != reduce_scatter_input.numel()
            or not all(g.dim() > 0 and g.size(0) % world_size == 0 and g.is_contiguous() for g in unsharded_grads)):
        return fallback(unsharded_grads, reduce_scatter_input, world_size)
    rows = reduce_scatter_input.view(world_size, -1)
    chunks = [g.view(world_size, -1) for g in unsharded_grads]  # row r: the r-th dim-0 chunk, contiguous
    targets, sources = [], []
    for rank in range(world_size):
        targets += rows[rank].split(sizes)
        sources += [c[rank] for c in chunks]
    torch._foreach_copy_(targets, sources)  # one kernel (per ~100 tensors) for every chunk, the cast included
