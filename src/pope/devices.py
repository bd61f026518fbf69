"""Device names as users give them ("auto", "cpu", "cuda", "cuda:1") -> the device to run on.

One resolver for the CLIs, the trainer's process setup and the evaluation tools, so "auto" means the same
everywhere (CUDA when available) and asking for CUDA on a machine without it fails the same clear way.
"""

from __future__ import annotations

import torch


def resolve_device(name: str) -> str:
    """ "auto" -> "cuda" if CUDA is available else "cpu"; "cpu" / "cuda" / "cuda:N" returned as given.

    Raises ValueError for other names and for CUDA names when CUDA is not available."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cpu" and not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available on this machine; use 'cpu' (or 'auto')")
    return name
