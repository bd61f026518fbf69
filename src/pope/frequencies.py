"""Frequencies and angles: the one place where rotation frequencies are computed.

Every positional encoding that rotates (PoPE, RoPE and its length-scaling variants YaRN, NTK-aware,
linear interpolation) gets its frequencies here, always in float32, and turns positions into angles
with `angles()`, which computes position × frequency in float32 whatever the autocast dtype (rotary
angles computed in bf16 are off by up to ~0.8 in cos at position 2048).
"""
from __future__ import annotations

import math

import torch


def pope_frequencies(dim: int, base: float = 10000.0, device=None, dtype=torch.float32) -> torch.Tensor:
    """PoPE's d frequencies theta_c = base^(-(c-1)/d), c = 1..d.  Returns (dim,) float32 (or float64).

    The odd-indexed ones (c = 1, 3, 5, ...) are exactly RoPE's d/2 frequencies for the same head dim.
    """
    _check_dim_base(dim, base)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"frequencies are float32 or float64; got {dtype}")
    exponent = torch.arange(dim, dtype=torch.float64, device=device) / dim
    return (base ** -exponent).to(dtype)


def rope_frequencies(dim: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """RoPE's d/2 frequencies theta_i = base^(-2i/d), i = 0..d/2-1.  Returns (dim // 2,) float32."""
    _check_dim_base(dim, base)
    if dim % 2:
        raise ValueError(f"RoPE rotates channel pairs, so its dimension must be even; got {dim}")
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    return (base ** -exponent).to(torch.float32)


def linear_interpolation_frequencies(dim: int, base: float, scale: float, device=None) -> torch.Tensor:
    """Position interpolation (Chen et al. 2023): every frequency divided by the scale s."""
    _check_scale(scale)
    return rope_frequencies(dim, base, device) / scale


def ntk_frequencies(dim: int, base: float, scale: float, device=None) -> torch.Tensor:
    """NTK-aware scaling: RoPE with base' = base * s^(d / (d - 2)).

    Keeps the highest frequency unchanged and stretches the lowest by exactly s.
    """
    _check_scale(scale)
    if dim <= 2:
        raise ValueError(f"NTK-aware scaling needs a rotary dimension > 2; got {dim}")
    return rope_frequencies(dim, base * scale ** (dim / (dim - 2)), device)


def yarn_frequencies(
    dim: int,
    base: float,
    scale: float,
    original_max_len: int,
    alpha: float = 1.0,
    beta: float = 32.0,
    device=None,
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023) 'NTK-by-parts' frequencies and its attention factor.

    For each RoPE frequency theta with wavelength lambda = 2π/theta, r = original_max_len / lambda and
    the ramp gamma = clamp((r - alpha) / (beta - alpha), 0, 1); the new frequency is
    (1 - gamma) * theta / s + gamma * theta (long wavelengths interpolated, short ones kept).
    Returns (frequencies (dim // 2,) float32, attention_factor) where attention_factor = 0.1 ln s + 1;
    logits are multiplied by attention_factor**2 (folded into the softmax scale by the caller).
    """
    _check_scale(scale)
    if original_max_len <= 0:
        raise ValueError(f"original_max_len must be positive; got {original_max_len}")
    if not beta > alpha:
        raise ValueError(f"YaRN needs beta > alpha; got alpha={alpha}, beta={beta}")
    theta = rope_frequencies(dim, base, device).double()
    ratio = original_max_len / (2 * math.pi / theta)
    gamma = ((ratio - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    scaled = (1 - gamma) * theta / scale + gamma * theta
    return scaled.to(torch.float32), 0.1 * math.log(scale) + 1.0


def angles(positions: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """Outer product position × frequency in float32 (float64 for float64 frequencies), immune to autocast.

    positions: (N,) integer or float; frequencies: (F,).  Returns (N, F).
    """
    dtype = torch.float64 if frequencies.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=positions.device.type, enabled=False):
        return positions.to(dtype)[:, None] * frequencies.to(dtype)[None, :]


@torch.library.custom_op("pope::cos_sin_table", mutates_args=())
def cos_sin_table(positions: torch.Tensor, frequencies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of angles(positions, frequencies): two (N, F) tables, float32 (float64 for float64 frequencies).

    An operator rather than two pointwise ops so that torch.compile computes the table once per call: inlined,
    inductor fused the frequencies' pow and the cos/sin into every rotated element of q and k (B * H times per
    position), 8 ms of RoPE's 27 ms GPT-2 training step on an H200
    (benchmarks/experiments/2026-11-30-train-step-owt-runs/train_step_profile_rope_8575259.txt). Positions and frequencies never need gradients.
    """
    phase = angles(positions, frequencies)
    return phase.cos(), phase.sin()


@cos_sin_table.register_fake
def _cos_sin_table_fake(positions, frequencies):
    dtype = torch.float64 if frequencies.dtype == torch.float64 else torch.float32
    shape = (positions.shape[0], frequencies.shape[0])
    return positions.new_empty(shape, dtype=dtype), positions.new_empty(shape, dtype=dtype)


def _check_dim_base(dim: int, base: float) -> None:
    if not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"frequency dimension must be a positive int; got {dim!r}")
    if not base > 0:
        raise ValueError(f"frequency base must be positive; got {base!r}")


def _check_scale(scale: float) -> None:
    if not scale >= 1.0:
        raise ValueError(f"a context-extension scale must be >= 1; got {scale!r}")
