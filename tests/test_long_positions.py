"""Exact angles at long positions (pope.frequencies.angles in float32, what the reference and the kernels use):
position x theta reduced mod 2 pi in exact integer arithmetic from the frequencies' fixed-point turns, so that the
angle error against float64 at positions 2^20, 10^7 and 2^30 is within a few times the error at small positions,
where the plain fp32 product was off by up to 0.8 rad at 10^7. The kernels' side: tests/test_kernel_accuracy.py."""

from __future__ import annotations

import math

import pytest
import torch

import pope
from pope.frequencies import MAX_EXACT_POSITION, angles, pope_frequencies, turn_angles, turn_words
from pope.testing import attention_inputs, formula_attention

D = 64
SMALL = 0  # positions SMALL .. SMALL + N - 1: the error every long position is held to
N = 2048


def _angle_error(ours: torch.Tensor, positions: torch.Tensor, theta64: torch.Tensor) -> float:
    """max |ours - t theta| over the circle (float64 truth), in radians."""
    difference = ours.double() - angles(positions, theta64)
    return torch.remainder(difference + math.pi, 2 * math.pi).sub(math.pi).abs().max().item()


def test_angle_error_at_long_positions_within_a_few_times_the_small_position_error():
    theta64 = pope_frequencies(D, 10000.0, dtype=torch.float64)
    theta32 = pope_frequencies(D, 10000.0)
    small_positions = torch.arange(SMALL, SMALL + N)
    small = _angle_error(angles(small_positions, theta64, dtype=torch.float32), small_positions, theta64)
    assert small < 4e-7  # about an ulp of pi: the angles are reduced before they are rounded
    for start in (2**20, 10**7, 2**30 - N):
        positions = torch.arange(start, start + N)
        ours = angles(positions, theta64, dtype=torch.float32)
        assert ours.dtype == torch.float32 and ours.abs().max() <= math.pi
        error = _angle_error(ours, positions, theta64)
        assert error <= 3 * small, (start, error, small)
        # The plain fp32 product was the problem being fixed: this test would catch it coming back.
        plain = _angle_error(positions.float()[:, None] * theta32[None, :], positions, theta64)
        assert plain > 1000 * small, (start, plain)


def test_turn_words_hold_the_frequency_to_64_fractional_bits():
    theta64 = pope_frequencies(D, 500000.0, dtype=torch.float64)
    words = turn_words(theta64).to(torch.int64) & 0xFFFFFFFF
    turns = (words[0].double() + words[1].double() / 2**32) / 2**32
    exact = theta64 / (2 * math.pi)
    assert (turns - (exact - exact.floor())).abs().max() <= 2**-52  # float64's own resolution, not the words'


def test_negative_float_and_large_frequency_positions():
    """Negative integer positions, fractional positions and frequencies above one turn per position (base < 1)
    are as exact as the rest."""
    theta64 = pope_frequencies(8, 0.01, dtype=torch.float64)  # theta up to 56 rad per position
    # (positions where float64's own t theta is still exact to ~1e-8: the truth must be truer than the test)
    positions = torch.tensor([-(10**6), -1, 0, 3, 10**6])
    assert _angle_error(angles(positions, theta64, dtype=torch.float32), positions, theta64) < 5e-7
    positions = torch.tensor([MAX_EXACT_POSITION - 1, -(MAX_EXACT_POSITION - 1)])  # no int64 overflow at the bound
    assert _angle_error(angles(positions, theta64[:1], dtype=torch.float32), positions, theta64[:1]) < 1e-6
    fractional = torch.tensor([0.25, 1e6 + 0.5, -3.75], dtype=torch.float64)
    ours = angles(fractional, pope_frequencies(8, 10000.0, dtype=torch.float64), dtype=torch.float32)
    truth = angles(fractional, pope_frequencies(8, 10000.0, dtype=torch.float64))
    assert (torch.remainder(ours.double() - truth + math.pi, 2 * math.pi) - math.pi).abs().max() < 1e-6
    assert torch.equal(turn_angles(positions, turn_words(theta64)), angles(positions, theta64, dtype=torch.float32))


def test_float64_angles_stay_the_plain_product():
    theta64 = pope_frequencies(D, 10000.0, dtype=torch.float64)
    positions = torch.arange(10**7, 10**7 + 8)
    assert torch.equal(angles(positions, theta64), positions.double()[:, None] * theta64[None, :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_attention_error_does_not_grow_with_the_query_offset(dtype):
    """The reference's output error against the float64 formula at q_offset 10^6 and 10^7 is within a few times
    its error at q_offset 0 (same inputs: PoPE's score depends on s - t only, so only the keys' and queries'
    absolute angles differ)."""
    g = torch.Generator().manual_seed(11)
    q, k, v, delta, _ = attention_inputs(1, 4, 2, 8, 40, 32, generator=g)

    def error(q_offset):
        truth = formula_attention(q, k, v, delta, causal=False, q_offset=q_offset)
        ours = pope.pope_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), delta.float(), causal=False, q_offset=q_offset, backend="reference"
        )
        return (ours.double() - truth).abs().max().item()

    small = error(0)
    for q_offset in (10**6, 10**7):
        assert error(q_offset) <= 3 * small, (q_offset, error(q_offset), small)
