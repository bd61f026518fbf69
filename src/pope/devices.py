"""Device names as users give them ("auto", "cpu", "cuda", "cuda:1") -> the device to run on.

One resolver for the CLIs, the trainer's process setup and the evaluation tools, so "auto" means the same
everywhere (CUDA when available) and asking for CUDA on a machine without it fails the same clear way. Also a
CUDA device's compute capability, asked once per device (pope.settings' caches).
"""

from __future__ import annotations

import torch

from pope.settings import SETTINGS


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


# Compiled code asks this on every attention call (pope.ops.triton_unsupported_reason). Traced as written, the
# cache's first fill would change a dict that dynamo guards on, so every compiled model would recompile once and run
# in two graphs; marked constant, dynamo calls it once while tracing and keeps the answer
# (tests/test_compile_graphs.py).
@torch.compiler.assume_constant_result
def cuda_capability(device) -> tuple[int, int]:
    """torch.cuda.get_device_capability(device), asked once per device (pope.settings' caches): it is on every
    kernel call's path. A device's capability never changes, so compiled code may keep it as a constant."""
    capabilities = SETTINGS.caches.capabilities
    capability = capabilities.get(device)
    if capability is None:
        capability = capabilities[device] = torch.cuda.get_device_capability(device)
    return capability
