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
    phase = _phase(position_offset + offs_r, Theta, Delta + h * HEAD_DIM, offs_d, mask_d, HAS_DELTA, HEAD_DIM)
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


def transform(x: torch.Tensor, theta: torch.Tensor, delta: torch.Tensor | None, *, position_offset: int,
              magnitude: str, site: tuple | None = None) -> torch.Tensor:
    """x (B, H, N, d) -> x' (B, H, N, 2 * BLOCK_D) contiguous, in x's dtype: [f(x) cos(phase) | f(x) sin(phase)],
    each half padded with zeros to BLOCK_D = host.block_d(d) channels (no padding for d = 16, 32, 64, 128),
    phase = (position_offset + n) * theta - delta[h]. site: the caller's launch-site key (direct_launch.launch)."""
    return _transform(x, theta, delta, position_offset, magnitude, site, None)[0]


def transform_queries_and_keys(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor, delta: torch.Tensor | None, *,
                               q_offset: int, magnitude: str, site: tuple | None = None):
    """(q', k') as `transform` makes them (q with delta at positions q_offset.., k without delta from 0), in one
    launch."""
    return _transform(q, theta, delta, q_offset, magnitude, site, k)


def _transform(x, theta, delta, position_offset, magnitude, site, keys):
    batch, heads, seq, head_dim = x.shape
    block_d = host.block_d(head_dim)
    out = host.empty((batch, heads, seq, 2 * block_d), device=x.device, dtype=x.dtype)
    rows = TRANSFORM_ROWS if block_d <= 64 else TRANSFORM_ROWS // 2  # 4K elements a program
    n_programs = batch * heads
    if keys is None:  # the kernel's key arguments unused: no program reaches them
        keys_out, kv_heads, seq_k, grid = out, heads, seq, (host.cdiv(seq, rows), n_programs)
    else:
        kv_heads, seq_k = keys.shape[1], keys.shape[2]
        keys_out = host.empty((batch, kv_heads, seq_k, 2 * block_d), device=x.device, dtype=x.dtype)
        grid = (host.cdiv(max(seq, seq_k), rows), n_programs + batch * kv_heads)
    direct_launch.launch(_pope_transform_kernel, grid, site, (
        x, theta, delta if delta is not None else theta, out, *host.strides(x), heads, seq, position_offset, n_programs,
        keys if keys is not None else x, keys_out, *host.strides(keys if keys is not None else x), kv_heads, seq_k),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_R=rows,
        HAS_DELTA=delta is not None, MAGNITUDE=MAGNITUDES[magnitude].kernel_code, num_warps=4)
    return out, (keys_out if keys is not None else None)
