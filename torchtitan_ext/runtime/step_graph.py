"""``[boost] step_cudagraph``: the whole train step captured once as one CUDA graph and replayed.

Why: at small micro-batches a low-rank model's step on an H200 is set by the host. Per-block CUDA
graphs (``[boost] cudagraphs``) remove the kernel launches inside the blocks, but the host still walks
FSDP2's per-parameter hooks, the compiled regions' wrappers, AccumulateGrad and the optimizer for
every parameter, which at local batch 1 can take longer than the GPU's work (docs/design.md, "Host
time"). Captured whole, a step
costs the host one ``replay()`` and two input copies; everything inside — FSDP2's casts, all-gathers and
reduce-scatters, the compiled blocks, the loss, gradient clipping, the fused AdamW step — runs as
recorded.

What that requires, and how this module provides it:

- **static inputs**: each step's microbatches are copied into the same device buffers (from pinned
  memory, without waiting for the GPU); the shapes must not change (they do not: torchtitan's loaders
  yield fixed ``[local_batch, seq_len]`` batches).
- **no host synchronisation inside the step**: the trainer's step is sync-free already
  (``torchtitan_ext/runtime/train.py``); the non-finite guard's flag travels to pinned memory inside the graph
  and is read after the replay (:meth:`faults.NonFiniteGuard.replayed`).
- **an optimizer whose step is recorded, not baked**: fused Adam / AdamW with ``capturable=True``
  (its step counter on the device) and a learning rate read from a device tensor, which is refilled
  from the scheduler before every replay (:class:`_GraphSafeRates`).
- **no nested graphs**: per-block cudagraph trees cannot run inside a capture.
- **warm-up**: the first steps run eagerly on the capture stream (compilation, cuBLAS workspaces,
  NCCL communicators, FSDP2's lazy initialisation), then one step is captured and replayed.

Off a GPU (CPU tests) the same step runs eagerly through the same buffers every time
(``capture=False``): what the tests compare against the trainer's plain step.
"""

from __future__ import annotations

import torch

from torchtitan_ext.runtime.device_copy import microbatch_to_device

WARMUP_STEPS = 2  # eager steps on the capture stream before the capture


class StepGraph:
    """The train step of ``trainer`` (:meth:`torchtitan_ext.runtime.train.Trainer.device_step`) as one CUDA graph.

    Call it with a step's microbatches (host tensors, as the data loader yields them); it returns what
    ``device_step`` returns, as tensors the next replay overwrites (read them before the next call).
    """

    def __init__(self, trainer, capture: bool = True):
        self.trainer, self.capture = trainer, capture
        self.static = None  # [(input_dict, labels)] on the device: the graph's inputs
        self.outputs = None  # the captured step's outputs
        self.graph = None
        self.eager_steps = 0
        self.rates = None  # _GraphSafeRates per optimizer
        self.stream = torch.cuda.Stream() if capture else None

    def __call__(self, microbatches):
        if self.rates is None:  # at the first step: a resumed run has loaded its optimizer state by now
            self.rates = [_GraphSafeRates(opt, self.trainer.device, self.capture)
                          for opt in self.trainer.optimizers.optimizers]
        for rates in self.rates:
            rates.refresh()
        self._stage(microbatches)
        guards = self.trainer.nonfinite_guards()
        for guard in guards:
            guard.check()  # the previous step's flag (waits for that step only), outside the step's work
        if self.graph is None and not (self.capture and self.eager_steps >= WARMUP_STEPS):
            self.eager_steps += 1
            return self._on_stream(lambda: self.trainer.device_step(self.static))
        first = self.graph is None
        if first:
            self._capture()
        self.graph.replay()
        for guard in guards:
            guard.replayed(first)
        return self.outputs

    def _stage(self, microbatches) -> None:
        """Copy the microbatches into the static device buffers (allocated at the first call)."""
        if self.static is None:
            self.static = [microbatch_to_device(mb, self.trainer.device) for mb in microbatches]
            return
        if len(microbatches) != len(self.static):
            raise ValueError(f"[boost] step_cudagraph: {len(microbatches)} microbatches in this step, "
                             f"{len(self.static)} when the step was captured")
        for (inputs, labels), (static_inputs, static_labels) in zip(microbatches, self.static, strict=True):
            for key, buffer in [*((k, static_inputs[k]) for k in inputs if isinstance(inputs[k], torch.Tensor)),
                                ("labels", static_labels)]:
                value = labels if key == "labels" else inputs[key]
                if value.shape != buffer.shape:
                    raise ValueError(f"[boost] step_cudagraph: {key} of shape {tuple(value.shape)} in this step, "
                                     f"{tuple(buffer.shape)} when the step was captured (the graph's inputs are fixed)")
                buffer.copy_(value.pin_memory() if buffer.is_cuda else value, non_blocking=True)

    def _on_stream(self, fn):
        """``fn()`` on the capture stream (CUDA's recipe: warm-up where the capture will run), joined back."""
        if self.stream is None:
            return fn()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def _capture(self) -> None:
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=self.stream):
            self.outputs = self.trainer.device_step(self.static)
        from torchtitan.tools.logging import logger

        pool = torch.cuda.memory_reserved() / 2**30
        logger.info(f"[boost] step_cudagraph: captured the train step as a CUDA graph after {self.eager_steps} eager "
                    f"steps; replaying it from now on ({pool:.2f} GiB reserved)")


class _GraphSafeRates:
    """A fused Adam / AdamW step that a graph can record: during ``step()`` each group's learning rate is a
    device tensor (refreshed from the scheduler's float before every step, outside the graph) and, for a
    capture, ``capturable`` is on (the fused kernel then reads its step counters on the device, where it
    keeps them anyway). Outside ``step()`` the groups hold the floats the schedulers and checkpoints know,
    so a run's state dicts look the same with and without the step graph.

    The rate's dtype is what the fused kernel reads: float32 on CUDA (so the rate is rounded to float32;
    a Python float reaches that kernel as a double, which changes an update by at most an ulp), float64
    on the CPU (the same numbers as a Python float, bit for bit)."""

    def __init__(self, opt, device: torch.device, capturable: bool):
        dtype = torch.float32 if device.type == "cuda" else torch.float64
        self.opt, self.capturable, self.saved = opt, capturable, None
        self.rates = [torch.tensor(float(group["lr"]), dtype=dtype, device=device) for group in opt.param_groups]
        opt.register_step_pre_hook(self._swap_in)
        opt.register_step_post_hook(self._swap_out)

    def refresh(self) -> None:
        """This step's rates into the device tensors (a fill kernel each: no host sync)."""
        for rate, group in zip(self.rates, self.opt.param_groups, strict=True):
            rate.fill_(group["lr"])

    def _swap_in(self, opt, args, kwargs) -> None:
        self.saved = [(group["lr"], group["capturable"]) for group in opt.param_groups]
        for rate, group in zip(self.rates, opt.param_groups, strict=True):
            group["lr"] = rate
            group["capturable"] = group["capturable"] or self.capturable

    def _swap_out(self, opt, args, kwargs) -> None:
        for (lr, capturable), group in zip(self.saved, opt.param_groups, strict=True):
            group["lr"], group["capturable"] = lr, capturable
