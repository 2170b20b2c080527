"""torchtitan's training entry point (``python -m torchtitan.train``), leaving without interpreter
finalization once training has finished cleanly.

Why: after a successful run, rank 0 sleeps 2 s in torchtitan's ``Trainer.train`` while the other ranks
close, destroy their process group and exit. At interpreter finalization gloo's worker threads can
still be torn down and abort the process ("terminate called without an active exception", SIGABRT;
the mechanism: pytorch/pytorch#179291), and torchrun then reports the whole run as failed although
every step and checkpoint completed (seen on CPU/gloo, mostly with torch 2.11).
``scripts/run_train.sh`` runs this module; a failing run still
raises (and exits non-zero) as before.

Its :class:`Trainer` is torchtitan's, plus two things:

- a ``--checkpoint.last_save_in_hf`` save becomes a complete Hugging Face directory (config.json and,
  for CoLA, the modeling file beside the safetensors; torchtitan writes the weights only);
- its train step never waits for the GPU before the logging step's read-out. torchtitan 0.2.2's
  ``train_step`` copies the token count and every microbatch from pageable host memory (each copy
  waits for all queued GPU work) and, with data parallelism, reads the all-reduced token count back
  with ``.item()``: three drains of the GPU queue per step, after which the next step's host work
  (FSDP's first all-gather, the embedding, the first compiled region's guards) runs with an idle GPU.
  Here the copies come from pinned memory without waiting and the count stays on the device (a
  functional all-reduce), so the host runs ahead of the GPU as it does inside the step. The math is
  torchtitan's: same loss scaling (the count is an integer, exact in fp32 below 2^24 tokens per step),
  same clipping, optimizer and logging; ``tests/test_torchtitan_e2e.py`` checks losses against the
  stock step.
"""

from __future__ import annotations

import logging
import os
import sys

import torch
import torch.distributed._functional_collectives as funcol
from torchtitan import train as titan_train
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.distributed import utils as dist_utils

from torchtitan_ext.cola_llama.job_config import fail_on, step_cudagraph_problem
from torchtitan_ext.cola_llama.spec import registered_hand_offs
from torchtitan_ext.cola_llama.state_dict_adapter import write_metadata_after_hf_save
from torchtitan_ext.runtime.device_copy import microbatch_to_device
from torchtitan_ext.runtime.faults import check_nonfinite_at_exit
from torchtitan_ext.runtime.step_graph import StepGraph


class Trainer(titan_train.Trainer):
    def __init__(self, job_config):
        super().__init__(job_config)
        ckpt = job_config.checkpoint
        if job_config.model.name == "cola_llama" and ckpt.enable and ckpt.last_save_in_hf:
            write_metadata_after_hf_save(self.checkpointer, self.model_args)
        self.step_graph = None
        if getattr(job_config, "boost", None) is not None and job_config.boost.step_cudagraph:
            fail_on([p for p in [step_cudagraph_problem(job_config, self.device)] if p])  # also the peers' runs
            self.step_graph = StepGraph(self)

    def train_step(self, data_iterator):
        """torchtitan 0.2.2's ``Trainer.train_step`` without its host-device syncs (see the module)."""
        lr = self.lr_schedulers.schedulers[0].get_last_lr()[0]  # this step's, for logging
        parallel_dims = self.parallel_dims

        # all microbatches of the step are drawn first: the loss is scaled by the step's token count
        microbatches = [next(data_iterator) for _ in range(self.gradient_accumulation_steps)]
        self.checkpointer.maybe_wait_for_staging()  # an async save's copy of the weights is complete
        if self.step_graph is not None:
            loss, grad_norm, local_valid_tokens, global_valid_tokens = self.step_graph(microbatches)
        else:
            loss, grad_norm, local_valid_tokens, global_valid_tokens = self.device_step(
                [microbatch_to_device(mb, self.device) for mb in microbatches])
        self.lr_schedulers.step()

        if not self.metrics_processor.should_log(self.step):
            return
        if parallel_dims.dp_cp_enabled:
            loss_mesh = parallel_dims.get_optional_mesh("loss")
            local_avg_loss = loss * global_valid_tokens / local_valid_tokens  # for the max over ranks
            ntokens_seen = torch.tensor(self.ntokens_seen, dtype=torch.int64, device=self.device)
            global_avg_loss = dist_utils.dist_sum(loss, loss_mesh)
            global_max_loss = dist_utils.dist_max(local_avg_loss, loss_mesh)
            global_ntokens_seen = dist_utils.dist_sum(ntokens_seen, loss_mesh)
        else:
            global_avg_loss = global_max_loss = loss.item()
            global_ntokens_seen = self.ntokens_seen
        self.metrics_processor.log(self.step, global_avg_loss, global_max_loss, grad_norm.item(),
                                   extra_metrics={"n_tokens_seen": global_ntokens_seen, "lr": float(lr)})

    def device_step(self, microbatches):
        """A step's device work on microbatches already on the device: the token count, forward and
        backward of each microbatch, clipping and the optimizer step, with no host sync (what
        ``[boost] step_cudagraph`` captures). Returns (loss, gradient norm, local and global token counts)."""
        self.optimizers.zero_grad()
        parallel_dims = self.parallel_dims
        local_valid_tokens = sum((labels != IGNORE_INDEX).sum() for _, labels in microbatches)
        if parallel_dims.dp_enabled:  # summed over the batch ranks, left on the device (no .item())
            batch_mesh = parallel_dims.get_mesh("batch")
            global_valid_tokens = funcol.all_reduce(local_valid_tokens, "sum", group=batch_mesh).float()
        else:
            global_valid_tokens = local_valid_tokens.float()

        accumulated_losses = []
        for input_dict, labels in microbatches:
            loss = self.forward_backward_step(input_dict=input_dict, labels=labels,
                                              global_valid_tokens=global_valid_tokens)
            accumulated_losses.append(loss.detach())

        grad_norm = dist_utils.clip_grad_norm_(  # looked up at call time: the project's patch applies
            [p for m in self.model_parts for p in m.parameters()],
            self.job_config.training.max_norm,
            foreach=True,
            pp_mesh=parallel_dims.get_optional_mesh("pp"),
            ep_enabled=parallel_dims.ep_enabled,
        )
        self.optimizers.step()
        loss = torch.sum(torch.stack(accumulated_losses))  # local loss sum / global token count
        return loss, grad_norm, local_valid_tokens, global_valid_tokens

    def nonfinite_guards(self):
        """The run's non-finite guards (``faults.NonFiniteGuard``), which :class:`StepGraph` arms per replay."""
        return registered_hand_offs().guards


def main_then_exit(trainer_class=Trainer) -> None:
    titan_train.main(trainer_class)  # trains, closes the trainer, destroys the process group; raises on failure
    check_nonfinite_at_exit(registered_hand_offs())  # the last step's flag (a fused optimizer's guard reads it one step late)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main_then_exit()
