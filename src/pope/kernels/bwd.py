"""The backward: dq, dk, dv and d(delta) of PoPE attention, by three kernels beside their launcher `backward`.

  1. `_pope_bwd_dq_kernel`, one program per query block: D = rowsum(dO * O), dq, and one partial sum of d(delta)
     per block, iterating over key blocks;
  2. `_pope_bwd_dkdv_kernel`, one program per key block: dk and dv, iterating over the query blocks of every
     query head of its key head's GQA group; at BLOCK_D <= 64 it reads its key block from k' and writes [dk | dv]
     over its own k' rows (after reading them);
  3. `_backward_epilogue_kernel`: copies dk and dv out of those rows and sums d(delta)'s partials.
Guarantees: no atomics anywhere: d(delta) is summed in a fixed order, so two runs give bitwise-identical gradients;
the buffers the backward allocates peak at 5 |q| at MHA (dq + q' + k'), as SDPA's dq, dk, dv and fp32 dq
accumulator; every pre-pass buffer is freed before the call returns. Same inputs and layouts as the forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pope.magnitudes import MAGNITUDES

from . import direct_launch, host, prepass
from .configs import DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D, TRANSFORM_ROWS, pick_tiles
from .jit_math import (
    _dot,
    _join_halves,
    _key_ranges,
    _magnitude,
    _magnitude_grad,
    _packed_sequence,
    _phase,
    _polar_to_cartesian,
    _query_block,
    _query_sequence,
    _sincos,
    _split_halves,
    _stats_start,
    _tf32_rounded,
)


@triton.jit
def _bwd_dq_inner(
    dq_wide,
    q_wide,
    do,
    lse2,
    row_delta,
    kp_desc,
    v_desc,
    kv_bh,
    b,
    hk,
    offs_m,
    q_offset,
    seq_k,
    start_k,
    lo,
    hi,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_KEYS: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dq' over key blocks [lo, hi) of the keys starting at row start_k. k' and v come by TMA (rows past the keys
    arrive as zeros, or in a packed batch as the next sequence's, whose probabilities are 0): TMA rather than
    pointer loads because the backward measured faster that way (docs/kernels.md)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_wide = kp_desc.load([kv_bh, start_k + start_n, 0]).reshape(BLOCK_N, 2 * BLOCK_D)
        v = v_desc.load([b, hk, start_k + start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        scores = _dot(q_wide, tl.trans(k_wide), None, PRECISION)
        probs = tl.math.exp2(scores * qk_scale - lse2[:, None])  # (BLOCK_M, BLOCK_N)
        if MASK_KEYS:
            visible = (offs_n < seq_k)[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= (q_offset + offs_m)[:, None])
            probs = tl.where(visible, probs, 0.0)
        dprobs = _dot(do, tl.trans(v), None, PRECISION)
        dscores = (probs * (dprobs - row_delta[:, None])).to(k_wide.dtype)
        dq_wide = _dot(dscores, k_wide, dq_wide, PRECISION)  # dq' (BLOCK_M, 2 BLOCK_D)
    return dq_wide


@triton.jit
def _pope_bwd_dq_kernel(
    Q,
    qp_desc,
    kp_desc,
    v_desc,
    Out,
    DO,
    LSE,
    Theta,
    Delta,
    DQ,
    RowDelta,
    DDeltaPartial,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_ob,
    stride_oh,
    stride_on,
    stride_dob,
    stride_doh,
    stride_don,
    stride_dqb,
    stride_dqh,
    stride_dqn,
    n_q_heads,
    group_size,
    seq_q,
    seq_k,
    q_offset,
    softmax_scale,
    row_delta_stride,
    CuSeqlensQ,
    CuSeqlensK,
    PackedLSE,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
    PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr = False,
):
    pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, mask_d, mask_rows = _query_block(
        n_q_heads, group_size, seq_q, BLOCK_M, BLOCK_D, HEAD_DIM
    )
    # Packed sequences (IS_VARLEN): this program's sequence; its lengths and q_offset replace the arguments.
    b, q_row, kv_bh, start_q, start_k, n_q, seq_k, q_offset, mask_rows = _query_sequence(
        CuSeqlensQ, CuSeqlensK, pid_bh, b, h, kv_bh, group_size, offs_m, mask_rows, seq_q, seq_k, q_offset, IS_VARLEN
    )
    if IS_VARLEN:
        if pid_m * BLOCK_M >= n_q:  # the grid covers the longest sequence: past this one's end, no rows
            if HAS_DELTA:  # (its d delta partial is zero)
                tl.store(
                    DDeltaPartial + (pid_bh * tl.num_programs(0) + pid_m) * HEAD_DIM + offs_d,
                    tl.zeros([BLOCK_D], dtype=tl.float32),
                    mask=mask_d,
                )
            return
    mask_q = mask_rows[:, None] & mask_d[None, :]

    # This program's query block, from the q' pre-pass by TMA into shared memory (as in the forward): no
    # transform at program start and no register copy of q' (rows past the queries arrive as zeros).
    q_wide = qp_desc.load([q_row, start_q + pid_m * BLOCK_M, 0]).reshape(BLOCK_M, 2 * BLOCK_D)

    rows = start_q + offs_m  # in the (B, Hq, Nq, d) tensors and (B * Hq, .) statistics; packed: batch-1 views
    do, row_delta = _row_statistics(
        Out,
        DO,
        LSE,
        RowDelta,
        PackedLSE,
        stride_ob,
        stride_oh,
        stride_on,
        stride_dob,
        stride_doh,
        stride_don,
        pid_bh,
        n_q_heads,
        b,
        h,
        q_row,
        start_q,
        rows,
        offs_m,
        offs_d,
        mask_q,
        mask_rows,
        seq_q,
        row_delta_stride,
        IS_VARLEN,
        PRECISION,
    )
    lse2 = tl.load(LSE + q_row * seq_q + rows, mask=mask_rows, other=float("inf")) * 1.4426950408889634

    hk = h // group_size
    dq_wide = tl.zeros([BLOCK_M, 2 * BLOCK_D], dtype=tl.float32)
    unmasked_end, last_visible = _key_ranges(pid_m, q_offset, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq_wide = _bwd_dq_inner(
        dq_wide,
        q_wide,
        do,
        lse2,
        row_delta,
        kp_desc,
        v_desc,
        kv_bh,
        b,
        hk,
        offs_m,
        q_offset,
        seq_k,
        start_k,
        0,
        unmasked_end,
        softmax_scale * 1.4426950408889634,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        False,
        CAUSAL,
        PRECISION,
    )
    dq_wide = _bwd_dq_inner(
        dq_wide,
        q_wide,
        do,
        lse2,
        row_delta,
        kp_desc,
        v_desc,
        kv_bh,
        b,
        hk,
        offs_m,
        q_offset,
        seq_k,
        start_k,
        unmasked_end,
        last_visible,
        softmax_scale * 1.4426950408889634,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        True,
        CAUSAL,
        PRECISION,
    )

    # Chain rule through q' = f(q) [cos(phase), sin(phase)], phase = t theta - delta; dq' = scale * dS k'.
    # The fp32 phase and magnitude are recomputed here rather than kept live through the loop (registers).
    q_rows = Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn  # (BLOCK_M, 1) row pointers
    dq_rows = DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqn
    d_delta_row = DDeltaPartial + (pid_bh * tl.num_programs(0) + pid_m) * HEAD_DIM
    _chain_rule(
        dq_wide * softmax_scale,
        q_rows,
        dq_rows,
        q_offset + offs_m,
        mask_rows,
        Theta,
        Delta + h * HEAD_DIM,
        1.0,
        d_delta_row,
        HEAD_DIM,
        BLOCK_D,
        HAS_DELTA,
        MAGNITUDE,
    )


@triton.jit
def _row_statistics(
    Out,
    DO,
    LSE,
    RowDelta,
    PackedLSE,
    stride_ob,
    stride_oh,
    stride_on,
    stride_dob,
    stride_doh,
    stride_don,
    pid_bh,
    n_q_heads,
    b,
    h,
    q_row,
    start_q,
    rows,
    offs_m,
    offs_d,
    mask_q,
    mask_rows,
    seq_q,
    row_delta_stride,
    IS_VARLEN: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """A query block's dO (BLOCK_M, BLOCK_D) and D_i = dO_i . O_i (BLOCK_M,) fp32, D stored where the dk/dv kernel
    reads it by TMA: row q_row * row_delta_stride + rows; packed (IS_VARLEN), at the sequence's 16-byte aligned
    statistics rows (`_stats_start`: a TMA row offset must be 16-byte aligned, a sequence's first row is anywhere),
    with a copy of its lse there. rows: the block's rows in the (B, Hq, Nq, d) tensors (packed: batch-1 views).
    Under TF32 dots D_i takes dO rounded to TF32, as the dots' dP_ij = dO_i . v_j do: dS_ij = P_ij (dP_ij - D_i)
    cancels, and a D_i from the unrounded dO would leave dO's rounding error, 2^-11 |dO_i| |O_i|, in every dS_ij
    of the row (a row that sees one key, P = 1, whose exact dS is 0, would keep all of it)."""
    do = tl.load(
        DO + b * stride_dob + h * stride_doh + rows[:, None] * stride_don + offs_d[None, :], mask=mask_q, other=0.0
    )
    if PRECISION == "tf32":
        do = _tf32_rounded(do)  # fp32 only: 16-bit dO (PRECISION "tf32" too) is unchanged
    out = tl.load(
        Out + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + offs_d[None, :], mask=mask_q, other=0.0
    )
    row_delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)
    if IS_VARLEN:
        stats_rows = q_row * row_delta_stride + _stats_start(start_q, pid_bh // n_q_heads) + offs_m
        tl.store(RowDelta + stats_rows, row_delta, mask=mask_rows)
        tl.store(PackedLSE + stats_rows, tl.load(LSE + q_row * seq_q + rows, mask=mask_rows), mask=mask_rows)
    else:
        tl.store(RowDelta + q_row * row_delta_stride + rows, row_delta, mask=mask_rows)
    return do, row_delta


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


@triton.jit
def _leading(tile, BLOCK_M: tl.constexpr):
    """The first BLOCK_M entries of a (1, BLOCK_M or 2 BLOCK_M) statistics tile (`statistics_descriptors`)."""
    if tile.shape[1] == BLOCK_M:
        leading = tile.reshape(BLOCK_M)
    else:  # (2, BLOCK_M) -> (BLOCK_M, 2): its first column is the first half
        leading, _ = tl.split(tl.trans(tile.reshape(2, BLOCK_M)))
    return leading


@triton.jit
def _bwd_dkdv_inner(
    dk_wide,
    dv,
    k_wide,
    v,
    qp_desc,
    do_desc,
    lse_desc,
    rowdelta_desc,
    bh_q,
    b,
    h,
    offs_n,
    q_offset,
    seq_q,
    start_q,
    stats_start,
    lo,
    hi,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dk', dv over query blocks [lo, hi) of the queries starting at row start_q (their lse and D at stats_start)."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_wide = qp_desc.load([bh_q, start_q + start_m, 0]).reshape(BLOCK_M, 2 * BLOCK_D)  # q' (BLOCK_M, 2 BLOCK_D)
        do = do_desc.load([b, h, start_q + start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        # Rows past the queries (the statistics' row padding holds anything): lse = +inf and D = 0, so P^T = 0 and
        # dS^T = 0 in those columns (q' and dO read as zeros there, or in a packed batch as the next sequence's).
        valid_rows = offs_m < seq_q
        lse2 = (
            tl.where(valid_rows, _leading(lse_desc.load([bh_q, stats_start + start_m]), BLOCK_M), float("inf"))
            * 1.4426950408889634
        )
        row_delta = tl.where(valid_rows, _leading(rowdelta_desc.load([bh_q, stats_start + start_m]), BLOCK_M), 0.0)
        # Transposed scores S^T (BLOCK_N, BLOCK_M).
        scores_t = _dot(k_wide, tl.trans(q_wide), None, PRECISION)
        probs_t = tl.math.exp2(scores_t * qk_scale - lse2[None, :])
        if MASK_CAUSAL:
            probs_t = tl.where(offs_n[:, None] <= (q_offset + offs_m)[None, :], probs_t, 0.0)
        dv = _dot(probs_t.to(do.dtype), do, dv, PRECISION)
        dprobs_t = _dot(v, tl.trans(do), None, PRECISION)
        dscores_t = (probs_t * (dprobs_t - row_delta[None, :])).to(q_wide.dtype)
        dk_wide = _dot(dscores_t, q_wide, dk_wide, PRECISION)  # dk' (BLOCK_N, 2 BLOCK_D)
    return dk_wide, dv


@triton.jit
def _pope_bwd_dkdv_kernel(
    K,
    V,
    kp_desc,
    v_desc,
    qp_desc,
    do_desc,
    lse_desc,
    rowdelta_desc,
    Theta,
    DK,
    DV,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    n_kv_heads,
    group_size,
    seq_q,
    seq_k,
    q_offset,
    softmax_scale,
    CuSeqlensQ,
    CuSeqlensK,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    MAGNITUDE: tl.constexpr,
    PRECISION: tl.constexpr,
    KEYS_FROM_PREPASS: tl.constexpr,
    IS_VARLEN: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    kv_row = pid_bh
    if IS_VARLEN:
        # Packed sequences, seen as batch 1 (as in jit_math._query_sequence): grid row pid_bh is (sequence b, key
        # head hk); the sequence's lengths and q_offset replace the arguments.
        start_q, seq_q, start_k, seq_k, q_offset = _packed_sequence(CuSeqlensQ, CuSeqlensK, b)
        stats_start = _stats_start(start_q, b)
        b = 0
        kv_row = hk
        if pid_n * BLOCK_N >= seq_k:  # the grid covers the longest sequence: past this one's end
            return
    else:
        start_q = 0
        start_k = 0
        stats_start = 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_k = (offs_n < seq_k)[:, None] & mask_d[None, :]

    rows = start_k + offs_n
    k_rows = K + b * stride_kb + hk * stride_kh + rows[:, None] * stride_kn  # (BLOCK_N, 1) row pointers
    if KEYS_FROM_PREPASS:
        # This program's key block k' and its v, by TMA into shared memory (the products' operands there, no
        # register copies: d=64 spills 136 B -> none). DK and DV point into the same k' rows: each program reads
        # its own rows here and overwrites them only in its epilogue (the launcher copies dk and dv out).
        # (In a packed batch, rows past the sequence are the next one's: they reach only their own, unstored rows.)
        k_wide = kp_desc.load([kv_row, start_k + pid_n * BLOCK_N, 0]).reshape(BLOCK_N, 2 * BLOCK_D)
        v = v_desc.load([b, hk, start_k + pid_n * BLOCK_N, 0]).reshape(BLOCK_N, BLOCK_D)
    else:
        # This program's key block, transformed once in registers.
        k = tl.load(k_rows + offs_d[None, :], mask=mask_k, other=0.0)
        v = tl.load(
            V + b * stride_vb + hk * stride_vh + rows[:, None] * stride_vn + offs_d[None, :], mask=mask_k, other=0.0
        )
        phase = _phase(offs_n, Theta, Theta, offs_d, mask_d, False, HEAD_DIM)
        k_cos, k_sin = _polar_to_cartesian(k, phase, mask_k, MAGNITUDE)
        k_wide = _join_halves(k_cos.to(k.dtype), k_sin.to(k.dtype))  # k' (BLOCK_N, 2 BLOCK_D)

    dk_wide = tl.zeros([BLOCK_N, 2 * BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    start_n = pid_n * BLOCK_N
    if CAUSAL:
        # Query rows i see this whole block iff q_offset + i >= start_n + BLOCK_N - 1.
        first_row = tl.maximum(start_n - q_offset, 0)
        masked_lo = tl.minimum((first_row // BLOCK_M) * BLOCK_M, seq_q)
        masked_hi = tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - q_offset, 0), seq_q)
        masked_hi = tl.minimum(tl.cdiv(masked_hi, BLOCK_M) * BLOCK_M, tl.cdiv(seq_q, BLOCK_M) * BLOCK_M)
        masked_hi = tl.maximum(masked_hi, masked_lo)
    else:
        masked_lo = 0
        masked_hi = 0
    n_q_heads = n_kv_heads * group_size
    for g in range(0, group_size):
        h = hk * group_size + g
        bh_q = b * n_q_heads + h
        if CAUSAL:
            dk_wide, dv = _bwd_dkdv_inner(
                dk_wide,
                dv,
                k_wide,
                v,
                qp_desc,
                do_desc,
                lse_desc,
                rowdelta_desc,
                bh_q,
                b,
                h,
                offs_n,
                q_offset,
                seq_q,
                start_q,
                stats_start,
                masked_lo,
                masked_hi,
                softmax_scale * 1.4426950408889634,
                BLOCK_M,
                BLOCK_D,
                True,
                PRECISION,
            )
        dk_wide, dv = _bwd_dkdv_inner(
            dk_wide,
            dv,
            k_wide,
            v,
            qp_desc,
            do_desc,
            lse_desc,
            rowdelta_desc,
            bh_q,
            b,
            h,
            offs_n,
            q_offset,
            seq_q,
            start_q,
            stats_start,
            masked_hi,
            seq_q,
            softmax_scale * 1.4426950408889634,
            BLOCK_M,
            BLOCK_D,
            False,
            PRECISION,
        )

    # dk through k' = f(k) [cos(s theta), sin(s theta)], dk' = scale * dS^T q', the phases recomputed, not kept.
    _chain_rule(
        dk_wide,
        k_rows,
        DK + b * stride_dkb + hk * stride_dkh + rows[:, None] * stride_dkn,
        offs_n,
        offs_n < seq_k,
        Theta,
        Theta,
        softmax_scale,
        Theta,
        HEAD_DIM,
        BLOCK_D,
        False,
        MAGNITUDE,
    )
    tl.store(
        DV + b * stride_dvb + hk * stride_dvh + rows[:, None] * stride_dvn + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=mask_k,
    )


@triton.jit
def _backward_epilogue_kernel(
    X,
    OutA,
    OutB,
    n_rows,
    n_split_programs,
    Partial,
    DDelta,
    batch,
    n_q_heads,
    n_m_blocks,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """The backward's last launch, two jobs by program id:
    * programs < n_split_programs: rows [a | b] of X (n_rows, 2 BLOCK_D), each half zero-padded to BLOCK_D ->
      contiguous OutA, OutB (n_rows, d): the dk/dv kernel's gradients, written over k' rows, copied out in one
      pass (two strided torch copies cost twice the time on an H200);
    * the programs after them, one per query head: d(delta)[h] (d,) = the sum of the dq kernel's partials
      Partial (B, Hq, n_m_blocks, d) fp32 over batches and query blocks, in a fixed order (deterministic), stored
      in DDelta's dtype: one launch instead of a torch sum and cast after the kernels."""
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    if pid < n_split_programs:
        offs_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = (offs_r < n_rows)[:, None] & mask_d[None, :]
        rows = X + offs_r[:, None] * (2 * BLOCK_D) + offs_d[None, :]
        out = offs_r[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(OutA + out, tl.load(rows, mask=mask), mask=mask)
        tl.store(OutB + out, tl.load(rows + BLOCK_D, mask=mask), mask=mask)
    else:
        h = pid - n_split_programs
        total = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)  # (blocks, channels) partial sums
        offs_m = tl.arange(0, BLOCK_R)
        for b in range(0, batch):
            head_rows = Partial + (b * n_q_heads + h).to(tl.int64) * n_m_blocks * HEAD_DIM
            for start in range(0, n_m_blocks, BLOCK_R):
                blocks = start + offs_m
                mask = (blocks < n_m_blocks)[:, None] & mask_d[None, :]
                total += tl.load(head_rows + blocks[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0)
        tl.store(DDelta + h * HEAD_DIM + offs_d, tl.sum(total, 0).to(DDelta.dtype.element_ty), mask=mask_d)


def statistics_buffers(rows: int, seq_q: int, packed: host.Packed | None, device: torch.device):
    """(padded_q, D, packed lse): the fp32 (rows = B * Hq, padded_q) buffer that D = rowsum(dO * O) is stored in for
    the dk/dv kernel's TMA loads, rows padded to a multiple of 4 (16-byte stride); packed, each sequence's statistics
    start 16-byte aligned (jit_math._stats_start) and lse is copied beside them into the second buffer (else None)."""
    padded_q = host.cdiv(seq_q + (3 * packed.batch if packed else 0), 4) * 4
    row_delta = host.empty((rows, padded_q), device=device, dtype=torch.float32)
    packed_lse = host.empty(row_delta.shape, device=device, dtype=torch.float32) if packed else None
    return padded_q, row_delta, packed_lse


def lse_statistics_rows(lse: torch.Tensor, row_delta: torch.Tensor, packed_lse: torch.Tensor | None) -> torch.Tensor:
    """lse as the dk/dv kernel's TMA source, laid out like D (`statistics_buffers`): its rows padded like D's;
    packed, the copy the kernel that computed D made."""
    if packed_lse is not None:
        return packed_lse
    rows, padded_q = row_delta.shape
    lse_rows = lse.reshape(rows, -1)  # (B * Hq, Nq)
    if lse_rows.shape[1] == padded_q:
        return lse_rows
    return torch.nn.functional.pad(lse_rows, (0, padded_q - lse_rows.shape[1]))


def statistics_descriptors(lse_rows: torch.Tensor, row_delta: torch.Tensor, block_m: int) -> tuple:
    """The dk/dv kernel's TMA descriptors of lse and D (`statistics_buffers`) for block_m-row query blocks, in boxes
    of max(block_m, 32) fp32, at least 128 bytes (direct_launch.TMA_SHARED_ALIGNMENT: 16 rows put every second
    pipeline stage at a misaligned address); the kernel keeps a box's first block_m entries (`_leading`)."""
    box = [1, max(block_m, direct_launch.TMA_SHARED_ALIGNMENT // row_delta.element_size())]
    return direct_launch.descriptor(lse_rows, box), direct_launch.descriptor(row_delta, box)


def backward(
    do,
    q,
    k,
    v,
    delta,
    out,
    lse,
    theta,
    *,
    causal: bool,
    softmax_scale: float,
    q_offset: int,
    magnitude: str,
    dq_config=None,
    dkdv_config=None,
    packed: host.Packed | None = None,
):
    """Returns (dq, dk, dv, d_delta or None). Deterministic: no atomics anywhere. packed: a packed batch as the
    forward's (do, q, out (total_q, Hq, d), k, v (total_k, Hkv, d), lse (Hq, total_q)), one launch per kernel."""
    precision = host.precision(q.dtype, q.device)  # a constexpr of the kernels: part of the launch sites' plan key
    plan = host.plan(
        do,
        q,
        k,
        v,
        delta,
        out,
        lse,
        theta,
        causal,
        q_offset,
        magnitude,
        dq_config,
        dkdv_config,
        precision,
        *(packed or ()),
    )
    # Pre-pass buffers and gradients are made as late and freed as early as they can be, so that what the
    # backward allocates peaks at 5 |q| at MHA (dq + q' + k'), as SDPA's dq, dk, dv and fp32 dq accumulator.
    # Gradients are allocated in the inputs' own shapes (packed: (total, H, d)); the kernels see batch views.
    dq = host.empty(q.shape, device=q.device, dtype=q.dtype)
    k_shape, v_shape = k.shape, v.shape
    dq_view = dq
    if packed is not None:  # batch-1 views of the packed tensors
        do, q, k, v, out, dq_view = (host.batch_view(t, packed) for t in (do, q, k, v, out, dq))
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    group_size = n_q_heads // n_kv_heads
    block_d = host.block_d(head_dim)
    code = MAGNITUDES[magnitude].kernel_code
    cu_seqlens = host.cu_seqlens(packed)
    # The grids' sequences and rows: packed, every sequence up to the longest.
    n_sequences, rows_q, rows_k = (
        (packed.batch, packed.max_seqlen_q, packed.max_seqlen_k) if packed else (batch, seq_q, seq_k)
    )
    padded_q, row_delta, packed_lse = statistics_buffers(batch * n_q_heads, seq_q, packed, q.device)
    # q' serves both parts: part 1's query blocks and part 2's streamed queries. k' serves part 1's streamed keys
    # (freed after part 1, or at d <= 64 after part 2, which reads its key blocks from it and writes dk and dv
    # over it). Both from one launch.
    q_prime, k_prime = prepass.transform_queries_and_keys(
        q, k, theta, delta, q_offset=q_offset, magnitude=magnitude, site=plan + ("backward q' k'",), packed=packed
    )

    # Part 1: dq, D and the d delta partials.
    block_m, block_n, num_warps, num_stages = pick_tiles("dq", head_dim, dq_config, q.dtype, q.device, precision)
    n_m_blocks = host.cdiv(rows_q, block_m)
    d_delta_partial = host.empty((n_sequences, n_q_heads, n_m_blocks, head_dim), device=q.device, dtype=torch.float32)
    q_rows = q_prime.view(batch * n_q_heads, seq_q, 2 * block_d)
    k_rows = k_prime.view(batch * n_kv_heads, seq_k, 2 * block_d)
    v_tma = host.tma_ready(v, block_d)
    qp_desc = direct_launch.descriptor(q_rows, [1, block_m, 2 * block_d])
    kp_desc = direct_launch.descriptor(k_rows, [1, block_n, 2 * block_d])
    v_desc = direct_launch.descriptor(v_tma, [1, 1, block_n, block_d])
    direct_launch.launch(
        _pope_bwd_dq_kernel,
        (n_m_blocks, n_sequences * n_q_heads),
        plan + ("dq",),
        (
            q,
            qp_desc,
            kp_desc,
            v_desc,
            out,
            do,
            lse,
            theta,
            delta if delta is not None else theta,
            dq_view,
            row_delta,
            d_delta_partial,
            *host.strides(q),
            *host.strides(out),
            *host.strides(do),
            *host.strides(dq_view),
            n_q_heads,
            group_size,
            seq_q,
            seq_k,
            q_offset,
            softmax_scale,
            padded_q,
            *cu_seqlens,
            packed_lse,
        ),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        HAS_DELTA=delta is not None,
        MAGNITUDE=code,
        PRECISION=precision,
        IS_VARLEN=packed is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    # Part 2: dk, dv, streaming the queries' q' (freed after). Part 1's descriptors serve again where the
    # tiles agree (host time).
    block_m, block_n, num_warps, num_stages = pick_tiles("dkdv", head_dim, dkdv_config, q.dtype, q.device, precision)
    keys_from_prepass = block_d <= DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D
    if keys_from_prepass:
        # Each program reads its key block from k' and writes its dk and dv over those same k' rows, [dk | dv]
        # (no new memory: k' and dq + dk + dv are the same 5 |q|); dk and dv are copied out below.
        kp_rows = k_prime.view(batch, n_kv_heads, seq_k, 2 * block_d)
        dk_out, dv_out = kp_rows[..., :head_dim], kp_rows[..., block_d : block_d + head_dim]
        key_descriptors = (
            direct_launch.same_tiles(kp_desc, k_rows, [1, block_n, 2 * block_d]),
            direct_launch.same_tiles(v_desc, v_tma, [1, 1, block_n, block_d]),
        )
    else:
        del k_prime, k_rows, kp_desc  # k' dies before dk and dv exist (peak memory; a descriptor holds its tensor)
        dk = host.empty(k_shape, device=k.device, dtype=k.dtype)
        dv = host.empty(v_shape, device=v.device, dtype=v.dtype)
        dk_out, dv_out = host.batch_view(dk, packed), host.batch_view(dv, packed)
        key_descriptors = (None, None)
    # q', dO, lse and D stream in by TMA.
    lse_rows = lse_statistics_rows(lse, row_delta, packed_lse)
    descriptors = (
        direct_launch.same_tiles(qp_desc, q_rows, [1, block_m, 2 * block_d]),
        direct_launch.descriptor(host.tma_ready(do, block_d), [1, 1, block_m, block_d]),
        *statistics_descriptors(lse_rows, row_delta, block_m),
    )
    direct_launch.launch(
        _pope_bwd_dkdv_kernel,
        (host.cdiv(rows_k, block_n), n_sequences * n_kv_heads),
        plan + ("dk dv",),
        (
            k,
            v,
            *key_descriptors,
            *descriptors,
            theta,
            dk_out,
            dv_out,
            *host.strides(k),
            *host.strides(v),
            *host.strides(dk_out),
            *host.strides(dv_out),
            n_kv_heads,
            group_size,
            seq_q,
            seq_k,
            q_offset,
            softmax_scale,
            *cu_seqlens,
        ),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        MAGNITUDE=code,
        PRECISION=precision,
        KEYS_FROM_PREPASS=keys_from_prepass,
        IS_VARLEN=packed is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    del q_prime, q_rows, qp_desc, descriptors, key_descriptors
    # One last launch: dk and dv copied out of k' (d <= 64) and d(delta) summed from its partials, by one kernel.
    # (k' rows are in the order of k's own: (B, Hkv, Nk) or packed (total_k, Hkv), so dk and dv come out contiguous.)
    if keys_from_prepass:
        dk = host.empty(k_shape, device=k.device, dtype=k.dtype)
        dv = host.empty(v_shape, device=v.device, dtype=v.dtype)
        n_rows = batch * n_kv_heads * seq_k
        source = k_prime
    else:
        n_rows, source = 0, dk  # nothing to split: source, outputs unused
    d_delta = host.empty(delta.shape, device=q.device, dtype=delta.dtype) if delta is not None else None
    n_split_programs = host.cdiv(n_rows, TRANSFORM_ROWS)
    n_programs = n_split_programs + (n_q_heads if delta is not None else 0)
    if n_programs:
        direct_launch.launch(
            _backward_epilogue_kernel,
            (n_programs,),
            plan + ("dk dv out, d delta",),
            (
                source,
                dk,
                dv,
                n_rows,
                n_split_programs,
                d_delta_partial,
                d_delta if d_delta is not None else d_delta_partial,
                n_sequences,
                n_q_heads,
                n_m_blocks,
            ),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_R=TRANSFORM_ROWS,
            num_warps=4,
        )
    if keys_from_prepass:
        del k_prime, k_rows, kp_desc, kp_rows, dk_out, dv_out
    return dq, dk, dv, d_delta
