"""The pre-pass's gradient: from dq', dk' (the gradients of the 2d-channel q' and k' that `prepass` made) back to dq,
dk and d(delta), one memory-bound launch (`_pope_transform_grad_kernel`, beside its launcher `transform_grad`).

It is what the backend built on a library attention kernel needs (pope.ops, backend "cudnn"): the library computes
attention on q', k' and v and returns dq', dk'; this pass applies the chain rule through the magnitudes and phases,
the same device function (pope.kernels.bwd_chain_rule) the fused backward ends with.
Guarantees: dx = (dx'_cos cos + dx'_sin sin) f'(x) for each half, phases as the pre-pass rounds them; d(delta) summed
in a fixed order (per-block partials, then one reduction): two runs give bitwise-identical gradients.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pope.magnitudes import MAGNITUDES

from . import direct_launch, host
from .bwd_chain_rule import _chain_rule
from .configs import TRANSFORM_ROWS


@triton.jit
def _transform_grad_rows(
    X,
    DWide,
    Theta,
    Delta,
    DX,
    DDeltaPartial,
    stride_xb,
    stride_xh,
    stride_xn,
    stride_wb,
    stride_wh,
    stride_wn,
    pid_r,
    pid_bh,
    n_heads,
    seq_len,
    position_offset,
    n_row_blocks,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
):
    """Rows pid_r * BLOCK_R .. + BLOCK_R of head pid_bh (= b * n_heads + h): dx' (rows, 2 BLOCK_D) -> dx (rows, d)
    into the contiguous DX, and with HAS_DELTA this block's d(delta) partial into DDeltaPartial[pid_bh, pid_r]."""
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_rows = offs_r < seq_len
    offs_w = tl.arange(0, 2 * BLOCK_D)
    wide_rows = DWide + b.to(tl.int64) * stride_wb + h * stride_wh + offs_r[:, None] * stride_wn
    d_wide = tl.load(wide_rows + offs_w[None, :], mask=mask_rows[:, None], other=0.0).to(tl.float32)
    x_rows = X + b.to(tl.int64) * stride_xb + h * stride_xh + offs_r[:, None] * stride_xn
    dx_rows = DX + (pid_bh.to(tl.int64) * seq_len + offs_r[:, None]) * HEAD_DIM
    d_delta_row = DDeltaPartial + (pid_bh.to(tl.int64) * n_row_blocks + pid_r) * HEAD_DIM
    _chain_rule(
        d_wide,
        x_rows,
        dx_rows,
        position_offset + offs_r,
        mask_rows,
        Theta,
        Delta + h * HEAD_DIM,
        1.0,
        d_delta_row,
        HEAD_DIM,
        BLOCK_D,
        HAS_DELTA,
        MAGNITUDE,
    )


@triton.jit
def _pope_transform_grad_kernel(
    Q,
    DQWide,
    Theta,
    Delta,
    DQ,
    DDeltaPartial,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_dqb,
    stride_dqh,
    stride_dqn,
    n_q_heads,
    seq_q,
    q_offset,
    n_q_programs,
    n_row_blocks,
    K,
    DKWide,
    DK,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    n_kv_heads,
    seq_k,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    MAGNITUDE: tl.constexpr,
):
    """Program (r, bh): bh < n_q_programs (= B * Hq) takes query rows (with delta, positions from q_offset), the
    others key rows (no delta, positions from 0): dq and dk in one launch, as the pre-pass makes q' and k'."""
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    if pid_bh < n_q_programs:
        _transform_grad_rows(
            Q, DQWide, Theta, Delta, DQ, DDeltaPartial,
            stride_qb, stride_qh, stride_qn, stride_dqb, stride_dqh, stride_dqn,
            pid_r, pid_bh, n_q_heads, seq_q, q_offset, n_row_blocks,
            HEAD_DIM, BLOCK_D, BLOCK_R, HAS_DELTA, MAGNITUDE,
        )  # fmt: skip
    else:
        _transform_grad_rows(
            K, DKWide, Theta, Theta, DK, DDeltaPartial,
            stride_kb, stride_kh, stride_kn, stride_dkb, stride_dkh, stride_dkn,
            pid_r, pid_bh - n_q_programs, n_kv_heads, seq_k, 0, n_row_blocks,
            HEAD_DIM, BLOCK_D, BLOCK_R, False, MAGNITUDE,
        )  # fmt: skip


def transform_grad(
    dq_wide: torch.Tensor,
    dk_wide: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    theta: torch.Tensor,
    delta: torch.Tensor | None,
    *,
    q_offset: int,
    magnitude: str,
):
    """(dq, dk, d_delta or None) from dq' (B, Hq, Nq, 2 BLOCK_D) and dk' (B, Hkv, Nk, 2 BLOCK_D), the gradients of
    `prepass.transform_queries_and_keys(q, k, theta, delta, q_offset=q_offset, magnitude=magnitude)`'s outputs.
    Any (batch, head, row) strides with unit stride along the last dimension; dq, dk contiguous in q's dtype;
    d_delta (Hq, d) in delta's dtype."""
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    block_d = host.block_d(head_dim)
    rows = TRANSFORM_ROWS if block_d <= 64 else TRANSFORM_ROWS // 2
    n_row_blocks = host.cdiv(max(seq_q, seq_k), rows)
    dq = host.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = host.empty(k.shape, device=k.device, dtype=k.dtype)
    # One fp32 partial sum of d(delta) per (batch, query head, row block): reduced below in a fixed order.
    partial = torch.empty((batch, n_q_heads, n_row_blocks, head_dim) if delta is not None else (1,), device=q.device)
    n_q_programs = batch * n_q_heads
    grid = (n_row_blocks, n_q_programs + batch * n_kv_heads)
    direct_launch.launch(
        _pope_transform_grad_kernel,
        grid,
        None,
        (
            q,
            dq_wide,
            theta,
            delta if delta is not None else theta,
            dq,
            partial,
            *host.strides(q),
            *host.strides(dq_wide),
            n_q_heads,
            seq_q,
            q_offset,
            n_q_programs,
            n_row_blocks,
            k,
            dk_wide,
            dk,
            *host.strides(k),
            *host.strides(dk_wide),
            n_kv_heads,
            seq_k,
        ),  # fmt: skip
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_R=rows,
        HAS_DELTA=delta is not None,
        MAGNITUDE=MAGNITUDES[magnitude].kernel_code,
        num_warps=4,
    )
    d_delta = partial.sum(dim=(0, 2)).to(delta.dtype) if delta is not None else None
    return dq, dk, d_delta
