"""The pre-pass: x (B, H, N, d) -> x' (B, H, N, 2 BLOCK_D) = [f(x) cos(phase) | f(x) sin(phase)], one memory-bound
launch (`_pope_transform_kernel`, beside its launchers `transform` and `transform_queries_and_keys`).

Guarantees: phase = (position_offset + n) * theta - delta[h] (delta optional), as pope.frequencies.angles rounds
it; each half is zero-padded to BLOCK_D channels (none at d = 16, 32, 64, 128), so a kernel reads a whole
(rows, 2 BLOCK_D) tile [cos | sin] with one TMA copy; x' is contiguous, in x's dtype. q' and k' can come from one
launch (q with delta at positions q_offset.., k without delta from 0), which writes exactly what two launches write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pope.magnitudes import MAGNITUDES

from . import direct_launch, host
from .configs import TRANSFORM_ROWS
from .jit_math import _phase, _polar_to_cartesian


@triton.jit
def _transform_rows(
    X,
    Theta,
    Delta,
    Out,
    stride_xb,
    stride_xh,
    stride_xn,
    pid_r,
    pid_bh,
    n_heads,
    seq_len,
    position_offset,
    CuSeqlens,
    CuSeqlensOther,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """Rows pid_r * BLOCK_R .. + BLOCK_R of head pid_bh (= b * n_heads + h) of x -> x'.

    Varlen (IS_VARLEN): x is packed sequences seen as batch 1 ((1, H, total, d)), b is the sequence: its rows
    start at CuSeqlens[b], its positions restart at 0, offset by the other side's length minus its own (queries:
    Nk_b - Nq_b; keys pass their own lengths as the other side: 0); x' is written token-major (total, H, 2 BLOCK_D),
    the packed tensors' own layout."""
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    if IS_VARLEN:
        start = tl.load(CuSeqlens + b)
        seq_len = tl.load(CuSeqlens + b + 1) - start
        position_offset = tl.load(CuSeqlensOther + b + 1) - tl.load(CuSeqlensOther + b) - seq_len
        rows = start + offs_r
        b = 0
    else:
        rows = offs_r
    mask_d = offs_d < HEAD_DIM
    mask = (offs_r < seq_len)[:, None] & mask_d[None, :]
    x = tl.load(X + b * stride_xb + h * stride_xh + rows[:, None] * stride_xn + offs_d[None, :], mask=mask, other=0.0)
    phase = _phase(position_offset + offs_r, Theta, Delta + h * HEAD_DIM, offs_d, mask_d, HAS_DELTA, HEAD_DIM)
    x_cos, x_sin = _polar_to_cartesian(x, phase, mask, MAGNITUDE)
    # Rows of x' are [cos (BLOCK_D) | sin (BLOCK_D)]: the padded channels are written as zeros, so a kernel
    # reads a whole (rows, 2 BLOCK_D) tile with one TMA copy.
    if IS_VARLEN:
        out_rows = Out + (rows[:, None] * n_heads + h) * (2 * BLOCK_D) + offs_d[None, :]
    else:
        out_rows = Out + (pid_bh * seq_len + offs_r[:, None]) * (2 * BLOCK_D) + offs_d[None, :]
    row_mask = (offs_r < seq_len)[:, None]
    tl.store(out_rows, x_cos.to(Out.dtype.element_ty), mask=row_mask)
    tl.store(out_rows + BLOCK_D, x_sin.to(Out.dtype.element_ty), mask=row_mask)


@triton.jit
def _pope_transform_kernel(
    X,
    Theta,
    Delta,
    Out,
    stride_xb,
    stride_xh,
    stride_xn,
    n_heads,
    seq_len,
    position_offset,
    n_programs,
    K,
    KOut,
    stride_kb,
    stride_kh,
    stride_kn,
    n_kv_heads,
    seq_k,
    CuSeqlensQ,
    CuSeqlensK,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
    IS_VARLEN: tl.constexpr = False,
):
    """Program (r, bh): bh < n_programs (= B * n_heads) transforms x (with delta, positions from
    position_offset); the others, if the grid has them, the keys K (no delta, positions from 0) in the same
    launch: the attention's q' and k' in one launch instead of two (host time, one launch tail). Varlen: the
    grid's rows cover the longest sequence, B is the number of sequences (`_transform_rows`)."""
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    if pid_bh < n_programs:
        _transform_rows(
            X,
            Theta,
            Delta,
            Out,
            stride_xb,
            stride_xh,
            stride_xn,
            pid_r,
            pid_bh,
            n_heads,
            seq_len,
            position_offset,
            CuSeqlensQ,
            CuSeqlensK,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_R,
            HAS_DELTA,
            MAGNITUDE,
            IS_VARLEN,
        )
    else:
        _transform_rows(
            K,
            Theta,
            Theta,
            KOut,
            stride_kb,
            stride_kh,
            stride_kn,
            pid_r,
            pid_bh - n_programs,
            n_kv_heads,
            seq_k,
            0,
            CuSeqlensK,
            CuSeqlensK,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_R,
            False,
            MAGNITUDE,
            IS_VARLEN,
        )


def transform(
    x: torch.Tensor,
    theta: torch.Tensor,
    delta: torch.Tensor | None,
    *,
    position_offset: int,
    magnitude: str,
    site: tuple | None = None,
) -> torch.Tensor:
    """x (B, H, N, d) -> x' (B, H, N, 2 * BLOCK_D) contiguous, in x's dtype: [f(x) cos(phase) | f(x) sin(phase)],
    each half padded with zeros to BLOCK_D = host.block_d(d) channels (no padding for d = 16, 32, 64, 128),
    phase = (position_offset + n) * theta - delta[h]. site: the caller's launch-site key (direct_launch.launch)."""
    return _transform(x, theta, delta, position_offset, magnitude, site, None)[0]


def transform_queries_and_keys(
    q: torch.Tensor,
    k: torch.Tensor,
    theta: torch.Tensor,
    delta: torch.Tensor | None,
    *,
    q_offset: int,
    magnitude: str,
    site: tuple | None = None,
    packed: host.Packed | None = None,
):
    """(q', k') as `transform` makes them (q with delta at positions q_offset.., k without delta from 0), in one
    launch. packed: q (1, Hq, total_q, d) and k (1, Hkv, total_k, d) are the batch views (host.batch_view) of a
    packed batch's tensors (q_offset unused: each sequence's queries sit at Nk_b - Nq_b.., its keys from 0); q' and k'
    are then (1, H, total, 2 BLOCK_D) views of token-major (total, H, 2 BLOCK_D) buffers."""
    return _transform(q, theta, delta, q_offset, magnitude, site, k, packed)


def _transform(x, theta, delta, position_offset, magnitude, site, keys, packed=None):
    batch, heads, seq, head_dim = x.shape
    block_d = host.block_d(head_dim)
    rows = TRANSFORM_ROWS if block_d <= 64 else TRANSFORM_ROWS // 2  # 4K elements a program
    out = host.prime_buffer(batch, heads, seq, block_d, like=x, packed=packed is not None)
    if packed is not None:  # the grid covers the longest sequence, its second axis (sequence, head)
        batch, seq, seq_k = packed.batch, packed.max_seqlen_q, packed.max_seqlen_k
    n_programs = batch * heads
    if keys is None:  # the kernel's key arguments unused: no program reaches them
        keys_out, kv_heads, seq_k, grid = out, heads, seq, (host.cdiv(seq, rows), n_programs)
    else:
        kv_heads = keys.shape[1]
        seq_k = seq_k if packed is not None else keys.shape[2]
        keys_out = host.prime_buffer(keys.shape[0], kv_heads, keys.shape[2], block_d, like=x, packed=packed is not None)
        grid = (host.cdiv(max(seq, seq_k), rows), n_programs + batch * kv_heads)
    direct_launch.launch(
        _pope_transform_kernel,
        grid,
        site,
        (
            x,
            theta,
            delta if delta is not None else theta,
            out,
            *host.strides(x),
            heads,
            x.shape[2],
            position_offset,
            n_programs,
            keys if keys is not None else x,
            keys_out,
            *host.strides(keys if keys is not None else x),
            kv_heads,
            (keys if keys is not None else x).shape[2],
            *host.cu_seqlens(packed),
        ),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_R=rows,
        HAS_DELTA=delta is not None,
        MAGNITUDE=MAGNITUDES[magnitude].kernel_code,
        IS_VARLEN=packed is not None,
        num_warps=4,
    )
    return out, (keys_out if keys is not None else None)
