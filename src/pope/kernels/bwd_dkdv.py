"""The dk/dv kernel of the backward, `_pope_bwd_dkdv_kernel`: one program per key block computes dk and dv,
iterating over the query blocks of every query head of its key head's GQA group, and writes them in their inputs'
layouts; at BLOCK_D <= 64 it reads its key block from the pre-pass's k'. Launched by pope.kernels.bwd.backward."""

from __future__ import annotations

import triton
import triton.language as tl

from .bwd_chain_rule import _chain_rule
from .jit_math import (
    _dot,
    _join_halves,
    _packed_sequence,
    _phase,
    _polar_to_cartesian,
    _stats_start,
)


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
        # register copies: d=64 spills 136 B -> none). (In a packed batch, rows past the sequence are the next
        # one's: they reach only their own rows, masked from the stores.)
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
