"""Every function of torch or torchtitan this project replaces, in one list, each with the versions it
was written for, why, and the upstream issue it works around.

The replacements themselves live beside the code they serve (the CPU shim, the emulator, the trainer's
hooks, the library's FSDP and optimizer helpers). The family's are installed only through
:func:`apply`, which refuses a name not listed here, or (a method of torchtitan's Trainer) overridden
in the project's Trainer subclass. The library (``boost_titan``, torch-only) cannot import this module:
its per-instance swaps are listed here with ``by`` naming the file that makes them, and a test finds
every swap in the code and checks it is listed. At import :func:`check` resolves every target on the
installed torch and torchtitan: a release that renames or drops one fails here, naming the patch,
instead of running without it.

(Private torch APIs that are *called*, not replaced, go through :mod:`boost_titan.compat`.)
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Patch:
    target: str  # "module:attribute.path" of what is replaced (for instance patches: the class's attribute)
    versions: str  # the releases it was written and tested for
    why: str
    upstream: str  # the issue it works around, or why there is none
    required: bool = True  # False: absent on some supported release, and then not applied (``why`` says)
    instance: bool = False  # replaced on one object the trainer hands us, not on the module or class
    by: str = ""  # the file that makes the replacement, where it is not installed through apply()

    def owner_and_name(self):
        module, path = self.target.split(":")
        *parents, name = path.split(".")
        owner = importlib.import_module(module)
        for parent in parents:
            owner = getattr(owner, parent)
        return owner, name


TORCHTITAN = "torchtitan 0.2.2"
PATCHES: dict[str, Patch] = {
    "cpu_device_type": Patch(
        "torchtitan.tools.utils:device_type", TORCHTITAN,
        "torchtitan picks its device type and module at import and falls back to 'cuda' without an "
        "accelerator; the CPU shim points these globals (and the copies in distributed.utils, "
        "parallel_dims, metrics and profiling) at the CPU (torchtitan_ext/runtime/cpu_shim.py)",
        "none: torchtitan does not support CPU training; this lets its loop run on gloo for CI"),
    "cpu_device_module": Patch(
        "torchtitan.tools.utils:device_module", TORCHTITAN,
        "with cpu_device_type: the device module beside the type (the same modules' copies) becomes a "
        "CPU stand-in with the calls torchtitan makes on it", "none (as above)"),
    "cpu_profiler_activities": Patch(
        "torchtitan.tools.profiling:torch.profiler.profile", TORCHTITAN,
        "torchtitan passes a None profiler activity when no accelerator exists; the shim drops it "
        "(CPU-only processes)", "none: CPU is unsupported upstream"),
    "fake_backend_any_rank": Patch(
        "torchtitan.distributed.utils:init_fake_mode", TORCHTITAN,
        "--comm.mode fake_backend always plays rank 0; the emulator plays any rank (EMULATE_RANK), so a "
        "pipeline layout's later stages can be timed (torchtitan_ext/runtime/emulate.py)",
        "none: a feature torchtitan's fake mode does not have"),
    "pipeline_stage_shape_inference": Patch(
        "torch.distributed.pipelining.stage:PipelineStage._shape_inference", "torch 2.11 (absent from 2.12)",
        "a later pipeline stage learns its input shape from a metadata message the fake backend never "
        "delivers; the emulator answers it (torchtitan_ext/runtime/emulate.py; later torch: only stage 0 is played)",
        "none: the fake backend is not meant to run pipelines", required=False),
    "pipeline_stage_metadata_receive": Patch(
        "torch.distributed.pipelining.stage:dist.recv_object_list", "torch 2.11 (with the one above)",
        "inside that shape inference only: the metadata message is delivered by the emulator",
        "none (as above)"),
    "clip_grad_norm_on_local_shards": Patch(
        "torchtitan.distributed.utils:clip_grad_norm_", TORCHTITAN,
        "the loop's gradient clipping runs on the local shards of DTensor gradients (one foreach norm "
        "instead of a DTensor dispatch per gradient; boost_titan/parallel/local_shards.py) and hands its "
        "norm to the non-finite guard (torchtitan_ext/cola_llama/spec.py)",
        "no hook for it upstream: the loop looks the function up in torchtitan.distributed.utils at every step"),
    "schedule_step_reduces_tied_grads": Patch(
        "torch.distributed.pipelining.schedules:_PipelineSchedule.step", TORCHTITAN + ", torch 2.11-2.14",
        "a tied embedding / lm_head split across pipeline stages: the schedule's step (of this one "
        "schedule) folds the mirror's gradient into the owner's after a train step's last microbatch "
        "(torchtitan_ext/cola_llama/spec.py pipeline_cola)",
        "pytorch/torchtitan#1524 (no plan to support weight tying; #1409, tied weights under pipelining, open)", instance=True),
    "fsdp_foreach_copy_in": Patch(
        "torch.distributed.fsdp._fully_shard._fsdp_collectives:foreach_reduce_scatter_copy_in", "torch 2.11-2.14",
        "FSDP2 packs the gradients for each reduce-scatter with fsdp::chunk_cat, whose host side grows with "
        "the gradients' bytes (14 ms per step for the 7B tp 4 rank, emulated trace); one _foreach_copy_ writes the same "
        "bytes (boost_titan/parallel/fsdp_copy_in.py; FSDP's own function for gradients that need padding)",
        "none filed: chunk_cat's per-block metadata is its design (pytorch#121081)"),
    "sync_free_train_step": Patch(
        "torchtitan.train:Trainer.train_step", TORCHTITAN,
        "overridden in torchtitan_ext/runtime/train.py's Trainer (not through apply): torchtitan's step with pinned "
        "non-blocking batch copies and the token count kept on the device, so the host never waits for the "
        "GPU before the forward; a copy of 0.2.2's logic otherwise (tests/test_torchtitan_e2e.py compares them)",
        "none filed: torchtitan's step syncs by design (the count is read for loss scaling and logging)"),
    "hf_save_writes_config": Patch(
        "torchtitan.components.checkpoint:CheckpointManager.dcp_save", TORCHTITAN,
        "torchtitan's HF save writes the weights only; this checkpointer's save also writes config.json "
        "(and CoLA's modeling file) so the folder loads in transformers (torchtitan_ext/cola_llama/state_dict_adapter.py)",
        "none: torchtitan's HF export targets its own model families, whose configs exist upstream",
        instance=True),
    "one_rank_fsdp_unshard": Patch(
        "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup.wait_for_unshard", "torch 2.11-2.14",
        "on a 1-rank mesh (mixed precision for tp/pp layouts without data sharding) FSDP2 casts and copies "
        "each parameter with its own two kernels; the group's method becomes one foreach copy of all of them "
        "(FSDP's own method for anything else)", "none filed: a 1-rank FSDP mesh is an unusual use",
        instance=True, by="boost_titan/parallel/one_rank_fsdp.py"),
    "one_rank_fsdp_post_backward": Patch(
        "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup.post_backward", "torch 2.11-2.14",
        "the same groups: the gradients are cast into the fp32 master gradients with one foreach copy, then "
        "FSDP's own post_backward reshards with nothing left to reduce", "none filed (as above)",
        instance=True, by="boost_titan/parallel/one_rank_fsdp.py"),
    "optimizer_steps_on_local_shards": Patch(
        "torch.optim:AdamW.step", "torch 2.11-2.14",
        "an Adam / AdamW built by torchtitan gets a subclass as its __class__ whose step runs on the local "
        "shards of DTensor parameters (one foreach step instead of a DTensor dispatch per parameter)",
        "none: DTensor's per-op dispatch is its design", instance=True, by="boost_titan/parallel/local_shards.py"),
}


def check() -> None:
    """Every required target resolves on the installed releases (one error naming the first that does not)."""
    for name, patch in PATCHES.items():
        try:
            owner, attr = patch.owner_and_name()
            getattr(owner, attr)
        except (ImportError, AttributeError) as e:
            if patch.required:
                tt = importlib.metadata.version("torchtitan")
                raise RuntimeError(f"patch {name!r} ({patch.versions}) cannot find {patch.target} on torch "
                                   f"{torch.__version__} / torchtitan {tt} ({e}): this release is not supported; "
                                   f"see torchtitan_ext/patches.py") from None


def available(name: str) -> bool:
    """Whether the target of ``name`` exists on the installed releases (for the optional ones)."""
    owner, attr = PATCHES[name].owner_and_name()
    return hasattr(owner, attr)


def apply(name: str, value, owner=None):
    """Replace the target of the listed patch ``name`` with ``value`` (on ``owner``: the object of an
    instance patch, or another module holding its own copy of a global); returns what was there."""
    patch = PATCHES[name]  # KeyError: not a listed patch
    default_owner, attr = patch.owner_and_name()
    if patch.instance and owner is None:
        raise ValueError(f"patch {name!r} replaces {attr} on one object: pass owner=")
    owner = default_owner if owner is None else owner
    original = getattr(owner, attr)
    setattr(owner, attr, value)
    return original


check()
