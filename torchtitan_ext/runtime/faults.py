"""What a rank does when its run fails around it.

torchrun starts every worker in a session of its own, so a worker outlives a launcher that is
killed (an OOM kill, a preempted wrapper, a closed terminal): it goes on training and writing
checkpoints, parented to init, and a restart then trains twice into one folder.
:func:`die_with_launcher` makes the kernel send the worker SIGTERM when the process that started it
(torchrun's agent) exits. When one *rank* dies, torchrun's agent already stops the others.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from torchtitan_ext.cola_llama.hand_offs import HandOffs

_PR_SET_PDEATHSIG = 1


def die_with_launcher(sig: int = signal.SIGTERM) -> bool:
    """Under torchrun on Linux: ``sig`` when the launching agent exits; exit now if it already has.

    Returns whether the parent-death signal was set.
    """
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    launcher = os.getppid()
    if launcher == 1:  # orphaned already
        os._exit(128 + int(sig))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != launcher:  # it died while the signal was being armed
        os._exit(128 + int(sig))
    return True


# ---- one live run per checkpoint folder ----------------------------------------------------------
def lock_path(folder: str) -> str:
    """The lock of a checkpoint folder lies beside it (``<folder>.run.lock``), not in it: torchtitan
    takes an existing folder for a run to resume and then ignores ``checkpoint.initial_load_path``."""
    return os.path.normpath(folder) + ".run.lock"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a live pid from a reused one)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return None if fields[0] == "Z" else fields[19]


def claim_checkpoint_folder(folder: str, launcher_pid: int) -> str | None:
    """Write :func:`lock_path` naming this run (host, launcher pid, its start time, since when);
    returns a one-line reason instead if another live run holds the folder.

    A lock whose process is gone (or whose pid now belongs to another process) is stale and taken
    over; a lock from another host cannot be checked and is reported, with the file to delete.
    """
    import datetime
    import json
    import socket

    host = socket.gethostname()
    path = lock_path(folder)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    mine = {"host": host, "pid": launcher_pid, "start_time": _start_time(launcher_pid),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                other = json.loads(open(path).read())
            except (OSError, ValueError):
                other = {}
            if other.get("host") == host and other.get("pid") == launcher_pid:
                return None  # ours already
            if other.get("host") == host and (not other.get("pid") or
                                              _start_time(other["pid"]) != other.get("start_time")):
                os.unlink(path)  # stale: its run is gone
                continue
            where = other.get("host", "?")
            return (f"checkpoint folder {folder} is held by a live run (host {where}, pid {other.get('pid')}, "
                    f"since {other.get('since')}); stop it first" +
                    ("" if where == host else f", or delete {path} if that run is known to be gone"))
        with os.fdopen(fd, "w") as f:
            json.dump(mine, f)
        return None
    return f"could not claim {path}"


# ---- non-finite gradients ------------------------------------------------------------------------


class NonFiniteGuard:
    """An optimizer step pre-hook against inf / nan gradients (a non-finite loss makes them so) on any
    rank: such a step is never applied; the run then stops with one line naming the step, or, with
    ``skip``, logs it and goes on.

    The flag comes from the gradient norm that the loop's clipping has just computed and all-reduced
    (:meth:`HandOffs.note_clip`; non-finite if any gradient on any rank is): no further pass over the
    gradients. Where that norm is missing or its gradients have changed since (another backward, a
    replaced ``.grad``, an optimizer used without torchtitan's loop), the guard computes its own: one
    norm pass over the rank's gradient shards and an all-reduce of one flag. How the step is kept from
    being applied:

    - **fused Adam / AdamW** (torchtitan's default ``[optimizer] implementation``), *sync-free*: the flag
      is handed to the optimizer as ``found_inf`` (what ``torch.amp.GradScaler`` uses), so the fused
      kernel itself leaves every weight and optimizer state, its step counter included, as they were.
      The host reads the flag one step later (copied to pinned memory behind a CUDA event: reading it
      waits for nothing of the current step), and at the end of training
      (:func:`check_nonfinite_at_exit`). A checkpoint written in between holds the last good weights.
    - **any other optimizer**: the host reads the flag before the step (one sync per step: the GPU
      idles while the host then launches the step) and stops there, or drops the step's gradients.

    Off on the fake backend (``torchtitan_ext.runtime.emulate``), whose collectives leave their outputs
    unwritten. Steps are counted on the host from AdamW's own per-parameter counter at the first call,
    so they are right after a resume too (as long as no step was skipped before it: AdamW does not count
    skipped steps).
    """

    def __init__(self, model_parts, skip: bool = False, hand_offs: HandOffs | None = None):
        # hand_offs: where the loop's clipping leaves its norm, and the run's guards (the TrainSpec's)
        self.model_parts, self.skip = model_parts, skip
        self.hand_offs = hand_offs if hand_offs is not None else HandOffs()
        self.step: int | None = None  # the step being guarded (torchtitan's numbering)
        self._pending = None  # (step, host flag, event): a fused step's flag, read one step later
        self._host_flag = None
        self._replaying = False  # [boost] step_cudagraph replays this guard's captured flag copy
        self.hand_offs.guards.append(self)

    @staticmethod
    def _adam_step(optimizer) -> int:
        for opt in getattr(optimizer, "optimizers", [optimizer]):
            for state in opt.state.values():
                if "step" in state:
                    return int(state["step"])  # a host sync, at the first step only
        return 0

    def __call__(self, optimizer, args, kwargs) -> None:
        import torch
        import torch.distributed as dist

        from boost_titan.parallel.local_shards import local_tensor

        # a norm serves one step: taken at every call (it holds the gradients until then)
        clipped, self.hand_offs.clipped = self.hand_offs.clipped, None
        if dist.is_initialized() and dist.get_backend() == "fake":
            return  # emulation: gradients are garbage by design
        self.check()
        inner = getattr(optimizer, "optimizers", [optimizer])
        self.step = (self._adam_step(optimizer) if self.step is None else self.step) + 1
        params = [p for m in self.model_parts for p in m.parameters() if p.grad is not None]
        grads = [local_tensor(p.grad) for p in params]
        fused = all(_is_fused_adam(opt) for opt in inner)
        if not grads:
            if fused:
                for opt in inner:
                    opt.found_inf = None
            return
        bad = _flag_from_clip(clipped, params)  # 1.0: skip this step
        if bad is None:
            norms = torch._foreach_norm(grads)
            bad = torch.stack(norms).float().sum().isfinite().logical_not().float()
            if dist.is_initialized():
                dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if fused:
            for opt in inner:
                opt.found_inf = bad  # read by Adam.step and passed to the fused kernel
            self._pending = (self.step, *self._to_host(bad))
            return
        if bad.item() == 1.0:
            for p in params:
                p.grad = None  # AdamW skips parameters without a gradient
            self._report(self.step, applied_later=False)

    def replayed(self, first: bool) -> None:
        """``[boost] step_cudagraph`` has just replayed the captured step (``first``: the replay right after
        the capture), whose graph holds this guard's flag copy to pinned memory: arm the read of that flag
        as a step of :meth:`__call__` does. The event recorded inside the capture cannot be waited on, so a
        new one is recorded behind the replay."""
        import torch

        if first:  # a guard that computed no flag in the capture (no gradients, the fake backend) stays off
            self._replaying = self._pending is not None and self._pending[2] is not None
        if not self._replaying:
            return
        if not first:
            self.step += 1
        event = torch.cuda.Event()
        event.record()
        self._pending = (self.step, self._host_flag, event)

    def _to_host(self, flag):
        import torch

        if flag.device.type != "cuda":
            return flag.clone(), None  # computed already
        if self._host_flag is None:
            self._host_flag = torch.empty((), dtype=flag.dtype, pin_memory=True)
        self._host_flag.copy_(flag, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return self._host_flag, event

    def check(self) -> None:
        """Read the flag of the last fused step, if not read yet (that step's work only is waited for)."""
        if self._pending is None:
            return
        step, flag, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        if flag.item() == 1.0:
            self._report(step, applied_later=True)

    def _report(self, step: int, applied_later: bool) -> None:
        if self.skip:
            from torchtitan.tools.logging import logger

            logger.warning(f"non-finite gradient at step {step}: step skipped (weights and optimizer state kept)")
            return
        what = ("its optimizer step was not applied; stopping" if applied_later
                else "stopping before its optimizer step")
        sys.stderr.write(f"non-finite loss or gradient at step {step}: {what}, so no checkpoint holds a non-finite "
                         "state (resume from the last one; [boost] skip_nonfinite_steps = true skips such steps "
                         "instead)\n")
        sys.stderr.flush()
        raise SystemExit(3)


def _flag_from_clip(clipped, params):
    """1.0 / 0.0 from the noted norm if it covers exactly these parameters' gradients, unchanged since;
    else None."""
    from boost_titan.parallel.local_shards import local_tensor

    if clipped is None:
        return None
    norm, seen = clipped
    grads = [p.grad for p in params]
    if len(grads) != len(seen) or any(g is not s or local_tensor(g)._version != v for g, (s, v) in zip(grads, seen)):
        return None
    return norm.isfinite().logical_not().float()


def _is_fused_adam(opt) -> bool:
    import torch

    return isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)) and all(g.get("fused") for g in opt.param_groups)


def check_nonfinite_at_exit(hand_offs: HandOffs) -> None:
    """The last step's flag of every sync-free guard of the run (the loop has ended without another step
    to read it)."""
    for guard in hand_offs.guards:
        guard.check()


def with_nonfinite_guard(build_optimizers, hand_offs: HandOffs):
    """The family's optimizer builder with a :class:`NonFiniteGuard` as a step pre-hook of what it
    builds (``[boost] skip_nonfinite_steps`` read from ``hand_offs``: torchtitan hands the builder only
    the ``[optimizer]`` section)."""

    def build(model_parts, optimizer_config, parallel_dims, ft_manager=None):
        optimizers = build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)
        optimizers.register_step_pre_hook(NonFiniteGuard(model_parts, skip=hand_offs.boost.skip_nonfinite_steps,
                                                         hand_offs=hand_offs))
        return optimizers

    return build
