"""torchtitan's state-dict adapter for the family: ``--checkpoint.last_save_in_hf`` and
``--checkpoint.initial_load_in_hf`` (boost_titan.hf.convert does the renaming; docs/hf_export.md).

torchtitan calls ``to_hf`` on the model's state dict (DTensors under TP / FSDP, one pipeline stage's
keys) both to save and, before loading, to name what to read; after DCP has filled those tensors it
calls ``from_hf`` and loads the result into the model. The adapter works on full tensors: ``to_hf``
gathers each DTensor (every rank of its mesh calls it in the same order), ``from_hf`` hands each
rank back a DTensor with the layout it was given (its own shard of the full tensor, no
communication), so any layout loads any export.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torchtitan.protocols.state_dict_adapter import StateDictAdapter

from boost_titan.hf import convert


class ColaStateDictAdapter(StateDictAdapter):
    def __init__(self, model_args, hf_assets_path: str | None):
        # not StateDictAdapter's: it looks for a model.safetensors.index.json in hf_assets_path (and
        # warns at every start without one) to shard saves the way that index does; ours are one file
        self.model_args, self.hf_assets_path, self.fqn_to_index_mapping = model_args, hf_assets_path, None
        self._layouts: dict[str, tuple[Any, Any] | None] = {}  # key → (mesh, placements) of the last to_hf

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        self._layouts = {k: (v.device_mesh, v.placements) if isinstance(v, DTensor) else None
                         for k, v in state_dict.items()}
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state_dict.items()}
        return convert.to_hf(full, self.model_args)

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        ours = convert.from_hf(hf_state_dict, self.model_args, keys=list(self._layouts) or None)
        for key, value in ours.items():
            if layout := self._layouts.get(key):
                mesh, placements = layout
                ours[key] = distribute_tensor(value, mesh, placements, src_data_rank=None)
        return ours


def write_metadata_after_hf_save(checkpointer, model_args) -> None:
    """Make torchtitan's HF saves complete Hugging Face directories: after the weights (consolidated
    into ``model-00001-of-00001.safetensors`` by DCP's coordinator, rank 0), rank 0 writes config.json
    (and CoLA's modeling file) into the same folder. Wraps this checkpointer only."""
    from torchtitan_ext import patches

    save = checkpointer.dcp_save

    def dcp_save(state_dict, checkpoint_id, *args, to_hf: bool = False, **kwargs):
        out = save(state_dict, checkpoint_id, *args, to_hf=to_hf, **kwargs)
        if to_hf and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
            dtypes = {v.dtype for v in state_dict.values() if isinstance(v, torch.Tensor)}
            convert.write_hf_metadata(Path(checkpoint_id), model_args,
                                      dtypes.pop() if len(dtypes) == 1 else torch.float32)
            # DCP's writer leaves the per-rank files it consolidated from (same bytes again)
            shutil.rmtree(Path(checkpoint_id) / "sharded", ignore_errors=True)
        return out

    patches.apply("hf_save_writes_config", dcp_save, owner=checkpointer)
