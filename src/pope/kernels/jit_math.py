"""Device functions shared by the kernels (@triton.jit, inlined into each kernel that calls them).

Guarantees: angles are pope.frequencies.angles' float32 angles bit for bit: position x theta reduced to [-pi, pi)
exactly, in 32-bit integers, from the frequencies' fixed-point turns (pope.frequencies.turn_words); `_sincos` is an
FMA-only sin/cos (Cody-Waite reduction by pi/2 in three parts, minimax polynomials), about 1 ulp for
|x| < 2**15; softplus is max(x, 0) + log1p(exp(-|x|)) in fp32 with log1p by a 9-FMA polynomial (relative error
2e-7). Magnitude codes (`MAGNITUDE` constexpr) are pope.magnitudes' kernel codes: 0 softplus, 1 relu,
2 identity. `_query_block` / `_key_ranges` give a query-block program's coordinates and the key blocks it sees
whole or through the causal / length mask (bottom-right causal: key j visible iff j <= q_offset + i);
`_query_sequence` / `_packed_sequence` the rows and lengths of its sequence in a packed (varlen) batch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import interpreter  # noqa: F401  (interpreter mode: its fixes are applied before any kernel runs)


@triton.jit
def _log1p_unit(u):
    """log(1 + u) for u in [0, 1]: u * P(u), a degree-8 fit of log1p(u)/u (max relative error 2e-7).

    Nine FMAs instead of libdevice's logf (about 30 instructions and a branch)."""
    p = tl.fma(u, 0.005253523122519255, -0.02958887256681919)
    p = tl.fma(p, u, 0.07836245745420456)
    p = tl.fma(p, u, -0.13674858212471008)
    p = tl.fma(p, u, 0.1911148577928543)
    p = tl.fma(p, u, -0.24844388663768768)
    p = tl.fma(p, u, 0.33319273591041565)
    p = tl.fma(p, u, -0.49999502301216125)
    p = tl.fma(p, u, 1.0)
    return u * p


@triton.jit
def _magnitude(x, MAGNITUDE: tl.constexpr):
    """f(x) in fp32: 0 softplus = max(x, 0) + log1p(exp(-|x|)), 1 relu, 2 identity."""
    if MAGNITUDE == 0:
        return tl.maximum(x, 0.0) + _log1p_unit(tl.exp(-tl.abs(x)))
    elif MAGNITUDE == 1:
        return tl.maximum(x, 0.0)
    else:
        return x


@triton.jit
def _magnitude_grad(x, MAGNITUDE: tl.constexpr):
    """f'(x) in fp32 (relu: 1 where x > 0, as torch's relu backward)."""
    if MAGNITUDE == 0:
        return 1.0 / (1.0 + tl.exp(-x))
    elif MAGNITUDE == 1:
        return tl.where(x > 0.0, 1.0, 0.0)
    else:
        return tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def _tf32_rounded(x):
    """fp32 x rounded to TF32 (10-bit mantissa) to nearest, ties away from zero, as PTX's cvt.rna.tf32.f32; other
    dtypes unchanged. ±inf and NaN stay what they are; a value within half a TF32 step of the fp32 maximum
    becomes inf, as the conversion gives."""
    if x.dtype == tl.float32:
        bits = x.to(tl.uint32, bitcast=True)
        x = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return x


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr):
    """tl.dot(a, b, acc) at input_precision PRECISION. Under "tf32" the fp32 operands are rounded to TF32 first:
    the tensor cores read only an fp32 operand's top 19 bits, i.e. they truncate, and that bias toward zero takes
    the kernels' error past the 2x rule against PyTorch's TF32 matmuls (docs/kernels.md). 16-bit operands
    (PRECISION "tf32" too) and "ieee" / "tf32x3" dots (Triton splits the latter itself) are unchanged."""
    if PRECISION == "tf32":
        a = _tf32_rounded(a)
        b = _tf32_rounded(b)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _turn_words(Theta, offs_d, mask_d, HEAD_DIM: tl.constexpr):
    """The frequencies as fixed-point turns, (A, B) (BLOCK_D,) uint32 each, from Theta (2, HEAD_DIM) int32
    (pope.frequencies.turn_words: frac(theta / 2 pi) = (A + B / 2^32) / 2^32)."""
    tl.static_assert(
        Theta.dtype.element_ty == tl.int32,
        "Theta must be the frequencies as fixed-point turns, int32 (2, d): pope.frequencies.turn_words",
    )
    turns_high = tl.load(Theta + offs_d, mask=mask_d, other=0).to(tl.uint32, bitcast=True)
    turns_low = tl.load(Theta + HEAD_DIM + offs_d, mask=mask_d, other=0).to(tl.uint32, bitcast=True)
    return turns_high, turns_low


@triton.jit
def _angles(positions, turns_high, turns_low):
    """Angles (rows, BLOCK_D) fp32 in [-pi, pi): position x theta mod 2 pi, bit for bit
    pope.frequencies.turn_angles. positions: (rows,) int32, 0 <= t < 2^31; turns_high, turns_low: `_turn_words`.

    The fraction of a turn (t A + umulhi(t, B)) mod 2^32 is exact in wrapping 32-bit unsigned arithmetic (no
    rounding, so no fused or reordered float operation can change it); read as signed, it is converted to fp32
    once and scaled by 2 pi / 2^32. Per element: two integer multiplies, one add, one int -> fp32 conversion, one
    fp32 multiply (the plain product was one conversion per row and one multiply per element)."""
    t, high = tl.broadcast(positions.to(tl.uint32)[:, None], turns_high[None, :])
    t, low = tl.broadcast(t, turns_low[None, :])
    fraction = t * high + tl.umulhi(t, low)  # (rows, BLOCK_D) uint32, wrapping: the turn fraction mod 1
    return fraction.to(tl.int32, bitcast=True).to(tl.float32) * 1.462918119976564e-09  # fp32(2 pi) / 2^32, exactly


@triton.jit
def _phase(positions, theta_ptr, delta_row_ptr, offs_d, mask_d, HAS_DELTA: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Phases (rows, BLOCK_D) fp32: the exact angle position x theta (`_angles`) - delta.

    positions: (rows,) int32; theta_ptr: the (2, HEAD_DIM) turn words; delta_row_ptr: pointer to this head's
    delta row (ignored without delta).
    """
    turns_high, turns_low = _turn_words(theta_ptr, offs_d, mask_d, HEAD_DIM)
    phase = _angles(positions, turns_high, turns_low)
    if HAS_DELTA:
        delta = tl.load(delta_row_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        phase = phase - delta[None, :]
    return phase


@triton.jit
def _sincos(x):
    """(sin x, cos x) in fp32 on FMA units, about 1 ulp for |x| < 2**15 (here |x| < 3 pi: reduced angles - delta).

    Cody-Waite reduction by pi/2 in three parts (each step one fused multiply-add), then Cephes' minimax
    polynomials on [-pi/4, pi/4] and the quadrant swap. No special-function unit, no slow path, few
    registers; libdevice's sinf/cosf carry a Payne-Hanek branch that inflates every kernel's registers.
    """
    quadrant = tl.floor(x * 0.6366197723675814 + 0.5)  # round(x / (pi/2))
    r = tl.fma(quadrant, -1.5703125, x)
    r = tl.fma(quadrant, -4.837512969970703125e-4, r)
    r = tl.fma(quadrant, -7.549789948768648e-8, r)
    z = r * r
    sin_r = tl.fma(r * z, tl.fma(z, tl.fma(z, -1.9515295891e-4, 8.3321608736e-3), -1.6666654611e-1), r)
    cos_r = tl.fma(
        z * z,
        tl.fma(z, tl.fma(z, 2.443315711809948e-5, -1.388731625493765e-3), 4.166664568298827e-2),
        tl.fma(z, -0.5, 1.0),
    )
    q = quadrant.to(tl.int32)
    swap = (q & 1) != 0
    sin_x = tl.where(swap, cos_r, sin_r)
    cos_x = tl.where(swap, sin_r, cos_r)
    sin_x = tl.where((q & 2) != 0, -sin_x, sin_x)
    cos_x = tl.where(((q + 1) & 2) != 0, -cos_x, cos_x)
    return sin_x, cos_x


@triton.jit
def _polar_to_cartesian(x, phase, valid, MAGNITUDE: tl.constexpr):
    """(f(x) cos(phase), f(x) sin(phase)) in fp32; zero where not `valid` (padding)."""
    magnitude = tl.where(valid, _magnitude(x.to(tl.float32), MAGNITUDE), 0.0)
    sin_phase, cos_phase = _sincos(phase)
    return magnitude * cos_phase, magnitude * sin_phase


@triton.jit
def _join_halves(x_cos, x_sin):
    """Two (rows, BLOCK_D) halves -> one wide (rows, 2 * BLOCK_D) tile [x_cos | x_sin].

    Why wide: a score is then ONE dot over 2d channels. As two d-wide dots into one accumulator, Triton waits for
    the first wgmma group to finish before issuing the second (sm_90a PTX), once per tile of every loop
    (the timings are in docs/kernels.md)."""
    rows: tl.constexpr = x_cos.shape[0]
    width: tl.constexpr = 2 * x_cos.shape[1]
    return tl.reshape(tl.permute(tl.join(x_cos, x_sin), (0, 2, 1)), (rows, width))


@triton.jit
def _split_halves(x):
    """A wide (rows, 2 * BLOCK_D) tile -> its halves (x_cos, x_sin), each (rows, BLOCK_D)."""
    rows: tl.constexpr = x.shape[0]
    half: tl.constexpr = x.shape[1] // 2
    return tl.split(tl.permute(tl.reshape(x, (rows, 2, half)), (0, 2, 1)))


@triton.jit
def _query_block(n_q_heads, group_size, seq_q, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A query-block program's coordinates: batch b, query head h, its key head's (b, hk) row kv_bh, query
    rows offs_m (BLOCK_M,), channels offs_d (BLOCK_D,) with mask_d, and mask_rows = offs_m < seq_q.

    Query blocks are taken last-first: under a causal mask the last ones see the most keys, so the longest
    programs of each head start first and the short ones fill the tail (the programs of one head still run side
    by side, sharing its K/V in L2; timings in docs/kernels.md)."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_q_heads
    h = pid_bh % n_q_heads
    kv_bh = b * (n_q_heads // group_size) + h // group_size
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    return pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, offs_d < HEAD_DIM, offs_m < seq_q


@triton.jit
def _packed_sequence(CuSeqlensQ, CuSeqlensK, index):
    """Sequence `index` of a packed (varlen) batch, from the int32 cumulative lengths: (first query row, Nq, first key
    row, Nk, q_offset = Nk - Nq). Its keys sit at positions 0..Nk - 1, its queries at the last Nq (bottom-right)."""
    start_q = tl.load(CuSeqlensQ + index)
    start_k = tl.load(CuSeqlensK + index)
    seq_q = tl.load(CuSeqlensQ + index + 1) - start_q
    seq_k = tl.load(CuSeqlensK + index + 1) - start_k
    return start_q, seq_q, start_k, seq_k, seq_k - seq_q


@triton.jit
def _stats_start(start_q, index):
    """Where sequence `index` of a packed batch (first query row start_q) keeps its per-row statistics (lse, D) in
    the backward's (Hq, ceil4(total_q + 3 batch)) buffers: start_q + 3 index rounded up to a multiple of 4, so a TMA
    copy of them starts 16-byte aligned (fp32); sequence b + 1's start is at least sequence b's + its length."""
    return (start_q + 3 * index + 3) // 4 * 4


@triton.jit
def _query_sequence(
    CuSeqlensQ,
    CuSeqlensK,
    pid_bh,
    b,
    h,
    kv_bh,
    group_size,
    offs_m,
    mask_rows,
    seq_q,
    seq_k,
    q_offset,
    IS_VARLEN: tl.constexpr,
):
    """Where a query-block program's sequence lies (after `_query_block`): (b, q_row, kv_row, start_q, start_k, seq_q,
    seq_k, q_offset, mask_rows). Batched: the arguments unchanged, q_row = pid_bh, kv_row = kv_bh, start_q = start_k
    = 0. Varlen: the tensors are packed sequences seen as batch 1 ((1, H, total, d) views, (H, total, .) q'/k' rows),
    grid row pid_bh is (sequence b, head h): addresses take batch 0, rows h / kv head and the sequence's first rows;
    lengths, q_offset and mask_rows are the sequence's."""
    if IS_VARLEN:
        start_q, seq_q, start_k, seq_k, q_offset = _packed_sequence(CuSeqlensQ, CuSeqlensK, b)
        return 0, h, h // group_size, start_q, start_k, seq_q, seq_k, q_offset, offs_m < seq_q
    else:
        return b, pid_bh, kv_bh, 0, 0, seq_q, seq_k, q_offset, mask_rows


@triton.jit
def _key_ranges(pid_m, q_offset, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(unmasked_end, last_visible): key blocks [0, unmasked_end) are seen whole by every row of query block
    pid_m (no mask); [unmasked_end, last_visible) need the causal / length mask."""
    if CAUSAL:
        last_visible = tl.minimum(q_offset + pid_m * BLOCK_M + BLOCK_M, seq_k)  # exclusive
        unmasked_end = (tl.minimum(q_offset + pid_m * BLOCK_M + 1, seq_k) // BLOCK_N) * BLOCK_N
    else:
        last_visible = seq_k
        unmasked_end = (seq_k // BLOCK_N) * BLOCK_N
    return unmasked_end, last_visible
