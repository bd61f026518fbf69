"""Provenance stamped on every result file: code version, libraries, device, date and command."""
from __future__ import annotations

import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch


def git_commit() -> str | None:
    """The commit of the source tree pope was imported from (None outside a git checkout)."""
    source = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=source,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def device_name(device: str | torch.device = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def provenance(device: str | torch.device = "cpu") -> dict:
    from pope.version import __version__

    return {
        "pope_version": __version__,
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device_name(device),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(shlex.quote(arg) for arg in sys.argv),
    }
