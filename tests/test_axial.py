"""Axial (N-D) PoPE: per-axis relative-position invariance, the 1-D case equals pope_attention, the ViT module."""

import math

import pytest
import torch

from pope.attention import pope_attention
from pope.axial import (
    AxialPoPE,
    AxialPoPEAttention,
    axial_phases,
    axial_pope_attention,
    grid_positions,
    split_axis_dims,
)


def _qkv(b=2, h=3, n=12, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, dtype=torch.float64, generator=g) for _ in range(3)]


def _scores(q, k, positions_q, positions_k, axis_dims, delta):
    """Attention logits sum_c f(q_c) f(k_c) cos((s_a - t_a) theta_c + delta_c) / sqrt(d), written out per axis."""
    f = torch.nn.functional.softplus
    d = q.shape[-1]
    total = torch.zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=torch.float64)
    start = 0
    for axis, g in enumerate(axis_dims):
        theta = 10000.0 ** (-torch.arange(g, dtype=torch.float64) / g)
        rel = (positions_k[None, :, axis] - positions_q[:, None, axis]).double()  # (Nq, Nk): s_a - t_a
        angle = rel[..., None] * theta + delta[:, None, None, start : start + g]  # (H, Nq, Nk, g)
        mags = f(q[..., start : start + g])[:, :, :, None, :] * f(k[..., start : start + g])[:, :, None, :, :]
        total += (mags * angle.cos()[None]).sum(-1)
        start += g
    return total / math.sqrt(d)


def test_2d_scores_are_per_axis_relative_and_shift_invariant():
    q, k, v = _qkv(n=12, d=8)
    grid = grid_positions((3, 4))  # (12, 2): [row, col]
    assert grid[5].tolist() == [1, 1] and grid.shape == (12, 2)
    delta = -2 * math.pi * torch.rand(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = axial_pope_attention(q, k, v, grid, delta=delta)
    expected = torch.softmax(_scores(q, k, grid, grid, (4, 4), delta), -1) @ v
    assert torch.allclose(out, expected, atol=1e-12, rtol=0)
    for shift in ([5, 0], [0, 7], [-3, 11]):  # moving the whole grid along an axis changes nothing
        moved = axial_pope_attention(q, k, v, grid + torch.tensor(shift), delta=delta)
        assert torch.allclose(moved, out, atol=1e-12, rtol=0), shift
    # ...but moving the keys alone along one axis does change the scores, and only through that axis.
    rows_moved = axial_pope_attention(q, k, v, grid, grid + torch.tensor([1, 0]), delta=delta)
    assert not torch.allclose(rows_moved, out, atol=1e-6)
    expected = torch.softmax(_scores(q, k, grid, grid + torch.tensor([1, 0]), (4, 4), delta), -1) @ v
    assert torch.allclose(rows_moved, expected, atol=1e-12, rtol=0)


def test_3d_video_positions_and_uneven_channel_groups():
    q, k, v = _qkv(b=1, h=2, n=2 * 2 * 3, d=10)
    grid = grid_positions((2, 2, 3))  # (t, row, col)
    dims = split_axis_dims(10, 3)
    assert dims == (4, 3, 3)
    out = axial_pope_attention(q, k, v, grid)
    shifted = axial_pope_attention(q, k, v, grid + torch.tensor([4, -2, 9]))
    assert torch.allclose(out, shifted, atol=1e-12, rtol=0)
    expected = torch.softmax(_scores(q, k, grid, grid, dims, torch.zeros(2, 10, dtype=torch.float64)), -1) @ v
    assert torch.allclose(out, expected, atol=1e-12, rtol=0)
    assert axial_phases(grid, dims).shape == (12, 10)


def test_one_axis_equals_pope_attention():
    q, k, v = _qkv(n=9, d=8)
    delta = -torch.rand(3, 8, dtype=torch.float64)
    line = torch.arange(9)[:, None]
    for causal in (False, True):
        ours = axial_pope_attention(q, k, v, line, delta=delta, causal=causal)
        theirs = pope_attention(q, k, v, delta, causal=causal, backend="reference")
        assert torch.allclose(ours, theirs, atol=1e-12, rtol=0)


def test_axial_layer_takes_pope_delta_range_and_softmax_scale():
    """AxialPoPE has pope.PoPE's options: on one axis with delta out of range, "wrap" scores as the unconstrained
    delta and a given softmax_scale reaches the op."""
    q, k, v = _qkv(n=9, d=8)
    line = torch.arange(9)[:, None]
    layer = AxialPoPE(n_heads=3, head_dim=8, n_axes=1, delta_range="wrap", softmax_scale=0.2).double()
    free = torch.full((3, 8), 1.5, dtype=torch.float64)  # outside [-2π, 0]
    with torch.no_grad():
        layer.delta.copy_(free)
    theirs = pope_attention(q, k, v, free, causal=False, softmax_scale=0.2, backend="reference")
    assert torch.allclose(layer(q, k, v, line), theirs, atol=1e-12, rtol=0)


def test_vit_drop_in_module_trains_and_refuses_bad_input():
    torch.manual_seed(0)
    layer = AxialPoPEAttention(32, 4, delta_init="uniform")
    x = torch.randn(2, 16, 32)
    grid = grid_positions((4, 4))
    y = layer(x, grid)
    assert y.shape == x.shape
    y.square().mean().backward()
    assert layer.pe.delta.grad is not None and layer.qkv.weight.grad.abs().sum() > 0
    perm = torch.randperm(16)  # tokens carry their positions: permuting both permutes the output
    assert torch.allclose(layer(x[:, perm], grid[perm]), y[:, perm].detach(), atol=1e-5)
    with pytest.raises(ValueError, match="axes"):
        layer(x, grid_positions((16,)))
    with pytest.raises(ValueError, match="shape"):
        layer(x, grid_positions((3, 4)))
    with pytest.raises(ValueError, match="sum to at most"):
        AxialPoPE(n_heads=2, head_dim=8, axis_dims=(6, 6))
    with pytest.raises(ValueError, match="cannot split"):
        split_axis_dims(2, 3)
    with pytest.raises(ValueError, match="positive sizes"):
        grid_positions((3, 0))
