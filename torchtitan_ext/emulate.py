"""torchtitan's trainer on the fake communication backend, as any rank of an ``NGPU`` layout.

    NGPU=8 EMULATE_RANK=4 LOCAL_RANK=0 python -m torchtitan_ext.emulate \
        --job.config_file train_configs/cola_1b_h200.toml --comm.mode fake_backend [--section.key value ...]

One process runs the real kernels of one rank at that rank's real shapes while every collective
returns at once (its result is left unwritten: losses are meaningless, times and memory are not).
torchtitan 0.2.2 always plays rank 0 (``init_fake_mode``); the only change here is the rank, so that
a pipeline layout's other stages can be timed too (rank ``k·(NGPU/pp)`` holds stage ``k``).
"""

from __future__ import annotations

import os

import torch
import torchtitan.distributed.utils as dist_utils
from torchtitan.train import Trainer

from torchtitan_ext.train import main_then_exit

RANK = int(os.environ.get("EMULATE_RANK", "0"))


def init_fake_mode(world_size: int, comm_mode: str = "fake_backend"):
    if comm_mode != "fake_backend":
        raise ValueError(f"torchtitan_ext.emulate runs --comm.mode fake_backend only, got {comm_mode!r}")
    if not 0 <= RANK < world_size:
        raise ValueError(f"EMULATE_RANK={RANK} is not a rank of NGPU={world_size}")
    torch.distributed.init_process_group("fake", rank=RANK, world_size=world_size)


dist_utils.init_fake_mode = init_fake_mode

if __name__ == "__main__":
    main_then_exit(Trainer)
