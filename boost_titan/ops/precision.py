"""Compute-dtype rule shared by the norm code paths."""

import torch


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Norm arithmetic runs in at least fp32 (fp64 stays fp64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
