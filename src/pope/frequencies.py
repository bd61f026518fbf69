"""Frequencies and angles: the one place where rotation frequencies are computed.

Every positional encoding that rotates (PoPE, RoPE and its length-scaling variants YaRN, NTK-aware,
linear interpolation) gets its frequencies here, always in float32 (float64 on request), and turns positions
into angles with `angles()`, immune to autocast (rotary angles computed in bf16 are off by up to ~0.8 in cos
at position 2048).

Exact angles at long positions. PoPE's score depends on s - t only, but position x theta rounded in fp32 is off
by up to half an ulp of the product (0.5 rad at position 10^7), and theta rounded to fp32 adds position x
2^-24 theta more. `angles()` in float32 therefore never forms that product in floating point: a frequency is
held as fixed-point turns (`turn_words`: frac(theta / 2 pi) in 64 bits, two 32-bit words A, B, from the float64
frequency), and position x frequency mod one turn is the integer (t A + floor(t B / 2^32)) mod 2^32, exact for
|t| < 2^31 (`MAX_EXACT_POSITION`); read as a signed 32-bit fraction of a turn, it is converted to fp32 once and
scaled by 2 pi / 2^32. The angle lies in [-pi, pi) and is within ~3e-7 rad of the float64 angle at every
position below 2^31 (the fp32 conversion and the one product; the dropped bits are < 2^-32 turn). The fused
kernels compute the same integers from the same words (pope.kernels.jit_math._angles), so their angles are the
reference's bit for bit. Float64 angles stay the plain float64 product: the ground truth the tests use (its own
error is ~t 2^-53 rad: 2e-9 at 10^7, 1.2e-7 at 2^30).
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
    return (base**-exponent).to(dtype)


def rope_frequencies(dim: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """RoPE's d/2 frequencies theta_i = base^(-2i/d), i = 0..d/2-1.  Returns (dim // 2,) float32."""
    _check_dim_base(dim, base)
    if dim % 2:
        raise ValueError(f"RoPE rotates channel pairs, so its dimension must be even; got {dim}")
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    return (base**-exponent).to(torch.float32)


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


# Angles in float32 are exact for integer positions below this in magnitude (t A < 2^63 in int64 arithmetic).
MAX_EXACT_POSITION = 2**31
# fp32(2 pi) / 2^32: one unit of the 32-bit turn fraction, in radians (a power-of-two scaling of fp32(2 pi)).
RADIANS_PER_TURN_UNIT = 6.2831854820251465 / 2**32


def turn_words(frequencies: torch.Tensor) -> torch.Tensor:
    """frequencies (F,) in radians per position -> (2, F) int32: A, B with frac(theta / 2 pi) = (A + B / 2^32) /
    2^32 (truncated; A and B are unsigned 32-bit values stored in int32). Computed from the float64 value of each
    frequency (pass float64 frequencies for angles accurate at long positions: a float32 frequency is taken as the
    exact value of that float32 number)."""
    turns = frequencies.detach().to(torch.float64) / (2 * math.pi)
    turns = turns - turns.floor()  # exact: a whole number of turns per position changes no angle
    scaled = turns * 2.0**32  # exact (power of two)
    high = scaled.floor()
    low = ((scaled - high) * 2.0**32).floor()  # scaled - high is exact
    words = torch.stack([high, low]).to(torch.int64)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def turn_angles(positions: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Integer positions (N,) (|t| < MAX_EXACT_POSITION) x frequencies given as `turn_words` (2, F) -> (N, F)
    float32 angles in [-pi, pi): the fraction (t A + floor(t B / 2^32)) mod 2^32 of a turn, exact in int64, read
    as a signed 32-bit number, converted to fp32 once and scaled by RADIANS_PER_TURN_UNIT."""
    high = words[0].to(torch.int64) & 0xFFFFFFFF
    low = words[1].to(torch.int64) & 0xFFFFFFFF
    t = positions.to(torch.int64)[:, None]
    fraction = (t * high + ((t * low) >> 32)) & 0xFFFFFFFF  # (N, F) in [0, 2^32)
    fraction = fraction - ((fraction >> 31) << 32)  # signed: [-2^31, 2^31), i.e. [-1/2, 1/2) turn
    # A Python float, not a tensor: a host constant would be a host-to-device copy, which CUDA graph capture forbids.
    # fp32 tensor x Python float multiplies in fp32 by the float rounded to fp32, exact here (an fp32 value).
    return fraction.to(torch.float32) * RADIANS_PER_TURN_UNIT


def angles(positions: torch.Tensor, frequencies: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """position x frequency, immune to autocast. positions: (N,) integer or float; frequencies: (F,).
    Returns (N, F) in dtype (default: float64 for float64 frequencies, float32 otherwise).

    float64: the plain float64 product (the ground truth). float32: reduced to [-pi, pi) exactly (module
    docstring): within ~3e-7 rad of the float64 angle at every integer position |t| < MAX_EXACT_POSITION when the
    frequencies are float64 (a float32 frequency counts as its exact float32 value). Float positions are split
    into an integer part (exact) and a fraction, whose product with the frequency is added in float32.
    """
    if dtype is None:
        dtype = torch.float64 if frequencies.dtype == torch.float64 else torch.float32
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"angles are float32 or float64; got {dtype}")
    with torch.autocast(device_type=positions.device.type, enabled=False):
        if dtype == torch.float64:
            return positions.to(torch.float64)[:, None] * frequencies.to(torch.float64)[None, :]
        words = turn_words(frequencies)
        if not positions.is_floating_point():
            return turn_angles(positions, words)
        whole = positions.floor()
        fraction = (positions - whole).to(torch.float64)[:, None] * frequencies.to(torch.float64)[None, :]
        return turn_angles(whole.to(torch.int64), words) + fraction.to(torch.float32)


def pope_turn_words(dim: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """PoPE's d frequencies as `turn_words` (2, dim) int32 from their float64 values: what the fused kernels
    take (pope.ops, pope.kernels), so that their angles are the reference's at every position."""
    return turn_words(pope_frequencies(dim, base, device=device, dtype=torch.float64))


@torch.library.custom_op("pope::cos_sin_table", mutates_args=())
def cos_sin_table(positions: torch.Tensor, frequencies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of angles(positions, frequencies): two (N, F) tables, float32 (float64 for float64 frequencies).

    An operator rather than two pointwise ops so that torch.compile computes the table once per call: inlined,
    inductor fused the frequencies' pow and the cos/sin into every rotated element of q and k (B * H times per
    position, most of RoPE's GPT-2 training step time outside the matmuls. Positions and frequencies never need
    gradients.
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
