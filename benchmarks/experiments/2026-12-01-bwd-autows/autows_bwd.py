"""Experimental copies of the backward's dq and dk/dv kernels (pope.kernels.bwd) whose main loop is ONE loop over
blocks, masking every block, tagged tl.range(warp_specialize=WARP_SPECIALIZE): the form in which Triton 3.6's
automatic Hopper warp specialisation (the "hopper warpspec" NVGPUWarpSpecialization pass) engaged on the forward
(benchmarks/experiments/2026-12-01-gluon-hopper). Batched inputs only (no packed / varlen batch, no atomic dq').

Numerics: per element the shipped formulas, the same statistics layout (D and lse rows, d(delta) partials), and the
same accumulation order (key / query blocks ascending; dk/dv: query heads of the group in order, each one's blocks
ascending), so the results are deterministic and, in the interpreter, bitwise the shipped kernels'. Masking a block
the shipped kernels run unmasked selects every element (tl.where with an all-true mask).

The kernels take the shipped kernels' arguments, so the shipped launcher `pope.kernels.bwd.backward` runs them:
`backward(...)` here swaps them in for one call (`experimental_kernels`), with tiles given as dq_config / dkdv_config.
"""
from __future__ import annotations

import contextlib

import triton
import triton.language as tl

from pope.kernels import bwd
from pope.settings import override
from pope.kernels.bwd import _chain_rule, _leading, _row_statistics
from pope.kernels.jit_math import _join_halves, _key_ranges, _phase, _polar_to_cartesian, _query_block


@triton.jit
def _autows_dq_kernel(
    Q, qp_desc, kp_desc, v_desc, Out, DO, LSE, Theta, Delta, DQ, RowDelta, DDeltaPartial,
    stride_qb, stride_qh, stride_qn,
    stride_ob, stride_oh, stride_on,
    stride_dob, stride_doh, stride_don,
    stride_dqb, stride_dqh, stride_dqn,
    n_q_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, row_delta_stride, CuSeqlensQ, CuSeqlensK, PackedLSE,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DELTA: tl.constexpr, MAGNITUDE: tl.constexpr, PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = True,
):
    """`bwd._pope_bwd_dq_kernel` (batched) with its two key loops (unmasked, then masked) made one masked loop."""
    tl.static_assert(not IS_VARLEN, "the experiment has no packed (varlen) form")
    pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, mask_d, mask_rows = _query_block(n_q_heads, group_size, seq_q,
                                                                                 BLOCK_M, BLOCK_D, HEAD_DIM)
    mask_q = mask_rows[:, None] & mask_d[None, :]
    q_wide = qp_desc.load([pid_bh, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, 2 * BLOCK_D)
    do, row_delta = _row_statistics(
        Out, DO, LSE, RowDelta, PackedLSE, stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
        pid_bh, n_q_heads, b, h, pid_bh, 0, offs_m, offs_m, offs_d, mask_q, mask_rows, seq_q, row_delta_stride,
        IS_VARLEN)
    lse2 = tl.load(LSE + pid_bh * seq_q + offs_m, mask=mask_rows, other=float("inf")) * 1.4426950408889634
    hk = h // group_size
    qk_scale = softmax_scale * 1.4426950408889634
    dq_wide = tl.zeros([BLOCK_M, 2 * BLOCK_D], dtype=tl.float32)
    _, last_visible = _key_ranges(pid_m, q_offset, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in tl.range(0, last_visible, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        # One block of bwd._bwd_dq_inner with MASK_KEYS (every block masked).
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_wide = kp_desc.load([kv_bh, start_n, 0]).reshape(BLOCK_N, 2 * BLOCK_D)
        v = v_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        scores = tl.dot(q_wide, tl.trans(k_wide), input_precision=PRECISION)
        probs = tl.math.exp2(scores * qk_scale - lse2[:, None])  # (BLOCK_M, BLOCK_N)
        visible = (offs_n < seq_k)[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= (q_offset + offs_m)[:, None])
        probs = tl.where(visible, probs, 0.0)
        dprobs = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        dscores = (probs * (dprobs - row_delta[:, None])).to(k_wide.dtype)
        dq_wide = tl.dot(dscores, k_wide, dq_wide, input_precision=PRECISION)  # dq' (BLOCK_M, 2 BLOCK_D)

    q_rows = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn
    dq_rows = DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn
    d_delta_row = DDeltaPartial + (pid_bh * tl.num_programs(0) + pid_m) * HEAD_DIM
    _chain_rule(dq_wide * softmax_scale, q_rows, dq_rows, q_offset + offs_m, mask_rows, Theta, Delta + h * HEAD_DIM,
                1.0, d_delta_row, HEAD_DIM, BLOCK_D, HAS_DELTA, MAGNITUDE)


@triton.jit
def _autows_dkdv_kernel(
    K, V, kp_desc, v_desc, qp_desc, do_desc, lse_desc, rowdelta_desc, Theta, DK, DV, DQAcc,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    n_kv_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, CuSeqlensQ, CuSeqlensK,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, MAGNITUDE: tl.constexpr, PRECISION: tl.constexpr, KEYS_FROM_PREPASS: tl.constexpr,
    IS_VARLEN: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = True,
):
    """`bwd._pope_bwd_dkdv_kernel` (batched, deterministic) with its loop over the group's query heads and, per head,
    the masked then unmasked query loops made ONE loop over (head, query block) pairs, every block causally masked."""
    tl.static_assert(not IS_VARLEN, "the experiment has no packed (varlen) form")
    tl.static_assert(DQAcc is None, "the experiment has no atomic dq' form")
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_k = (offs_n < seq_k)[:, None] & mask_d[None, :]
    k_rows = K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn  # (BLOCK_N, 1) row pointers
    if KEYS_FROM_PREPASS:  # as shipped at BLOCK_D <= 64: k' and v by TMA; DK / DV alias these k' rows
        k_wide = kp_desc.load([pid_bh, pid_n * BLOCK_N, 0]).reshape(BLOCK_N, 2 * BLOCK_D)
        v = v_desc.load([b, hk, pid_n * BLOCK_N, 0]).reshape(BLOCK_N, BLOCK_D)
    else:  # as shipped at BLOCK_D > 64: the key block transformed once in registers
        k = tl.load(k_rows + offs_d[None, :], mask=mask_k, other=0.0)
        v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=mask_k,
                    other=0.0)
        phase = _phase(offs_n, Theta, Theta, offs_d, mask_d, False, HEAD_DIM)
        k_cos, k_sin = _polar_to_cartesian(k, phase, mask_k, MAGNITUDE)
        k_wide = _join_halves(k_cos.to(k.dtype), k_sin.to(k.dtype))  # k' (BLOCK_N, 2 BLOCK_D)

    dk_wide = tl.zeros([BLOCK_N, 2 * BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if CAUSAL:  # the first query block any row of which sees a key of this block (the shipped masked_lo)
        first = tl.minimum((tl.maximum(pid_n * BLOCK_N - q_offset, 0) // BLOCK_M) * BLOCK_M, seq_q)
    else:
        first = 0
    blocks_per_head = tl.cdiv(seq_q - first, BLOCK_M)
    n_q_heads = n_kv_heads * group_size
    qk_scale = softmax_scale * 1.4426950408889634
    for step in tl.range(0, group_size * blocks_per_head, warp_specialize=WARP_SPECIALIZE):
        # One block of bwd._bwd_dkdv_inner with MASK_CAUSAL = CAUSAL.
        h = hk * group_size + step // blocks_per_head
        bh_q = b * n_q_heads + h
        start_m = first + (step % blocks_per_head) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_wide = qp_desc.load([bh_q, start_m, 0]).reshape(BLOCK_M, 2 * BLOCK_D)  # q' (BLOCK_M, 2 BLOCK_D)
        do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        valid_rows = offs_m < seq_q
        lse2 = tl.where(valid_rows, _leading(lse_desc.load([bh_q, start_m]), BLOCK_M),
                        float("inf")) * 1.4426950408889634
        row_delta = tl.where(valid_rows, _leading(rowdelta_desc.load([bh_q, start_m]), BLOCK_M), 0.0)
        scores_t = tl.dot(k_wide, tl.trans(q_wide), input_precision=PRECISION)  # S^T (BLOCK_N, BLOCK_M)
        probs_t = tl.math.exp2(scores_t * qk_scale - lse2[None, :])
        if CAUSAL:
            probs_t = tl.where(offs_n[:, None] <= (q_offset + offs_m)[None, :], probs_t, 0.0)
        dv = tl.dot(probs_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dprobs_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dscores_t = (probs_t * (dprobs_t - row_delta[None, :])).to(q_wide.dtype)
        dk_wide = tl.dot(dscores_t, q_wide, dk_wide, input_precision=PRECISION)  # dk' (BLOCK_N, 2 BLOCK_D)

    _chain_rule(dk_wide, k_rows, DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn, offs_n,
                offs_n < seq_k, Theta, Theta, softmax_scale, Theta, HEAD_DIM, BLOCK_D, False, MAGNITUDE)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=mask_k)


class _WithConstexprs:
    """A kernel that a launcher runs as kernel[grid](*args, **meta), launched with extra constexprs the shipped
    launcher does not pass (WARP_SPECIALIZE)."""

    def __init__(self, kernel, **extra):
        self.kernel, self.extra = kernel, extra

    def __getitem__(self, grid):
        def run(*args, **meta):
            return self.kernel[grid](*args, **meta, **self.extra)
        return run


@contextlib.contextmanager
def experimental_kernels(dq: bool = True, dkdv: bool = True, dq_tagged: bool = True, dkdv_tagged: bool = True,
                         keys_from_prepass: bool | None = None):
    """Within: the shipped launcher `bwd.backward` launches the experimental dq and/or dk/dv kernel, each tagged for
    warp specialisation or not; keys_from_prepass (None: as shipped, d <= 64) sets whether the dk/dv kernel reads its
    key block from k' by TMA. Launches take Triton's own path (pope.settings direct_launch off)."""
    saved = bwd._pope_bwd_dq_kernel, bwd._pope_bwd_dkdv_kernel, bwd.DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D
    try:
        with override(direct_launch=False):
            if dq:
                bwd._pope_bwd_dq_kernel = _WithConstexprs(_autows_dq_kernel, WARP_SPECIALIZE=dq_tagged)
            if dkdv:
                bwd._pope_bwd_dkdv_kernel = _WithConstexprs(_autows_dkdv_kernel, WARP_SPECIALIZE=dkdv_tagged)
            if keys_from_prepass is not None:
                bwd.DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D = 128 if keys_from_prepass else 0
            yield
    finally:
        bwd._pope_bwd_dq_kernel, bwd._pope_bwd_dkdv_kernel, bwd.DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D = saved


def backward(*args, dq_config=None, dkdv_config=None, packed=None, **kwargs):
    """`bwd.backward` (same arguments and returns) through the experimental kernels (options: experimental_kernels's,
    taken from kwargs); batched inputs only."""
    if packed is not None:
        raise ValueError("the bwd-autows experiment has no packed (varlen) form; pass batched inputs")
    options = {name: kwargs.pop(name) for name in ("dq", "dkdv", "dq_tagged", "dkdv_tagged", "keys_from_prepass")
               if name in kwargs}
    with experimental_kernels(**options):
        return bwd.backward(*args, dq_config=dq_config, dkdv_config=dkdv_config, **kwargs)
