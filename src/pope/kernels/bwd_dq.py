"""The dq kernel of the backward, `_pope_bwd_dq_kernel`: one program per query block computes D = rowsum(dO * O), dq
and one partial sum of d(delta) per block, iterating over key blocks. Launched by pope.kernels.bwd.backward."""

from __future__ import annotations

import triton
import triton.language as tl

from .bwd_chain_rule import _chain_rule
from .jit_math import (
    _dot,
    _key_ranges,
    _query_block,
    _query_sequence,
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
