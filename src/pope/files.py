"""Durable, atomic file writes, checksums and a lock for shared caches (standard library only).

Everything the project publishes — prepared datasets, checkpoints, result tables and plots — is written
to a temporary name, flushed to disk, then renamed into place, so a crash never leaves half a file
under the final name. Temporary names are unique per process, so processes writing the same file at
once never write into each other's temporary; :func:`exclusive_lock` serialises whole check-then-build
steps on a shared cache entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pope.optional import require

try:
    import fcntl
except ImportError:  # not POSIX: exclusive_lock takes no lock
    fcntl = None


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside `path` durable (best effort: some filesystems refuse directory fsync)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(target: str | os.PathLike) -> Iterator[None]:
    """Hold an inter-process lock on ``target`` (a file or directory; it need not exist) for the block.

    Wrap every check-then-build of a shared cache entry in it (generated splits, prepared datasets, fetched
    sources), so that processes preparing the same entry at once (seed sweeps, torchrun ranks) take turns:
    the first builds it, the others wait (saying so on stderr), then find it built and reuse it. The lock is
    ``fcntl.flock`` on the sibling file ``.NAME.lock``, which the holder deletes on leaving the block (a
    waiter that then holds the lock of a deleted file notices and locks the new one). The kernel releases
    the lock when its holder exits or is killed, so the lock file a killed holder leaves behind never blocks
    a later run, which reuses and then deletes it. Where no lock can be taken (no ``fcntl``, a filesystem
    without flock, a read-only parent directory) the block runs unlocked; the atomic writes above still
    keep every file whole. Not re-entrant: never nest two locks on one target in one process.
    """
    target = Path(target)
    lock_path = target.parent / f".{target.name}.lock"
    descriptor = _lock_file(lock_path, f"another process that is preparing {target}")
    try:
        yield
    finally:
        if descriptor is not None:
            with contextlib.suppress(OSError):
                os.unlink(lock_path)  # while still holding it: see _lock_file
            os.close(descriptor)  # closing the only descriptor releases the flock


def _lock_file(path: Path, holder: str) -> int | None:
    """A descriptor of ``path`` holding its exclusive flock (created if missing), or None when no lock can be
    taken. Retries when the file it locked was deleted or replaced meanwhile (by the previous holder)."""
    if fcntl is None:  # not POSIX
        return None
    waiting = False
    while True:
        descriptor = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waiting:
                    print(f"waiting for {holder} ...", file=sys.stderr, flush=True)
                    waiting = True
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            locked = os.fstat(descriptor)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
        except OSError:  # unlockable here: run unlocked (see exclusive_lock)
            if descriptor is not None:
                os.close(descriptor)
            return None
        if current is not None and (current.st_dev, current.st_ino) == (locked.st_dev, locked.st_ino):
            return descriptor
        os.close(descriptor)  # we locked a file the previous holder deleted: lock the one at the path now


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it, flushed to disk, then
    renamed over it. When the write fails (a full disk, a read-only directory, a signal) the temporary file is
    removed and ``path`` keeps its previous content; the OSError says which file could not be written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError) and err.errno is not None:  # name the file meant, not the temporary one
            raise type(err)(err.errno, err.strerror, str(path)) from err
        raise
    fsync_dir(path.parent)
    return path


def keep_aside(path: str | os.PathLike, label: str = "damaged") -> Path:
    """Rename ``path`` to ``NAME.LABEL`` beside it (``NAME.LABEL-2``, ... when taken) and return the new path: a file
    that is about to be rewritten but may still matter to its owner (a record torn by a crash) is kept, not lost."""
    path = Path(path)
    target = path.with_name(f"{path.name}.{label}")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.{label}-{number}")
    os.replace(path, target)
    return target


def read_json_record(path: str | os.PathLike, *, fix: str) -> dict:
    """The JSON object in path, {} when there is none. A file that is not a JSON object (pope writes its records
    atomically, so it was cut or edited elsewhere) is one ValueError naming it and `fix`, what to do about it."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(errors="replace"))
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except ValueError as err:
        raise ValueError(f"{path} is damaged ({err}): {fix}") from None
    return record


def write_json_atomic(path: str | os.PathLike, data, indent: int = 2) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=indent, allow_nan=True) + "\n")


def savefig_atomic(fig, path: str | os.PathLike, **kwargs) -> Path:
    """matplotlib figure -> file, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    fig.savefig(tmp, **kwargs)
    os.replace(tmp, path)
    return path


def finish_figure(fig, path: str | os.PathLike, *, title: str = "", tight_layout: bool = True) -> Path:
    """The project's plots end alike: optional suptitle, tight layout, atomic PNG at 120 dpi, figure closed."""
    plt = require("matplotlib.pyplot")
    if title:
        fig.suptitle(title)
    if tight_layout:
        fig.tight_layout()
    try:
        return savefig_atomic(fig, path, dpi=120)
    finally:
        plt.close(fig)


def height_with_legend_below(entries: int, columns: int = 2, *, panel: float = 4.5, row: float = 0.2) -> float:
    """A figure's height in inches: ``panel`` for the plot, plus ``row`` for each legend row that
    :func:`legend_below` will need for ``entries`` entries in ``columns`` columns, so the panel keeps its size."""
    return panel + row * -(-entries // columns)


def legend_below(fig, handles: list, labels: list[str], columns: int) -> None:
    """One legend for the whole figure, under its panels and inside the PNG: the panels (and a suptitle set
    before) are laid out above the rows the legend needs, so no entry hides a curve or is cut off at the
    figure's edges. Finish with ``finish_figure(..., tight_layout=False)``."""
    legend = fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    height = legend.get_window_extent(fig.canvas.get_renderer()).height / fig.bbox.height  # share of the figure
    fig.tight_layout(rect=(0, min(0.6, height + 0.01), 1, 1))


def plain_log_ticks(axis) -> None:
    """Plain numbers ('80', '1,500') on a log-scaled axis instead of matplotlib's '8 × 10^1'. Call it after the
    data are drawn: over less than a decade (a perplexity from 60 to 160) the labels are about six round values
    spread over the range, where the decade ticks alone would label one value or none; over more, the decades."""
    ticker = require("matplotlib.ticker")

    def plain(value: float, _position) -> str:  # whole numbers with thousands separators, others to 3 digits
        return f"{value:,.0f}" if value >= 1 and abs(value - round(value)) <= 1e-9 * value else f"{value:.3g}"

    formatter = ticker.FuncFormatter(plain)
    low, high = sorted(axis.get_view_interval())
    if low > 0 and high / low < 10:
        axis.set_major_locator(ticker.MaxNLocator(nbins=6))
        axis.set_minor_formatter(ticker.NullFormatter())
    axis.set_major_formatter(formatter)


def check_output_dir(path: str | os.PathLike, *, what: str = "--out") -> Path:
    """Fail fast, before any work, unless ``path`` is or can become a writable directory.

    Returns the expanded path. Raises ValueError naming ``what`` (the option the user set) when the path
    is a file, lies under a file, or its nearest existing directory cannot be written (checked by creating
    and removing a probe file there, which also catches read-only mounts where ``os.access`` says yes).
    Creates nothing that remains.
    """
    if not str(path).strip():
        raise ValueError(f"{what} is empty; give a directory path")
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"{what} {path} is an existing file, not a directory; choose a directory path (or remove the file)"
        )
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"{what} {path} lies under {existing}, which is a file, not a directory; choose a directory path"
        )
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".pope-write-probe-", dir=existing)
    except OSError as err:
        raise ValueError(
            f"{what} {path} cannot be written ({existing} is not writable: {err.strerror or err}); "
            f"choose a writable directory"
        ) from err
    os.close(descriptor)
    os.unlink(probe)
    return path
