"""The forward kernel and its launcher: (out, lse) of PoPE attention for a block of queries per program.

Supports q (B, Hq, Nq, d), k/v (B, Hkv, Nk, d), Hq % Hkv == 0 (GQA: K/V read per key head, never repeated),
Nq <= Nk, queries at positions q_offset + i, keys at j, bottom-right causal masking (key j visible iff
j <= q_offset + i) or none; bf16 / fp16 / fp32 (fp32 dots fp32-accurate — three TF32 products each, or exact
FMA dots on GPUs without TF32 tensor cores — unless torch.set_float32_matmul_precision allows TF32:
host.precision); d <= 128 (padded to a power of two inside); any length (masked tails). Guarantees: softmax
statistics in fp32; lse is the natural-log log-sum-exp (B, Hq, Nq) fp32; a key masked from a query (causal or past
Nk) enters its scores through tl.where(..., -inf), so no value of it, finite or not, reaches that query's output; q'
and k' come from one pre-pass launch and are freed on return unless the caller asks for them (return_primes: for the
backward, which then skips its own pre-pass).
How: score(i, j) = scale * (q'_i . k'_j), q' and k' held as one wide (rows, 2 BLOCK_D) tile [cos | sin] read by TMA
(one dot over 2d channels); online softmax in base 2, the scale riding in the exponent's FMA (scale > 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import direct_launch, host, prepass
from .configs import pick_tiles
from .jit_math import _dot, _key_ranges, _query_block, _query_sequence


@triton.jit
def _fwd_inner(
    acc,
    row_sum,
    row_max,
    q_wide,
    kp_desc,
    v_desc,
    kp_row,
    b,
    hk,
    offs_m,
    q_offset,
    seq_k,
    start_k,
    lo,
    hi,
    qk_scale,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_KEYS: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi) of the keys starting at row start_k. Scores are kept in base 2
    (scaled by log2 e). k' and v come by TMA: rows past the keys (and padded channels) arrive as zeros, or in a
    packed batch as the next sequence's rows, whose values are zeroed here (their scores are masked anyway)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_wide = kp_desc.load([kp_row, start_k + start_n, 0]).reshape(BLOCK_N, 2 * BLOCK_D)  # k' [cos | sin]
        v = v_desc.load([b, hk, start_k + start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        if IS_VARLEN and MASK_KEYS:  # another sequence's values, even non-finite, reach nothing (0 * inf = NaN)
            v = tl.where((offs_n < seq_k)[:, None], v, 0.0)
        # S (BLOCK_M, BLOCK_N) = q' k'^T, one dot over 2d channels; qk_scale = softmax_scale * log2(e).
        scores = _dot(q_wide, tl.trans(k_wide), None, PRECISION)
        if MASK_KEYS:
            visible = (offs_n < seq_k)[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= (q_offset + offs_m)[:, None])
            scores = tl.where(visible, scores, float("-inf"))
        # qk_scale > 0 (pope.attention requires softmax_scale > 0): max(S) * scale = max(S * scale), so the scaling
        # rides in the exponent's FMA instead of a separate multiply per score (forward -4% at d=64 on an H200).
        new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
        probs = tl.math.exp2(scores * qk_scale - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        acc = acc * rescale[:, None]
        acc = _dot(probs.to(v.dtype), v, acc, PRECISION)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _pope_fwd_kernel(
    qp_desc,
    kp_desc,
    v_desc,
    Out,
    LSE,
    stride_ob,
    stride_oh,
    stride_on,
    n_q_heads,
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
        if pid_m * BLOCK_M >= n_q:  # the grid covers the longest sequence: past this one's end
            return
    mask_q = mask_rows[:, None] & mask_d[None, :]

    # This program's query block, from the q' pre-pass (rows past the queries arrive as zeros): TMA puts it in
    # shared memory, where the score products read it (no register copy; no transform at program start).
    q_wide = qp_desc.load([q_row, start_q + pid_m * BLOCK_M, 0]).reshape(BLOCK_M, 2 * BLOCK_D)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    unmasked_end, last_visible = _key_ranges(pid_m, q_offset, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    hk = h // group_size
    acc, row_sum, row_max = _fwd_inner(
        acc,
        row_sum,
        row_max,
        q_wide,
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
        BLOCK_N,
        BLOCK_D,
        False,
        CAUSAL,
        PRECISION,
        IS_VARLEN,
    )
    acc, row_sum, row_max = _fwd_inner(
        acc,
        row_sum,
        row_max,
        q_wide,
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
        BLOCK_N,
        BLOCK_D,
        True,
        CAUSAL,
        PRECISION,
        IS_VARLEN,
    )

    out = acc / row_sum[:, None]
    lse = (row_max + tl.math.log2(row_sum)) * 0.6931471805599453  # natural-log log-sum-exp
    rows = start_q + offs_m  # in the (B, Hq, Nq, d) out / (B * Hq, Nq) lse; packed: (1, Hq, total, d) / (Hq, total)
    tl.store(
        Out + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=mask_q,
    )
    tl.store(LSE + q_row * seq_q + rows, lse, mask=offs_m < n_q)


def forward(
    q,
    k,
    v,
    delta,
    theta,
    *,
    causal: bool,
    softmax_scale: float,
    q_offset: int,
    magnitude: str,
    config=None,
    packed: host.Packed | None = None,
    return_primes: bool = False,
):
    """Returns (out (B, Hq, Nq, d) in q's dtype and layout (host.empty_in_layout_of), lse (B, Hq, Nq) fp32, natural
    log); return_primes: (out, lse, (q', k')), the pre-pass's q' (B, Hq, Nq, 2 BLOCK_D) and k' (B, Hkv, Nk, 2 BLOCK_D)
    (packed: host.prime_buffer's batch views) that `backward(..., primes=)` takes instead of computing them again.

    packed: q (total_q, Hq, d), k/v (total_k, Hkv, d) hold the sequences of a packed batch, all run by one launch per
    kernel (q_offset unused: each sequence is bottom-right aligned); returns out (total_q, Hq, d), lse (Hq, total_q)."""
    precision = host.precision(q.dtype, q.device)  # a constexpr of the kernel: part of the launch site's plan key
    plan = host.plan(q, k, v, delta, theta, causal, q_offset, magnitude, config, precision, *(packed or ()))
    out_like = q  # out in q's layout (host.empty_in_layout_of); packed: (total_q, Hq, d) contiguous
    if packed is not None:  # batch-1 views of the packed tensors
        q, k, v = (host.batch_view(t, packed) for t in (q, k, v))
    # q' and k' from the pre-pass (freed on return unless returned): q' by (BLOCK_M, 2 BLOCK_D) and k' by
    # (BLOCK_N, 2 BLOCK_D) [cos | sin] tiles, v by (BLOCK_N, BLOCK_D) tiles, all by TMA (zeros past the rows).
    q_prime, k_prime = prepass.transform_queries_and_keys(
        q, k, theta, delta, q_offset=q_offset, magnitude=magnitude, site=plan + ("forward q' k'",), packed=packed
    )
    out = host.empty_in_layout_of(out_like)
    out_view = out if packed is None else host.batch_view(out, packed)
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    block_m, block_n, num_warps, num_stages = pick_tiles("fwd", head_dim, config, q.dtype, q.device, precision)
    block_d = host.block_d(head_dim)
    lse = host.empty((batch, n_q_heads, seq_q), device=q.device, dtype=torch.float32)
    qp_desc = direct_launch.descriptor(q_prime.view(batch * n_q_heads, seq_q, 2 * block_d), [1, block_m, 2 * block_d])
    kp_desc = direct_launch.descriptor(k_prime.view(batch * n_kv_heads, seq_k, 2 * block_d), [1, block_n, 2 * block_d])
    v_desc = direct_launch.descriptor(host.tma_ready(v, block_d), [1, 1, block_n, block_d])
    n_sequences, rows_q = (packed.batch, packed.max_seqlen_q) if packed else (batch, seq_q)  # packed: to the longest
    grid = (host.cdiv(rows_q, block_m), n_sequences * n_q_heads)
    direct_launch.launch(
        _pope_fwd_kernel,
        grid,
        plan + ("forward",),
        (
            qp_desc,
            kp_desc,
            v_desc,
            out_view,
            lse,
            *host.strides(out_view),
            n_q_heads,
            n_q_heads // n_kv_heads,
            seq_q,
            seq_k,
            q_offset,
            softmax_scale,
            *host.cu_seqlens(packed),
        ),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        PRECISION=precision,
        IS_VARLEN=packed is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    lse = lse[0] if packed else lse
    return (out, lse, (q_prime, k_prime)) if return_primes else (out, lse)
