"""What the family's runs print: progress on every step line, and none of the known-irrelevant noise.

* :class:`ProgressMetricsProcessor` (the TrainSpec's metrics processor) appends ``[n/N, elapsed,
  ETA]`` to torchtitan's step line, and ``mfu: n/a`` where torchtitan knows no peak (CPU), keeping the
  line's fields as torchtitan prints them (log parsers keep working).
* :func:`quiet` drops messages that say nothing about a run of this family: on CPU, torchtitan's
  ``lspci`` probe and its A100 peak-FLOPS fallback (MFU is n/a there), DTensor's RNG and gloo's
  timeout warnings; everywhere, torchdata's ``set_vital`` deprecation (torchtitan's call, not ours).
  ``parallelize_cola`` drops torchtitan's "Mixed precision training is disabled" where it gave a
  TP/PP layout mixed precision itself (it logs which mechanism applies instead).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import time
import warnings

import torch
from torchtitan.components.metrics import MetricsProcessor

from torchtitan_ext.log_filter import DropMessages, drop

_CPU_NOISE = ("Error running lspci", "Peak flops undefined for: CPU", "Peak FLOPS used for computing MFU")
_ROOT = logging.getLogger()  # torchtitan logs through the root logger


def quiet() -> None:
    """Install the filters (idempotent; called when the family is registered)."""
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    if not torch.cuda.is_available():
        warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support on cpu")
        warnings.filterwarnings("ignore", message=r"DTensor manual_seed\(\) may not have complete support on cpu")
        warnings.filterwarnings("ignore", message="Set timeout is now only supported for either nccl or gloo")
        if not any(isinstance(f, DropMessages) and f.prefixes == _CPU_NOISE for f in _ROOT.filters):
            drop(_CPU_NOISE)


class _EditStepLine(logging.Filter):
    """Rewrites the next step line logged: MFU → n/a if asked, then the progress suffix."""

    def __init__(self, suffix: str, mfu_na: bool):
        super().__init__()
        self.suffix, self.mfu_na = suffix, mfu_na

    def filter(self, record):
        msg = record.getMessage()
        if re.search(r"step:\s*\d+\s+\S*loss:", msg) and "validate" not in msg:
            if self.mfu_na:
                msg = re.sub(r"mfu: [\d.]+%", "mfu: n/a", msg)
            record.msg, record.args = msg + self.suffix, ()
        return True


@contextlib.contextmanager
def _editing(suffix: str, mfu_na: bool):
    edit = _EditStepLine(suffix, mfu_na)
    _ROOT.addFilter(edit)
    try:
        yield
    finally:
        _ROOT.removeFilter(edit)


def eta_text(step: int, total: int, first_step: int, first_time: float, now: float) -> str:
    """``[step/total, elapsed h:mm:ss, ETA h:mm:ss]``; the pace is measured from ``first_step`` (the first
    logged step, whose time includes compilation and warm-up) on."""
    fmt = lambda s: str(datetime.timedelta(seconds=round(s)))  # noqa: E731
    elapsed = now - first_time
    if step <= first_step:
        return f"  [{step}/{total}, eta n/a]"
    remaining = (total - step) * elapsed / (step - first_step)
    return f"  [{step}/{total}, {fmt(elapsed)} elapsed, eta {fmt(remaining)}]"


class ProgressMetricsProcessor(MetricsProcessor):
    def __init__(self, job_config, parallel_dims, tag=None):
        super().__init__(job_config, parallel_dims, tag)
        self.total_steps = job_config.training.steps
        self.mfu_na = not torch.cuda.is_available()
        self._first: tuple[int, float] | None = None

    def log(self, step, *args, **kwargs):
        now = time.perf_counter()
        if self._first is None:
            self._first = (step, now)
        with _editing(eta_text(step, self.total_steps, *self._first, now), self.mfu_na):
            super().log(step, *args, **kwargs)


def build_metrics_processor(job_config, parallel_dims, model_args=None, tag=None) -> ProgressMetricsProcessor:
    return ProgressMetricsProcessor(job_config, parallel_dims, tag)
