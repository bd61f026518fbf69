"""Decode: few queries against a long cache of d channels per key (raw keys, or the magnitudes f(k) the model
caches, magnitude "identity"), split-K over the cache, merged by one combine launch. Kernels beside `decode_forward`.

Two kernels: `_pope_decode_lanes_kernel` (CUDA cores, one program per query row: fp32 FMAs, one online-softmax lane
per key position, the key phases folded into a per-tile rotation of the query row by angle addition) for up to
pope.settings' decode_lanes_max_rows rows per key head; `_pope_decode_kernel` (tensor cores, one program per key
head, its rows padded to 16) for more (GQA), with k' = f(k) * rows of one (Nk, 2d) key-phase table
(pope.kernels.phase_tables) shared by every batch and head. Guarantees: the cache is read as it is (d channels,
no 2d-channel copy is ever written); keys past the last visible position of a program's rows are never loaded,
and a masked key enters the scores through tl.where(..., -inf), so no value of it reaches a query that cannot see
it; output and lse as the forward's (the combine weights splits by their log-sum-exp; a split that sees no key
has lse = -inf and weight 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pope.magnitudes import MAGNITUDES
from pope.settings import SETTINGS

from . import configs, direct_launch, host, phase_tables
from .configs import decode_tile
from .interpreter import INTERPRET
from .jit_math import _angles, _dot, _magnitude, _polar_to_cartesian, _sincos, _turn_words

# The combine kernel holds all of a row's splits in registers.
MAX_DECODE_SPLITS = 128


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


def decode_forward(
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
    method: str | None = None,
    block_n: int | None = None,
    num_splits: int | None = None,
    num_warps: int | None = None,
    stages: int | None = None,
    maxnreg: int | None = None,
    keep_phase_table: bool = False,
):
    """Split-K decode over a raw (d-channel) cache. Returns (out, lse) like `forward`.

    Suited to group_size * Nq <= 64 rows per key head; keys are transformed once, in registers.
    method: "lanes" (CUDA cores, one program per query row), "tensor_cores" (one program per key head), or
    None: lanes up to pope.settings' decode_lanes_max_rows rows per key head. maxnreg: a cap on registers per
    thread (Triton's launch option; more programs resident per SM at the price of spills), 0 for none, None for
    the default (lanes: configs.DECODE_LANES_MAXNREG, the compiler's choice unless set; tensor cores: none).
    keep_phase_table: keep the tensor-core kernel's key-phase table for later calls with this theta (one launch
    less per decode step: for callers whose theta lives on, e.g. pope.ops' eager path); False builds it per call.
    """
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    group_size = n_q_heads // n_kv_heads
    rows = group_size * seq_q
    block_d = host.block_d(head_dim)
    if method is None:
        method = "lanes" if rows <= SETTINGS.decode_lanes_max_rows else "tensor_cores"
    elif method not in ("lanes", "tensor_cores"):
        raise ValueError(f"decode method must be 'lanes' or 'tensor_cores'; got {method!r}")
    default_block_n, default_warps, default_stages = decode_tile(head_dim, q.dtype, method, magnitude)
    # Partial results are (splits, B*Hkv, row_stride, d): the tensor-core kernel's rows are padded to block_m.
    block_m = max(16, host.next_power_of_2(rows))
    row_stride = rows if method == "lanes" else block_m
    programs_per_split = batch * n_kv_heads * (rows if method == "lanes" else 1)
    block_n = default_block_n if block_n is None else block_n
    num_warps = default_warps if num_warps is None else num_warps
    stages = default_stages if stages is None else stages
    if INTERPRET:
        block_n = min(block_n, 32)
    if num_splits is None:
        # ~16 programs per SM to hide latency, each with at least two key tiles; at most MAX_DECODE_SPLITS
        # (the combine kernel holds all of a row's splits in registers).
        num_splits = max(
            1,
            min(
                host.cdiv(seq_k, 2 * block_n),
                host.cdiv(16 * host.sm_count(q.device), programs_per_split),
                MAX_DECODE_SPLITS,
            ),
        )
    keys_per_split = host.cdiv(host.cdiv(seq_k, num_splits), block_n) * block_n
    num_splits = host.cdiv(seq_k, keys_per_split)
    partial_out = host.empty(
        (num_splits, batch * n_kv_heads, row_stride, block_d), device=q.device, dtype=torch.float32
    )
    partial_lse = host.empty((num_splits, batch * n_kv_heads, row_stride), device=q.device, dtype=torch.float32)
    args = (
        q,
        k,
        v,
        theta,
        delta if delta is not None else theta,
        partial_out,
        partial_lse,
        *host.strides(q),
        *host.strides(k),
        *host.strides(v),
        n_kv_heads,
        group_size,
        seq_q,
        seq_k,
        q_offset,
        softmax_scale,
        keys_per_split,
    )
    options = dict(
        HEAD_DIM=head_dim,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        HAS_DELTA=delta is not None,
        MAGNITUDE=MAGNITUDES[magnitude].kernel_code,
        STAGES=stages,
        num_warps=num_warps,
        num_stages=stages,
    )
    if maxnreg is None and method == "lanes":
        maxnreg = configs.DECODE_LANES_MAXNREG
    if maxnreg and not INTERPRET:  # 0: no cap
        options["maxnreg"] = maxnreg
    if method == "lanes":
        direct_launch.launch(
            _pope_decode_lanes_kernel,
            (num_splits, programs_per_split),
            direct_launch.specialization_site("decode lanes", args, options),
            args,
            **options,
        )
    else:
        # The key phases' (seq_k, 2 block_d) [cos | sin] table for this call: the pre-pass over ones with
        # magnitude "identity". A cache of magnitudes (identity) gets a table in its own dtype, so that the
        # kernel multiplies k by it in that dtype: 13-16% faster than an fp16 table with fp32 products on the
        # H200, error 1.06-1.19x the reference's in bf16 (cos/sin rounded to 2^-9 before the product's own
        # rounding; decode_packed_ab_bf16_84eb72a.json). Raw keys (softplus, relu: f(k) in fp32): fp16 for 16-bit
        # inputs, its 2^-12 rounding below bf16's 2^-9 rounding of k' and equal to fp16's; an fp32 table made fp16
        # decode 1.1-2.3x slower (fp32_decode_8575259.log). fp32 inputs: an fp32 table.
        table_dtype = q.dtype if q.dtype == torch.float32 or magnitude == "identity" else torch.float16
        table = phase_tables.phase_table(theta, head_dim, seq_k, table_dtype, keep_phase_table)
        table_args = args[:7] + (table,) + args[7:]
        options.update(BLOCK_M=block_m, PRECISION=host.precision(q.dtype, q.device))
        site = direct_launch.specialization_site("decode tensor cores", table_args, options)
        direct_launch.launch(_pope_decode_kernel, (num_splits, batch * n_kv_heads), site, table_args, **options)
    # Combine the splits in one launch: (splits, B*Hkv, rows, d) -> (B, Hq, Nq, d) and the row LSEs.
    out = host.empty((batch, n_q_heads, seq_q, head_dim), device=q.device, dtype=q.dtype)
    lse = host.empty((batch, n_q_heads, seq_q), device=q.device, dtype=torch.float32)
    combine_args = (partial_out, partial_lse, out, lse, num_splits, batch * n_kv_heads, rows, row_stride)
    combine_options = dict(
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, host.next_power_of_2(num_splits)), num_warps=4
    )
    site = direct_launch.specialization_site("decode combine", combine_args, combine_options)
    direct_launch.launch(
        _pope_decode_combine_kernel, (batch * n_kv_heads * rows,), site, combine_args, **combine_options
    )
    return out, lse
