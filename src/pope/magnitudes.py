"""The magnitude functions f of PoPE (score = sum_c f(q_c) f(k_c) cos(...)): one registry for every user.

Each entry names the torch function (the reference, the modules, the evaluation tools) and the code that the
Triton kernels' `MAGNITUDE` constexpr takes for it (pope.kernels.jit_math._magnitude: 0 softplus, 1 relu,
2 identity), so a name means the same function everywhere. An entry is callable: MAGNITUDES["relu"](x).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Magnitude:
    name: str
    function: Callable[[torch.Tensor], torch.Tensor]
    kernel_code: int  # the MAGNITUDE constexpr of pope.kernels' _magnitude / _magnitude_grad
    description: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


# A plain dict, never changed after import: compiled code reads it on every attention call, and torch.compile
# (torch 2.11) breaks the graph on a membership test of a read-only MappingProxyType, which splits a compiled model
# in two around attention and leaves its LM head to run eagerly.
MAGNITUDES: dict[str, Magnitude] = {
    m.name: m
    for m in (
        Magnitude("softplus", F.softplus, 0, "the paper's choice: magnitudes are positive and smooth"),
        Magnitude("relu", F.relu, 1, "ablation"),
        Magnitude("identity", _identity, 2, "ablation 'no softplus': signed magnitudes"),
    )
}


def magnitude(name: str) -> Magnitude:
    """The registry entry for name; ValueError naming the choices for anything else."""
    entry = MAGNITUDES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(f"unknown magnitude {name!r}; choose one of {sorted(MAGNITUDES)}")
    return entry


__all__ = ["MAGNITUDES", "Magnitude", "magnitude"]
