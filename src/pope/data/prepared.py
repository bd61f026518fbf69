"""The on-disk prepared-data format and its reader (the atomic writer is pope.data.writer).

A prepared dataset is a directory::

    DIR/manifest.json          vocabulary, token counts, sha256 of every file, source + library versions,
                               the request that produced it, and ``"complete": true`` (written last)
    DIR/{split}.bin            flat token ids, uint16 when vocab_size < 65536 else uint32 (raw memmap)
    DIR/{split}.docs.npy       int64 document offsets into {split}.bin, length n_docs + 1

Writing goes to a sibling temporary directory that is renamed onto DIR only after every file and the
manifest are on disk, so an interrupted prepare never leaves a DIR whose manifest claims completeness.
A prepare never deletes a file it did not create (a ``.pope-dataset`` marker lists its own; see
pope.data.writer).
Reading is cheap (numpy memmaps); :meth:`PreparedDataset.verify` re-hashes the files on demand.

This module needs only numpy: builders with heavy dependencies live in sibling modules.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from pope.data import registry  # light: only names and lazy builders
from pope.data.paths import data_root
from pope.files import sha256_file

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
STANDARD_SPLITS = ("train", "valid", "test")


class DamagedDatasetError(ValueError):
    """A prepared file does not match its manifest (modified or corrupted); ``problem`` is the message
    without the fix, for callers that fix it themselves (a prepare rebuilds)."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab < 65536), else uint32."""
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    if vocab_size >= 2**32:
        raise ValueError(f"vocab_size {vocab_size} does not fit uint32 token ids")
    return np.dtype(np.uint16) if vocab_size < 2**16 else np.dtype(np.uint32)


def file_fingerprint(paths: Iterable[str | os.PathLike]) -> str:
    """Cheap identity of source files (path, size, mtime) for idempotence checks; not a content hash."""
    digest = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def check_max_docs(max_docs: int | None) -> None:
    """``max_docs`` is None (every document) or a positive integer; checked before any download."""
    if max_docs is not None and (isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs < 1):
        raise ValueError(
            f"max_docs (--max-docs) must be a positive integer, or None for every document; got {max_docs!r}"
        )


def stable_order_key(item_id: str) -> str:
    """Deterministic, library-version-independent shuffle key for split assignment (sha256 of the id)."""
    return hashlib.sha256(item_id.encode("utf-8")).hexdigest()


def split_counts(n_items: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Items per (train, valid, test) for `fractions`; valid/test get at least one item when n >= 3."""
    if n_items <= 0:
        raise ValueError("cannot split an empty collection: the source produced no items")
    if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) < 0:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions}")
    n_valid = int(round(n_items * fractions[1]))
    n_test = int(round(n_items * fractions[2]))
    if n_items >= 3:
        n_valid = max(n_valid, 1 if fractions[1] > 0 else 0)
        n_test = max(n_test, 1 if fractions[2] > 0 else 0)
    n_train = n_items - n_valid - n_test
    if n_train < 1:
        raise ValueError(f"{n_items} items are too few for a train/valid/test split {fractions}")
    return n_train, n_valid, n_test


def assign_splits(item_ids: Iterable[str], fractions: tuple[float, float, float]) -> dict[str, str]:
    """Map each id to "train"/"valid"/"test": order by sha256(id), then cut by `fractions`.

    Deterministic across machines and library versions; whole items (pieces, files, regions) stay in
    one split, so splits never share an item.
    """
    ids = sorted(set(item_ids), key=stable_order_key)
    n_train, n_valid, _ = split_counts(len(ids), fractions)
    assignment = {}
    for rank, item_id in enumerate(ids):
        assignment[item_id] = "train" if rank < n_train else "valid" if rank < n_train + n_valid else "test"
    return assignment


def library_version(distribution: str) -> str | None:
    """Installed version of a distribution (for manifests), None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def warn(message: str) -> None:
    """User-visible notice on stderr (skipped inputs etc.); the same facts also go into the manifest."""
    print(f"pope data: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class TokenSplit:
    """One split: `tokens` (n_tokens,) memmap and `doc_offsets` (n_docs + 1,) int64 boundaries."""

    name: str
    tokens: np.memmap
    doc_offsets: np.ndarray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_docs(self) -> int:
        return int(self.doc_offsets.shape[0] - 1)

    def document(self, index: int) -> np.ndarray:
        """Tokens of document `index` (a view into the memmap)."""
        if not -self.n_docs <= index < self.n_docs:
            raise IndexError(f"document {index} out of range: split {self.name!r} has {self.n_docs} documents")
        index %= self.n_docs
        return self.tokens[self.doc_offsets[index] : self.doc_offsets[index + 1]]

    def document_lengths(self) -> np.ndarray:
        return np.diff(self.doc_offsets)


class TokenRangeShift:
    """Train-time augmentation: add one random shift s to every token id inside [low, high].

    Used for MAESTRO pitch transposition (REMI Pitch tokens are a contiguous id range ordered by pitch,
    so shifting the id by s transposes by s semitones). s is uniform over the shifts in
    {-max_shift..+max_shift} that keep every shifted token of this sequence inside [low, high]
    (s = 0 is always allowed), so pitches never leave the vocabulary's range.
    """

    def __init__(self, low: int, high: int, max_shift: int):
        if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
            raise ValueError(f"TokenRangeShift needs integer ids 0 <= low <= high, got low={low!r} high={high!r}")
        if not isinstance(max_shift, int) or max_shift < 0:
            raise ValueError(f"max_shift must be a non-negative integer, got {max_shift!r}")
        self.low, self.high, self.max_shift = low, high, max_shift

    def allowed_shifts(self, tokens: np.ndarray) -> np.ndarray:
        in_range = tokens[(tokens >= self.low) & (tokens <= self.high)]
        shifts = np.arange(-self.max_shift, self.max_shift + 1)
        if in_range.size == 0:
            return shifts[shifts == 0]
        lowest, highest = int(in_range.min()), int(in_range.max())
        return shifts[(lowest + shifts >= self.low) & (highest + shifts <= self.high)]

    def __call__(self, tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        tokens = np.asarray(tokens)
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"token ids must be an integer array, got dtype {tokens.dtype}")
        shift = int(rng.choice(self.allowed_shifts(tokens)))
        shifted = tokens.astype(np.int64, copy=True)
        shifted[(shifted >= self.low) & (shifted <= self.high)] += shift
        return shifted.astype(tokens.dtype, copy=False)

    def __repr__(self) -> str:
        return f"TokenRangeShift(low={self.low}, high={self.high}, max_shift={self.max_shift})"


def _build_transform(spec: dict | None) -> Callable[[np.ndarray, np.random.Generator], np.ndarray] | None:
    if spec is None:
        return None
    kind = spec.get("name")
    if kind == "token_range_shift":
        return TokenRangeShift(int(spec["low"]), int(spec["high"]), int(spec["max_shift"]))
    raise ValueError(f"manifest names an unknown train_transform {kind!r}; upgrade pope or re-prepare the data")


class PreparedDataset:
    """Reader for a prepared dataset directory (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.reused = False  # set by reuse_if_prepared when a prepare call found it already built
        manifest_path = self.path / MANIFEST_NAME
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(
                f"{self.path} is a file, not a prepared dataset directory; give the directory that "
                f"`pope data prepare` wrote (it holds {MANIFEST_NAME}) or a dataset name"
            )
        if not self.path.is_dir():
            raise FileNotFoundError(
                f"prepared dataset directory {self.path} does not exist; "
                f"create it with `pope data prepare NAME --out {self.path}`"
            )
        if not manifest_path.is_file():
            raise FileNotFoundError(
                f"{self.path} has no {MANIFEST_NAME}: it is not a prepared dataset "
                f"(or its prepare was interrupted); run `pope data prepare` again"
            )
        try:
            self.manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(
                f"{manifest_path} is not valid JSON ({err}); rebuild the dataset with "
                f"`pope data prepare NAME --out {self.path} --force`"
            ) from err
        if not isinstance(self.manifest, dict) or self.manifest.get("complete") is not True:
            raise ValueError(
                f"{manifest_path} does not claim completeness (interrupted prepare?); rebuild the "
                f"dataset with `pope data prepare NAME --out {self.path} --force`"
            )
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{manifest_path} has format_version {self.manifest.get('format_version')!r}, "
                f"this pope reads {FORMAT_VERSION}; rebuild it with `{prepare_command(self)}`"
            )
        _check_manifest_fields(self.manifest, manifest_path)
        self.token_dtype = np.dtype(self.manifest["dtype"])
        if self.token_dtype != token_dtype_for(self.vocab_size):
            raise ValueError(f"{manifest_path}: dtype {self.token_dtype} does not match vocab size {self.vocab_size}")
        self._splits: dict[str, TokenSplit] = {}
        for _name, info in self.manifest["splits"].items():  # cheap size checks now, hashes in verify()
            expected = info["n_tokens"] * self.token_dtype.itemsize
            actual = (
                (self.path / info["tokens_file"]).stat().st_size if (self.path / info["tokens_file"]).exists() else -1
            )
            if actual != expected:
                state = "is missing" if actual < 0 else f"has {actual} bytes, the manifest expects {expected}"
                raise DamagedDatasetError(
                    f"{self.path / info['tokens_file']} {state} (modified or truncated)",
                    f"rebuild the dataset with `{prepare_command(self)}`",
                )

    # -- metadata
    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab"]["size"])

    @property
    def pad_id(self) -> int | None:
        return self.manifest["vocab"].get("pad_id")

    @property
    def seq_len(self) -> int | None:
        """The context length the paper trains this data at (a training window; documents may be longer)."""
        return self.manifest.get("seq_len")

    @property
    def vocabulary(self) -> list[str] | None:
        """Token strings by id, when the manifest stores them (small vocabularies); else None."""
        return self.manifest["vocab"].get("tokens")

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(self.manifest["splits"])

    @property
    def train_transform(self) -> Callable[[np.ndarray, np.random.Generator], np.ndarray] | None:
        """None, or callable(tokens, rng) -> tokens applied to training sequences (e.g. MAESTRO transposition)."""
        return _build_transform(self.manifest.get("train_transform"))

    def split(self, name: str) -> TokenSplit:
        if name not in self.manifest["splits"]:
            raise ValueError(
                f"dataset {self.name!r} at {self.path} has no split {name!r}; available: {', '.join(self.split_names)}"
            )
        if name not in self._splits:
            info = self.manifest["splits"][name]
            n_tokens = int(info["n_tokens"])
            if n_tokens:
                tokens = np.memmap(self.path / info["tokens_file"], dtype=self.token_dtype, mode="r", shape=(n_tokens,))
            else:  # numpy cannot memmap an empty file
                tokens = np.zeros((0,), dtype=self.token_dtype)
            docs_path = self.path / info["docs_file"]
            try:
                offsets = np.load(docs_path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as err:
                raise DamagedDatasetError(
                    f"{docs_path} is unreadable ({err}): modified or corrupted",
                    f"rebuild the dataset with `{prepare_command(self)}`",
                ) from err
            if offsets.ndim != 1 or offsets.shape[0] != info["n_docs"] + 1 or offsets[-1] != n_tokens:
                raise DamagedDatasetError(
                    f"{docs_path} does not match the manifest (modified or corrupted)",
                    f"rebuild the dataset with `{prepare_command(self)}`",
                )
            self._splits[name] = TokenSplit(name=name, tokens=tokens, doc_offsets=offsets)
        return self._splits[name]

    def verify(self, splits: Iterable[str] | None = None) -> None:
        """Re-hash every file (of ``splits``, default all) against the manifest's sha256; raise
        DamagedDatasetError (a ValueError) naming the first file that differs and the command that rebuilds it."""
        for name in self.split_names if splits is None else splits:
            info = self.manifest["splits"][name]
            for key in ("tokens_file", "docs_file"):
                file_path = self.path / info[key]
                fix = f"rebuild the dataset with `{prepare_command(self)}`"
                if not file_path.is_file():
                    raise DamagedDatasetError(f"{file_path} is missing", fix)
                actual, expected = sha256_file(file_path), info["sha256"][info[key]]
                if actual != expected:
                    raise DamagedDatasetError(
                        f"{file_path} was modified or corrupted: checksum mismatch (sha256 "
                        f"{actual[:12]}…, the manifest says {expected[:12]}…)",
                        fix,
                    )

    def check_own_vocabulary(self, split: str, tokens: np.ndarray | None = None) -> None:
        """Raise DamagedDatasetError when ``split`` (or ``tokens`` read from it) holds an id at or above the
        dataset's own vocabulary size: no prepare writes one, so a file was modified or corrupted (the split
        is re-hashed first, so the message names the file whose checksum differs). A cheap check for callers
        that do not hash (the trainer); whether ids fit a *model's* vocabulary is the caller's own check."""
        tokens = np.asarray(self.split(split).tokens if tokens is None else tokens)
        max_id = int(tokens.max(initial=0)) if tokens.size else 0
        if max_id >= self.vocab_size:
            self.verify([split])
            raise DamagedDatasetError(
                f"split {split!r} of {self.path} holds token id {max_id:,}, outside the "
                f"dataset's own vocabulary of {self.vocab_size:,} (modified or corrupted)",
                f"rebuild the dataset with `{prepare_command(self)}`",
            )

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={self.manifest['splits'][s]['n_tokens']}" for s in self.split_names)
        return f"PreparedDataset({str(self.path)!r}, vocab_size={self.vocab_size}, tokens: {sizes})"


def _check_manifest_fields(manifest: dict, manifest_path: Path) -> None:
    """DamagedDatasetError naming the first field a reader needs that is missing or of the wrong type."""

    def fail(what: str):
        raise DamagedDatasetError(
            f"{manifest_path} is damaged: {what}",
            f"rebuild the dataset with `pope data prepare NAME --out {manifest_path.parent} --force`",
        )

    def need(container: dict, key: str, kind: type, where: str = ""):
        value = container.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            fail(f"{where}{key} is missing or not a {kind.__name__}")
        return value

    need(manifest, "name", str)
    need(need(manifest, "vocab", dict), "size", int, "vocab.")
    if need(manifest, "dtype", str) not in ("uint16", "uint32"):
        fail(f"dtype {manifest['dtype']!r} is not uint16 or uint32")
    for split in need(manifest, "splits", dict):
        info = need(manifest["splits"], split, dict, "splits.")
        for key, kind in (("n_tokens", int), ("n_docs", int), ("tokens_file", str), ("docs_file", str)):
            need(info, key, kind, f"splits.{split}.")
        hashes = need(info, "sha256", dict, f"splits.{split}.")
        for key in ("tokens_file", "docs_file"):
            need(hashes, info[key], str, f"splits.{split}.sha256.")


def prepare_command(dataset: PreparedDataset) -> str:
    """The command that rebuilds ``dataset`` in place (named as `pope data prepare` knows it)."""
    request = dataset.manifest.get("request") or {}
    name = str(request.get("dataset") or dataset.name)
    if name == "genome" and "hf" in request:
        name = "genome-hf"
    return f"pope data prepare {name} --out {dataset.path} --force"


def resolve_dataset(name_or_path: str | os.PathLike, *, prepare_if_missing: bool = False) -> PreparedDataset:
    """A PreparedDataset from a directory path, or from a name looked up under :func:`data_root`.

    With ``prepare_if_missing`` a known name that is not prepared yet is prepared from its default
    (offline) source first.
    """
    candidate = Path(name_or_path).expanduser()
    looks_like_path = os.sep in str(name_or_path) or str(name_or_path).startswith((".", "~"))
    if looks_like_path or (candidate / MANIFEST_NAME).is_file():
        return PreparedDataset(candidate)
    try:
        canonical = registry.canonical_name(str(name_or_path))
    except ValueError:
        if candidate.exists():  # a directory (or file) that is not a prepared dataset: say so
            return PreparedDataset(candidate)
        raise
    target = data_root() / canonical
    if not (target / MANIFEST_NAME).is_file() and prepare_if_missing:
        registry.prepare(canonical, out_dir=target)
    if not target.is_dir():
        raise FileNotFoundError(
            f"dataset {name_or_path!r} is not prepared under {data_root()} "
            f"(set POPE_DATA_DIR to look elsewhere); run `pope data prepare {canonical}`"
        )
    return PreparedDataset(target)
