"""The atomic backward (pope_attention(..., deterministic=False)): dq, dk, dv and d(delta) by FlashAttention-2's scheme,
one pass over the scores instead of bwd's two, beside its launcher `backward_atomic`.

  1. `_row_statistics_kernel`, one program per query block: D = rowsum(dO * O) (packed: and a copy of lse) at the
     statistics rows bwd's dk/dv kernel reads them from (the same layout, read the same way, by TMA);
  2. `_pope_bwd_atomic_kernel`, one program per key block: dk and dv as bwd's dk/dv kernel computes them, and for
     every query block it visits dq' = dS k' (BLOCK_M, 2 BLOCK_D), added with tl.atomic_add into an fp32
     accumulator (B * Hq, Nq, 2 BLOCK_D) (packed: (Hq, total_q, 2 BLOCK_D)) that starts at zero;
  3. `_dq_from_accumulator_kernel`, one program per query block: the chain rule from the summed dq' to dq, and one
     partial sum of d(delta) per block (bwd's dq kernel's epilogue);
  4. bwd's `_backward_epilogue_kernel`: d(delta) summed from those partials in a fixed order.
Guarantees: the gradients are bwd.backward's up to fp32 summation order (other tiles; the atomics add the key
blocks' dq' contributions in the order they arrive, so dq, and through it d(delta), may differ in their last bits
from run to run; dk and dv take no atomics and are reproducible). Same inputs, layouts and packed batches as
bwd.backward. Memory: the accumulator holds 2 BLOCK_D fp32 channels a query row (4 |q| at 16-bit inputs, d a
power of two), beside q', k', dk and dv: 10 |q| at MHA at the peak, against the deterministic backward's 5 |q|.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pope.magnitudes import MAGNITUDES

from . import direct_launch, host, prepass
from .bwd import _backward_epilogue_kernel
from .configs import TRANSFORM_ROWS, Tiles, bucket, pick_tiles
from .interpreter import INTERPRET
from .jit_math import (_magnitude, _magnitude_grad, _packed_sequence, _phase, _query_block, _query_sequence,
                       _sincos, _split_halves, _stats_start)

# The atomic kernel's 16-bit tiles (BLOCK_M, BLOCK_N, warps, stages) by head-dim bucket, for sm_90: bwd's dk/dv tiles
# do not fit it (at d = 128 it would need 264 KB of shared memory, more than an H100/H200 SM has; at d = 64 they
# spill 340 B), these compile for sm_90a with no spills (d = 64: two programs per SM) and fit (scripts/
# kernel_registers.py's report, also tests/test_kernel_atomic_bwd.py). Chosen by that report alone, not timed on
# a GPU. fp32 inputs and the interpreter take bwd's dk/dv tiles (configs.pick_tiles).
ATOMIC_TILES = {64: Tiles(16, 64, 4, 3), 128: Tiles(16, 64, 8, 3)}


def atomic_tiles(head_dim: int, override, dtype: torch.dtype, device: torch.device) -> Tiles:
    """The tiles `backward_atomic` runs its main kernel with: override when given, else ATOMIC_TILES (16-bit on a
    GPU; the largest bucket's beyond it), else the dk/dv kernel's (fp32, the interpreter)."""
    if override is not None:
        return Tiles(*override)
    if INTERPRET or dtype == torch.float32:
        return pick_tiles("dkdv", head_dim, None, dtype, device)
    return ATOMIC_TILES.get(bucket(head_dim), ATOMIC_TILES[max(ATOMIC_TILES)])


@triton.jit
def _row_statistics_kernel(
    Out, DO, LSE, RowDelta, PackedLSE,
    stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
    n_q_heads, seq_q, row_delta_stride, CuSeqlensQ, CuSeqlensK,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr = False,
):
    """D_i = dO_i . O_i (fp32) of one query block, stored where bwd's dq kernel stores it (packed: lse copied too)."""
    pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, mask_d, mask_rows = _query_block(n_q_heads, 1, seq_q, BLOCK_M,
                                                                                 BLOCK_D, HEAD_DIM)
    b, q_row, kv_bh, start_q, start_k, n_q, seq_k, q_offset, mask_rows = _query_sequence(
        CuSeqlensQ, CuSeqlensK, pid_bh, b, h, kv_bh, 1, offs_m, mask_rows, seq_q, 0, 0, IS_VARLEN)
    if IS_VARLEN:
        if pid_m * BLOCK_M >= n_q:  # the grid covers the longest sequence
            return
    mask_q = mask_rows[:, None] & mask_d[None, :]
    rows = start_q + offs_m
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows[:, None] * stride_don + offs_d[None, :], mask=mask_q,
                 other=0.0)
    out = tl.load(Out + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + offs_d[None, :], mask=mask_q,
                  other=0.0)
    row_delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)  # (BLOCK_M,)
    if IS_VARLEN:
        stats_rows = q_row * row_delta_stride + _stats_start(start_q, pid_bh // n_q_heads) + offs_m
        tl.store(RowDelta + stats_rows, row_delta, mask=mask_rows)
        tl.store(PackedLSE + stats_rows, tl.load(LSE + q_row * seq_q + rows, mask=mask_rows), mask=mask_rows)
    else:
        tl.store(RowDelta + q_row * row_delta_stride + rows, row_delta, mask=mask_rows)


@triton.jit
def _bwd_atomic_inner(
    dk_wide, dv, k_wide, v, qp_desc, do_desc, lse_desc, rowdelta_desc, DQAcc, acc_row, bh_q, b, h,
    offs_n, q_offset, seq_q, seq_k, start_q, stats_start, lo, hi, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_KEYS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dk', dv over query blocks [lo, hi) (as bwd's `_bwd_dkdv_inner`), and each block's dq' = dS k' added into
    the fp32 accumulator rows acc_row + start_q + i (int64) for its valid rows. MASK_KEYS (packed batches): the
    key rows past seq_k are the next sequence's: their dS is zeroed, as it would reach dq' (their dk, dv are not
    stored). Batched, those rows read as zeros (k' and v), so their dS k' is zero already."""
    offs_w = tl.arange(0, 2 * BLOCK_D)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_wide = qp_desc.load([bh_q, start_q + start_m, 0]).reshape(BLOCK_M, 2 * BLOCK_D)  # q' (BLOCK_M, 2 BLOCK_D)
        do = do_desc.load([b, h, start_q + start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        # Rows past the queries: lse = +inf and D = 0, so P^T = 0 and dS^T = 0 in those columns.
        valid_rows = offs_m < seq_q
        lse2 = tl.where(valid_rows, lse_desc.load([bh_q, stats_start + start_m]).reshape(BLOCK_M),
                        float("inf")) * 1.4426950408889634
        row_delta = tl.where(valid_rows, rowdelta_desc.load([bh_q, stats_start + start_m]).reshape(BLOCK_M), 0.0)
        scores_t = tl.dot(k_wide, tl.trans(q_wide), input_precision=PRECISION)  # S^T (BLOCK_N, BLOCK_M)
        probs_t = tl.math.exp2(scores_t * qk_scale - lse2[None, :])
        if MASK_CAUSAL:
            probs_t = tl.where(offs_n[:, None] <= (q_offset + offs_m)[None, :], probs_t, 0.0)
        dv = tl.dot(probs_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dprobs_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dscores_t = probs_t * (dprobs_t - row_delta[None, :])
        if MASK_KEYS:
            dscores_t = tl.where((offs_n < seq_k)[:, None], dscores_t, 0.0)
        dscores_t = dscores_t.to(q_wide.dtype)
        dk_wide = tl.dot(dscores_t, q_wide, dk_wide, input_precision=PRECISION)  # dk' (BLOCK_N, 2 BLOCK_D)
        dq_wide = tl.dot(tl.trans(dscores_t), k_wide, input_precision=PRECISION)  # dq' (BLOCK_M, 2 BLOCK_D) fp32
        tl.atomic_add(DQAcc + (acc_row + start_q + offs_m)[:, None] * (2 * BLOCK_D) + offs_w[None, :], dq_wide,
                      mask=valid_rows[:, None], sem="relaxed")
    return dk_wide, dv


@triton.jit
def _pope_bwd_atomic_kernel(
    K, kp_desc, v_desc, qp_desc, do_desc, lse_desc, rowdelta_desc, Theta, DK, DV, DQAcc,
    stride_kb, stride_kh, stride_kn,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    n_kv_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, acc_rows, CuSeqlensQ, CuSeqlensK,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, MAGNITUDE: tl.constexpr, PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    kv_row = pid_bh
    if IS_VARLEN:  # grid row pid_bh is (sequence b, key head hk), as in bwd's dk/dv kernel
        start_q, seq_q, start_k, seq_k, q_offset = _packed_sequence(CuSeqlensQ, CuSeqlensK, b)
        stats_start = _stats_start(start_q, b)
        b = 0
        kv_row = hk
        if pid_n * BLOCK_N >= seq_k:
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

    # This program's key block k' (pre-pass) and v, by TMA into shared memory (rows past the keys read as zeros;
    # in a packed batch they are the next sequence's, masked in the loop).
    k_wide = kp_desc.load([kv_row, start_k + pid_n * BLOCK_N, 0]).reshape(BLOCK_N, 2 * BLOCK_D)
    v = v_desc.load([b, hk, start_k + pid_n * BLOCK_N, 0]).reshape(BLOCK_N, BLOCK_D)

    dk_wide = tl.zeros([BLOCK_N, 2 * BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    start_n = pid_n * BLOCK_N
    if CAUSAL:  # query blocks [masked_lo, masked_hi) see this key block through the mask, the rest whole
        first_row = tl.maximum(start_n - q_offset, 0)
        masked_lo = tl.minimum((first_row // BLOCK_M) * BLOCK_M, seq_q)
        masked_hi = tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - q_offset, 0), seq_q)
        masked_hi = tl.minimum(tl.cdiv(masked_hi, BLOCK_M) * BLOCK_M, tl.cdiv(seq_q, BLOCK_M) * BLOCK_M)
        masked_hi = tl.maximum(masked_hi, masked_lo)
    else:
        masked_lo = 0
        masked_hi = 0
    n_q_heads = n_kv_heads * group_size
    qk_scale = softmax_scale * 1.4426950408889634
    for g in range(0, group_size):
        h = hk * group_size + g
        bh_q = b * n_q_heads + h
        acc_row = bh_q.to(tl.int64) * acc_rows
        if CAUSAL:
            dk_wide, dv = _bwd_atomic_inner(
                dk_wide, dv, k_wide, v, qp_desc, do_desc, lse_desc, rowdelta_desc, DQAcc, acc_row, bh_q, b, h,
                offs_n, q_offset, seq_q, seq_k, start_q, stats_start, masked_lo, masked_hi, qk_scale,
                BLOCK_M, BLOCK_D, True, IS_VARLEN, PRECISION)
        dk_wide, dv = _bwd_atomic_inner(
            dk_wide, dv, k_wide, v, qp_desc, do_desc, lse_desc, rowdelta_desc, DQAcc, acc_row, bh_q, b, h,
            offs_n, q_offset, seq_q, seq_k, start_q, stats_start, masked_hi, seq_q, qk_scale,
            BLOCK_M, BLOCK_D, False, IS_VARLEN, PRECISION)

    # Chain rule through k' = f(k) [cos(s theta), sin(s theta)]; dk' = scale * dS^T q'.
    k32 = tl.load(K + b * stride_kb + hk * stride_kh + rows[:, None] * stride_kn + offs_d[None, :], mask=mask_k,
                  other=0.0).to(tl.float32)
    sin_k, cos_k = _sincos(_phase(offs_n, Theta, Theta, offs_d, mask_d, False, HEAD_DIM))
    dk_cos, dk_sin = _split_halves(dk_wide)
    dk = (dk_cos * cos_k + dk_sin * sin_k) * (_magnitude_grad(k32, MAGNITUDE) * softmax_scale)
    tl.store(DK + b * stride_dkb + hk * stride_dkh + rows[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=mask_k)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + rows[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=mask_k)


@triton.jit
def _dq_from_accumulator_kernel(
    Q, DQAcc, Theta, Delta, DQ, DDeltaPartial,
    stride_qb, stride_qh, stride_qn, stride_dqb, stride_dqh, stride_dqn,
    n_q_heads, seq_q, q_offset, softmax_scale, CuSeqlensQ, CuSeqlensK,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr, IS_VARLEN: tl.constexpr = False,
):
    """One query block: dq from the summed dq' (chain rule through q' = f(q) [cos(phase), sin(phase)], phase =
    t theta - delta) in q's dtype, and this block's d(delta) partial (fp32), as bwd's dq kernel ends."""
    pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, mask_d, mask_rows = _query_block(n_q_heads, 1, seq_q, BLOCK_M,
                                                                                 BLOCK_D, HEAD_DIM)
    b, q_row, kv_bh, start_q, start_k, n_q, seq_k, q_offset, mask_rows = _query_sequence(
        CuSeqlensQ, CuSeqlensK, pid_bh, b, h, kv_bh, 1, offs_m, mask_rows, seq_q, seq_q, q_offset, IS_VARLEN)
    if IS_VARLEN:
        if pid_m * BLOCK_M >= n_q:  # past this sequence's end: no rows (its d delta partial is zero)
            if HAS_DELTA:
                tl.store(DDeltaPartial + (pid_bh * tl.num_programs(0) + pid_m) * HEAD_DIM + offs_d,
                         tl.zeros([BLOCK_D], dtype=tl.float32), mask=mask_d)
            return
    mask_q = mask_rows[:, None] & mask_d[None, :]
    rows = start_q + offs_m
    offs_w = tl.arange(0, 2 * BLOCK_D)
    dq_wide = tl.load(DQAcc + (q_row.to(tl.int64) * seq_q + rows)[:, None] * (2 * BLOCK_D) + offs_w[None, :],
                      mask=mask_rows[:, None], other=0.0)
    q32 = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + offs_d[None, :], mask=mask_q,
                  other=0.0).to(tl.float32)
    phase = _phase(q_offset + offs_m, Theta, Delta + h * HEAD_DIM, offs_d, mask_d, HAS_DELTA, HEAD_DIM)
    sin_q, cos_q = _sincos(phase)
    dq_cos, dq_sin = _split_halves(dq_wide * softmax_scale)
    dq = (dq_cos * cos_q + dq_sin * sin_q) * _magnitude_grad(q32, MAGNITUDE)
    tl.store(DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqn + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=mask_q)
    if HAS_DELTA:  # d phase = f(q) (-dq'_cos sin + dq'_sin cos); d delta = -sum_rows d phase
        magnitude = tl.where(mask_q, _magnitude(q32, MAGNITUDE), 0.0)
        d_phase = magnitude * (dq_sin * cos_q - dq_cos * sin_q)
        d_delta = -tl.sum(tl.where(mask_q, d_phase, 0.0), 0)
        tl.store(DDeltaPartial + (pid_bh * tl.num_programs(0) + pid_m) * HEAD_DIM + offs_d, d_delta, mask=mask_d)


def backward_atomic(do, q, k, v, delta, out, lse, theta, *, causal: bool, softmax_scale: float, q_offset: int,
                    magnitude: str, atomic_config=None, packed: host.Packed | None = None):
    """Returns (dq, dk, dv, d_delta or None), as bwd.backward (same arguments; atomic_config: the main kernel's
    (BLOCK_M, BLOCK_N, warps, stages), default `atomic_tiles`), with dq summed by fp32 atomics: not bitwise
    reproducible in dq and d(delta)."""
    plan = host.plan(do, q, k, v, delta, out, lse, theta, causal, q_offset, magnitude, atomic_config, *(packed or ()))
    # Buffers (|q| = |k| at MHA, 16-bit): dk, dv, q', k' and the accumulator (4 |q|) live during the main kernel
    # (10 |q|); dq is made after q' and k' die (7 |q|). Gradients in the inputs' own shapes; kernels see batch views.
    q_shape = q.shape
    dk = host.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = host.empty(v.shape, device=v.device, dtype=v.dtype)
    dk_view, dv_view = host.batch_view(dk, packed), host.batch_view(dv, packed)
    if packed is not None:  # batch-1 views of the packed tensors
        do, q, k, v, out = (host.batch_view(t, packed) for t in (do, q, k, v, out))
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    block_d = host.block_d(head_dim)
    code = MAGNITUDES[magnitude].kernel_code
    cu_seqlens = host.cu_seqlens(packed)
    n_sequences, rows_q, rows_k = (packed.batch, packed.max_seqlen_q, packed.max_seqlen_k) if packed else (
        batch, seq_q, seq_k)
    rows_per_program = TRANSFORM_ROWS if block_d <= 64 else TRANSFORM_ROWS // 2  # the elementwise kernels' blocks
    n_row_blocks = host.cdiv(rows_q, rows_per_program)

    # 1. D = rowsum(dO * O) (and packed, lse) in bwd's statistics layout: rows padded to a multiple of 4.
    padded_q = host.cdiv(seq_q + (3 * packed.batch if packed else 0), 4) * 4
    row_delta = host.empty((batch * n_q_heads, padded_q), device=q.device, dtype=torch.float32)
    packed_lse = host.empty(row_delta.shape, device=q.device, dtype=torch.float32) if packed else None
    direct_launch.launch(_row_statistics_kernel, (n_row_blocks, n_sequences * n_q_heads), plan + ("atomic D",), (
        out, do, lse, row_delta, packed_lse, *host.strides(out), *host.strides(do), n_q_heads, seq_q, padded_q,
        *cu_seqlens), HEAD_DIM=head_dim, BLOCK_M=rows_per_program, BLOCK_D=block_d, IS_VARLEN=packed is not None,
        num_warps=4)

    # 2. dk, dv and the dq' accumulator, one program per key block.
    q_prime, k_prime = prepass.transform_queries_and_keys(q, k, theta, delta, q_offset=q_offset, magnitude=magnitude,
                                                          site=plan + ("atomic q' k'",), packed=packed)
    block_m, block_n, num_warps, num_stages = atomic_tiles(head_dim, atomic_config, q.dtype, q.device)
    dq_accumulator = torch.zeros((batch * n_q_heads, seq_q, 2 * block_d), device=q.device, dtype=torch.float32)
    lse_rows = lse.reshape(batch * n_q_heads, seq_q) if packed is None else packed_lse
    if padded_q != seq_q and packed is None:
        lse_rows = torch.nn.functional.pad(lse_rows, (0, padded_q - seq_q))
    descriptors = (
        direct_launch.descriptor(k_prime.view(batch * n_kv_heads, seq_k, 2 * block_d), [1, block_n, 2 * block_d]),
        direct_launch.descriptor(host.tma_ready(v, block_d), [1, 1, block_n, block_d]),
        direct_launch.descriptor(q_prime.view(batch * n_q_heads, seq_q, 2 * block_d), [1, block_m, 2 * block_d]),
        direct_launch.descriptor(host.tma_ready(do, block_d), [1, 1, block_m, block_d]),
        direct_launch.descriptor(lse_rows, [1, block_m]), direct_launch.descriptor(row_delta, [1, block_m]))
    direct_launch.launch(_pope_bwd_atomic_kernel, (host.cdiv(rows_k, block_n), n_sequences * n_kv_heads),
                         plan + ("atomic dk dv dq'",), (
        k, *descriptors, theta, dk_view, dv_view, dq_accumulator,
        *host.strides(k), *host.strides(dk_view), *host.strides(dv_view),
        n_kv_heads, n_q_heads // n_kv_heads, seq_q, seq_k, q_offset, softmax_scale, seq_q, *cu_seqlens),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, CAUSAL=causal, MAGNITUDE=code,
        PRECISION=host.precision(q.dtype), IS_VARLEN=packed is not None, num_warps=num_warps, num_stages=num_stages)
    del q_prime, k_prime, descriptors, lse_rows, packed_lse

    # 3. dq (and d delta's partials) from the accumulator; 4. d delta summed in a fixed order (bwd's epilogue).
    dq = host.empty(q_shape, device=q.device, dtype=q.dtype)
    dq_view = host.batch_view(dq, packed)
    d_delta_partial = host.empty((n_sequences, n_q_heads, n_row_blocks, head_dim), device=q.device,
                                 dtype=torch.float32)
    direct_launch.launch(_dq_from_accumulator_kernel, (n_row_blocks, n_sequences * n_q_heads), plan + ("atomic dq",), (
        q, dq_accumulator, theta, delta if delta is not None else theta, dq_view, d_delta_partial,
        *host.strides(q), *host.strides(dq_view), n_q_heads, seq_q, q_offset, softmax_scale, *cu_seqlens),
        HEAD_DIM=head_dim, BLOCK_M=rows_per_program, BLOCK_D=block_d, HAS_DELTA=delta is not None, MAGNITUDE=code,
        IS_VARLEN=packed is not None, num_warps=4)
    del dq_accumulator
    d_delta = None
    if delta is not None:
        d_delta = host.empty(delta.shape, device=q.device, dtype=delta.dtype)
        direct_launch.launch(_backward_epilogue_kernel, (n_q_heads,), plan + ("atomic d delta",), (
            d_delta_partial, d_delta_partial, d_delta_partial, 0, 0,
            d_delta_partial, d_delta, n_sequences, n_q_heads, n_row_blocks),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_R=TRANSFORM_ROWS, num_warps=4)
    return dq, dk, dv, d_delta
