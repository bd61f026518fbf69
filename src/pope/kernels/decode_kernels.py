"""The decode kernels (device code; launched by pope.kernels.decode.decode_forward): `_pope_decode_kernel` (tensor
cores, one program per key head, its rows padded to 16), `_pope_decode_lanes_kernel` (CUDA cores, one program per
query row), the device functions they share (query rows, one split of the cache, the partial results), and
`_pope_decode_combine_kernel`, which merges the splits by their log-sum-exp."""

from __future__ import annotations

import triton
import triton.language as tl

from .jit_math import _angles, _dot, _magnitude, _polar_to_cartesian, _sincos, _turn_words


@triton.jit
def _decode_query_rows(
    Q,
    Theta,
    Delta,
    b,
    hk,
    first_row,
    stride_qb,
    stride_qh,
    stride_qn,
    group_size,
    seq_q,
    q_offset,
    HEAD_DIM: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
):
    """Query rows first_row .. first_row + ROWS - 1 of key head hk: row r = query head hk * group_size + r // seq_q,
    query index r % seq_q. Returns (q'cos, q'sin) fp32 (ROWS, BLOCK_D) (zero in padded rows/channels) and the
    rows' query indices qi (ROWS,)."""
    offs_r = first_row + tl.arange(0, ROWS)
    mask_rows = offs_r < group_size * seq_q
    head = hk * group_size + offs_r // seq_q
    qi = offs_r % seq_q
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_q = mask_rows[:, None] & mask_d[None, :]
    q = tl.load(
        Q + b * stride_qb + head[:, None] * stride_qh + qi[:, None] * stride_qn + offs_d[None, :],
        mask=mask_q,
        other=0.0,
    )
    turns_high, turns_low = _turn_words(Theta, offs_d, mask_d, HEAD_DIM)
    phase_q = _angles(q_offset + qi, turns_high, turns_low)
    if HAS_DELTA:
        phase_q = phase_q - tl.load(Delta + head[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_q, other=0.0).to(
            tl.float32
        )
    q_cos, q_sin = _polar_to_cartesian(q, phase_q, mask_q, MAGNITUDE)
    return q_cos, q_sin, qi


@triton.jit
def _decode_split(
    K,
    V,
    b,
    hk,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    pid_split,
    keys_per_split,
    seq_k,
    visible_end,
    CAUSAL: tl.constexpr,
):
    """Key head hk's K/V base pointers and this split's key range [lo, hi), clipped when causal to the keys
    its rows may see (key index < visible_end)."""
    lo = pid_split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, seq_k)
    if CAUSAL:
        hi = tl.minimum(hi, visible_end)
    return K + b * stride_kb + hk * stride_kh, V + b * stride_vb + hk * stride_vh, lo, hi


@triton.jit
def _decode_store_partial(
    PartialOut, PartialLSE, partial_row, mask_rows, acc, row_sum, row_max, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr
):
    """Normalised partial output (rows, BLOCK_D) and natural-log LSE (-inf where this split saw no key) of one
    split, at rows partial_row (rows,) of the (splits, B*Hkv, row stride, BLOCK_D) partial buffers."""
    offs_d = tl.arange(0, BLOCK_D)
    has_keys = row_sum > 0.0
    out = acc / tl.where(has_keys, row_sum, 1.0)[:, None]
    lse = tl.where(
        has_keys, (row_max + tl.math.log2(tl.where(has_keys, row_sum, 1.0))) * 0.6931471805599453, float("-inf")
    )
    tl.store(
        PartialOut + partial_row[:, None] * BLOCK_D + offs_d[None, :],
        out,
        mask=mask_rows[:, None] & (offs_d < HEAD_DIM)[None, :],
    )
    tl.store(PartialLSE + partial_row, lse, mask=mask_rows)


@triton.jit
def _pope_decode_kernel(
    Q,
    K,
    V,
    Theta,
    Delta,
    PartialOut,
    PartialLSE,
    Table,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    n_kv_heads,
    group_size,
    seq_q,
    seq_k,
    q_offset,
    softmax_scale,
    keys_per_split,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
    PRECISION: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Tensor-core decode, one program per (split, key head): the head's group_size * seq_q query rows padded to
    BLOCK_M >= 16, scores and P V by tl.dot.

    k' = f(k) [cos(n theta), sin(n theta)] per key tile, with the key phases read from Table (>= seq_k rows,
    2 BLOCK_D) [cos | sin], shared by every batch and head (it stays in L2). The query rows' q' (with delta) is
    built once per program. Both are rounded to the input dtype as the reference rounds them (with a cache of
    magnitudes and a table in the input dtype, k' = k * table is one 16-bit product per element).
    Why a table: the previous kernel kept a per-program (BLOCK_N, BLOCK_D) table in registers and rotated the
    padded query rows per tile by angle addition; half of its elementwise work went to those padded rows and
    it ran at 250 registers (two programs per SM). The table leaves one multiply per key element and channel
    (plus f(k)), which measured faster at the same tiles (docs/kernels.md)."""
    pid_split = tl.program_id(0)
    pid_bh = tl.program_id(1)  # b * n_kv_heads + hk
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    q_cos, q_sin, qi = _decode_query_rows(
        Q,
        Theta,
        Delta,
        b,
        hk,
        0,
        stride_qb,
        stride_qh,
        stride_qn,
        group_size,
        seq_q,
        q_offset,
        HEAD_DIM,
        BLOCK_M,
        BLOCK_D,
        HAS_DELTA,
        MAGNITUDE,
    )  # (BLOCK_M, BLOCK_D) each
    q_cos = q_cos.to(Q.dtype.element_ty)
    q_sin = q_sin.to(Q.dtype.element_ty)
    qk_scale = softmax_scale * 1.4426950408889634
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    k_base, v_base, lo, hi = _decode_split(
        K,
        V,
        b,
        hk,
        stride_kb,
        stride_kh,
        stride_vb,
        stride_vh,
        pid_split,
        keys_per_split,
        seq_k,
        q_offset + seq_q,
        CAUSAL,
    )
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    offs_j = tl.arange(0, BLOCK_N)
    # k feeds elementwise math: pipelined only through an explicit tl.range(num_stages=STAGES).
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        offs_n = start_n + offs_j
        kv_mask = (offs_n < hi)[:, None] & mask_d[None, :]
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        # Every program reads the same table rows: keep them in L2 (K and V stream through once).
        table_rows = Table + offs_n[:, None] * (2 * BLOCK_D) + offs_d[None, :]
        cos_t = tl.load(table_rows, mask=kv_mask, other=0.0, eviction_policy="evict_last")
        sin_t = tl.load(table_rows + BLOCK_D, mask=kv_mask, other=0.0, eviction_policy="evict_last")
        if MAGNITUDE == 2 and K.dtype.element_ty == Table.dtype.element_ty:
            # A cache of magnitudes with a table in its dtype: k' = k * table in that dtype (bf16x2 / f16x2
            # products, exact before their one rounding). Triton then applies the products to the tiles as the
            # score dot reads them: no k' tile written to and read back from shared memory.
            k_cos = k * cos_t
            k_sin = k * sin_t
        else:
            magnitude_k = tl.where(kv_mask, _magnitude(k.to(tl.float32), MAGNITUDE), 0.0)
            k_cos = (magnitude_k * cos_t.to(tl.float32)).to(k.dtype)
            k_sin = (magnitude_k * sin_t.to(tl.float32)).to(k.dtype)
        scores = _dot(q_cos, tl.trans(k_cos), None, PRECISION)
        scores = _dot(q_sin, tl.trans(k_sin), scores, PRECISION)
        visible = (offs_n < hi)[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= (q_offset + qi)[:, None])
        scores = tl.where(visible, scores * qk_scale, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        # Rows with nothing visible yet keep max = -inf; subtracting 0 there keeps exp2 at 0, not NaN.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.math.exp2(scores - safe_max[:, None])
        rescale = tl.math.exp2(row_max - safe_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        acc = _dot(probs.to(v.dtype), v, acc * rescale[:, None], PRECISION)
        row_max = new_max
    offs_r = tl.arange(0, BLOCK_M)
    partial_row = (pid_split * tl.num_programs(1) + pid_bh) * BLOCK_M + offs_r  # row stride BLOCK_M
    _decode_store_partial(
        PartialOut, PartialLSE, partial_row, offs_r < group_size * seq_q, acc, row_sum, row_max, HEAD_DIM, BLOCK_D
    )


@triton.jit
def _pope_decode_lanes_kernel(
    Q,
    K,
    V,
    Theta,
    Delta,
    PartialOut,
    PartialLSE,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    n_kv_heads,
    group_size,
    seq_q,
    seq_k,
    q_offset,
    softmax_scale,
    keys_per_split,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
    STAGES: tl.constexpr,
):
    """CUDA-core decode, one program per (split, query row): fp32 FMAs, no tensor cores, no padding of the
    rows to 16. The rows of a key head (its group's query heads x Nq) are separate programs that stream the
    same key range, so their K/V reads after the first mostly hit L2 (and f(k) is recomputed per row: a
    cache of magnitudes, magnitude "identity", avoids that).

    Score of key n = start_n + j by angle addition, folded into the query row: with A = q'cos, B = q'sin
    (BLOCK_D,) and (c, s) = (cos, sin)(start_n theta) once per tile, P = A c + B s, Q = B c - A s, and
        s[j] = sum_c f(k[n, c]) * W[j, c],   W = P[c] cos(j theta_c) + Q[c] sin(j theta_c),
    from a per-program table (cos, sin)(j theta): three FMAs per cached key element plus f(k), all in fp32.
    Each key position j of the tile is its own online-softmax lane (running max m[j], sum l[j], output
    acc[j, :]), so the loop has no reduction across keys (no cross-warp exchange per tile); the BLOCK_N lanes
    are merged once at the end.
    Shapes: table, W, acc (BLOCK_N, BLOCK_D); m, l, s (BLOCK_N,).
    """
    pid_split = tl.program_id(0)
    pid_row = tl.program_id(1)  # (b * n_kv_heads + hk) * rows + r
    rows = group_size * seq_q
    pid_bh = pid_row // rows
    row = pid_row % rows
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    q_cos, q_sin, qi = _decode_query_rows(
        Q,
        Theta,
        Delta,
        b,
        hk,
        row,
        stride_qb,
        stride_qh,
        stride_qn,
        group_size,
        seq_q,
        q_offset,
        HEAD_DIM,
        1,
        BLOCK_D,
        HAS_DELTA,
        MAGNITUDE,
    )
    qk_scale = softmax_scale * 1.4426950408889634  # scores come out in base 2, scaled
    q_cos = tl.reshape(q_cos, (BLOCK_D,)) * qk_scale
    q_sin = tl.reshape(q_sin, (BLOCK_D,)) * qk_scale
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_j = tl.arange(0, BLOCK_N)
    turns_high, turns_low = _turn_words(Theta, offs_d, mask_d, HEAD_DIM)
    table_sin, table_cos = _sincos(_angles(offs_j, turns_high, turns_low))  # (BLOCK_N, BLOCK_D)

    k_base, v_base, lo, hi = _decode_split(
        K,
        V,
        b,
        hk,
        stride_kb,
        stride_kh,
        stride_vb,
        stride_vh,
        pid_split,
        keys_per_split,
        seq_k,
        q_offset + row % seq_q + 1,
        CAUSAL,
    )
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    lane_max = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    # k and v feed elementwise math only: Triton's default pipeliner does not prefetch such loads, an explicit
    # tl.range(num_stages=STAGES) does (cp.async into STAGES - 1 shared-memory buffers).
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        offs_n = start_n + offs_j
        kv_mask = (offs_n < hi)[:, None] & mask_d[None, :]
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        # (BLOCK_D,): the tile's first key position, its angle reduced exactly as every other
        base_sin, base_cos = _sincos(
            tl.reshape(_angles(tl.full([1], start_n, tl.int32), turns_high, turns_low), (BLOCK_D,))
        )
        p_row = q_cos * base_cos + q_sin * base_sin  # (BLOCK_D,)
        q_row = q_sin * base_cos - q_cos * base_sin
        # Keys past hi were loaded as 0: finite f(0), masked out of the scores here, and v = 0 there.
        magnitude_k = _magnitude(k.to(tl.float32), MAGNITUDE)  # (BLOCK_N, BLOCK_D)
        scores = tl.sum((magnitude_k * table_cos) * p_row[None, :] + (magnitude_k * table_sin) * q_row[None, :], 1)
        scores = tl.where(offs_n < hi, scores, float("-inf"))
        new_max = tl.maximum(lane_max, scores)
        # Lanes with nothing visible yet keep max = -inf; subtracting 0 there keeps exp2 at 0, not NaN.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.math.exp2(scores - safe_max)
        rescale = tl.math.exp2(lane_max - safe_max)
        lane_sum = lane_sum * rescale + probs
        acc = acc * rescale[:, None] + probs[:, None] * v.to(tl.float32)
        lane_max = new_max

    # Merge the BLOCK_N lanes: one reduction across keys for the whole split. (1, BLOCK_N) views give the
    # one-row shapes that _decode_store_partial takes.
    row_max = tl.max(lane_max[None, :], 1)  # (1,)
    safe_row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    lane_weight = tl.math.exp2(lane_max[None, :] - safe_row_max[:, None])  # (1, BLOCK_N); 0 where no key
    row_sum = tl.sum(lane_sum[None, :] * lane_weight, 1)
    out = tl.sum(acc * tl.reshape(lane_weight, (BLOCK_N, 1)), 0)  # (BLOCK_D,)
    partial_row = tl.full([1], pid_split * tl.num_programs(1) + pid_row, tl.int32)  # row stride: rows
    _decode_store_partial(
        PartialOut, PartialLSE, partial_row, partial_row >= 0, out[None, :], row_sum, row_max, HEAD_DIM, BLOCK_D
    )


@triton.jit
def _pope_decode_combine_kernel(
    PartialOut,
    PartialLSE,
    Out,
    LSE,
    num_splits,
    n_kv_programs,
    rows,
    row_stride,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One query row: merge the splits' normalised outputs by their log-sum-exp weights.

    Program pid = (b * Hkv + hk) * rows + r is also the row's index in (B, Hq, Nq) order."""
    pid = tl.program_id(0)
    bh = pid // rows
    r = pid % rows
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_splits
    partial_row = (offs_s * n_kv_programs + bh) * row_stride + r  # (BLOCK_S,)
    split_lse = tl.load(PartialLSE + partial_row, mask=mask_s, other=float("-inf"))
    top = tl.max(split_lse, 0)  # finite: the first split always sees key 0
    weights = tl.exp(split_lse - top)
    total = tl.sum(weights, 0)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    parts = tl.load(
        PartialOut + partial_row[:, None] * BLOCK_D + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0
    )
    out = tl.sum(weights[:, None] * parts, 0) / total
    tl.store(Out + pid * HEAD_DIM + offs_d, out.to(Out.dtype.element_ty), mask=mask_d)
    tl.store(LSE + pid, top + tl.log(total))
