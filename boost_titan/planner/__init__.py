"""The layout planner: which strategy × tp × pp × dp × activation checkpointing to run, PREDICTED.

    python -m boost_titan.planner --flavor 7B --gpus 8
    from boost_titan.planner import plan; rows = plan("7B", gpus=8)

:mod:`~boost_titan.planner.predict` (layouts, memory, step time, the ranking),
:mod:`~boost_titan.planner.costs` (each strategy's parameters, ``COSTS``; the measured constants in
``measured_h200.json``), :mod:`~boost_titan.planner.comm_model` (α–β NCCL model of NVLink and
InfiniBand), :mod:`~boost_titan.planner.collectives` (a layer's collectives counted from the real
model on the meta device, :mod:`~boost_titan.planner.trace`).
"""

from .costs import COSTS, StrategyCosts
from .predict import Layout, layouts, memory, plan, step_time, train_command

__all__ = ["COSTS", "Layout", "StrategyCosts", "layouts", "memory", "plan", "step_time", "train_command"]
