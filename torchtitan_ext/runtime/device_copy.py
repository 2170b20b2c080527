"""A loader's microbatch onto the device without waiting for the GPU (the trainer's step and the
step graph's input buffers both copy this way)."""

from __future__ import annotations

import torch


def microbatch_to_device(microbatch, device: torch.device):
    """A loader's ``(input_dict, labels)`` with its tensors on ``device`` (:func:`to_device`)."""
    inputs, labels = microbatch
    return {k: to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}, to_device(labels, device)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without waiting for the GPU: a pageable copy to CUDA waits for all
    queued work, a copy from pinned memory does not (the caching host allocator keeps the pinned
    buffer until the copy has run)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
