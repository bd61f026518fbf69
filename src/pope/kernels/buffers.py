"""Buffers the kernels write, and their layouts. Imports torch and pope.settings only, so that pope.ops' fake (meta)
implementations can ask the same questions as the launchers without importing Triton.

Guarantees: `empty` gives a buffer for a kernel to write, NaN-filled when pope.settings' poison_outputs is on;
`empty_in_layout_of` gives an output or a gradient in its input's layout, the launchers' and the fake
implementations' alike (the strides torch.compile asserts).
"""

from __future__ import annotations

import torch

from pope.settings import SETTINGS


def empty(shape, *, device, dtype) -> torch.Tensor:
    buffer = torch.empty(shape, device=device, dtype=dtype)
    return buffer.fill_(float("nan")) if SETTINGS.poison_outputs else buffer


def heads_inner(t: torch.Tensor) -> bool:
    """Whether a (B, H, N, d) tensor is the (1, 2) transpose of a (B, N, H, d) buffer, heads inside each row: what
    q, k and v are when a model projects x (B, N, H * d) and transposes, and the layout SDPA returns its output in."""
    return t.dim() == 4 and t.shape[1] > 1 and t.stride(3) == 1 and t.stride(1) < t.stride(2)


def empty_in_layout_of(ref: torch.Tensor) -> torch.Tensor:
    """A buffer shaped and typed like ref (an output, or a gradient): (B, N, H, d) memory shown as its (B, H, N, d)
    transpose where ref is `heads_inner`, else contiguous. So a model's transpose back to (B, N, H * d) is a view,
    not a copy, for outputs and gradients alike. Fake (meta) implementations call it too: same strides."""
    if heads_inner(ref):
        batch, heads, rows, width = ref.shape
        return empty((batch, rows, heads, width), device=ref.device, dtype=ref.dtype).transpose(1, 2)
    return empty(ref.shape, device=ref.device, dtype=ref.dtype)
