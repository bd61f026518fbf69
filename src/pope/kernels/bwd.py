"""The backward: dq, dk, dv and d(delta) of PoPE attention, by three kernels and their launcher `backward` (here).

  1. `_pope_bwd_dq_kernel` (pope.kernels.bwd_dq), one program per query block: D = rowsum(dO * O), dq, and one
     partial sum of d(delta) per block, iterating over key blocks;
  2. `_pope_bwd_dkdv_kernel` (pope.kernels.bwd_dkdv), one program per key block: dk and dv, iterating over the
     query blocks of every query head of its key head's GQA group (at BLOCK_D <= 64 its key block comes from k'),
     writing dk and dv in their inputs' layouts;
  3. `_d_delta_sum_kernel` (here): d(delta) summed from the dq kernel's partials.
The chain rule both gradient kernels end with is pope.kernels.bwd_chain_rule.
Guarantees: no atomics anywhere: d(delta) is summed in a fixed order, so two runs give bitwise-identical gradients;
the buffers the backward allocates peak at MHA at 5 |q| for BLOCK_D > 64 (dq + q' + k', then dq + q' + dk + dv: as
SDPA's dq, dk, dv and fp32 dq accumulator) and at 7 |q| for BLOCK_D <= 64 (dq + q' + k' + dk + dv: SDPA's
gradients and the pre-pass's q' and k'); every pre-pass buffer is freed before the call returns. Given the forward's
q', k' (primes) it runs no pre-pass and they live through the call: 7 |q| at any d. Same inputs and layouts as the
forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pope.magnitudes import MAGNITUDES

from . import direct_launch, host, prepass
from .bwd_dkdv import _pope_bwd_dkdv_kernel
from .bwd_dq import _pope_bwd_dq_kernel
from .configs import DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D, TRANSFORM_ROWS, pick_tiles


@triton.jit
def _d_delta_sum_kernel(
    Partial,
    DDelta,
    batch,
    n_q_heads,
    n_m_blocks,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """The backward's last launch, one program per query head: d(delta)[h] (d,) = the sum of the dq kernel's
    partials Partial (B, Hq, n_m_blocks, d) fp32 over batches and query blocks, in a fixed order (deterministic),
    stored in DDelta's dtype: one launch instead of a torch sum and cast after the kernels."""
    h = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    total = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)  # (blocks, channels) partial sums
    offs_m = tl.arange(0, BLOCK_R)
    for b in range(0, batch):
        head_rows = Partial + (b * n_q_heads + h).to(tl.int64) * n_m_blocks * HEAD_DIM
        for start in range(0, n_m_blocks, BLOCK_R):
            blocks = start + offs_m
            mask = (blocks < n_m_blocks)[:, None] & mask_d[None, :]
            total += tl.load(head_rows + blocks[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0)
    tl.store(DDelta + h * HEAD_DIM + offs_d, tl.sum(total, 0).to(DDelta.dtype.element_ty), mask=mask_d)


def statistics_buffers(rows: int, seq_q: int, packed: host.Packed | None, device: torch.device):
    """(padded_q, D, packed lse): the fp32 (rows = B * Hq, padded_q) buffer that D = rowsum(dO * O) is stored in for
    the dk/dv kernel's TMA loads, rows padded to a multiple of 4 (16-byte stride); packed, each sequence's statistics
    start 16-byte aligned (jit_math._stats_start) and lse is copied beside them into the second buffer (else None)."""
    padded_q = host.cdiv(seq_q + (3 * packed.batch if packed else 0), 4) * 4
    row_delta = host.empty((rows, padded_q), device=device, dtype=torch.float32)
    packed_lse = host.empty(row_delta.shape, device=device, dtype=torch.float32) if packed else None
    return padded_q, row_delta, packed_lse


def lse_statistics_rows(lse: torch.Tensor, row_delta: torch.Tensor, packed_lse: torch.Tensor | None) -> torch.Tensor:
    """lse as the dk/dv kernel's TMA source, laid out like D (`statistics_buffers`): its rows padded like D's;
    packed, the copy the kernel that computed D made."""
    if packed_lse is not None:
        return packed_lse
    rows, padded_q = row_delta.shape
    lse_rows = lse.reshape(rows, -1)  # (B * Hq, Nq)
    if lse_rows.shape[1] == padded_q:
        return lse_rows
    return torch.nn.functional.pad(lse_rows, (0, padded_q - lse_rows.shape[1]))


def statistics_descriptors(lse_rows: torch.Tensor, row_delta: torch.Tensor, block_m: int) -> tuple:
    """The dk/dv kernel's TMA descriptors of lse and D (`statistics_buffers`) for block_m-row query blocks, in boxes
    of max(block_m, 32) fp32, at least 128 bytes (direct_launch.TMA_SHARED_ALIGNMENT: 16 rows put every second
    pipeline stage at a misaligned address); the kernel keeps a box's first block_m entries (`_leading`)."""
    box = [1, max(block_m, direct_launch.TMA_SHARED_ALIGNMENT // row_delta.element_size())]
    return direct_launch.descriptor(lse_rows, box), direct_launch.descriptor(row_delta, box)


def backward(
    do,
    q,
    k,
    v,
    delta,
    out,
    lse,
    theta,
    *,
    causal: bool,
    softmax_scale: float,
    q_offset: int,
    magnitude: str,
    dq_config=None,
    dkdv_config=None,
    packed: host.Packed | None = None,
    primes: tuple | None = None,
):
    """Returns (dq, dk, dv, d_delta or None). Deterministic: no atomics anywhere. packed: a packed batch as the
    forward's (do, q, out (total_q, Hq, d), k, v (total_k, Hkv, d), lse (Hq, total_q)), one launch per kernel.
    primes: the (q', k') the forward returned for these inputs (forward(..., return_primes=True)): no pre-pass."""
    precision = host.precision(q.dtype, q.device)  # a constexpr of the kernels: part of the launch sites' plan key
    plan = host.plan(
        do,
        q,
        k,
        v,
        delta,
        out,
        lse,
        theta,
        causal,
        q_offset,
        magnitude,
        dq_config,
        dkdv_config,
        precision,
        *(packed or ()),
    )
    # Pre-pass buffers and gradients are made as late and freed as early as they can be (peaks: module docstring).
    # Gradients are allocated in the inputs' own shapes (packed: (total, H, d)); the kernels see batch views.
    dq = host.empty_in_layout_of(q)  # each gradient in its input's layout (packed: (total, H, d) contiguous)
    k_in, v_in = k, v
    dq_view = dq
    if packed is not None:  # batch-1 views of the packed tensors
        do, q, k, v, out, dq_view = (host.batch_view(t, packed) for t in (do, q, k, v, out, dq))
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    group_size = n_q_heads // n_kv_heads
    block_d = host.block_d(head_dim)
    code = MAGNITUDES[magnitude].kernel_code
    cu_seqlens = host.cu_seqlens(packed)
    # The grids' sequences and rows: packed, every sequence up to the longest.
    n_sequences, rows_q, rows_k = (
        (packed.batch, packed.max_seqlen_q, packed.max_seqlen_k) if packed else (batch, seq_q, seq_k)
    )
    padded_q, row_delta, packed_lse = statistics_buffers(batch * n_q_heads, seq_q, packed, q.device)
    # q' serves both parts: part 1's query blocks and part 2's streamed queries. k' serves part 1's streamed keys
    # (freed after part 1, or at d <= 64 after part 2, which reads its key blocks from it). Both from one launch.
    if primes is None:
        q_prime, k_prime = prepass.transform_queries_and_keys(
            q, k, theta, delta, q_offset=q_offset, magnitude=magnitude, site=plan + ("backward q' k'",), packed=packed
        )
    else:
        q_prime, k_prime = primes

    # Part 1: dq, D and the d delta partials.
    block_m, block_n, num_warps, num_stages = pick_tiles("dq", head_dim, dq_config, q.dtype, q.device, precision)
    n_m_blocks = host.cdiv(rows_q, block_m)
    d_delta_partial = host.empty((n_sequences, n_q_heads, n_m_blocks, head_dim), device=q.device, dtype=torch.float32)
    q_rows = q_prime.view(batch * n_q_heads, seq_q, 2 * block_d)
    k_rows = k_prime.view(batch * n_kv_heads, seq_k, 2 * block_d)
    v_tma = host.tma_ready(v, block_d)
    qp_desc = direct_launch.descriptor(q_rows, [1, block_m, 2 * block_d])
    kp_desc = direct_launch.descriptor(k_rows, [1, block_n, 2 * block_d])
    v_desc = direct_launch.descriptor(v_tma, [1, 1, block_n, block_d])
    direct_launch.launch(
        _pope_bwd_dq_kernel,
        (n_m_blocks, n_sequences * n_q_heads),
        plan + ("dq",),
        (
            q,
            qp_desc,
            kp_desc,
            v_desc,
            out,
            do,
            lse,
            theta,
            delta if delta is not None else theta,
            dq_view,
            row_delta,
            d_delta_partial,
            *host.strides(q),
            *host.strides(out),
            *host.strides(do),
            *host.strides(dq_view),
            n_q_heads,
            group_size,
            seq_q,
            seq_k,
            q_offset,
            softmax_scale,
            padded_q,
            *cu_seqlens,
            packed_lse,
        ),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        HAS_DELTA=delta is not None,
        MAGNITUDE=code,
        PRECISION=precision,
        IS_VARLEN=packed is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    # Part 2: dk, dv, streaming the queries' q' (freed after). Part 1's descriptors serve again where the
    # tiles agree (host time).
    block_m, block_n, num_warps, num_stages = pick_tiles("dkdv", head_dim, dkdv_config, q.dtype, q.device, precision)
    keys_from_prepass = block_d <= DKDV_KEYS_FROM_PREPASS_MAX_BLOCK_D
    if keys_from_prepass:
        # Each program reads its key block from k' (kept alive until part 2 ends: 2 |k| more than at d = 128, the
        # price of not transforming keys in registers) and writes dk and dv straight into their own buffers.
        key_descriptors = (
            direct_launch.same_tiles(kp_desc, k_rows, [1, block_n, 2 * block_d]),
            direct_launch.same_tiles(v_desc, v_tma, [1, 1, block_n, block_d]),
        )
    else:
        del k_prime, k_rows, kp_desc  # k' dies before dk and dv exist (peak memory; a descriptor holds its tensor)
        key_descriptors = (None, None)
    dk, dv = host.empty_in_layout_of(k_in), host.empty_in_layout_of(v_in)
    dk_out, dv_out = host.batch_view(dk, packed), host.batch_view(dv, packed)
    # q', dO, lse and D stream in by TMA.
    lse_rows = lse_statistics_rows(lse, row_delta, packed_lse)
    descriptors = (
        direct_launch.same_tiles(qp_desc, q_rows, [1, block_m, 2 * block_d]),
        direct_launch.descriptor(host.tma_ready(do, block_d), [1, 1, block_m, block_d]),
        *statistics_descriptors(lse_rows, row_delta, block_m),
    )
    direct_launch.launch(
        _pope_bwd_dkdv_kernel,
        (host.cdiv(rows_k, block_n), n_sequences * n_kv_heads),
        plan + ("dk dv",),
        (
            k,
            v,
            *key_descriptors,
            *descriptors,
            theta,
            dk_out,
            dv_out,
            *host.strides(k),
            *host.strides(v),
            *host.strides(dk_out),
            *host.strides(dv_out),
            n_kv_heads,
            group_size,
            seq_q,
            seq_k,
            q_offset,
            softmax_scale,
            *cu_seqlens,
        ),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        MAGNITUDE=code,
        PRECISION=precision,
        KEYS_FROM_PREPASS=keys_from_prepass,
        IS_VARLEN=packed is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    del q_prime, q_rows, qp_desc, descriptors, key_descriptors
    if keys_from_prepass:
        del k_prime, k_rows, kp_desc
    # One last launch: d(delta) summed from its partials (deterministic: a fixed order, no atomics).
    d_delta = None
    if delta is not None:
        d_delta = host.empty(delta.shape, device=q.device, dtype=delta.dtype)
        direct_launch.launch(
            _d_delta_sum_kernel,
            (n_q_heads,),
            plan + ("d delta",),
            (d_delta_partial, d_delta, n_sequences, n_q_heads, n_m_blocks),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_R=TRANSFORM_ROWS,
            num_warps=4,
        )
    return dq, dk, dv, d_delta
