"""PoPE with explicit positions: per-token phases, and axial (N-D) PoPE for images and video.

`pope.pope_attention` places query i at q_offset + i and key j at j. Here positions are given:
- `polar_features(x, phase, magnitude)` turns raw q or k (..., N, d) and phases (..., N, r) into PoPE's
  2r + (d - r) Cartesian channels [f(x) cos(phase), f(x) sin(phase), x[r:]], whose dot products are PoPE's
  scores (the same q'/k' that pope.attention.reference_pope_attention materialises);
- `phase_attention` runs SDPA on those features with an optional additive mask (padding, causal);
- axial PoPE splits the r = sum(axis_dims) rotated channels of each head into one group per axis; group a
  gets its own PoPE frequencies theta_c = base^(-c/g_a), c = 0..g_a-1, applied to that axis's coordinate:
      phase[c in group a] = position[a] * theta_c
  so the score between tokens s and t depends on the coordinate differences s_a - t_a only (per axis).

Backends: the features are materialised and fed to torch's scaled_dot_product_attention, which uses its
fused (flash / memory-efficient) kernels on CUDA; the fused Triton PoPE kernels compute phases from 1-D
indices in-kernel and do not take N-D positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn

from pope.attention import MAGNITUDES, sdpa
from pope.attention.checks import check_tensors
from pope.encodings import PoPE
from pope.encodings.base import check_head_layout
from pope.frequencies import angles, pope_frequencies


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def position_phases(positions: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """positions (...) times frequencies (F,) -> (..., F), in float32 (float64 frequencies: float64)."""
    return angles(positions.reshape(-1), frequencies).reshape(*positions.shape, frequencies.shape[0])


def polar_features(x: torch.Tensor, phase: torch.Tensor, magnitude: str = "softplus") -> torch.Tensor:
    """PoPE's Cartesian channels of x (..., N, d) at phases broadcastable to (..., N, r), r <= d.

    Returns (..., N, 2r + d - r) = [f(x_r) cos(phase), f(x_r) sin(phase), x[r:]] in x's dtype; f, cos and sin
    in float32 (float64 for float64 x). magnitude="identity" takes x as magnitudes already (a PoPE KV cache).
    """
    r = phase.shape[-1]
    compute = _compute_dtype(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        mag = MAGNITUDES[magnitude](x[..., :r].to(compute))
        phase = phase.to(compute)
        out = torch.cat([mag * phase.cos(), mag * phase.sin(), x[..., r:].to(compute)], dim=-1)
    return out.to(x.dtype)


def phase_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    phase_q: torch.Tensor,
    phase_k: torch.Tensor,
    *,
    magnitude_q: str = "softplus",
    magnitude_k: str = "softplus",
    softmax_scale: float,
    causal: bool = False,
    attn_bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """PoPE attention with given phases. q (B, Hq, Nq, d), k/v (B, Hkv, Nk, d) (GQA: Hq a multiple of Hkv);
    phase_q broadcastable to (B, Hq, Nq, r) (delta already subtracted), phase_k to (B, Hkv, Nk, r);
    attn_bias: additive float mask broadcastable to (B, Hq, Nq, Nk); causal is bottom-right aligned by index.
    Returns (B, Hq, Nq, d) in q's dtype."""
    q_cart = polar_features(q, phase_q, magnitude_q)
    k_cart = polar_features(k, phase_k, magnitude_k)
    return sdpa(q_cart, k_cart, v, causal=causal, softmax_scale=softmax_scale, attn_bias=attn_bias, dropout_p=dropout_p)


def _check_positions(name: str, positions, n: int, device: torch.device) -> None:
    """Positions of n tokens: a tensor of integer or float coordinates, (n, n_axes) or (batch, n, n_axes), on the
    device of q (metadata only: no value is read)."""
    if not isinstance(positions, torch.Tensor):
        raise TypeError(
            f"{name} must be a tensor of coordinates, (N, n_axes) or (batch, N, n_axes) (e.g. grid_positions((rows, "
            f"cols))); got {type(positions).__name__}"
        )
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"{name} must hold integer or float coordinates; got {positions.dtype}")
    if positions.dim() not in (2, 3) or positions.shape[-2] != n:
        raise ValueError(f"{name} must have shape ({n}, n_axes) or (batch, {n}, n_axes); got {tuple(positions.shape)}")
    if positions.device != device:
        raise ValueError(f"{name} is on {positions.device} but q is on {device}; move them to one device")


def _check_axis_dims(axis_dims: tuple, head_dim: int) -> None:
    if (
        not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in axis_dims)
        or sum(axis_dims) > head_dim
    ):
        raise ValueError(
            f"axis_dims {axis_dims} must be positive ints (rotated channels per axis) that sum to at most "
            f"head_dim={head_dim}"
        )


def split_axis_dims(head_dim: int, n_axes: int) -> tuple[int, ...]:
    """An even split of head_dim channels over n_axes axes (the first axes take the remainder)."""
    if not isinstance(n_axes, int) or isinstance(n_axes, bool):
        raise TypeError(f"n_axes must be an int (the number of position axes, e.g. 2 for images); got {n_axes!r}")
    if n_axes < 1 or head_dim < n_axes:
        raise ValueError(f"cannot split head_dim={head_dim} over {n_axes} axes: every axis needs >= 1 channel")
    share, extra = divmod(head_dim, n_axes)
    return tuple(share + (axis < extra) for axis in range(n_axes))


def grid_positions(shape: Sequence[int], device=None) -> torch.Tensor:
    """Coordinates of a row-major grid: shape (H, W) -> (H*W, 2) [row, col]; (T, H, W) -> (T*H*W, 3)."""
    if not shape or any(int(n) < 1 for n in shape):
        raise ValueError(f"grid shape must be a non-empty sequence of positive sizes; got {tuple(shape)}")
    axes = [torch.arange(int(n), device=device) for n in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(shape))


def axial_phases(
    positions: torch.Tensor, axis_dims: Sequence[int], base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """positions (..., N, n_axes) -> phases (..., N, sum(axis_dims)): axis a's coordinate times its group's
    frequencies base^(-c/g_a), c = 0..g_a-1, in float32 (or float64)."""
    if positions.shape[-1] != len(axis_dims):
        raise ValueError(
            f"positions have {positions.shape[-1]} axes but axis_dims {tuple(axis_dims)} name "
            f"{len(axis_dims)}; give positions of shape (..., N, {len(axis_dims)})"
        )
    groups = [
        position_phases(positions[..., a], pope_frequencies(g, base, device=positions.device, dtype=dtype))
        for a, g in enumerate(axis_dims)
    ]
    return torch.cat(groups, dim=-1)


def axial_pope_attention(
    q,
    k,
    v,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor | None = None,
    *,
    axis_dims: Sequence[int] | None = None,
    delta: torch.Tensor | None = None,
    base: float = 10000.0,
    magnitude: str = "softplus",
    softmax_scale: float | None = None,
    causal: bool = False,
    attn_bias=None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Axial PoPE attention. q (B, Hq, Nq, d), k/v (B, Hkv, Nk, d); positions_q (Nq, n_axes) or (B, Nq, n_axes),
    positions_k likewise (default positions_q); axis_dims: rotated channels per axis (default: d split evenly;
    sum(axis_dims) = r <= d, channels past r are a plain dot product); delta: (Hq, r) or None.
    Non-causal by default (a grid of patches). Returns (B, Hq, Nq, d)."""
    check_tensors(q, k, v, 4, "(batch, heads, seq, head_dim)")
    d = q.shape[-1]
    positions_k = positions_q if positions_k is None else positions_k
    for name, pos, n in (("positions_q", positions_q, q.shape[2]), ("positions_k", positions_k, k.shape[2])):
        _check_positions(name, pos, n, q.device)
    axis_dims = tuple(axis_dims) if axis_dims is not None else split_axis_dims(d, positions_q.shape[-1])
    _check_axis_dims(axis_dims, d)
    if delta is not None and (not isinstance(delta, torch.Tensor) or delta.device != q.device):
        where = delta.device if isinstance(delta, torch.Tensor) else type(delta).__name__
        raise ValueError(f"delta must be a tensor on q's device {q.device}; got {where}")
    compute = _compute_dtype(q)
    phase_q = axial_phases(positions_q, axis_dims, base, compute)  # (Nq, r) or (B, Nq, r)
    phase_k = axial_phases(positions_k, axis_dims, base, compute)
    phase_q = phase_q.unsqueeze(-3)  # (1 or B, 1, Nq, r): broadcast over heads
    phase_k = phase_k.unsqueeze(-3)
    if delta is not None:
        if tuple(delta.shape) != (q.shape[1], sum(axis_dims)):
            raise ValueError(
                f"delta must have shape (query_heads, rotated channels) = ({q.shape[1]}, "
                f"{sum(axis_dims)}); got {tuple(delta.shape)}"
            )
        phase_q = phase_q - delta.to(compute)[:, None, :]  # (.., Hq, Nq, r)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    return phase_attention(
        q,
        k,
        v,
        phase_q,
        phase_k,
        magnitude_q=magnitude,
        magnitude_k=magnitude,
        softmax_scale=scale,
        causal=causal,
        attn_bias=attn_bias,
        dropout_p=dropout_p,
    )


class AxialPoPE(PoPE):
    """Axial PoPE for one attention layer: forward(q, k, v, positions) with q (B, H, N, head_dim), k/v
    (B, Hkv, N, head_dim) and positions (N, n_axes) or (B, N, n_axes) (e.g. `grid_positions((rows, cols))`),
    non-causal by default.

    pope.PoPE with N-D positions: the same options, validation and delta (n_heads, sum(axis_dims)), brought
    into [-2π, 0] as delta_range says; axis_dims (default: head_dim split evenly over n_axes) are the rotated
    channels per axis."""

    def __init__(
        self,
        *,
        n_heads: int,
        head_dim: int,
        n_kv_heads: int | None = None,
        n_axes: int = 2,
        axis_dims: Sequence[int] | None = None,
        base: float = 10000.0,
        magnitude: str = "softplus",
        delta_init: str = "zero",
        delta_range: str = "clamp",
        use_delta: bool = True,
        softmax_scale: float | None = None,
    ):
        check_head_layout(
            "AxialPoPE", n_heads=n_heads, n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads, head_dim=head_dim
        )
        axis_dims = tuple(axis_dims) if axis_dims is not None else split_axis_dims(head_dim, n_axes)
        if len(axis_dims) != n_axes:
            raise ValueError(f"axis_dims {axis_dims} name {len(axis_dims)} axes but n_axes={n_axes}")
        _check_axis_dims(axis_dims, head_dim)
        super().__init__(
            n_heads=n_heads,
            n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
            head_dim=head_dim,
            base=base,
            magnitude=magnitude,
            delta_init=delta_init,
            delta_range=delta_range,
            use_delta=use_delta,
            rotary_dim=sum(axis_dims),
            softmax_scale=softmax_scale,
        )
        self.axis_dims, self.n_axes = axis_dims, n_axes

    def forward(
        self,
        q,
        k,
        v,
        positions: torch.Tensor,
        positions_k: torch.Tensor | None = None,
        *,
        causal: bool = False,
        attn_bias=None,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        self._check(q, k)
        return axial_pope_attention(
            q,
            k,
            v,
            positions,
            positions_k,
            axis_dims=self.axis_dims,
            delta=self.bounded_delta(),
            base=self.base,
            magnitude=self.magnitude,
            softmax_scale=self.softmax_scale,
            causal=causal,
            attn_bias=attn_bias,
            dropout_p=dropout_p,
        )

    def cache_keys(self, k, start):
        raise NotImplementedError("AxialPoPE has no KV cache: it attends over a grid given by positions")

    attend_cached = cache_keys

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, axis_dims={self.axis_dims}"


class AxialPoPEAttention(nn.Module):
    """Multi-head self-attention with axial PoPE, a drop-in for a ViT block's attention:
    forward(x (B, N, dim), positions (N, n_axes) or (B, N, n_axes)) -> (B, N, dim). Patch tokens of an
    (H, W) grid: `positions = grid_positions((H, W))`; a class token can sit at any coordinate (e.g. -1s)."""

    def __init__(
        self, dim: int, n_heads: int, *, n_axes: int = 2, qkv_bias: bool = True, dropout: float = 0.0, **pope_options
    ):
        super().__init__()
        for name, value in (("dim", dim), ("n_heads", n_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"AxialPoPEAttention {name} must be a positive int; got {value!r}")
        if dim % n_heads:
            raise ValueError(f"dim ({dim}) must be divisible by n_heads ({n_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"AxialPoPEAttention dropout must be in [0, 1); got {dropout!r}")
        self.n_heads, self.head_dim, self.dropout = n_heads, dim // n_heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.pe = AxialPoPE(n_heads=n_heads, head_dim=self.head_dim, n_axes=n_axes, **pope_options)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        width = self.n_heads * self.head_dim
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != width:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"AxialPoPEAttention takes x of shape (batch, tokens, {width}); got {shape}")
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, hd)
        y = self.pe(q, k, v, positions, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))
