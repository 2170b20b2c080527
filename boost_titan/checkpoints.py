"""A trained model in one process, from either kind of folder training leaves:

- a DCP checkpoint of torchtitan's loop (``<dump_folder>/checkpoint/step-N``, full or model-only, from
  any layout: DCP reassembles the full tensors from the shards), given its flavor;
- a Hugging Face directory (``--checkpoint.last_save_in_hf``, or boost_titan.hf.save_hf): config.json
  says the shapes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from boost_titan.models import FLAVORS, Transformer, TransformerArgs


def load_model(path: str | Path, flavor: str | None = None, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> Transformer:
    """The model saved at ``path``, in eval mode. ``flavor`` is needed for DCP checkpoints only (their
    vocabulary size is read from the checkpoint)."""
    path = Path(path)
    if (path / "config.json").is_file():
        from boost_titan.hf import load_hf

        args, state = load_hf(path)
    elif (path / ".metadata").is_file():
        args, state = _load_dcp(path, flavor)
    else:
        raise FileNotFoundError(f"{path} is neither a DCP checkpoint (no .metadata) nor a Hugging Face "
                                "directory (no config.json)")
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device=device)
    model.init_weights(torch.device(device))  # the RoPE table; every parameter is overwritten below
    missing, unexpected = model.load_state_dict(state, strict=False)
    if args.tie_embeddings:
        missing = [k for k in missing if k != "output.weight"]
    if missing or unexpected:
        raise KeyError(f"{path}: checkpoint and flavor disagree: missing {missing}, unexpected {unexpected}")
    return model.to(dtype).eval()


def _load_dcp(path: Path, flavor: str | None) -> tuple[TransformerArgs, dict[str, torch.Tensor]]:
    import torch.distributed.checkpoint as dcp

    if flavor is None:
        raise ValueError(f"{path} is a DCP checkpoint: name its flavor (e.g. --flavor debugmodel)")
    meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    if "tok_embeddings.weight" not in meta:
        raise KeyError(f"{path} holds no model weights (no tok_embeddings.weight): a pipeline stage's or "
                       "another family's checkpoint?")
    args = FLAVORS[flavor].replace(vocab_size=meta["tok_embeddings.weight"].size[0])
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Transformer(args).state_dict().items()}
    absent = [k for k in shapes if k not in meta and not (k == "output.weight" and args.tie_embeddings)]
    if absent:
        raise KeyError(f"{path} lacks {absent[:3]}{'…' if len(absent) > 3 else ''}: not flavor {flavor!r}?")
    mismatched = [f"{k} {tuple(meta[k].size)} vs {shape}" for k, shape in shapes.items()
                  if k in meta and tuple(meta[k].size) != shape]
    if mismatched:
        raise ValueError(f"{path} does not hold flavor {flavor!r} (checkpoint vs flavor): {mismatched[:3]}")
    state = {k: torch.empty(shape, dtype=torch.float32) for k, shape in shapes.items() if k in meta}
    dcp.load(state, checkpoint_id=str(path))  # one process, no process group: full tensors
    return args, state
