"""pope.pope_attention_varlen: packed variable-length sequences in flash-attn's varlen layout, on CPU (reference
backend; "auto" falls back to it): equal to one pope_attention call per sequence, forward and backward, right
against the float64 formula, and every bad input refused with a clear error."""

from __future__ import annotations

import pytest
import torch

import pope
from pope.testing import formula_attention


def _packed(lengths_q, lengths_k, hq, hkv, d, *, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = torch.randn(total_q, hq, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(total_k, hkv, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(total_k, hkv, d, generator=g, dtype=torch.float64).to(dtype)
    delta = -6.283185307179586 * torch.rand(hq, d, generator=g, dtype=torch.float64)
    cu_q = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lengths_k).cumsum(0).tolist(), dtype=torch.int32)
    return q, k, v, delta, cu_q, cu_k


def _sequences(x, cu):
    bounds = cu.tolist()
    return [x[a:b] for a, b in zip(bounds, bounds[1:])]


CASES = [
    # (lengths_q, lengths_k, Hq, Hkv, d, causal)
    pytest.param([5, 0, 1, 7], [5, 3, 1, 7], 2, 2, 8, True, id="empty-and-length-1-causal"),
    pytest.param([3, 1, 6], [9, 4, 6], 4, 2, 16, True, id="gqa-Nq<Nk-causal"),
    pytest.param([2, 5, 1], [7, 5, 3], 4, 1, 12, False, id="mqa-Nq<Nk-noncausal-odd"),
    pytest.param([0, 0], [0, 4], 2, 1, 8, True, id="no-queries-at-all"),
]


@pytest.mark.parametrize("lengths_q,lengths_k,hq,hkv,d,causal", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_equals_per_sequence_calls_forward_and_backward(lengths_q, lengths_k, hq, hkv, d, causal, dtype):
    q, k, v, delta, cu_q, cu_k = _packed(lengths_q, lengths_k, hq, hkv, d, dtype=dtype)
    delta = delta.to(torch.float64 if dtype == torch.float64 else torch.float32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, delta)]
    out = pope.pope_attention_varlen(
        *leaves, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal, backend="reference"
    )
    assert out.shape == q.shape and out.dtype == dtype
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad(out, leaves, grad_out, allow_unused=False) if out.numel() else None

    seq_leaves = [t.clone().requires_grad_() for t in (q, k, v, delta)]
    pieces = []
    for qs, ks, vs in zip(
        _sequences(seq_leaves[0], cu_q), _sequences(seq_leaves[1], cu_k), _sequences(seq_leaves[2], cu_k)
    ):
        if qs.shape[0]:
            one = pope.pope_attention(
                qs.transpose(0, 1)[None],
                ks.transpose(0, 1)[None],
                vs.transpose(0, 1)[None],
                seq_leaves[3],
                causal=causal,
                backend="reference",
            )
            pieces.append(one[0].transpose(0, 1))
    if not pieces:
        assert out.numel() == 0
        return
    expected = torch.cat(pieces)
    assert torch.equal(out.detach(), expected.detach())
    expected_grads = torch.autograd.grad(expected, seq_leaves, grad_out)
    for name, ours, theirs in zip(("dq", "dk", "dv", "d_delta"), grads, expected_grads):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6 if dtype != torch.float64 else 1e-12, msg=name)


def test_matches_the_float64_formula_with_positions_restarting_per_sequence():
    """Each sequence's queries at Nk_b - Nq_b + i and keys at 0..Nk_b - 1, against the score formula."""
    lengths_q, lengths_k = [4, 1, 0, 6], [9, 1, 2, 6]
    q, k, v, delta, cu_q, cu_k = _packed(lengths_q, lengths_k, 4, 2, 8, seed=3)
    out = pope.pope_attention_varlen(q, k, v, delta, cu_q, cu_k, 6, 9)
    rows = []
    for qs, ks, vs in zip(_sequences(q, cu_q), _sequences(k, cu_k), _sequences(v, cu_k)):
        if qs.shape[0]:
            rows.append(
                formula_attention(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None], delta)[
                    0
                ].transpose(0, 1)
            )
    torch.testing.assert_close(out, torch.cat(rows), rtol=1e-10, atol=1e-10)
    # Packing is not attention across documents: a change in one sequence's keys leaves the others' rows alone.
    k2 = k.clone()
    k2[cu_k[0] : cu_k[1]] += 1.0
    out2 = pope.pope_attention_varlen(q, k2, v, delta, cu_q, cu_k, 6, 9)
    assert not torch.equal(out2[:4], out[:4]) and torch.equal(out2[4:], out[4:])


def _good():
    q, k, v, delta, cu_q, cu_k = _packed([3, 2], [4, 2], 2, 1, 8)
    return dict(q=q, k=k, v=v, delta=delta, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=3, max_seqlen_k=4)


def _call(**changes):
    arguments = {**_good(), **changes}
    options = {
        name: arguments.pop(name)
        for name in ("causal", "softmax_scale", "base", "magnitude", "backend")
        if name in arguments
    }
    return pope.pope_attention_varlen(*arguments.values(), **options)


@pytest.mark.parametrize(
    "changes,error,message",
    [
        (dict(cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int64)), TypeError, "int32"),
        (dict(cu_seqlens_k=[0, 4, 6]), TypeError, "cu_seqlens_k must be a torch.Tensor"),
        (
            dict(
                cu_seqlens_q=torch.tensor([0, 4, 3, 5], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 4, 5, 6], dtype=torch.int32),
            ),
            ValueError,
            "non-decreasing",
        ),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 4], dtype=torch.int32)), ValueError, "last entry must be the total"),
        (dict(cu_seqlens_q=torch.tensor([1, 3, 5], dtype=torch.int32)), ValueError, "must start at 0"),
        (dict(cu_seqlens_q=torch.tensor([5], dtype=torch.int32)), ValueError, "batch \\+ 1 >= 2"),
        (dict(cu_seqlens_q=torch.tensor([[0, 3, 5]], dtype=torch.int32)), ValueError, "1-D"),
        (dict(cu_seqlens_k=torch.tensor([0, 6], dtype=torch.int32)), ValueError, "same length"),
        (dict(max_seqlen_q=2), ValueError, "max_seqlen_q=2 is smaller than sequence 0's length 3"),
        (dict(max_seqlen_k=3), ValueError, "max_seqlen_k=3 is smaller"),
        (dict(max_seqlen_q=3.0), TypeError, "max_seqlen_q must be an int"),
        (dict(max_seqlen_k=True), TypeError, "max_seqlen_k must be an int"),
        (
            dict(cu_seqlens_k=torch.tensor([0, 1, 6], dtype=torch.int32), max_seqlen_k=5),
            ValueError,
            "sequence 0 has 3 queries but only 1",
        ),
        (dict(q=torch.randn(5, 2, 8, dtype=torch.float64)[None]), ValueError, "must have 3 dims"),
        (dict(k=torch.randn(6, 1, 4, dtype=torch.float64)), ValueError, "same shape"),
        (
            dict(
                q=torch.randn(5, 3, 8, dtype=torch.float64),
                delta=None,
                k=torch.randn(6, 2, 8, dtype=torch.float64),
                v=torch.randn(6, 2, 8, dtype=torch.float64),
            ),
            ValueError,
            "multiple of key/value heads",
        ),
        (dict(q=torch.randn(5, 2, 8, dtype=torch.float32)), TypeError, "share one dtype"),
        (dict(q=torch.randint(0, 3, (5, 2, 8))), TypeError, "float16, bfloat16"),
        (dict(delta=torch.zeros(3, 8)), ValueError, "delta must have shape"),
        (dict(causal=1), TypeError, "causal must be True or False"),
        (dict(magnitude="exp"), ValueError, "unknown magnitude"),
        (dict(backend="cuda"), ValueError, "unknown backend"),
        (dict(softmax_scale=-1.0), ValueError, "softmax_scale must be positive"),
        (dict(base=0.0), ValueError, "base must be a positive"),
        (dict(backend="triton"), ValueError, "backend='triton' cannot run this call"),
    ],
)
def test_bad_input_is_a_clear_error(changes, error, message):
    with pytest.raises(error, match=message):
        _call(**changes)


def test_good_input_runs():
    out = _call()
    assert out.shape == (5, 2, 8) and torch.isfinite(out).all()


@pytest.mark.parametrize(
    "cu_q,cu_k,max_q,max_k",
    [
        ([1, 3, 5], [0, 4, 6], 3, 4),  # does not start at 0
        ([0, 3, 2, 5], [0, 4, 5, 6], 3, 4),  # decreasing
        ([0, 3, 4], [0, 4, 6], 3, 4),  # does not end at total_q
        ([0, 3, 5], [0, 4, 6], 2, 4),  # a length above max_seqlen_q
        ([0, 3, 5], [0, 4, 6], 3, 3),  # a length above max_seqlen_k
        ([0, 3, 5], [0, 1, 6], 3, 5),  # Nq > Nk
    ],
)
def test_device_side_check_refuses_what_the_host_checks_refuse(cu_q, cu_k, max_q, max_k):
    """On CUDA the kernel path checks cu_seqlens' values as one asynchronous device assertion (no host read); on CPU
    tensors torch._assert_async raises at once, so the same conditions can be checked here, and the host checks
    refuse each case too (ValueError)."""
    from pope.attention.checks import assert_packing_on_device, packed_lengths

    cu_q, cu_k = (torch.tensor(x, dtype=torch.int32) for x in (cu_q, cu_k))
    with pytest.raises(RuntimeError, match="cu_seqlens_q / cu_seqlens_k must start at 0"):
        assert_packing_on_device(cu_q, cu_k, 5, 6, max_q, max_k)
    with pytest.raises(ValueError):
        packed_lengths(cu_q, cu_k, 5, 6, max_q, max_k)
    good_q, good_k = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 4, 6], dtype=torch.int32)
    assert_packing_on_device(good_q, good_k, 5, 6, 3, 4)  # no error
