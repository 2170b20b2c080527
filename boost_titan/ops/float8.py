"""Float8 GEMMs for the projections, opt-in: torchao's float8 training recipes on our stacked weights.

torchao's own switch (``convert_to_float8_training``, torchtitan's ``quantize.linear.float8``) swaps
``nn.Linear`` modules, and the projections here are stacked ``[c, d_out, d_in]`` weights run through
``F.linear`` (one GEMM for the A factors or the dense W's of a group). So :func:`float8_linear` calls the
autograd function ``Float8Linear`` itself uses, ``torchao.float8.float8_linear.
matmul_with_hp_or_float8_args``: the same dynamic scaling, the same three float8 GEMMs (output,
input gradient, weight gradient), on any ``x wᵀ``.

Recipes (torchao's names): ``"tensorwise"`` (one scale per tensor), ``"rowwise"`` (one scale per row
of each operand along the contracted dim, power-of-2 scales), ``"rowwise_with_gw_hp"`` (rowwise, the
weight gradient in bf16). ``"none"`` is plain ``F.linear``.

Where the scales come from matters under tensor parallelism: each rank computes them on its local
shards (for BTP's A factors the contracted dim d is sharded, so a rowwise scale covers d/tp values).
That is a finer quantization grid than tp 1 uses, not the same rounding: a float8 run at tp t matches
its tp 1 twin within float8's tolerance, not to fp32 precision (bf16 runs do; docs/design.md).

On a GPU the GEMMs need SM89+ (``torch._scaled_mm``) and every contracted / output dim a multiple of
16 per rank. On a CPU torchao's emulation runs (quantise → dequantise → matmul in the input dtype): the same
rounding, no speed; the tests use it. torchao is imported only when a recipe other than "none" is used.
"""

from __future__ import annotations

import dataclasses

import torch

RECIPES = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")
GEMM_MULTIPLE = 16  # torch._scaled_mm: K and N multiples of 16


def float8_linear(x: torch.Tensor, w: torch.Tensor, recipe: str) -> torch.Tensor:
    """``x wᵀ`` for ``w [d_out, d_in]`` as float8 GEMMs with the recipe's scaling (the model reaches it
    through :func:`boost_titan.ops.gemm.gemm`)."""
    key = (recipe, x.device.type != "cuda")
    matmul, mm_config, config = _loaded.get(key) or _load(*key)  # a dict lookup: compiled code reads it
    return matmul.apply(x, w.t(), mm_config, config)


def check_float8(recipe: str, gemm_dims: dict[str, int], tp: int = 1, device: torch.device | str | None = None) -> str:
    """Fail early, one line naming the bad value or what is missing; returns what will run (for the log).

    ``gemm_dims``: name -> a full (unsharded) GEMM dimension of the model. On a GPU each must be a
    multiple of 16·tp, so that it stays a multiple of 16 per rank whichever dims the tp strategy
    shards (the emulation has no such rule).
    """
    if recipe not in RECIPES:
        raise ValueError(f"float8={recipe!r} is unknown; choose one of {RECIPES}")
    if recipe == "none":
        return "bf16 GEMMs (float8 off)"
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for name, value in gemm_dims.items():
        if device.type == "cuda" and value % (GEMM_MULTIPLE * tp):
            raise ValueError(f"float8={recipe!r} needs every GEMM dimension to be a multiple of {GEMM_MULTIPLE}·tp = "
                             f"{GEMM_MULTIPLE * tp} (torch._scaled_mm wants multiples of {GEMM_MULTIPLE} per rank), "
                             f"but {name}={value}")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise RuntimeError(f"float8={recipe!r} needs an SM89+ GPU (float8 tensor cores); this one is SM{major}{minor}")
    _load(recipe, device.type != "cuda")
    where = "float8 tensor cores" if device.type == "cuda" else f"torchao's emulation on {device.type}: no speed-up"
    return f"torchao float8 '{recipe}' GEMMs in every projection ({where}); lm_head in bf16"


_loaded: dict = {}  # (recipe, emulate) -> (autograd function, LinearMMConfig, Float8LinearConfig)


def _load(recipe: str, emulate: bool):
    try:
        from torchao.float8.config import Float8LinearConfig
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
        from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig
    except ImportError as e:
        raise RuntimeError(f"float8={recipe!r} needs torchao ({e}): pip install torchao, or set float8='none'") from e
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    # as Float8Linear builds it: one GEMM config each for the output, grad_input and grad_weight
    gemms = (config.gemm_config_output, config.gemm_config_grad_input, config.gemm_config_grad_weight)
    mm_config = LinearMMConfig(*(ScaledMMConfig(emulate, g.use_fast_accum, False, config.pad_inner_dim) for g in gemms))
    _loaded[recipe, emulate] = matmul_with_hp_or_float8_args, mm_config, config
    return _loaded[recipe, emulate]
