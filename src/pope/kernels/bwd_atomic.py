"""The atomic backward (pope_attention(..., deterministic=False)): dq, dk, dv and d(delta) by FlashAttention-2's scheme,
one pass over the scores instead of bwd's two, beside its launcher `backward_atomic`.

  1. `_row_statistics_kernel`, one program per query block: D = rowsum(dO * O) (packed: and a copy of lse) at the
     statistics rows bwd's dk/dv kernel reads them from (the same layout, read the same way, by TMA);
  2. bwd's `_pope_bwd_dkdv_kernel` given a dq' accumulator (its key blocks from k'), one program per key block:
     dk and dv, and for every query block it visits dq' = dS k' (BLOCK_M, 2 BLOCK_D), added with tl.atomic_add
     into the fp32 accumulator (B * Hq, Nq, 2 BLOCK_D) (packed: (Hq, total_q, 2 BLOCK_D)) that starts at zero;
  3. `_dq_from_accumulator_kernel`, one program per query block: the chain rule from the summed dq' to dq, and one
     partial sum of d(delta) per block (bwd's `_chain_rule`, as the dq kernel ends);
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
from .bwd import (_backward_epilogue_kernel, _chain_rule, _pope_bwd_dkdv_kernel, _row_statistics, lse_statistics_rows,
                  statistics_buffers, statistics_descriptors)
from .configs import TRANSFORM_ROWS, Tiles, bucket, pick_tiles
from .interpreter import INTERPRET
from .jit_math import _query_block, _query_sequence

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
    _row_statistics(Out, DO, LSE, RowDelta, PackedLSE, stride_ob, stride_oh, stride_on, stride_dob, stride_doh,
                    stride_don, pid_bh, n_q_heads, b, h, q_row, start_q, start_q + offs_m, offs_m, offs_d,
                    mask_rows[:, None] & mask_d[None, :], mask_rows, seq_q, row_delta_stride, IS_VARLEN)


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
    # Packed: past this sequence's end (the grid covers the longest) mask_rows is all False: no dq rows are
    # stored and the block's d delta partial is zero.
    b, q_row, kv_bh, start_q, start_k, n_q, seq_k, q_offset, mask_rows = _query_sequence(
        CuSeqlensQ, CuSeqlensK, pid_bh, b, h, kv_bh, 1, offs_m, mask_rows, seq_q, seq_q, q_offset, IS_VARLEN)
    rows = start_q + offs_m
    offs_w = tl.arange(0, 2 * BLOCK_D)
    dq_wide = tl.load(DQAcc + (q_row.to(tl.int64) * seq_q + rows)[:, None] * (2 * BLOCK_D) + offs_w[None, :],
                      mask=mask_rows[:, None], other=0.0)
    _chain_rule(dq_wide * softmax_scale, Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn,
                DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqn, q_offset + offs_m, mask_rows, Theta,
                Delta + h * HEAD_DIM, 1.0, DDeltaPartial + (pid_bh * tl.num_programs(0) + pid_m) * HEAD_DIM,
                HEAD_DIM, BLOCK_D, HAS_DELTA, MAGNITUDE)


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
    padded_q, row_delta, packed_lse = statistics_buffers(batch * n_q_heads, seq_q, packed, q.device)
    direct_launch.launch(_row_statistics_kernel, (n_row_blocks, n_sequences * n_q_heads), plan + ("atomic D",), (
        out, do, lse, row_delta, packed_lse, *host.strides(out), *host.strides(do), n_q_heads, seq_q, padded_q,
        *cu_seqlens), HEAD_DIM=head_dim, BLOCK_M=rows_per_program, BLOCK_D=block_d, IS_VARLEN=packed is not None,
        num_warps=4)

    # 2. dk, dv and the dq' accumulator, one program per key block.
    q_prime, k_prime = prepass.transform_queries_and_keys(q, k, theta, delta, q_offset=q_offset, magnitude=magnitude,
                                                          site=plan + ("atomic q' k'",), packed=packed)
    block_m, block_n, num_warps, num_stages = atomic_tiles(head_dim, atomic_config, q.dtype, q.device)
    dq_accumulator = torch.zeros((batch * n_q_heads, seq_q, 2 * block_d), device=q.device, dtype=torch.float32)
    lse_rows = lse_statistics_rows(lse, row_delta, packed_lse)
    descriptors = (
        direct_launch.descriptor(k_prime.view(batch * n_kv_heads, seq_k, 2 * block_d), [1, block_n, 2 * block_d]),
        direct_launch.descriptor(host.tma_ready(v, block_d), [1, 1, block_n, block_d]),
        direct_launch.descriptor(q_prime.view(batch * n_q_heads, seq_q, 2 * block_d), [1, block_m, 2 * block_d]),
        direct_launch.descriptor(host.tma_ready(do, block_d), [1, 1, block_m, block_d]),
        *statistics_descriptors(lse_rows, row_delta, block_m))
    direct_launch.launch(_pope_bwd_dkdv_kernel, (host.cdiv(rows_k, block_n), n_sequences * n_kv_heads),
                         plan + ("atomic dk dv dq'",), (
        k, v, *descriptors, theta, dk_view, dv_view, dq_accumulator,
        *host.strides(k), *host.strides(v), *host.strides(dk_view), *host.strides(dv_view),
        n_kv_heads, n_q_heads // n_kv_heads, seq_q, seq_k, q_offset, softmax_scale, *cu_seqlens),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, CAUSAL=causal, MAGNITUDE=code,
        PRECISION=host.precision(q.dtype), KEYS_FROM_PREPASS=True, IS_VARLEN=packed is not None, num_warps=num_warps,
        num_stages=num_stages)
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
