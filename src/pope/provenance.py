"""Provenance stamped on every run record, result file and benchmark row: code version, libraries,
device, date and command. One implementation for the trainer, the evaluation tools and the benchmarks.

The environment variable POPE_GIT_COMMIT, when set, names the commit and wins over git: a copy of the tree
shipped to another machine (a cluster node, a container) may carry no .git, or a stale one that names an older
commit + dirty. Without it, git decides, and a tree without .git reports None — never a guess.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from pope.version import __version__

_SOURCE_ROOT = Path(__file__).resolve().parent


def git_commit() -> dict:
    """{"commit": full hash or None, "dirty": tracked files differ from it (None if unknown), "source"}."""
    if os.environ.get("POPE_GIT_COMMIT"):
        return {"commit": os.environ["POPE_GIT_COMMIT"], "dirty": None, "source": "POPE_GIT_COMMIT"}
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--verify", "HEAD"], cwd=_SOURCE_ROOT, capture_output=True, text=True, timeout=10
        )
        commit = head.stdout.strip() if head.returncode == 0 else None
        dirty = None
        if commit:
            status = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=_SOURCE_ROOT,
                capture_output=True,
                text=True,
                timeout=10,
            )
            dirty = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty, "source": "git" if commit else None}


def commit_label() -> str | None:
    """Short form for tables: 'abc1234', 'abc1234+dirty' or None."""
    info = git_commit()
    if info["commit"] is None:
        return None
    return info["commit"][:7] + ("+dirty" if info["dirty"] else "")


def library_versions() -> dict:
    """Versions of Python, torch, numpy, pope and the optional libraries (None where absent)."""
    import numpy as np  # on first use, as torch in device_name: sweeps and the CLI use this module without torch
    import torch

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pope": __version__,
    }
    for name in ("triton", "safetensors", "tensorboard"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # optional: an absent or broken install is recorded as such
            versions[name] = None
    return versions


def cuda_mps_active(proc: Path = Path("/proc")) -> bool:
    """Whether a CUDA MPS daemon or server runs on this machine (scripts/cuda_mps.sh): with MPS, processes that
    share a GPU run their kernels side by side instead of time-slicing it, which changes their step times, so
    a run records it. Read from the process table (``comm`` of every process; Linux), False where there is none."""
    try:
        entries = list(proc.iterdir())
    except OSError:
        return False
    for entry in entries:
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith("nvidia-cuda-mps"):  # -control / -server, cut to 15
                    return True
            except OSError:  # the process ended while we looked
                continue
    return False


def device_name(device="cpu") -> str:
    import torch  # on first use: sweeps and the CLI use this module's argv and path helpers without torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def provenance(device="cpu") -> dict:
    """The stamp for one result: commit, versions, device, UTC date and the command line."""
    versions = library_versions()
    return {
        "pope_version": versions["pope"],
        "git_commit": commit_label(),
        "torch": versions["torch"],
        "triton": versions["triton"],
        "python": versions["python"],
        "device": device_name(device),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command_line(),
    }


def portable_path(path: str | Path) -> str:
    """``path`` written relative to the working directory when it is an absolute path below it, else as given, so a
    result committed to the repository names no machine's own directories."""
    if Path(path).is_absolute():
        try:
            return Path(path).relative_to(Path.cwd()).as_posix()
        except ValueError:
            pass
    return str(path)


def portable_argv(argv: list[str] | None = None) -> list[str]:
    """The command line (default sys.argv) with each absolute path below the working directory made relative
    (:func:`portable_path`)."""
    return [portable_path(arg) for arg in (sys.argv if argv is None else argv)]


def command_line(argv: list[str] | None = None) -> str:
    """portable_argv as one shell-quoted string."""
    return " ".join(shlex.quote(arg) for arg in portable_argv(argv))
