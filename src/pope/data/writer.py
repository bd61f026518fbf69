"""Writing prepared datasets: the atomic writer, idempotent reuse, and the rule that nothing is lost.

A prepare writes into a sibling temporary directory and publishes it onto ``DIR`` only when every file
and the manifest are on disk (see :mod:`pope.data.prepared` for the format). It never deletes what it
did not create:

* every directory it publishes holds a marker file, ``.pope-dataset``, listing the files it wrote;
* over an existing ``DIR`` it replaces only files that marker (or, for datasets written before the
  marker existed, a valid manifest) lists, and keeps every other file, saying so;
* a non-empty ``DIR`` without a marker is refused, naming what would be overwritten, unless ``force``
  (then only the files a prepare writes -- manifest.json, SPLIT.bin, SPLIT.docs.npy -- are replaced);
* temporary ``.DIR.partial-*`` siblings are removed only when they carry the marker.

The writer alone does not serialise two prepares of one ``DIR`` (a new writer removes the marked
partials it finds); :func:`pope.data.registry.prepare`, which every ``pope data prepare`` and
``resolve_dataset(prepare_if_missing=True)`` goes through, holds ``pope.files.exclusive_lock(DIR)``
around the whole check-then-write, so concurrent prepares take turns and reuse the first one's result.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from pope.data.prepared import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    STANDARD_SPLITS,
    PreparedDataset,
    prepare_command,
    token_dtype_for,
    warn,
)
from pope.files import check_output_dir, fsync_dir, sha256_file, write_json_atomic
from pope.version import __version__

MARKER_NAME = ".pope-dataset"
_PARTIAL_MARKER = ".partial-"


# ------------------------------------------------------------------------------------- ownership
def written_names(split_names: Iterable[str]) -> set[str]:
    """The file names a prepare with these splits writes into its directory."""
    return {MANIFEST_NAME, MARKER_NAME} | {f"{s}{ext}" for s in split_names for ext in (".bin", ".docs.npy")}


def owned_names(out_dir: Path) -> set[str] | None:
    """Names in ``out_dir`` that a prepare created (from its marker, else from a valid pope manifest);
    None when nothing says the directory was made by ``pope data prepare``."""
    try:
        marker = json.loads((out_dir / MARKER_NAME).read_text())
        return {MARKER_NAME, *marker["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:  # a dataset written before the marker existed: its manifest lists its files
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
        if manifest.get("format_version") == FORMAT_VERSION and manifest.get("complete") is True:
            return {MANIFEST_NAME} | {
                info[key] for info in manifest["splits"].values() for key in ("tokens_file", "docs_file")
            }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def _listing(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def replacement_plan(
    out_dir: Path, split_names: Iterable[str] = STANDARD_SPLITS, *, force: bool = False
) -> tuple[list[str], list[str]]:
    """(names a prepare into ``out_dir`` would replace, names it keeps); ValueError when it must refuse."""
    if not out_dir.exists():
        return [], []
    if not out_dir.is_dir():
        raise ValueError(f"output {out_dir} exists and is a file; choose a directory for --out")
    present = {p.name for p in out_dir.iterdir()}
    owned = owned_names(out_dir)
    if owned is None:
        if present and not force:
            colliding = present & written_names(split_names)
            would = (
                f"preparing there would overwrite {_listing(colliding)}"
                if colliding
                else "preparing there would add the dataset's files beside them"
            )
            raise ValueError(
                f"output directory {out_dir} was not made by `pope data prepare` (no {MARKER_NAME} "
                f"marker) and holds {_listing(present)}; {would}. Choose a new or empty --out, or "
                f"pass --force to write there (only the dataset's own file names are replaced, "
                f"every other file is kept)"
            )
        owned = written_names(split_names)
    return sorted(present & owned), sorted(present - owned)


def remove_stale_partials(out_dir: Path) -> None:
    """Delete temporary siblings left by a killed prepare of the same target (only those it marked)."""
    for stale in out_dir.parent.glob(f".{out_dir.name}{_PARTIAL_MARKER}*"):
        if stale.is_dir() and (stale / MARKER_NAME).is_file():
            shutil.rmtree(stale, ignore_errors=True)


def _write_marker(directory: Path, files: Iterable[str]) -> None:
    write_json_atomic(directory / MARKER_NAME, {"created_by": "pope data prepare", "files": sorted(files)})


# ---------------------------------------------------------------------------------------- writer
class PreparedWriter:
    """Streams documents into a temporary directory, then publishes it atomically.

    Usage::

        with PreparedWriter(out_dir, vocab_size=90) as writer:
            writer.add_document("train", tokens)   # tokens: 1-D integer array
            ...
            writer.finish(manifest_fields)          # writes manifest (complete: true), publishes onto out_dir

    Leaving the block without ``finish`` (an exception, Ctrl-C) deletes the temporary directory; a
    killed process leaves only a marked ``.NAME.partial-*`` sibling, removed by the next prepare. Over
    an existing ``out_dir`` only files this module created are replaced (module docstring); ``force``
    allows writing into an unmarked non-empty directory.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        vocab_size: int,
        splits: Iterable[str] = STANDARD_SPLITS,
        *,
        force: bool = False,
    ):
        self.out_dir = check_output_dir(out_dir).absolute()
        self.dtype = token_dtype_for(vocab_size)  # ValueError unless a positive int
        self.vocab_size = int(vocab_size)
        self.split_names = tuple(splits)
        self.force = force
        replacement_plan(self.out_dir, self.split_names, force=force)  # refuse before any work
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(self.out_dir)
        self.tmp_dir = self.out_dir.parent / f".{self.out_dir.name}{_PARTIAL_MARKER}{uuid.uuid4().hex[:8]}"
        self.tmp_dir.mkdir()
        _write_marker(self.tmp_dir, [])
        self._handles = {s: open(self.tmp_dir / f"{s}.bin", "wb") for s in self.split_names}
        self._offsets: dict[str, list[int]] = {s: [0] for s in self.split_names}
        self._finished = False

    def __enter__(self) -> PreparedWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._finished:
            self.abort()

    def add_document(self, split: str, tokens: np.ndarray | list[int]) -> None:
        if split not in self._handles:
            raise ValueError(f"unknown split {split!r}; this writer has {self.split_names}")
        array = np.asarray(tokens)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise TypeError(
                f"a document must be a 1-D integer token array, got shape {array.shape} dtype {array.dtype}"
            )
        if array.size == 0:
            return  # an empty document carries nothing; callers count their own empty inputs
        if int(array.min()) < 0 or int(array.max()) >= self.vocab_size:
            raise ValueError(
                f"token ids must lie in [0, {self.vocab_size}), got range "
                f"[{int(array.min())}, {int(array.max())}] in split {split!r}"
            )
        self._handles[split].write(array.astype(self.dtype, copy=False).tobytes())
        self._offsets[split].append(self._offsets[split][-1] + int(array.size))

    def n_tokens(self, split: str) -> int:
        return self._offsets[split][-1]

    def n_docs(self, split: str) -> int:
        return len(self._offsets[split]) - 1

    def finish(self, manifest_fields: dict[str, Any]) -> PreparedDataset:
        """Write docs offsets + manifest, hash everything, and publish onto out_dir.

        Raises ValueError (and publishes nothing) when a split received no tokens: training and evaluation
        need every split."""
        empty = [split for split in self.split_names if self.n_tokens(split) == 0]
        if empty:
            source = manifest_fields.get("source") or {}
            origin = source.get("path") or source.get("description") or "its source"
            raise ValueError(
                f"dataset {manifest_fields.get('name')!r}: split(s) {', '.join(map(repr, empty))} "
                f"received no documents from {origin}; every split needs at least one. Give a "
                f"larger source (or check its split layout)"
            )
        splits: dict[str, Any] = {}
        for split in self.split_names:
            handle = self._handles[split]
            handle.flush()
            os.fsync(handle.fileno())  # data on disk before the rename publishes it
            handle.close()
            docs_name, tokens_name = f"{split}.docs.npy", f"{split}.bin"
            with open(self.tmp_dir / docs_name, "wb") as docs_handle:
                np.save(docs_handle, np.asarray(self._offsets[split], dtype=np.int64))
                docs_handle.flush()
                os.fsync(docs_handle.fileno())
            splits[split] = {
                "n_tokens": self.n_tokens(split),
                "n_docs": self.n_docs(split),
                "tokens_file": tokens_name,
                "docs_file": docs_name,
                "sha256": {
                    tokens_name: sha256_file(self.tmp_dir / tokens_name),
                    docs_name: sha256_file(self.tmp_dir / docs_name),
                },
            }
        vocab = dict(manifest_fields.pop("vocab"))
        vocab["size"] = self.vocab_size
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": manifest_fields.pop("name"),
            "vocab": vocab,
            "dtype": self.dtype.name,
            "splits": splits,
            **manifest_fields,
            "pope_version": __version__,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "complete": True,  # last key, written only here
        }
        write_json_atomic(self.tmp_dir / MANIFEST_NAME, manifest, indent=1)
        _write_marker(self.tmp_dir, written_names(self.split_names) - {MARKER_NAME})
        fsync_dir(self.tmp_dir)
        self._publish()
        self._finished = True
        return PreparedDataset(self.out_dir)

    def _publish(self) -> None:
        replaced, kept = replacement_plan(self.out_dir, self.split_names, force=self.force)
        if replaced and owned_names(self.out_dir) is None:  # --force over files a prepare did not write
            warn(f"--force: replacing {_listing(replaced)} in {self.out_dir}, which `pope data prepare` did not create")
        if not self.out_dir.exists():
            os.replace(self.tmp_dir, self.out_dir)
        elif not kept:  # every file there is ours: swap whole directories (readers never see a mix)
            old = self.out_dir.parent / f".{self.out_dir.name}{_PARTIAL_MARKER}old-{uuid.uuid4().hex[:8]}"
            os.replace(self.out_dir, old)
            os.replace(self.tmp_dir, self.out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:  # other files live there: replace ours one by one, the manifest (completeness) last
            (self.out_dir / MANIFEST_NAME).unlink(missing_ok=True)
            new = {p.name for p in self.tmp_dir.iterdir()}
            for name in set(replaced) - new:
                (self.out_dir / name).unlink(missing_ok=True)
            for name in sorted(new - {MANIFEST_NAME}):
                os.replace(self.tmp_dir / name, self.out_dir / name)
            os.replace(self.tmp_dir / MANIFEST_NAME, self.out_dir / MANIFEST_NAME)
            self.tmp_dir.rmdir()
            warn(
                f"kept {len(kept)} file(s) in {self.out_dir} that `pope data prepare` did not create: {_listing(kept)}"
            )
        fsync_dir(self.out_dir.parent)

    def abort(self) -> None:
        for handle in self._handles.values():
            handle.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self._finished = True


# ------------------------------------------------------------------------------------ idempotence
def layout_upgrade(found: Any, request: dict[str, Any]) -> list[str]:
    """The version keys (names ending in ``_version``) that ``request`` raises over ``found``, the request
    recorded in an existing dataset, when those are the only differences between the two (a key that
    ``found`` lacks counts as version 0); else []. Such a dataset was made with the same settings by a
    pope whose tokenisation or layout has since changed, so a prepare rebuilds it; a lower version (an
    older pope meeting newer data) or any other difference is not an upgrade."""
    if not isinstance(found, dict) or found == request:
        return []
    differing = sorted(key for key in set(found) | set(request) if found.get(key) != request.get(key))
    for key in differing:
        new, old = request.get(key), found.get(key, 0)
        if not (key.endswith("_version") and type(new) is int and type(old) is int and new > old):
            return []
    return differing


def reuse_if_prepared(
    out_dir: str | os.PathLike, request: dict[str, Any], *, force: bool = False, splits: Iterable[str] = STANDARD_SPLITS
) -> PreparedDataset | None:
    """Idempotence: the existing dataset at out_dir if it was made by the same `request` and its files
    still match their checksums; None when it must be (re)built.

    Checks the output before any work: a file, a path under a file, an unwritable directory, or a
    non-empty directory that a prepare did not make (without `force`) raise ValueError. A complete
    dataset made by a *different* request is not overwritten silently: ValueError unless `force`. Two
    cases are rebuilt, with a notice: a damaged dataset (checksum mismatch, truncated, incomplete), and
    one made by the same request in an older layout (see :func:`layout_upgrade`).
    """
    out_dir = check_output_dir(out_dir)
    replacement_plan(out_dir, splits, force=force)
    if force or not out_dir.exists() or not any(out_dir.iterdir()):
        return None
    try:
        existing = PreparedDataset(out_dir)
    except (FileNotFoundError, ValueError, KeyError) as err:
        warn(f"{out_dir} holds an unusable dataset ({err}); rebuilding it from its source now")
        return None
    found = existing.manifest.get("request")
    upgraded = layout_upgrade(found, request)
    if upgraded:
        changes = ", ".join(f"{key} {found.get(key, 'unset')} -> {request[key]}" for key in upgraded)
        warn(
            f"dataset {existing.name!r} at {out_dir} was prepared in an older layout ({changes}); rebuilding it "
            f"from its source now"
        )
        return None
    if found != request:
        raise ValueError(
            f"{out_dir} already holds a dataset prepared with different settings "
            f"({existing.manifest.get('request')}); choose another --out or pass --force to replace it"
        )
    try:
        existing.verify()
    except ValueError as err:
        warn(
            f"dataset {existing.name!r} at {out_dir} is damaged ({err}); rebuilding it from its source now, "
            f"as `{prepare_command(existing)}` would"
        )
        return None
    existing.reused = True
    return existing
