"""The layout planner: which strategy × tp × pp × dp × activation checkpointing to run, PREDICTED.

    python -m boost_titan.planner --flavor 7B --gpus 8
    from boost_titan.planner import plan; rows = plan("7B", gpus=8)

:mod:`~boost_titan.planner.predict` (layouts, memory, step time, the ranking),
:mod:`~boost_titan.planner.costs` (each strategy's ``PLANNER`` parameters; the measured constants in
``measured_h200.json``), :mod:`~boost_titan.planner.comm_model` (α–β NCCL model of NVLink and
InfiniBand), :mod:`~boost_titan.planner.collectives` (a layer's collectives counted from the real
model on the meta device, :mod:`~boost_titan.planner.trace`).

Attributes load on first use, so the strategy modules can import ``planner.costs`` without a cycle.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"plan": "predict", "Layout": "predict", "layouts": "predict", "memory": "predict",
            "step_time": "predict", "train_command": "predict", "StrategyCosts": "costs"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_EXPORTS)
