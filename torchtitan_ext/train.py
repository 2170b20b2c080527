"""torchtitan's training entry point (``python -m torchtitan.train``), leaving without interpreter
finalization once training has finished cleanly.

Why: after a successful run, rank 0 sleeps 2 s in torchtitan's ``Trainer.train`` while the other ranks
close, destroy their process group and exit. At interpreter finalization gloo's worker threads can
still be torn down and abort the process ("terminate called without an active exception", SIGABRT;
the mechanism: pytorch/pytorch#179291), and torchrun then reports the whole run as failed although
every step and checkpoint completed. Seen on CPU/gloo, mostly with torch 2.11 (2 of 4 runs of the
distributed tests on 2026-12-03). ``scripts/run_train.sh`` runs this module; a failing run still
raises (and exits non-zero) as before.
"""

from __future__ import annotations

import logging
import os
import sys

from torchtitan.train import Trainer, main

from .faults import check_nonfinite_at_exit


def main_then_exit(trainer_class=Trainer) -> None:
    main(trainer_class)  # trains, closes the trainer, destroys the process group; raises on failure
    check_nonfinite_at_exit()  # the last step's flag (a fused optimizer's guard reads it one step late)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main_then_exit()
