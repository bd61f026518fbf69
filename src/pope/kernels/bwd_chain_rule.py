"""The backward's chain rule, shared by the dq and the dk/dv kernels (device functions): from the gradients of the
2d-channel q' or k' ([cos | sin] halves) back to the gradients of q or k through the magnitudes and phases, and
d(delta)'s per-block partial sums."""

from __future__ import annotations

import triton
import triton.language as tl

from .jit_math import (
    _magnitude,
    _magnitude_grad,
    _phase,
    _sincos,
    _split_halves,
)


@triton.jit
def _chain_rule(
    d_wide,
    x_rows,
    dx_rows,
    positions,
    mask_rows,
    Theta,
    delta_row,
    scale,
    d_delta_row,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
):
    """The gradient through x' = f(x) [cos(phase), sin(phase)] from dx' = [d_cos | d_sin] (rows, 2 BLOCK_D) fp32:
    dx = (d_cos cos + d_sin sin) (f'(x) scale) stored at dx_rows; with HAS_DELTA also this block's d(delta) partial
    -sum_rows f(x) (d_sin cos - d_cos sin) at d_delta_row (HEAD_DIM,). x_rows / dx_rows: (rows, 1) row pointers.
    Every element is computed as by one whole-tile pass; at BLOCK_D > 64 in channel quarters one after another."""
    # Why quarters: a whole (rows, 128) tile's phase, sin and cos beside the accumulators exceed 255 registers
    # (ptxas spilled the dq kernel's epilogue), and a quarter's recomputed phase cannot be merged by the compiler
    # with the dk/dv kernel's prologue transform of the whole key block (which kept its sin and cos live, spilled,
    # through the loop). docs/kernels.md, "Head dim 128".
    d_cos, d_sin = _split_halves(d_wide)
    if BLOCK_D > 64:
        d_cos_low, d_cos_high = _split_halves(d_cos)
        d_sin_low, d_sin_high = _split_halves(d_sin)
        _chain_rule_in_halves(
            d_cos_low,
            d_sin_low,
            x_rows,
            dx_rows,
            positions,
            mask_rows,
            Theta,
            delta_row,
            scale,
            d_delta_row,
            0,
            HEAD_DIM,
            HAS_DELTA,
            MAGNITUDE,
        )
        _chain_rule_in_halves(
            d_cos_high,
            d_sin_high,
            x_rows,
            dx_rows,
            positions,
            mask_rows,
            Theta,
            delta_row,
            scale,
            d_delta_row,
            BLOCK_D // 2,
            HEAD_DIM,
            HAS_DELTA,
            MAGNITUDE,
        )
    else:
        _chain_rule_part(
            d_cos,
            d_sin,
            x_rows,
            dx_rows,
            positions,
            mask_rows,
            Theta,
            delta_row,
            scale,
            d_delta_row,
            tl.arange(0, BLOCK_D),
            HEAD_DIM,
            HAS_DELTA,
            MAGNITUDE,
        )


@triton.jit
def _chain_rule_in_halves(
    d_cos,
    d_sin,
    x_rows,
    dx_rows,
    positions,
    mask_rows,
    Theta,
    delta_row,
    scale,
    d_delta_row,
    first_channel: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
):
    """`_chain_rule_part` for channels first_channel.. + width of d_cos, in two halves one after the other."""
    half: tl.constexpr = d_cos.shape[1] // 2
    d_cos_low, d_cos_high = _split_halves(d_cos)
    d_sin_low, d_sin_high = _split_halves(d_sin)
    _chain_rule_part(
        d_cos_low,
        d_sin_low,
        x_rows,
        dx_rows,
        positions,
        mask_rows,
        Theta,
        delta_row,
        scale,
        d_delta_row,
        tl.arange(0, half) + first_channel,
        HEAD_DIM,
        HAS_DELTA,
        MAGNITUDE,
    )
    _chain_rule_part(
        d_cos_high,
        d_sin_high,
        x_rows,
        dx_rows,
        positions,
        mask_rows,
        Theta,
        delta_row,
        scale,
        d_delta_row,
        tl.arange(0, half) + (first_channel + half),
        HEAD_DIM,
        HAS_DELTA,
        MAGNITUDE,
    )


@triton.jit
def _chain_rule_part(
    d_cos,
    d_sin,
    x_rows,
    dx_rows,
    positions,
    mask_rows,
    Theta,
    delta_row,
    scale,
    d_delta_row,
    offs_d,
    HEAD_DIM: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
):
    """`_chain_rule` for the channels offs_d of (d_cos, d_sin)."""
    mask_d = offs_d < HEAD_DIM
    mask = mask_rows[:, None] & mask_d[None, :]
    x32 = tl.load(x_rows + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    sin_x, cos_x = _sincos(_phase(positions, Theta, delta_row, offs_d, mask_d, HAS_DELTA, HEAD_DIM))
    dx = (d_cos * cos_x + d_sin * sin_x) * (_magnitude_grad(x32, MAGNITUDE) * scale)
    tl.store(dx_rows + offs_d[None, :], dx.to(dx_rows.dtype.element_ty), mask=mask)
    if HAS_DELTA:
        # d phase = f(x) (-dx'_cos sin + dx'_sin cos); d delta = -sum_rows d phase. One partial per block.
        magnitude = tl.where(mask, _magnitude(x32, MAGNITUDE), 0.0)
        d_phase = magnitude * (d_sin * cos_x - d_cos * sin_x)
        d_delta = -tl.sum(tl.where(mask, d_phase, 0.0), 0)  # (channels,)
        tl.store(d_delta_row + offs_d, d_delta, mask=mask_d)
