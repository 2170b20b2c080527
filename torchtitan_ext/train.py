"""torchtitan's training entry point (``python -m torchtitan.train``), leaving without interpreter
finalization once training has finished cleanly.

Why: after a successful run, rank 0 sleeps 2 s in torchtitan's ``Trainer.train`` while the other ranks
close, destroy their process group and exit. At interpreter finalization gloo's worker threads can
still be torn down and abort the process ("terminate called without an active exception", SIGABRT;
the mechanism: pytorch/pytorch#179291), and torchrun then reports the whole run as failed although
every step and checkpoint completed. Seen on CPU/gloo, mostly with torch 2.11 (2 of 4 runs of the
distributed tests on 2026-12-03). ``scripts/run_train.sh`` runs this module; a failing run still
raises (and exits non-zero) as before.

Its :class:`Trainer` is torchtitan's, plus one thing: a ``--checkpoint.last_save_in_hf`` save
becomes a complete Hugging Face directory (config.json and, for CoLA, the modeling file beside the
safetensors; torchtitan writes the weights only).
"""

from __future__ import annotations

import logging
import os
import sys

from torchtitan import train as titan_train

from .faults import check_nonfinite_at_exit
from .hf_adapter import write_metadata_after_hf_save
from .train_spec import registered_hand_offs


class Trainer(titan_train.Trainer):
    def __init__(self, job_config):
        super().__init__(job_config)
        ckpt = job_config.checkpoint
        if job_config.model.name == "cola_llama" and ckpt.enable and ckpt.last_save_in_hf:
            write_metadata_after_hf_save(self.checkpointer, self.model_args)


def main_then_exit(trainer_class=Trainer) -> None:
    titan_train.main(trainer_class)  # trains, closes the trainer, destroys the process group; raises on failure
    check_nonfinite_at_exit(registered_hand_offs())  # the last step's flag (a fused optimizer's guard reads it one step late)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main_then_exit()
