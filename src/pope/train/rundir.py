"""The run directory: checked before any work, locked while a trainer uses it, and its records.

- ``check_output_dir``: ``--out`` must be (or be creatable as) a writable directory; a path that is a
  file, lies under a file or cannot be written is one ValueError before anything is computed.
- ``RunLock``: ``RUN/.lock`` holds the pid and host of the process training into ``RUN``, under an
  exclusive ``flock``. A second trainer (or fine-tune) on the same directory fails at once naming the
  holder. The kernel drops the flock when its process dies, so the lock of a dead process is taken
  over (with a notice naming it); the file itself is kept (emptied on release), so two processes
  can never lock two different files of the same name.
- ``describe_run``: what a directory holds (config, metrics, checkpoints and their steps), for error
  messages that say what exists and what to do.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import sys
from pathlib import Path

from pope.checkpoint import checkpoint_step
from pope.files import check_output_dir as check_writable
from pope.train.metrics import parse_metrics

LOCK_FILE = ".lock"
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "checkpoints")


def check_output_dir(path: Path) -> None:
    """Create ``path`` if needed; ValueError saying what is wrong when it is a file, lies under a file or
    cannot be written (the checks of pope.files.check_output_dir, shared with the data and eval commands)."""
    check_writable(path, what="--out")
    path.mkdir(parents=True, exist_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Exclusive lock on a run directory for this process (see module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._handle = None

    def acquire(self) -> None:
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self._read(handle)
            handle.close()
            raise RuntimeError(
                f"{self.path.parent} is in use by another trainer ({holder}); wait for it to finish, "
                "stop it, or choose another --out"
            ) from None
        previous = self._read(handle)
        if previous:
            print(
                f"notice: taking over the lock of {self.path.parent} from {previous}, which is no longer running",
                file=sys.stderr,
            )
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": platform.node()}) + "\n")
        handle.flush()
        self._handle = handle

    @staticmethod
    def _read(handle) -> str:
        handle.seek(0)
        text = handle.read().strip()
        if not text:
            return ""
        try:
            record = json.loads(text)
            alive = "" if record.get("host") != platform.node() or _process_alive(int(record["pid"])) else ", dead"
            return f"pid {record['pid']} on host {record['host']}{alive}"
        except (ValueError, KeyError, TypeError):
            return f"unreadable lock record {text[:80]!r}"

    def release(self) -> None:
        if self._handle is None:
            return
        self._handle.seek(0)
        self._handle.truncate()
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None


def describe_run(run_dir: Path) -> str:
    """'config.json, metrics.jsonl (up to step 40), checkpoints/best (step 40)' — or 'nothing'."""
    parts = []
    if (run_dir / "config.json").exists():
        parts.append("config.json")
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        try:
            records, torn = parse_metrics(metrics)
            steps = [record.get("step", 0) for _, record in records]
            text = f"metrics.jsonl (up to step {max(steps)})" if steps else "an empty metrics.jsonl"
            parts.append(text + (" with a torn last line" if torn is not None else ""))
        except ValueError:
            parts.append("a damaged metrics.jsonl")
    for name in ("last", "best"):
        if (run_dir / "checkpoints" / name).exists():
            step = checkpoint_step(run_dir / "checkpoints" / name)
            parts.append(f"checkpoints/{name} ({'unreadable' if step is None else f'step {step}'})")
    return ", ".join(parts) or "nothing"


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in RUN_FILES)
