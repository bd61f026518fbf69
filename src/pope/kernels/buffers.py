"""Buffers the kernels write, their layouts and tile widths (`block_d`). Imports torch and pope.settings only, so
that pope.ops' fake (meta) implementations can ask the same questions as the launchers without importing Triton.

Guarantees: `empty` gives a buffer for a kernel to write, NaN-filled when pope.settings' poison_outputs is on;
`empty_in_layout_of` gives an output or a gradient in its input's layout, the launchers' and the fake
implementations' alike (the strides torch.compile asserts); `prime_buffer` gives the pre-pass's x' buffer, the same
for the launchers and the fake implementations of operators that return it.
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


def prime_buffer(batch: int, heads: int, rows: int, block_d: int, *, like: torch.Tensor, packed: bool) -> torch.Tensor:
    """The pre-pass's x' for (batch, heads, rows) of x (like: x's device and dtype): contiguous (B, H, N, 2 BLOCK_D);
    packed (batch 1, rows = total), the (1, H, total, 2 BLOCK_D) view of a token-major (total, H, 2 BLOCK_D) buffer
    (the launchers' batch view of a packed tensor)."""
    if not packed:
        return empty((batch, heads, rows, 2 * block_d), device=like.device, dtype=like.dtype)
    return empty((rows, heads, 2 * block_d), device=like.device, dtype=like.dtype).transpose(0, 1)[None]


def block_d(head_dim: int) -> int:
    """Channels of a kernel's tiles: head_dim padded to a power of two, at least 16. Looked up, not computed:
    it is asked ~10 times per eager forward+backward (host time)."""
    cache = SETTINGS.caches.block_d
    width = cache.get(head_dim)
    if width is None:
        width = cache[head_dim] = max(16, next_power_of_2(head_dim))
    return width


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
