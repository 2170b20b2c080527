"""torchtitan's trainer on the fake communication backend, as any rank of an ``NGPU`` layout.

    NGPU=8 EMULATE_RANK=4 LOCAL_RANK=0 python -m torchtitan_ext.runtime.emulate \
        --job.config_file train_configs/cola_1b_h200.toml --comm.mode fake_backend [--section.key value ...]

One process runs the real kernels of one rank at that rank's real shapes while every collective
returns at once (its result is left unwritten: losses are meaningless, times and memory are not).
torchtitan 0.2.2 always plays rank 0 (``init_fake_mode``); here any rank can be played, so that a
pipeline layout's other stages can be timed too (rank ``k·(NGPU/pp)`` holds stage ``k``).

A later stage learns its input's shape at its first step from the previous stage (a metadata
message, ``recv_object_list``), which the fake backend never delivers. For the cola_llama family
that input is always the residual stream, ``[microbatch, seq, dim]`` in the compute dtype, with the
tp strategy's stream layout (btp: d sharded; fullrank: the sequence sharded), so the family's
``stage_input`` (:mod:`torchtitan_ext.cola_llama.parallelize`) gives it here and the stage's own shape
inference then runs as usual. That hook uses torch 2.11's pipelining (``PipelineStage._shape_inference``,
the GPU image's torch); later torch versions replace it with a metadata vote, and playing a later stage
there stops with one line.
"""

from __future__ import annotations

import os

import torch
import torch.distributed.pipelining.stage as pipelining_stage

from torchtitan_ext import patches
from torchtitan_ext.cola_llama.parallelize import stage_input
from torchtitan_ext.runtime.train import Trainer, main_then_exit

RANK = int(os.environ.get("EMULATE_RANK", "0"))
_job_config = None  # the running job's config (set when the Trainer is built)


def init_fake_mode(world_size: int, comm_mode: str = "fake_backend"):
    if comm_mode != "fake_backend":
        raise ValueError(f"torchtitan_ext.runtime.emulate runs --comm.mode fake_backend only, got {comm_mode!r}")
    if not 0 <= RANK < world_size:
        raise ValueError(f"EMULATE_RANK={RANK} is not a rank of NGPU={world_size}")
    torch.distributed.init_process_group("fake", rank=RANK, world_size=world_size)


patches.apply("fake_backend_any_rank", init_fake_mode)  # only --comm.mode fake_backend runs call it


_torch_shape_inference = getattr(pipelining_stage.PipelineStage, "_shape_inference", None)


def _shape_inference(stage, args, kwargs=None):
    """torch 2.11's shape inference with the previous stage's metadata message answered here."""
    if stage.is_first or stage.stage_index_to_group_rank[stage.stage_index - 1] == stage.group_rank:
        return _torch_shape_inference(stage, args, kwargs)  # nothing is received
    inputs = (stage_input(_job_config, stage.submod.model_args.dim),)
    def delivered(objects, *_, **__):
        objects[0] = inputs

    receive = patches.apply("pipeline_stage_metadata_receive", delivered)
    try:
        return _torch_shape_inference(stage, args, kwargs)
    finally:
        patches.apply("pipeline_stage_metadata_receive", receive)


def _check_stage_emulation(job_config) -> None:
    pp = job_config.parallelism.pipeline_parallel_degree
    if pp > 1 and RANK > 0 and _torch_shape_inference is None:
        raise RuntimeError(f"EMULATE_RANK={RANK} may hold a later pipeline stage, whose input shape this emulation "
                           f"supplies through torch 2.11's PipelineStage._shape_inference; torch {torch.__version__} "
                           "has no such hook: play rank 0 (stage 0) here, or use torch 2.11")


class EmulatedTrainer(Trainer):
    """The project's Trainer (torchtitan_ext/runtime/train.py), with later pipeline stages' input shapes
    supplied (installed here, in the emulating process only: importing this module changes nothing)."""

    def __init__(self, job_config):
        global _job_config
        _job_config = job_config
        _check_stage_emulation(job_config)
        if _torch_shape_inference is not None:
            patches.apply("pipeline_stage_shape_inference", _shape_inference)
        super().__init__(job_config)

if __name__ == "__main__":
    main_then_exit(EmulatedTrainer)
