"""Fused PoPE flash attention: Triton forward, backward and decode kernels (launchers only, no autograd).

What it supports
    q (B, Hq, Nq, d), k/v (B, Hkv, Nk, d), Hq % Hkv == 0 (GQA: K/V are read per key head, never repeated),
    Nq <= Nk, queries at positions q_offset + i (q_offset >= 0), keys at j, bottom-right causal masking
    (key j visible iff j <= q_offset + i) or none; bf16 / fp16 / fp32 inputs with fp32 softmax statistics
    (fp32 dots use input_precision="ieee", not tf32); head dims up to 128 (any d, padded to a power of two
    inside the kernel: 32, 48, 64, 128 tested); any length (masked tails); magnitude softplus / relu /
    identity; delta (Hq, d) or none; gradients for q, k, v and delta. Partial rotary (rotary_dim < d) is
    not supported: the dispatcher falls back to the reference.

How the 2d-channel dot product is computed
    score(i, j) = scale * (q'_i . k'_j) with q' = [f(q) cos(t theta - delta), f(q) sin(t theta - delta)]
    and k' = [f(k) cos(s theta), f(k) sin(s theta)]. The forward and backward kernels hold q' and k' as one
    wide (rows, 2d) tile [cos | sin], read so by TMA from the pre-pass rows, so S, dq' and dk' are single dots
    over 2d channels (as two d-wide dots into one accumulator, Triton waits for the first wgmma group before
    issuing the second: one dot saves that wait, backward 2-4% and forward 1-3% faster on an H200;
    scripts/kernel_variants.py, docs/kernels.md). The tensor-core decode kernel keeps the halves as separate
    (rows, d) tiles, S = Qcos @ Kcos^T + Qsin @ Ksin^T (mma.sync, both operands in registers). The
    transcendental work (softplus, cos/sin) is done ONCE per element, never per (query block, key block) pair:
      * the side that streams through the inner loop is read from a pre-pass buffer x' (B, H, N, 2 BLOCK_D),
        rows [cos | sin] zero-padded to the power-of-two BLOCK_D, written by `_pope_transform_kernel` (one
        memory-bound pass, q' and k' in one launch, freed right after the kernel that reads it: the forward
        saves only q, k, v, out and lse for backward). The forward's k'/v tiles and the dk/dv kernel's
        q'/dO/lse/D tiles stream in by TMA (host-side tensor descriptors): 10-12% off forward+backward at d = 64
        on an H200, mostly from the dk/dv kernel, whose pointer version spilled; the dq kernel's k'/v by TMA too
        (2-4% off its backward);
      * the side a program holds fixed: in the forward, its query block comes from a q' pre-pass too, by TMA
        into shared memory, where the score products read it: no transform at program start and no register
        copy of q' (d=128: no more spills), so the d=64 forward fits (128, 64) tiles in 121 registers and
        105 KB of shared memory: two programs per SM, one's start and end overlapping the other's products
        (it was one program per SM at 220 registers, idle while transforming its queries): forward -7% at 4K,
        -3.5% at 16K, -7% at d=128 on an H200. The forward holds q' and k' together (2|q| + 2|k| during the
        call), below the backward's peak (it holds no gradients). The backward builds q' once and k' for the dq
        kernel, which reads its query block from q' the same way (backward -2.4 to -4.9% on an H200). At
        d <= 64 the dk/dv kernel reads its key block from k' (and v) by TMA too, and writes its dk and dv over
        those same k' rows ([dk | dv], its own rows only, after reading them), copied out by one split pass:
        no memory beside k', so the backward's own buffers peak at dq + q' + k' (5 |q| at MHA, SDPA's dq, dk,
        dv and fp32 dq accumulator); backward -1.4 to -2.7% (d=64 spills 136 B -> none). At d=128 that was
        slower and the key block is transformed in registers (k' dies before dk and dv are allocated), as are
        the decode kernels' query rows;
      * the decode kernels (few queries, long cache) transform each cached key tile in registers, because
        there every key element is used by one program: the cache stays at d channels per key (RoPE's
        memory; raw keys, or the magnitudes f(k) the model caches, magnitude "identity") and no
        2d-channel copy of it is ever written. One query row per key head runs on CUDA cores
        (_pope_decode_lanes_kernel: fp32 FMAs, one online-softmax lane per key position, the key phases by
        angle addition folded into a per-tile rotation of the query row); more rows (GQA) on tensor cores
        (_pope_decode_kernel: rows padded to 16, the key phases read from one (Nk, 2d) [cos | sin] table that
        every batch and head shares, so k' = f(k) * table rows; for a cache of magnitudes a table in the input
        dtype and 16-bit products, applied as the dot reads its operands; eager callers keep the table across
        decode steps).
    Backward: no atomics. dq (+ the per-block partial sums of d(delta)) comes from one kernel that
    iterates over key blocks; dk and dv from another that iterates over the query blocks of every query
    head of its key head's group; d(delta) is the sum of the per-block partials, in a fixed order by the
    backward's last launch (with the split pass), so two runs give bitwise-identical gradients.
    Host: after a launch site's first call (Triton's own path), each kernel is launched through its compiled C
    launcher (`_launch`, `_RawLaunch`) with the TMA descriptors' encodings kept per buffer, so a steady-state
    call does no Triton argument binding and no tensor-map encoding: in torch.compile's default mode the
    operators' Python is on a training step's critical path when the host is slow. Decode launches too, their
    sites keyed by what Triton specialises on rather than by shapes (the cache grows every step).

Angles: position (fp32) x theta (fp32) rounded once, as pope.frequencies.angles does; cos/sin through an
FMA-only sincos (Cody-Waite reduction + minimax polynomials, ~1 ulp); softplus as max(x, 0) +
log1p(exp(-|x|)) in fp32 (log1p by a 9-FMA polynomial, 2e-7 relative).

Measured (one NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, commit a6af9a6 for attention; full tables, targets
and the experiments that lost in docs/kernels.md): bf16 causal forward+backward 2.10 / 3.72 / 6.83 ms at (B,H,N,64) =
(4,16,4K), (2,16,8K), (1,16,16K) and 5.32 ms at (4,16,4K,128): 1.52-1.63x SDPA without PE at N >= 4K (2.6x at
d=128; target 1.5x missed, the deterministic backward's 22 M.N.d units dominate); 1.00-1.31x a RoPE+SDPA that
rotates eagerly and 1.49-1.55x one that rotates through torch.compile, itself 1.01-1.08x SDPA (target 1.0x met
only at 4K against the eager rotation); peak memory equal to SDPA's (met), 80-108x faster than pope-pytorch 0.2.1 at
N >= 4K (75ccece). At (8,12,1K) the GPU time (CUDA-graph replay) is 0.36 ms; an eager call there is host-bound.
GPT-2 124M training step under torch.compile: 0.92x RoPE's tokens/s with CUDA graphs (reduce-overhead) and in
the default mode (c49570b), where a slow host can make it 0.88x (b90054b): the operators' Python is on the step's
critical path there (the earlier 1.17-1.26x was against a RoPE whose compiled rotation recomputed its cos/sin per
element). Decode (8c4233e, CUDA-graph replay) over a cache of magnitudes: 0.53-0.92x the time of SDPA over a
materialised 2d-channel cache from 4K keys on, GQA included (8x32x8x16384x128 0.89x, was 1.19x before the 16-bit
products and 1.40x before the shared key-phase table); 1K keys 1.32x and raw keys at d=64 / GQA 1.3-1.4x (missed).
A fused backward with ordered, deterministic dq accumulation (commit 1099773) was correct but slower at every
shape and was removed. Correct within 2x the reference's error in bf16/fp16/fp32 on that GPU; backward bitwise
deterministic.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors, passed to kernels as arguments: Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError as _error:
    raise ImportError(f"pope's fused kernels need Triton >= 3.4 (triton.tools.tensor_descriptor); found triton "
                      f"{triton.__version__}: pip install -U 'triton>=3.4'") from _error

# Interpreter mode (TRITON_INTERPRET=1 before triton is imported) runs these kernels on CPU tensors.
INTERPRET = triton.knobs.runtime.interpret if hasattr(triton, "knobs") else False
LOG2E = 1.4426950408889634


def _fix_triton_interpreter() -> None:
    """Four gaps in Triton 3.6's CPU interpreter that these kernels hit, closed by wrapping its internals:
    * it turns a scalar tensor into an int with int(array([x])), which NumPy >= 2.4 rejects, so loop
      bounds computed from program_id fail: use the single element instead;
    * its tl.dot multiplies bfloat16 operands as their raw uint16 bit patterns: widen them to fp32 first
      (exact, as the tensor cores' bf16 products are);
    * so do its bfloat16 +, -, *, /: compute them in fp32 and round once, as the GPU's bf16x2 instructions do;
    * its fp32 -> bf16 cast truncates, where compiled Triton rounds to nearest even: round like the GPU."""
    import numpy as np
    from triton.runtime import interpreter

    if getattr(interpreter, "_pope_fixed", False):
        return
    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    def widen(x):  # bf16 bits -> fp32 (exact)
        if x.dtype.scalar == tl.bfloat16:
            data = (x.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)
        return x

    original_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    original_cast = interpreter.InterpreterBuilder.cast_impl

    def to_bf16(data):  # fp32 -> bf16 bits, rounded to nearest even
        rounded = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(torch.bfloat16)
        return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return to_bf16(src.data)
        return original_cast(self, src, dst_type)

    def bf16_arithmetic(name, op):
        original = getattr(interpreter.InterpreterBuilder, name)

        def create(self, lhs, rhs):
            if lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16:
                return to_bf16(op(widen(lhs).data, widen(rhs).data))
            return original(self, lhs, rhs)

        setattr(interpreter.InterpreterBuilder, name, create)

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.cast_impl = cast_impl
    for name, op in (("create_fadd", np.add), ("create_fsub", np.subtract), ("create_fmul", np.multiply),
                     ("create_fdiv", np.divide)):
        bf16_arithmetic(name, op)
    interpreter._pope_fixed = True


if INTERPRET:
    _fix_triton_interpreter()

MAGNITUDE_CODES = {"softplus": 0, "relu": 1, "identity": 2}
# Tests set this: every buffer a kernel writes then starts NaN-filled, so an unwritten element fails.
POISON_OUTPUTS = False


def _empty(shape, *, device, dtype) -> torch.Tensor:
    buffer = torch.empty(shape, device=device, dtype=dtype)
    return buffer.fill_(float("nan")) if POISON_OUTPUTS else buffer


# ----------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------
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
def _phase(positions, theta_ptr, delta_row_ptr, offs_d, mask_d, HAS_DELTA: tl.constexpr):
    """Angles (rows, BLOCK_D) fp32: position * theta (rounded once, as pope.frequencies.angles) - delta.

    positions: (rows,) int32; delta_row_ptr: pointer to this head's delta row (ignored without delta).
    """
    theta = tl.load(theta_ptr + offs_d, mask=mask_d, other=0.0)
    phase = positions.to(tl.float32)[:, None] * theta[None, :]
    if HAS_DELTA:
        delta = tl.load(delta_row_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        phase = phase - delta[None, :]
    return phase


@triton.jit
def _sincos(x):
    """(sin x, cos x) in fp32 on FMA units, about 1 ulp for |x| < 2**15 (positions x frequencies here).

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
    cos_r = tl.fma(z * z, tl.fma(z, tl.fma(z, 2.443315711809948e-5, -1.388731625493765e-3), 4.166664568298827e-2),
                   tl.fma(z, -0.5, 1.0))
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
    the first wgmma group to finish before issuing the second (sm_90a PTX), once per tile of every loop; the
    backward kernels are 2-4% faster wide on an H200."""
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
    programs of each head start first and the short ones fill the tail (forward 1.863 against 2.005 ms at
    1x16x16384x64 on an H200, same run; the programs of one head still run side by side, sharing its K/V in L2)."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_q_heads
    h = pid_bh % n_q_heads
    kv_bh = b * (n_q_heads // group_size) + h // group_size
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    return pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, offs_d < HEAD_DIM, offs_m < seq_q


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


# ----------------------------------------------------------------------------------------------------
# Pre-pass: x (B, H, N, d) -> x' (B, H, N, 2d) = [f(x) cos(phase), f(x) sin(phase)]
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _transform_rows(
    X, Theta, Delta, Out, stride_xb, stride_xh, stride_xn, pid_r, pid_bh, n_heads, seq_len, position_offset,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
):
    """Rows pid_r * BLOCK_R .. + BLOCK_R of head pid_bh (= b * n_heads + h) of x -> x'."""
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask = (offs_r < seq_len)[:, None] & mask_d[None, :]
    x = tl.load(X + b * stride_xb + h * stride_xh + offs_r[:, None] * stride_xn + offs_d[None, :], mask=mask, other=0.0)
    phase = _phase(position_offset + offs_r, Theta, Delta + h * HEAD_DIM, offs_d, mask_d, HAS_DELTA)
    x_cos, x_sin = _polar_to_cartesian(x, phase, mask, MAGNITUDE)
    # Rows of x' are [cos (BLOCK_D) | sin (BLOCK_D)]: the padded channels are written as zeros, so a kernel
    # reads a whole (rows, 2 BLOCK_D) tile with one TMA copy.
    out_rows = Out + (pid_bh * seq_len + offs_r[:, None]) * (2 * BLOCK_D) + offs_d[None, :]
    row_mask = (offs_r < seq_len)[:, None]
    tl.store(out_rows, x_cos.to(Out.dtype.element_ty), mask=row_mask)
    tl.store(out_rows + BLOCK_D, x_sin.to(Out.dtype.element_ty), mask=row_mask)


@triton.jit
def _pope_transform_kernel(
    X, Theta, Delta, Out,
    stride_xb, stride_xh, stride_xn,
    n_heads, seq_len, position_offset, n_programs,
    K, KOut, stride_kb, stride_kh, stride_kn, n_kv_heads, seq_k,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    HAS_DELTA: tl.constexpr, MAGNITUDE: tl.constexpr,
):
    """Program (r, bh): bh < n_programs (= B * n_heads) transforms x (with delta, positions from
    position_offset); the others, if the grid has them, the keys K (no delta, positions from 0) in the same
    launch: the attention's q' and k' in one launch instead of two (host time, one launch tail)."""
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    if pid_bh < n_programs:
        _transform_rows(X, Theta, Delta, Out, stride_xb, stride_xh, stride_xn, pid_r, pid_bh, n_heads, seq_len,
                        position_offset, HEAD_DIM, BLOCK_D, BLOCK_R, HAS_DELTA, MAGNITUDE)
    else:
        _transform_rows(K, Theta, Theta, KOut, stride_kb, stride_kh, stride_kn, pid_r, pid_bh - n_programs,
                        n_kv_heads, seq_k, 0, HEAD_DIM, BLOCK_D, BLOCK_R, False, MAGNITUDE)


@triton.jit
def _backward_epilogue_kernel(
    X, OutA, OutB, n_rows, n_split_programs,
    Partial, DDelta, batch, n_q_heads, n_m_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
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


# ----------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _fwd_inner(
    acc, row_sum, row_max, q_wide, kp_desc, v_desc, kp_row, b, hk,
    offs_m, q_offset, seq_k, lo, hi, qk_scale,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASK_KEYS: tl.constexpr, CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi). Scores are kept in base 2 (scaled by log2 e). k' and v come by
    TMA: rows past the keys (and padded channels) arrive as zeros."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_wide = kp_desc.load([kp_row, start_n, 0]).reshape(BLOCK_N, 2 * BLOCK_D)  # k' [cos | sin]
        v = v_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        # S (BLOCK_M, BLOCK_N) = q' k'^T, one dot over 2d channels; qk_scale = softmax_scale * log2(e).
        scores = tl.dot(q_wide, tl.trans(k_wide), input_precision=PRECISION)
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
        acc = tl.dot(probs.to(v.dtype), v, acc, input_precision=PRECISION)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _pope_fwd_kernel(
    qp_desc, kp_desc, v_desc, Out, LSE,
    stride_ob, stride_oh, stride_on,
    n_q_heads, group_size, seq_q, seq_k, q_offset, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, mask_d, mask_rows = _query_block(n_q_heads, group_size, seq_q,
                                                                                 BLOCK_M, BLOCK_D, HEAD_DIM)
    mask_q = mask_rows[:, None] & mask_d[None, :]

    # This program's query block, from the q' pre-pass (rows past the queries arrive as zeros): TMA puts it in
    # shared memory, where the score products read it (no register copy; no transform at program start).
    q_wide = qp_desc.load([pid_bh, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, 2 * BLOCK_D)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    unmasked_end, last_visible = _key_ranges(pid_m, q_offset, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    hk = h // group_size
    acc, row_sum, row_max = _fwd_inner(
        acc, row_sum, row_max, q_wide, kp_desc, v_desc, kv_bh, b, hk, offs_m, q_offset, seq_k,
        0, unmasked_end, softmax_scale * 1.4426950408889634, BLOCK_N, BLOCK_D, False, CAUSAL, PRECISION)
    acc, row_sum, row_max = _fwd_inner(
        acc, row_sum, row_max, q_wide, kp_desc, v_desc, kv_bh, b, hk, offs_m, q_offset, seq_k,
        unmasked_end, last_visible, softmax_scale * 1.4426950408889634, BLOCK_N, BLOCK_D, True, CAUSAL, PRECISION)

    out = acc / row_sum[:, None]
    lse = (row_max + tl.math.log2(row_sum)) * 0.6931471805599453  # natural-log log-sum-exp
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=mask_q)
    tl.store(LSE + pid_bh * seq_q + offs_m, lse, mask=offs_m < seq_q)


# ----------------------------------------------------------------------------------------------------
# Backward, part 1: dq (and the per-block partials of d delta, and D = rowsum(dO * O))
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _bwd_dq_inner(
    dq_wide, q_wide, do, lse2, row_delta, kp_desc, v_desc, kv_bh, b, hk,
    offs_m, q_offset, seq_k, lo, hi, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK_KEYS: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    """dq' over key blocks [lo, hi). k' and v come by TMA (rows past the keys arrive as zeros): against pointer
    loads in the same H200 run, backward 1.742 -> 1.702 ms at 4x16x4096x64, 5.830 -> 5.600 at 1x16x16384x64."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_wide = kp_desc.load([kv_bh, start_n, 0]).reshape(BLOCK_N, 2 * BLOCK_D)
        v = v_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        scores = tl.dot(q_wide, tl.trans(k_wide), input_precision=PRECISION)
        probs = tl.math.exp2(scores * qk_scale - lse2[:, None])  # (BLOCK_M, BLOCK_N)
        if MASK_KEYS:
            visible = (offs_n < seq_k)[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= (q_offset + offs_m)[:, None])
            probs = tl.where(visible, probs, 0.0)
        dprobs = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        dscores = (probs * (dprobs - row_delta[:, None])).to(k_wide.dtype)
        dq_wide = tl.dot(dscores, k_wide, dq_wide, input_precision=PRECISION)  # dq' (BLOCK_M, 2 BLOCK_D)
    return dq_wide


@triton.jit
def _pope_bwd_dq_kernel(
    Q, qp_desc, kp_desc, v_desc, Out, DO, LSE, Theta, Delta, DQ, RowDelta, DDeltaPartial,
    stride_qb, stride_qh, stride_qn,
    stride_ob, stride_oh, stride_on,
    stride_dob, stride_doh, stride_don,
    stride_dqb, stride_dqh, stride_dqn,
    n_q_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, row_delta_stride,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DELTA: tl.constexpr, MAGNITUDE: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_bh, b, h, kv_bh, offs_m, offs_d, mask_d, mask_rows = _query_block(n_q_heads, group_size, seq_q,
                                                                                 BLOCK_M, BLOCK_D, HEAD_DIM)
    mask_q = mask_rows[:, None] & mask_d[None, :]

    # This program's query block, from the q' pre-pass by TMA into shared memory (as in the forward): no
    # transform at program start and no register copy of q' (rows past the queries arrive as zeros).
    q_wide = qp_desc.load([pid_bh, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, 2 * BLOCK_D)

    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :], mask=mask_q, other=0.0)
    out = tl.load(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :], mask=mask_q, other=0.0)
    row_delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)  # D_i = dO_i . O_i  (BLOCK_M,)
    tl.store(RowDelta + pid_bh * row_delta_stride + offs_m, row_delta, mask=mask_rows)
    lse2 = tl.load(LSE + pid_bh * seq_q + offs_m, mask=mask_rows, other=float("inf")) * 1.4426950408889634

    hk = h // group_size
    dq_wide = tl.zeros([BLOCK_M, 2 * BLOCK_D], dtype=tl.float32)
    unmasked_end, last_visible = _key_ranges(pid_m, q_offset, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq_wide = _bwd_dq_inner(
        dq_wide, q_wide, do, lse2, row_delta, kp_desc, v_desc, kv_bh, b, hk, offs_m, q_offset, seq_k,
        0, unmasked_end, softmax_scale * 1.4426950408889634, HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, PRECISION)
    dq_wide = _bwd_dq_inner(
        dq_wide, q_wide, do, lse2, row_delta, kp_desc, v_desc, kv_bh, b, hk, offs_m, q_offset, seq_k,
        unmasked_end, last_visible, softmax_scale * 1.4426950408889634, HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL,
        PRECISION)

    # Chain rule through q' = f(q) [cos(phase), sin(phase)], phase = t theta - delta; dq' = scale * dS k'.
    # The fp32 phase and magnitude are recomputed here rather than kept live through the loop (registers).
    q32 = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :], mask=mask_q,
                  other=0.0).to(tl.float32)
    phase = _phase(q_offset + offs_m, Theta, Delta + h * HEAD_DIM, offs_d, mask_d, HAS_DELTA)
    sin_q, cos_q = _sincos(phase)
    dq_cos, dq_sin = _split_halves(dq_wide * softmax_scale)
    d_magnitude = dq_cos * cos_q + dq_sin * sin_q
    dq = d_magnitude * _magnitude_grad(q32, MAGNITUDE)
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=mask_q)
    if HAS_DELTA:
        # d phase = f(q) (-dq'_cos sin + dq'_sin cos); d delta = -sum_rows d phase. One partial per block.
        magnitude = tl.where(mask_q, _magnitude(q32, MAGNITUDE), 0.0)
        d_phase = magnitude * (dq_sin * cos_q - dq_cos * sin_q)
        d_delta = -tl.sum(tl.where(mask_q, d_phase, 0.0), 0)  # (BLOCK_D,)
        tl.store(DDeltaPartial + (pid_bh * tl.num_programs(0) + pid_m) * HEAD_DIM + offs_d, d_delta, mask=mask_d)


# ----------------------------------------------------------------------------------------------------
# Backward, part 2: dk, dv (one program per key block, looping over its group's query heads)
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _bwd_dkdv_inner(
    dk_wide, dv, k_wide, v, qp_desc, do_desc, lse_desc, rowdelta_desc, bh_q, b, h,
    offs_n, q_offset, seq_q, lo, hi, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, MASK_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_wide = qp_desc.load([bh_q, start_m, 0]).reshape(BLOCK_M, 2 * BLOCK_D)  # q' (BLOCK_M, 2 BLOCK_D)
        do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        # Rows past the queries (the statistics' row padding holds anything): lse = +inf and D = 0, so P^T = 0 and
        # dS^T = 0 in those columns (q' and dO read as zeros there).
        valid_rows = offs_m < seq_q
        lse2 = tl.where(valid_rows, lse_desc.load([bh_q, start_m]).reshape(BLOCK_M), float("inf")) * 1.4426950408889634
        row_delta = tl.where(valid_rows, rowdelta_desc.load([bh_q, start_m]).reshape(BLOCK_M), 0.0)
        # Transposed scores S^T (BLOCK_N, BLOCK_M).
        scores_t = tl.dot(k_wide, tl.trans(q_wide), input_precision=PRECISION)
        probs_t = tl.math.exp2(scores_t * qk_scale - lse2[None, :])
        if MASK_CAUSAL:
            probs_t = tl.where(offs_n[:, None] <= (q_offset + offs_m)[None, :], probs_t, 0.0)
        dv = tl.dot(probs_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dprobs_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dscores_t = (probs_t * (dprobs_t - row_delta[None, :])).to(q_wide.dtype)
        dk_wide = tl.dot(dscores_t, q_wide, dk_wide, input_precision=PRECISION)  # dk' (BLOCK_N, 2 BLOCK_D)
    return dk_wide, dv


@triton.jit
def _pope_bwd_dkdv_kernel(
    K, V, kp_desc, v_desc, qp_desc, do_desc, lse_desc, rowdelta_desc, Theta, DK, DV,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    n_kv_heads, group_size, seq_q, seq_k, q_offset, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, MAGNITUDE: tl.constexpr, PRECISION: tl.constexpr, KEYS_FROM_PREPASS: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_k = (offs_n < seq_k)[:, None] & mask_d[None, :]

    k_ptrs = K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    if KEYS_FROM_PREPASS:
        # This program's key block k' and its v, by TMA into shared memory (the products' operands there, no
        # register copies: d=64 spills 136 B -> none). DK and DV point into the same k' rows: each program reads
        # its own rows here and overwrites them only in its epilogue (the launcher copies dk and dv out).
        k_wide = kp_desc.load([pid_bh, pid_n * BLOCK_N, 0]).reshape(BLOCK_N, 2 * BLOCK_D)
        v = v_desc.load([b, hk, pid_n * BLOCK_N, 0]).reshape(BLOCK_N, BLOCK_D)
    else:
        # This program's key block, transformed once in registers.
        k = tl.load(k_ptrs, mask=mask_k, other=0.0)
        v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=mask_k,
                    other=0.0)
        phase = _phase(offs_n, Theta, Theta, offs_d, mask_d, False)
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
                dk_wide, dv, k_wide, v, qp_desc, do_desc, lse_desc, rowdelta_desc, bh_q, b, h,
                offs_n, q_offset, seq_q, masked_lo, masked_hi, softmax_scale * 1.4426950408889634,
                BLOCK_M, BLOCK_D, True, PRECISION)
        dk_wide, dv = _bwd_dkdv_inner(
            dk_wide, dv, k_wide, v, qp_desc, do_desc, lse_desc, rowdelta_desc, bh_q, b, h,
            offs_n, q_offset, seq_q, masked_hi, seq_q, softmax_scale * 1.4426950408889634,
            BLOCK_M, BLOCK_D, False, PRECISION)

    # Chain rule through k' = f(k) [cos(s theta), sin(s theta)]; dk' = scale * dS^T q'. Recomputed, not kept.
    k32 = tl.load(k_ptrs, mask=mask_k, other=0.0).to(tl.float32)
    sin_k, cos_k = _sincos(_phase(offs_n, Theta, Theta, offs_d, mask_d, False))
    dk_cos, dk_sin = _split_halves(dk_wide)
    dk = (dk_cos * cos_k + dk_sin * sin_k) * (_magnitude_grad(k32, MAGNITUDE) * softmax_scale)
    tl.store(DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=mask_k)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=mask_k)


# ----------------------------------------------------------------------------------------------------
# Decode: few queries against a long d-channel cache (raw keys or magnitudes f(k)), split-K
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _decode_query_rows(Q, Theta, Delta, b, hk, first_row, stride_qb, stride_qh, stride_qn, group_size, seq_q,
                       q_offset, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                       HAS_DELTA: tl.constexpr, MAGNITUDE: tl.constexpr):
    """Query rows first_row .. first_row + ROWS - 1 of key head hk: row r = query head hk * group_size + r // seq_q,
    query index r % seq_q. Returns (q'cos, q'sin) fp32 (ROWS, BLOCK_D) (zero in padded rows/channels), the
    rows' query indices qi (ROWS,), and theta (BLOCK_D,)."""
    offs_r = first_row + tl.arange(0, ROWS)
    mask_rows = offs_r < group_size * seq_q
    head = hk * group_size + offs_r // seq_q
    qi = offs_r % seq_q
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_q = mask_rows[:, None] & mask_d[None, :]
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + qi[:, None] * stride_qn + offs_d[None, :], mask=mask_q, other=0.0)
    theta = tl.load(Theta + offs_d, mask=mask_d, other=0.0)
    phase_q = (q_offset + qi).to(tl.float32)[:, None] * theta[None, :]
    if HAS_DELTA:
        phase_q = phase_q - tl.load(Delta + head[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_q, other=0.0).to(tl.float32)
    q_cos, q_sin = _polar_to_cartesian(q, phase_q, mask_q, MAGNITUDE)
    return q_cos, q_sin, qi, theta


@triton.jit
def _decode_split(K, V, b, hk, stride_kb, stride_kh, stride_vb, stride_vh, pid_split, keys_per_split, seq_k,
                  visible_end, CAUSAL: tl.constexpr):
    """Key head hk's K/V base pointers and this split's key range [lo, hi), clipped when causal to the keys
    its rows may see (key index < visible_end)."""
    lo = pid_split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, seq_k)
    if CAUSAL:
        hi = tl.minimum(hi, visible_end)
    return K + b * stride_kb + hk * stride_kh, V + b * stride_vb + hk * stride_vh, lo, hi


@triton.jit
def _decode_store_partial(PartialOut, PartialLSE, partial_row, mask_rows, acc, row_sum, row_max,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Normalised partial output (rows, BLOCK_D) and natural-log LSE (-inf where this split saw no key) of one
    split, at rows partial_row (rows,) of the (splits, B*Hkv, row stride, BLOCK_D) partial buffers."""
    offs_d = tl.arange(0, BLOCK_D)
    has_keys = row_sum > 0.0
    out = acc / tl.where(has_keys, row_sum, 1.0)[:, None]
    lse = tl.where(has_keys, (row_max + tl.math.log2(tl.where(has_keys, row_sum, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    tl.store(PartialOut + partial_row[:, None] * BLOCK_D + offs_d[None, :], out,
             mask=mask_rows[:, None] & (offs_d < HEAD_DIM)[None, :])
    tl.store(PartialLSE + partial_row, lse, mask=mask_rows)


@triton.jit
def _pope_decode_kernel(
    Q, K, V, Theta, Delta, PartialOut, PartialLSE, Table,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    n_kv_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, keys_per_split,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DELTA: tl.constexpr, MAGNITUDE: tl.constexpr, PRECISION: tl.constexpr,
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
    (plus f(k)): 13-25% faster on the H200 at the same tiles (decode_table_ab_same_tiles_4f519dd.json)."""
    pid_split = tl.program_id(0)
    pid_bh = tl.program_id(1)  # b * n_kv_heads + hk
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    q_cos, q_sin, qi, _ = _decode_query_rows(Q, Theta, Delta, b, hk, 0, stride_qb, stride_qh, stride_qn,
                                             group_size, seq_q, q_offset, HEAD_DIM, BLOCK_M, BLOCK_D, HAS_DELTA,
                                             MAGNITUDE)  # (BLOCK_M, BLOCK_D) each
    q_cos = q_cos.to(Q.dtype.element_ty)
    q_sin = q_sin.to(Q.dtype.element_ty)
    qk_scale = softmax_scale * 1.4426950408889634
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    k_base, v_base, lo, hi = _decode_split(K, V, b, hk, stride_kb, stride_kh, stride_vb, stride_vh, pid_split,
                                           keys_per_split, seq_k, q_offset + seq_q, CAUSAL)
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
        scores = tl.dot(q_cos, tl.trans(k_cos), input_precision=PRECISION)
        scores = tl.dot(q_sin, tl.trans(k_sin), scores, input_precision=PRECISION)
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
        acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None], input_precision=PRECISION)
        row_max = new_max
    offs_r = tl.arange(0, BLOCK_M)
    partial_row = (pid_split * tl.num_programs(1) + pid_bh) * BLOCK_M + offs_r  # row stride BLOCK_M
    _decode_store_partial(PartialOut, PartialLSE, partial_row, offs_r < group_size * seq_q, acc, row_sum, row_max,
                          HEAD_DIM, BLOCK_D)


@triton.jit
def _pope_decode_lanes_kernel(
    Q, K, V, Theta, Delta, PartialOut, PartialLSE,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    n_kv_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, keys_per_split,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_DELTA: tl.constexpr, MAGNITUDE: tl.constexpr, STAGES: tl.constexpr,
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
    q_cos, q_sin, qi, theta = _decode_query_rows(Q, Theta, Delta, b, hk, row, stride_qb, stride_qh, stride_qn,
                                                 group_size, seq_q, q_offset, HEAD_DIM, 1, BLOCK_D, HAS_DELTA, MAGNITUDE)
    qk_scale = softmax_scale * 1.4426950408889634  # scores come out in base 2, scaled
    q_cos = tl.reshape(q_cos, (BLOCK_D,)) * qk_scale
    q_sin = tl.reshape(q_sin, (BLOCK_D,)) * qk_scale
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_j = tl.arange(0, BLOCK_N)
    table_sin, table_cos = _sincos(offs_j.to(tl.float32)[:, None] * theta[None, :])  # (BLOCK_N, BLOCK_D)

    k_base, v_base, lo, hi = _decode_split(K, V, b, hk, stride_kb, stride_kh, stride_vb, stride_vh, pid_split,
                                           keys_per_split, seq_k, q_offset + row % seq_q + 1, CAUSAL)
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
        base_sin, base_cos = _sincos(theta * start_n)  # (BLOCK_D,), start_n exact in fp32 (< 2**24)
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
    _decode_store_partial(PartialOut, PartialLSE, partial_row, partial_row >= 0, out[None, :], row_sum, row_max,
                          HEAD_DIM, BLOCK_D)


@triton.jit
def _pope_decode_combine_kernel(
    PartialOut, PartialLSE, Out, LSE, num_splits, n_kv_programs, rows, row_stride,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
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
    parts = tl.load(PartialOut + partial_row[:, None] * BLOCK_D + offs_d[None, :],
                    mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    out = tl.sum(weights[:, None] * parts, 0) / total
    tl.store(Out + pid * HEAD_DIM + offs_d, out.to(Out.dtype.element_ty), mask=mask_d)
    tl.store(LSE + pid, top + tl.log(total))


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------
# Tile shapes per head dim (BLOCK_M, BLOCK_N, num_warps, num_stages), timed on an H200, bf16 causal, at
# (8,12,1024,d), (4,16,4096,d) and (1,16,16384,d) (benchmarks/results/kernel_sweep*.json, kernel_variants_*.json,
# docs/kernels.md). Forward: (128, 64, 8, 3) since its q' block comes from the pre-pass (registers freed, two
# programs per SM at d=64; 0.546 against 0.589 ms for the in-register q' at (128, 128, 8, 3) at 4x16x4096x64,
# kernel_variants_qprime_fwd.json). dq: the fastest in the sweeps (at d=128 (128, 32, 8, 3) since its k'/v came by
# TMA: backward 4.67 against 4.89 ms for (128, 64, 8, 2) at 4x16x4096x128, kernel_variants_dqtma_d128.json). dk/dv
# at d=64: (64, 64, 4, 3), two 4-warp programs per SM (CUDA-graph backward 0.286 / 1.677 / 3.023 / 5.564 ms at
# 1K / 4K / 8K / 16K against 0.303 / 1.715 / 3.036 / 5.590 for one 8-warp (64, 128, 8, 3) program per SM, one run
# at 93fb998, kernel_variants_dkdv_tiles_93fb998.json; older kernels had run 16K faster at (64, 128, 8, 3)); at
# d=128 (64, 64, 8, 3) (4.89 ms against 5.44 for the old (64, 128, 8, 2)).
FWD_CONFIGS = {64: (128, 64, 8, 3), 128: (128, 64, 8, 3)}
BWD_DQ_CONFIGS = {64: (64, 64, 4, 3), 128: (128, 32, 8, 3)}
BWD_DKDV_CONFIGS = {64: (64, 64, 4, 3), 128: (64, 64, 8, 3)}
TRANSFORM_ROWS = 64
KERNEL_CONFIGS = {"fwd": FWD_CONFIGS, "dq": BWD_DQ_CONFIGS, "dkdv": BWD_DKDV_CONFIGS}
# Up to this BLOCK_D the dk/dv kernel reads its key block from the backward's k' (kept alive, dk and dv written
# over it) instead of transforming it in registers: backward -4.7% at 4x16x4096x64 before the copy-out, but +4.5%
# at d=128 (where the register path stays) on an H200 (kernel_variants_dkdv_keys_prepass.json); with the copy-out
# (_backward_epilogue_kernel) -1.4 to -2.7% from 1K to 16K (kernel_variants_dkdv_keys_prepass_split.json).
DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D = 64


def load_configs(path: str) -> None:
    """Replace tile configs from a JSON file {"fwd"|"dq"|"dkdv": {"64"|"128": [BM, BN, warps, stages]}}, as
    written by scripts/gpu_kernel_check.py --sweep (tuning for another GPU). Also read from the
    environment variable POPE_KERNEL_CONFIGS at import."""
    import json

    with open(path) as f:
        table = json.load(f)
    for kind, by_dim in table.items():
        if kind not in KERNEL_CONFIGS:
            raise ValueError(f"{path}: unknown kernel {kind!r}; expected one of {sorted(KERNEL_CONFIGS)}")
        for dim, config in by_dim.items():
            if int(dim) not in (64, 128) or len(config) != 4:
                raise ValueError(f"{path}: {kind}[{dim}] must be head-dim bucket 64/128 -> [BLOCK_M, BLOCK_N, warps, stages]")
            KERNEL_CONFIGS[kind][int(dim)] = tuple(int(x) for x in config)


if os.environ.get("POPE_KERNEL_CONFIGS"):
    load_configs(os.environ["POPE_KERNEL_CONFIGS"])


_BLOCK_D: dict = {}


def _block_d(head_dim: int) -> int:
    """Channels of a kernel's tiles: head_dim padded to a power of two, at least 16. Looked up, not computed:
    it is asked ~10 times per eager forward+backward (host time)."""
    block_d = _BLOCK_D.get(head_dim)
    if block_d is None:
        block_d = _BLOCK_D[head_dim] = max(16, _next_power_of_2(head_dim))
    return block_d


# Host-side integer helpers in plain Python: Triton 3.6's triton.cdiv / triton.next_power_of_2 are constexpr
# functions whose host calls cost ~4 us each (argument unwrapping), a dozen times per eager forward+backward.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# fp32 inputs take exact fp32 dots (input_precision="ieee": FMA units, no tensor cores): small tiles, one
# stage, or the fp32 operand tiles overflow shared memory (228 KB on an H200) and registers.
FP32_CONFIGS = {64: (32, 32, 4, 1), 128: (16, 32, 4, 1)}


def _pick(configs: dict, head_dim: int, override, dtype=None):
    if override is not None:
        return override
    if INTERPRET:  # small tiles keep the CPU interpreter fast and exercise multi-block paths
        return (32, 32, 4, 1)
    bucket = 64 if _block_d(head_dim) <= 64 else 128
    return FP32_CONFIGS[bucket] if dtype == torch.float32 else configs[bucket]


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _strides(t: torch.Tensor):
    return t.stride()[:3]


# Compiled kernels by launch site, called directly after their first launch (see _launch). Bounded: a site key
# that changes with every call would grow it forever, so decode launches (the cache grows a key a step) key their
# sites by what Triton specialises on (_specialization_site), not by shapes.
_DIRECT_LAUNCHES: dict = {}
MAX_DIRECT_LAUNCHES = 512
DIRECT_LAUNCH = True  # False: every launch through Triton's own path (benchmarks/launch_overhead.py compares)


def _plan(*items) -> tuple:
    """A launcher call's plan key: what fixes every argument Triton specialises on for the kernels it launches.
    Tensors give shape, strides, dtype, device and 16-byte alignment (the buffers a launcher allocates itself
    follow from these); other items (flags, offsets, tile configs) are taken as they are."""
    return tuple((x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0) if isinstance(x, torch.Tensor) else x
                 for x in items)


def _specialization_site(tag: str, args: tuple, meta: dict) -> tuple:
    """A launch-site key (_launch) for calls whose shapes change every call (decode: the cache grows a key a step),
    so that a plan key (_plan: shapes, strides) would never repeat: what Triton 3.6 specialises the compiled kernel on
    and nothing else, i.e. per tensor its dtype and 16-byte alignment, per int whether it is 1 (a constant then),
    divisible by 16, and which integer type holds it (i32 / i64 / u64), bools and floats by type, None as such;
    plus the constexprs and launch options. A CPU test holds it to Triton's own specialisation
    (native_specialize_impl): calls with equal keys run the same compiled kernel."""
    # One expression per argument, no calls beyond the tensor's own: this runs on every decode launch.
    key = tuple((x.dtype, not x.data_ptr() & 15) if isinstance(x, torch.Tensor)
                else (x == 1, not x & 15, -2147483648 <= x < 2147483648, x < 9223372036854775808)
                if type(x) is int else type(x) for x in args)
    return tag, key, tuple(meta.items())


def _launch(kernel, grid: tuple, site: tuple | None, args: tuple, **meta):
    """kernel[grid](*args, **meta). After the first launch of a site (plan key + launch-site tag), the compiled
    kernel is called directly: Triton's launch path (binding and specialising ~30 arguments, cache lookup,
    checks) costs several times the launch itself in host time, which is what an eager call at short
    sequences waits on (docs/kernels.md, host overhead), and so does a compiled model's step in torch.compile's
    default mode (benchmarks/experiments/host_delay_step.py). Where it can (_RawLaunch), the direct call skips
    Triton's Python launcher as well and reuses each TMA descriptor's encoding. site=None (or the interpreter,
    or a Triton launch hook) always takes Triton's path."""
    if site is None or not DIRECT_LAUNCH or INTERPRET or _launch_hooks_active():
        return kernel[grid](*args, **meta)
    device = torch.cuda.current_device()  # Triton launches on the current device, and loads kernels per device
    key = (kernel, site, grid, device)
    entry = _DIRECT_LAUNCHES.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **meta)
        if len(_DIRECT_LAUNCHES) >= MAX_DIRECT_LAUNCHES:
            _DIRECT_LAUNCHES.clear()
        # The compiled launcher takes every kernel parameter in order, constexprs included (it skips them).
        constants = tuple(meta[name] for name in kernel.arg_names[len(args):])
        raw = _RawLaunch.of(compiled) if RAW_LAUNCH else None
        _DIRECT_LAUNCHES[key] = (compiled.run, compiled.function, compiled.packed_metadata, constants, dict(meta), raw)
        return compiled
    run, function, packed_metadata, constants, first_meta, raw = entry
    if meta != first_meta:  # a config changed (load_configs, overrides): not the kernel that was compiled
        del _DIRECT_LAUNCHES[key]
        return _launch(kernel, grid, site, args, **meta)
    stream = _current_stream(device)
    grid_y = grid[1] if len(grid) > 1 else 1
    if raw is not None:
        raw(grid[0], grid_y, stream, function, packed_metadata, args + constants)
    else:
        run(grid[0], grid_y, 1, stream, function, packed_metadata, None, None, None, *args, *constants)
    return None


RAW_LAUNCH = True  # False: direct launches go through Triton's Python launcher (CudaLauncher) as before


class _RawLaunch:
    """A compiled kernel's C launcher, called without Triton's Python layers around it: CudaLauncher.__call__
    (scratch allocation, here none) and the wrapper that expands each host-side TensorDescriptor into
    (CUtensorMap, shape, strides) by encoding a fresh tensor map on every launch (`make_tensordesc_arg`,
    cuTensorMapEncodeTiled). Here each expansion is kept per (parameter, base pointer, shape, strides): within one
    launch site the caching allocator hands back the same buffers call after call, so a training step re-encodes
    nothing. Safe to reuse: the map holds only what the key holds, and the launcher copies it into the launch's
    parameters by value. The expansion itself is Triton's (`make_tensordesc_arg`), made on a miss.

    `of` returns None (the caller keeps Triton's launcher) unless the launcher is what this knows: Triton 3.6's
    CudaLauncher, no scratch memory, one CTA per program, and its `launch` either the C launcher itself (no
    descriptors) or the descriptor wrapper, recognised by its closure (launcher, signature indices, metadata), with
    every descriptor lowered to a CUtensorMap (nvTmaDesc). A CPU test holds the expansion to the wrapper's."""

    MAX_ENCODINGS = 64  # per launch site; cleared when full (pointers that keep changing)

    def __init__(self, c_launch, cooperative, pdl, descriptor_params, expand):
        self.c_launch = c_launch
        self.cooperative = cooperative
        self.pdl = pdl
        self.descriptor_params = descriptor_params  # ((parameter index, Triton's descriptor metadata), ...) in order
        self.expand = expand  # triton's make_tensordesc_arg(descriptor, metadata) -> [tensor map, *shape, *strides]
        self.encodings: dict = {}

    @classmethod
    def of(cls, compiled):
        try:
            from triton.backends.nvidia import driver
        except ImportError:
            return None
        launcher = getattr(compiled, "run", None)
        if (not isinstance(launcher, getattr(driver, "CudaLauncher", ()))
                or getattr(driver, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO"  # the leading arguments, below
                or getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1)
                or getattr(launcher, "num_ctas", 1) != 1):
            return None
        c_launch, descriptor_params, expand = launcher.launch, (), None
        closure = getattr(c_launch, "__closure__", None)
        if closure is not None:  # wrap_handle_tensordesc's wrapper around the C launcher: expand here instead
            cells = dict(zip(c_launch.__code__.co_freevars, (cell.cell_contents for cell in closure)))
            if set(cells) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
                return None
            indices, metadata = sorted(cells["tensordesc_indices"]), list(cells["tensordesc_meta"] or ())
            if len(indices) != len(metadata) or any(m is None for m in metadata):
                return None  # descriptors passed decomposed (no TMA lowering): Triton's path
            c_launch, descriptor_params, expand = cells["launcher"], tuple(zip(indices, metadata)), \
                driver.make_tensordesc_arg
        return cls(c_launch, launcher.launch_cooperative_grid, launcher.launch_pdl, descriptor_params, expand)

    def expanded_args(self, params: tuple) -> list:
        """The kernel parameters as the C launcher takes them: each descriptor replaced by its expansion."""
        out, start = [], 0
        for index, metadata in self.descriptor_params:
            out.extend(params[start:index])
            descriptor = params[index]
            key = (index, descriptor.base.data_ptr(), tuple(descriptor.shape), tuple(descriptor.strides))
            expansion = self.encodings.get(key)
            if expansion is None:
                if len(self.encodings) >= self.MAX_ENCODINGS:
                    self.encodings.clear()
                expansion = self.encodings[key] = self.expand(descriptor, metadata)
            out.extend(expansion)
            start = index + 1
        out.extend(params[start:])
        return out

    def __call__(self, grid_x, grid_y, stream, function, packed_metadata, params: tuple):
        # The C launcher's leading arguments (Triton 3.6, driver._BASE_ARGS_FORMAT): grid, stream, function,
        # cooperative, PDL, global and profile scratch, metadata, launch metadata, enter and exit hooks.
        self.c_launch(grid_x, grid_y, 1, stream, function, self.cooperative, self.pdl, None, None, packed_metadata,
                      None, None, None, *self.expanded_args(params))


def _launch_hooks_active() -> bool:
    """A launch hook (e.g. Triton's proton profiler) wants to see launches: Triton 3.6 keeps hook chains that
    are empty when unused, older versions None."""
    if not hasattr(triton, "knobs"):  # an older Triton: take its own launch path
        return True
    runtime = triton.knobs.runtime
    return any(hook is not None and bool(getattr(hook, "calls", True))
               for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook))


def _current_stream(device: int) -> int:
    return triton.runtime.driver.active.get_current_stream(device)


def transform(x: torch.Tensor, theta: torch.Tensor, delta: torch.Tensor | None, *, position_offset: int,
              magnitude: str, site: tuple | None = None) -> torch.Tensor:
    """x (B, H, N, d) -> x' (B, H, N, 2 * BLOCK_D) contiguous, in x's dtype: [f(x) cos(phase) | f(x) sin(phase)],
    each half padded with zeros to BLOCK_D = _block_d(d) channels (no padding for d = 16, 32, 64, 128),
    phase = (position_offset + n) * theta - delta[h]. site: the caller's launch-site key (_launch)."""
    return _transform(x, theta, delta, position_offset, magnitude, site, None)[0]


def transform_queries_and_keys(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor, delta: torch.Tensor | None, *,
                               q_offset: int, magnitude: str, site: tuple | None = None):
    """(q', k') as `transform` makes them (q with delta at positions q_offset.., k without delta from 0), in one
    launch."""
    return _transform(q, theta, delta, q_offset, magnitude, site, k)


def _transform(x, theta, delta, position_offset, magnitude, site, keys):
    batch, heads, seq, head_dim = x.shape
    block_d = _block_d(head_dim)
    out = _empty((batch, heads, seq, 2 * block_d), device=x.device, dtype=x.dtype)
    rows = TRANSFORM_ROWS if block_d <= 64 else TRANSFORM_ROWS // 2  # 4K elements a program
    n_programs = batch * heads
    if keys is None:  # the kernel's key arguments unused: no program reaches them
        keys_out, kv_heads, seq_k, grid = out, heads, seq, (_cdiv(seq, rows), n_programs)
    else:
        kv_heads, seq_k = keys.shape[1], keys.shape[2]
        keys_out = _empty((batch, kv_heads, seq_k, 2 * block_d), device=x.device, dtype=x.dtype)
        grid = (_cdiv(max(seq, seq_k), rows), n_programs + batch * kv_heads)
    _launch(_pope_transform_kernel, grid, site, (
        x, theta, delta if delta is not None else theta, out, *_strides(x), heads, seq, position_offset, n_programs,
        keys if keys is not None else x, keys_out, *_strides(keys if keys is not None else x), kv_heads, seq_k),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_R=rows,
        HAS_DELTA=delta is not None, MAGNITUDE=MAGNITUDE_CODES[magnitude], num_warps=4)
    return out, (keys_out if keys is not None else None)


def _tma_ready(t: torch.Tensor, block_d: int) -> torch.Tensor:
    """t (..., d) in a layout a TMA copy reads: last dim contiguous, base and other strides 16-byte aligned. The
    usual inputs (contiguous, or (B, N, H, d) transposed to (B, H, N, d)) already are and pass through; others
    are copied, padded with zero channels to block_d when d * element size is not a multiple of 16 bytes."""
    size = t.element_size()
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(  # (broadcast, stride-0 dims are copied too)
            stride > 0 and (stride * size) % 16 == 0 for stride, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
        return t
    if (t.shape[-1] * size) % 16:
        return torch.nn.functional.pad(t, (0, block_d - t.shape[-1]))
    return t.contiguous()


def _unchecked_descriptor(base, shape: list, strides: list, block_shape: list) -> TensorDescriptor:
    """TensorDescriptor(base, shape, strides, block_shape) without its __post_init__ checks (alignment, strides,
    block shape: ~5 us of host time each, six descriptors per eager forward+backward). The launchers describe only
    tensors that pass them (_tma_ready's layouts and their own buffers); the tests run the checks on every
    descriptor the launchers make."""
    descriptor = object.__new__(TensorDescriptor)
    descriptor.__dict__.update(base=base, shape=shape, strides=strides, block_shape=block_shape, padding="zero")
    return descriptor


def _unchecked_descriptors_work() -> bool:
    """Whether this Triton's TensorDescriptor is the dataclass _unchecked_descriptor knows (same fields, same
    values as its constructor gives); if not, descriptors are made the checked way."""
    import dataclasses

    try:
        names = tuple(field.name for field in dataclasses.fields(TensorDescriptor))
        probe = torch.zeros(4, 8)
        made = _unchecked_descriptor(probe, [4, 8], [8, 1], [4, 8])
        checked = TensorDescriptor(probe, [4, 8], [8, 1], [4, 8])
    except Exception:
        return False
    return names == ("base", "shape", "strides", "block_shape", "padding") and all(
        getattr(made, name) is getattr(checked, name) or getattr(made, name) == getattr(checked, name)
        for name in names)


UNCHECKED_DESCRIPTORS = _unchecked_descriptors_work()


def _same_tiles(descriptor: TensorDescriptor, t: torch.Tensor, block_shape: list) -> TensorDescriptor:
    """descriptor (made for t) when its tiles are block_shape, else a new descriptor of t in those tiles."""
    return descriptor if descriptor.block_shape == block_shape else _descriptor(t, block_shape)


def _descriptor(t: torch.Tensor, block_shape: list) -> TensorDescriptor:
    """A host-side TMA descriptor of t, copied tile by tile in block_shape; a tile's part outside t reads as
    zeros. Strides of size-1 dims are meaningless and may be unaligned: they are replaced by aligned ones."""
    strides = list(t.stride())
    for i in range(t.dim() - 2, -1, -1):
        if t.shape[i] == 1:
            strides[i] = strides[i + 1] * t.shape[i + 1]
    if UNCHECKED_DESCRIPTORS:
        return _unchecked_descriptor(t, list(t.shape), strides, list(block_shape))
    return TensorDescriptor(t, list(t.shape), strides, list(block_shape))


def forward(q, k, v, delta, theta, *, causal: bool, softmax_scale: float, q_offset: int, magnitude: str,
            config=None):
    """Returns (out (B, Hq, Nq, d) in q's dtype, lse (B, Hq, Nq) fp32, natural log)."""
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    plan = _plan(q, k, v, delta, theta, causal, q_offset, magnitude, config)
    block_m, block_n, num_warps, num_stages = _pick(FWD_CONFIGS, head_dim, config, q.dtype)
    block_d = _block_d(head_dim)
    # q' and k' from the pre-pass (freed on return): q' by (BLOCK_M, 2 BLOCK_D) and k' by (BLOCK_N, 2 BLOCK_D)
    # [cos | sin] tiles, v by (BLOCK_N, BLOCK_D) tiles, all by TMA (zeros past the rows).
    q_prime, k_prime = transform_queries_and_keys(q, k, theta, delta, q_offset=q_offset, magnitude=magnitude,
                                                  site=plan + ("forward q' k'",))
    out = _empty(q.shape, device=q.device, dtype=q.dtype)
    lse = _empty((batch, n_q_heads, seq_q), device=q.device, dtype=torch.float32)
    qp_desc = _descriptor(q_prime.view(batch * n_q_heads, seq_q, 2 * block_d), [1, block_m, 2 * block_d])
    kp_desc = _descriptor(k_prime.view(batch * n_kv_heads, seq_k, 2 * block_d), [1, block_n, 2 * block_d])
    v_desc = _descriptor(_tma_ready(v, block_d), [1, 1, block_n, block_d])
    grid = (_cdiv(seq_q, block_m), batch * n_q_heads)
    _launch(_pope_fwd_kernel, grid, plan + ("forward",), (
        qp_desc, kp_desc, v_desc, out, lse, *_strides(out),
        n_q_heads, n_q_heads // n_kv_heads, seq_q, seq_k, q_offset, softmax_scale),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        CAUSAL=causal, PRECISION=_precision(q.dtype), num_warps=num_warps, num_stages=num_stages)
    return out, lse


def backward(do, q, k, v, delta, out, lse, theta, *, causal: bool, softmax_scale: float, q_offset: int,
             magnitude: str, dq_config=None, dkdv_config=None):
    """Returns (dq, dk, dv, d_delta or None). Deterministic: no atomics anywhere."""
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    group_size = n_q_heads // n_kv_heads
    block_d = _block_d(head_dim)
    code = MAGNITUDE_CODES[magnitude]
    precision = _precision(q.dtype)
    plan = _plan(do, q, k, v, delta, out, lse, theta, causal, q_offset, magnitude, dq_config, dkdv_config)
    # Pre-pass buffers and gradients are made as late and freed as early as they can be, so that what the
    # backward allocates peaks at 5 |q| at MHA (dq + q' + k'), as SDPA's dq, dk, dv and fp32 dq accumulator.
    dq = _empty(q.shape, device=q.device, dtype=q.dtype)
    # D = rowsum(dO * O) as a (B * Hq, rows) TMA source for part 2: rows padded to a multiple of 4 (16-byte stride).
    padded_q = _cdiv(seq_q, 4) * 4
    row_delta = _empty((batch * n_q_heads, padded_q), device=q.device, dtype=torch.float32)
    # q' serves both parts: part 1's query blocks and part 2's streamed queries. k' serves part 1's streamed keys
    # (freed after part 1, or at d <= 64 after part 2, which reads its key blocks from it and writes dk and dv
    # over it). Both from one launch.
    q_prime, k_prime = transform_queries_and_keys(q, k, theta, delta, q_offset=q_offset, magnitude=magnitude,
                                                  site=plan + ("backward q' k'",))

    # Part 1: dq, D and the d delta partials.
    block_m, block_n, num_warps, num_stages = _pick(BWD_DQ_CONFIGS, head_dim, dq_config, q.dtype)
    n_m_blocks = _cdiv(seq_q, block_m)
    d_delta_partial = _empty((batch, n_q_heads, n_m_blocks, head_dim), device=q.device, dtype=torch.float32)
    q_rows = q_prime.view(batch * n_q_heads, seq_q, 2 * block_d)
    k_rows = k_prime.view(batch * n_kv_heads, seq_k, 2 * block_d)
    v_tma = _tma_ready(v, block_d)
    qp_desc = _descriptor(q_rows, [1, block_m, 2 * block_d])
    kp_desc = _descriptor(k_rows, [1, block_n, 2 * block_d])
    v_desc = _descriptor(v_tma, [1, 1, block_n, block_d])
    _launch(_pope_bwd_dq_kernel, (n_m_blocks, batch * n_q_heads), plan + ("dq",), (
        q, qp_desc, kp_desc, v_desc, out, do, lse, theta, delta if delta is not None else theta, dq, row_delta,
        d_delta_partial, *_strides(q), *_strides(out), *_strides(do), *_strides(dq),
        n_q_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, padded_q),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        CAUSAL=causal, HAS_DELTA=delta is not None, MAGNITUDE=code, PRECISION=precision,
        num_warps=num_warps, num_stages=num_stages)
    # Part 2: dk, dv, streaming the queries' q' (freed after). Part 1's descriptors serve again where the
    # tiles agree (host time).
    block_m, block_n, num_warps, num_stages = _pick(BWD_DKDV_CONFIGS, head_dim, dkdv_config, q.dtype)
    keys_from_prepass = block_d <= DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D
    if keys_from_prepass:
        # Each program reads its key block from k' and writes its dk and dv over those same k' rows, [dk | dv]
        # (no new memory: k' and dq + dk + dv are the same 5 |q|); dk and dv are copied out below.
        kp_rows = k_prime.view(batch, n_kv_heads, seq_k, 2 * block_d)
        dk_out, dv_out = kp_rows[..., :head_dim], kp_rows[..., block_d:block_d + head_dim]
        key_descriptors = (_same_tiles(kp_desc, k_rows, [1, block_n, 2 * block_d]),
                           _same_tiles(v_desc, v_tma, [1, 1, block_n, block_d]))
    else:
        del k_prime, k_rows, kp_desc  # k' dies before dk and dv exist (peak memory; a descriptor holds its tensor)
        dk_out = _empty(k.shape, device=k.device, dtype=k.dtype)
        dv_out = _empty(v.shape, device=v.device, dtype=v.dtype)
        key_descriptors = (None, None)
    # q', dO, lse and D stream in by TMA; lse's rows padded like D's.
    lse_rows = lse.reshape(batch * n_q_heads, seq_q)
    if padded_q != seq_q:
        lse_rows = torch.nn.functional.pad(lse_rows, (0, padded_q - seq_q))
    descriptors = (_same_tiles(qp_desc, q_rows, [1, block_m, 2 * block_d]),
                   _descriptor(_tma_ready(do, block_d), [1, 1, block_m, block_d]),
                   _descriptor(lse_rows, [1, block_m]), _descriptor(row_delta, [1, block_m]))
    _launch(_pope_bwd_dkdv_kernel, (_cdiv(seq_k, block_n), batch * n_kv_heads), plan + ("dk dv",), (
        k, v, *key_descriptors, *descriptors, theta, dk_out, dv_out,
        *_strides(k), *_strides(v), *_strides(dk_out), *_strides(dv_out),
        n_kv_heads, group_size, seq_q, seq_k, q_offset, softmax_scale),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        CAUSAL=causal, MAGNITUDE=code, PRECISION=precision, KEYS_FROM_PREPASS=keys_from_prepass,
        num_warps=num_warps, num_stages=num_stages)
    del q_prime, q_rows, qp_desc, descriptors, key_descriptors
    # One last launch: dk and dv copied out of k' (d <= 64) and d(delta) summed from its partials, by one kernel.
    if keys_from_prepass:
        dk = _empty(k.shape, device=k.device, dtype=k.dtype)
        dv = _empty(v.shape, device=v.device, dtype=v.dtype)
        n_rows = batch * n_kv_heads * seq_k
        source = k_prime
    else:
        dk, dv, n_rows, source = dk_out, dv_out, 0, dk_out  # nothing to split: source, outputs unused
    d_delta = _empty(delta.shape, device=q.device, dtype=delta.dtype) if delta is not None else None
    n_split_programs = _cdiv(n_rows, TRANSFORM_ROWS)
    n_programs = n_split_programs + (n_q_heads if delta is not None else 0)
    if n_programs:
        _launch(_backward_epilogue_kernel, (n_programs,), plan + ("dk dv out, d delta",), (
            source, dk, dv, n_rows, n_split_programs,
            d_delta_partial, d_delta if d_delta is not None else d_delta_partial, batch, n_q_heads, n_m_blocks),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_R=TRANSFORM_ROWS, num_warps=4)
    if keys_from_prepass:
        del k_prime, k_rows, kp_desc, kp_rows, dk_out, dv_out
    return dq, dk, dv, d_delta


_SM_COUNTS: dict = {}
MAX_DECODE_SPLITS = 128


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 132
    if device not in _SM_COUNTS:
        _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[device]


# Rows per key head (group_size * Nq) up to which decode takes the CUDA-core lanes kernel (one program per
# row); more rows go to the tensor-core kernel (one program per key head, rows padded to 16). On an H200 the
# lanes kernel wins at one row (0.27 vs 0.36 ms at 8x16x16x16384x64) and loses from four (GQA 8x32x8x16384x128:
# 0.72 vs 0.39 ms; decode_sweep_4cba99b.json).
DECODE_LANES_MAX_ROWS = 1


def decode_tile(head_dim: int, dtype: torch.dtype, method: str, magnitude: str = "softplus") -> tuple[int, int, int]:
    """Default (block_n, num_warps, stages) of a decode kernel ("lanes" or "tensor_cores"; both stream k/v
    through a cp.async pipeline of `stages` - 1 buffers). From the decode sweeps on an H200 (docs/kernels.md):
    "lanes": 2K-element key tiles, 4 warps, 3 stages (d=64: 32 keys, d=128: 16).
    "tensor_cores": 4 warps, 2 stages; 64 keys, but 32 at d = 128 for raw keys (bf16 GQA 8x32x{4,8}x16384: 2 stages
    beat 3 by 10-22%, decode_table_ab_same_tiles_4f519dd.json; a cache of magnitudes, whose 16-bit products need
    no fp32 copy of the tile, runs d = 128 fastest at 64 keys: 0.179 against 0.187 ms at 32, 0.219 at 3 stages,
    0.208 at 8 warps, decode_graph_ab_tiles_d128_84eb72a.json); fp32 one stage (GQA 8x32x4x16384x64:
    0.42-0.48 vs 0.74-0.78 ms at 2-3 stages, gpu_kernel_check_decode_8575259.json)."""
    block_d = _block_d(head_dim)
    if method == "lanes":
        return max(16, 2048 // block_d), 4, 3
    if dtype == torch.float32:
        return (64 if block_d <= 64 else 32), 4, 1
    return (64 if block_d <= 64 or magnitude == "identity" else 32), 4, 2


# Key-phase tables kept across decode calls: {(theta's address, device, dtype, block_d, rows): (theta, version,
# table)}. An entry holds its theta (so the address cannot be reused by another tensor) and is never replaced or
# dropped while theta is unchanged: a CUDA graph captured over a decode call keeps reading the table's memory.
# Rows are a power of two >= the cache length (>= MIN_PHASE_TABLE_ROWS), so a growing cache makes few tables;
# at most MAX_PHASE_TABLES entries, then tables are built per call.
_PHASE_TABLES: dict = {}
MAX_PHASE_TABLES = 32
MIN_PHASE_TABLE_ROWS = 1024


def _phase_table(theta: torch.Tensor, head_dim: int, seq_k: int, dtype: torch.dtype, keep: bool) -> torch.Tensor:
    """(rows >= seq_k, 2 BLOCK_D) [cos | sin] of key positions 0..rows-1 in dtype: the pre-pass over ones with
    magnitude "identity" (stride-0 rows, one read). keep=True: from / into _PHASE_TABLES (not while a CUDA graph
    is being captured: a table made then would live in the graph's private memory pool)."""
    block_d = _block_d(head_dim)
    if not keep:
        return _build_phase_table(theta, head_dim, block_d, seq_k, dtype)
    rows = max(MIN_PHASE_TABLE_ROWS, _next_power_of_2(seq_k))
    key = (theta.data_ptr(), theta.device, dtype, block_d, rows)
    entry = _PHASE_TABLES.get(key)
    if entry is not None and entry[0] is theta and entry[1] == theta._version:
        return entry[2]
    table = _build_phase_table(theta, head_dim, block_d, rows, dtype)
    capturing = theta.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing and key not in _PHASE_TABLES and len(_PHASE_TABLES) < MAX_PHASE_TABLES:
        _PHASE_TABLES[key] = (theta, theta._version, table)
    return table


def _build_phase_table(theta, head_dim: int, block_d: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    ones = torch.ones((1, 1, 1, head_dim), device=theta.device, dtype=dtype).expand(1, 1, rows, head_dim)
    return transform(ones, theta, None, position_offset=0, magnitude="identity").view(rows, 2 * block_d)


def release_phase_tables() -> int:
    """Drop the key-phase tables eager decode calls kept (_PHASE_TABLES; at most 2x the longest cache's table per
    theta and dtype, e.g. 64 MB for 128K keys at d=128 in bf16). Returns how many were dropped. Only when no
    captured CUDA graph still replays a decode call: such a graph reads a kept table's memory."""
    count = len(_PHASE_TABLES)
    _PHASE_TABLES.clear()
    return count


def decode_forward(q, k, v, delta, theta, *, causal: bool, softmax_scale: float, q_offset: int, magnitude: str,
                   method: str | None = None, block_n: int | None = None, num_splits: int | None = None,
                   num_warps: int | None = None, stages: int | None = None, maxnreg: int | None = None,
                   keep_phase_table: bool = False):
    """Split-K decode over a raw (d-channel) cache. Returns (out, lse) like `forward`.

    Suited to group_size * Nq <= 64 rows per key head; keys are transformed once, in registers.
    method: "lanes" (CUDA cores, one program per query row), "tensor_cores" (one program per key head), or
    None: lanes up to DECODE_LANES_MAX_ROWS rows per key head. maxnreg: a cap on registers per thread (Triton's
    launch option; more programs resident per SM at the price of spills), None for the compiler's choice.
    keep_phase_table: keep the tensor-core kernel's key-phase table for later calls with this theta (one launch
    less per decode step: for callers whose theta lives on, e.g. pope.ops' eager path); False builds it per call.
    """
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    group_size = n_q_heads // n_kv_heads
    rows = group_size * seq_q
    block_d = _block_d(head_dim)
    if method is None:
        method = "lanes" if rows <= DECODE_LANES_MAX_ROWS else "tensor_cores"
    elif method not in ("lanes", "tensor_cores"):
        raise ValueError(f"decode method must be 'lanes' or 'tensor_cores'; got {method!r}")
    default_block_n, default_warps, default_stages = decode_tile(head_dim, q.dtype, method, magnitude)
    # Partial results are (splits, B*Hkv, row_stride, d): the tensor-core kernel's rows are padded to block_m.
    block_m = max(16, _next_power_of_2(rows))
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
        num_splits = max(1, min(_cdiv(seq_k, 2 * block_n), _cdiv(16 * _sm_count(q.device), programs_per_split),
                                MAX_DECODE_SPLITS))
    keys_per_split = _cdiv(_cdiv(seq_k, num_splits), block_n) * block_n
    num_splits = _cdiv(seq_k, keys_per_split)
    partial_out = _empty((num_splits, batch * n_kv_heads, row_stride, block_d), device=q.device, dtype=torch.float32)
    partial_lse = _empty((num_splits, batch * n_kv_heads, row_stride), device=q.device, dtype=torch.float32)
    args = (q, k, v, theta, delta if delta is not None else theta, partial_out, partial_lse,
            *_strides(q), *_strides(k), *_strides(v),
            n_kv_heads, group_size, seq_q, seq_k, q_offset, softmax_scale, keys_per_split)
    options = dict(HEAD_DIM=head_dim, BLOCK_N=block_n, BLOCK_D=block_d, CAUSAL=causal, HAS_DELTA=delta is not None,
                   MAGNITUDE=MAGNITUDE_CODES[magnitude], STAGES=stages, num_warps=num_warps, num_stages=stages)
    if maxnreg is not None and not INTERPRET:
        options["maxnreg"] = maxnreg
    if method == "lanes":
        _launch(_pope_decode_lanes_kernel, (num_splits, programs_per_split),
                _specialization_site("decode lanes", args, options), args, **options)
    else:
        # The key phases' (seq_k, 2 block_d) [cos | sin] table for this call: the pre-pass over ones with
        # magnitude "identity". A cache of magnitudes (identity) gets a table in its own dtype, so that the
        # kernel multiplies k by it in that dtype: 13-16% faster than an fp16 table with fp32 products on the
        # H200, error 1.06-1.19x the reference's in bf16 (cos/sin rounded to 2^-9 before the product's own
        # rounding; decode_packed_ab_bf16_84eb72a.json). Raw keys (softplus, relu: f(k) in fp32): fp16 for 16-bit
        # inputs, its 2^-12 rounding below bf16's 2^-9 rounding of k' and equal to fp16's; an fp32 table made fp16
        # decode 1.1-2.3x slower (fp32_decode_8575259.log). fp32 inputs: an fp32 table.
        table_dtype = q.dtype if q.dtype == torch.float32 or magnitude == "identity" else torch.float16
        table = _phase_table(theta, head_dim, seq_k, table_dtype, keep_phase_table)
        table_args = args[:7] + (table,) + args[7:]
        options.update(BLOCK_M=block_m, PRECISION=_precision(q.dtype))
        _launch(_pope_decode_kernel, (num_splits, batch * n_kv_heads),
                _specialization_site("decode tensor cores", table_args, options), table_args, **options)
    # Combine the splits in one launch: (splits, B*Hkv, rows, d) -> (B, Hq, Nq, d) and the row LSEs.
    out = _empty((batch, n_q_heads, seq_q, head_dim), device=q.device, dtype=q.dtype)
    lse = _empty((batch, n_q_heads, seq_q), device=q.device, dtype=torch.float32)
    combine_args = (partial_out, partial_lse, out, lse, num_splits, batch * n_kv_heads, rows, row_stride)
    combine_options = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, _next_power_of_2(num_splits)),
                           num_warps=4)
    _launch(_pope_decode_combine_kernel, (batch * n_kv_heads * rows,),
            _specialization_site("decode combine", combine_args, combine_options), combine_args, **combine_options)
    return out, lse


def frequencies(head_dim: int, base: float, device) -> torch.Tensor:
    """theta (head_dim,) fp32 on device, from pope.frequencies (the project's one frequency function)."""
    from pope.frequencies import pope_frequencies

    return pope_frequencies(head_dim, base, device=device).contiguous()


__all__ = ["forward", "backward", "decode_forward", "decode_tile", "release_phase_tables", "transform",
           "transform_queries_and_keys", "frequencies", "load_configs", "INTERPRET", "MAGNITUDE_CODES",
           "KERNEL_CONFIGS", "POISON_OUTPUTS"]
