"""``llama3_peer``: torchtitan's own Llama 3 (its model, ``parallelize_llama``, loss and optimizers) at our
dense twins' shapes, fed by this package's offline data, as a reference row for the benchmarks.

Our dense twin (``<size>_fullrank``, ``[boost] tp_strategy = "fullrank"``) must train at least as fast
as torchtitan's llama3 does at the same shape; ``--model.name llama3_peer --model.flavor 7B`` runs the
latter through the same loop and configs (``scripts.bench.e2e``'s ``llama3_peer`` variants). Flavors:
the dense twins' dims, heads, FFN width and vocabulary (torchtitan derives the FFN width from ``dim``
and ``multiple_of``; the one that gives the twin's is picked), untied embeddings (torchtitan's llama3 has no tying: one
more ``vocab × dim`` matrix than the tied twin, the same GEMMs). Synthetic tokens only
(``training.dataset = "synthetic"``): torchtitan's own loader would download its dataset.

torchtitan 0.2.2 runs a tp-only layout without FSDP in fp32 (its mixed precision is FSDP's); our
family runs it in bf16 through a 1-rank FSDP wrapper. Compare the two where FSDP shards (dp ≥ 2).
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

from boost_titan.models import FLAVORS
from torchtitan_ext.cola_llama.data import build_dataloader, build_tokenizer

NAME = "llama3_peer"


def _peer(flavor: str) -> TransformerModelArgs:
    twin = FLAVORS[f"{flavor}_fullrank"]
    # torchtitan's FFN width: int(2/3 · 4d) rounded up to a multiple of multiple_of
    width = int(2 * 4 * twin.dim / 3)
    multiple = next(m for m in (256, 128, 64, 32, 16, 8) if -(-width // m) * m == twin.ffn_dim)
    return TransformerModelArgs(dim=twin.dim, n_layers=twin.n_layers, n_heads=twin.n_heads,
                                vocab_size=twin.vocab_size, multiple_of=multiple)


PEER_FLAVORS = {name: _peer(name) for name in ("debugmodel", "1B", "7B", "13B")}


def register() -> None:
    """Idempotent. torchtitan's llama3 spec with our flavors and offline synthetic data."""
    try:
        get_train_spec(NAME)
    except ValueError:
        spec = dataclasses.replace(get_train_spec("llama3"), model_args=PEER_FLAVORS,
                                   build_dataloader_fn=build_dataloader, build_tokenizer_fn=build_tokenizer,
                                   build_validator_fn=None)
        register_train_spec(NAME, spec)
