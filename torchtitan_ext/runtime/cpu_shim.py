"""Let torchtitan 0.2.2's stock training loop run on CPU with gloo (CI, laptops).

Imported by ``torchtitan_ext`` only when CUDA is absent. torchtitan assumes an accelerator in a few
module-level globals (``device_type`` falls back to "cuda"); this points them at the CPU, gives the
memory monitor a CUDA-like ``memory_stats`` backed by the process RSS, and drops the ``None``
profiler activity torchtitan passes when no accelerator exists. FSDP's gloo reduce-scatter needs a
plain SUM (gloo rejects PREMUL_SUM): see :func:`torchtitan_ext.cola_llama.parallelize.apply_fsdp`.
"""

from __future__ import annotations

import resource
import sys
import types

import torch


def _total_memory() -> int:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) * 1024


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda``-style calls torchtitan makes."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def set_device(self, device=None):
        pass

    def current_device(self):
        return 0

    def synchronize(self, device=None):
        pass

    def get_device_name(self, device=None):
        return "CPU"

    def get_device_properties(self, device=None):
        return types.SimpleNamespace(total_memory=_total_memory(), name="CPU")

    def reset_peak_memory_stats(self, device=None):
        pass

    def empty_cache(self):
        pass

    def memory_stats(self, device=None):
        peak = _peak_rss()
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak,
                "num_alloc_retries": 0, "num_ooms": 0}


class _Profile(torch.profiler.profile):
    def __init__(self, *args, activities=None, **kwargs):
        super().__init__(*args, activities=[a for a in activities or [] if a is not None] or None, **kwargs)


def install() -> None:
    """The patches ``cpu_device_type``, ``cpu_device_module`` and ``cpu_profiler_activities`` (torchtitan_ext/patches.py)."""
    from torchtitan_ext import patches

    cpu = _CPUDeviceModule("torchtitan_cpu_device")
    # torchtitan.tools.utils holds the globals; these modules took their own copies at import
    for name in ("torchtitan.tools.utils", "torchtitan.distributed.utils", "torchtitan.distributed.parallel_dims",
                 "torchtitan.components.metrics", "torchtitan.tools.profiling"):
        __import__(name)
        module = sys.modules[name]
        if hasattr(module, "device_type"):
            patches.apply("cpu_device_type", "cpu", owner=module)
        if hasattr(module, "device_module"):
            patches.apply("cpu_device_module", cpu, owner=module)
    # torchtitan builds it as torch.profiler.profile(...): patched process-wide, CPU-only runs alone
    patches.apply("cpu_profiler_activities", _Profile)
