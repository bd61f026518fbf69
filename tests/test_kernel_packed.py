"""Packed (varlen) batches on the fused kernels: equal to per-sequence calls, within 2x the reference's error, no
sequence reaching another, clear errors for what the kernels cannot run, and the operators under torch.compile.

Shared set-up (Triton's interpreter on CPU, outputs poisoned with NaN) and the acceptance rule:
tests/kernel_fixtures.py.
"""

from __future__ import annotations

import pytest
import torch
from kernel_fixtures import (  # before pope's imports: it sets Triton's interpreter up
    DEVICE,
    ON_GPU,
    delegated,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    recorded_launches,
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
)

from pope.settings import SETTINGS
from pope.testing import (
    GRADIENT_NAMES,
    check_within_rule,
    outputs_and_gradients,
)

# Packed (varlen) batches: empty (no queries; no queries and no keys), length-1, few-query and multi-block
# sequences, Nq < Nk and odd lengths; the interpreter's tiles are 32 rows.
PACKED_Q, PACKED_K = [0, 1, 3, 0, 21, 40], [5, 1, 30, 0, 21, 45]


def _packed_kernel_call(kernels, q, k, v, delta, grad_out, packed, causal, magnitude="softplus"):
    """(out, dq, dk, dv, d_delta or None, lse) from the launchers directly: packed, or one (1, H, N, d) call."""
    theta = kernels.frequencies(q.shape[-1], 10000.0, q.device)
    options = dict(
        causal=causal, softmax_scale=q.shape[-1] ** -0.5, q_offset=k.shape[-2] - q.shape[-2], magnitude=magnitude
    )
    out, lse = kernels.forward(q, k, v, delta, theta, **options, packed=packed)
    grads = kernels.backward(grad_out, q, k, v, delta, out, lse, theta, **options, packed=packed)
    return (out, *grads, lse)


@pytest.mark.parametrize("causal", [True, False])
def test_packed_kernels_equal_per_sequence_kernel_calls(kernels, causal):
    """One launch per kernel over a packed batch computes what the same kernels compute on each sequence alone:
    out, lse, dq, dk and dv bit for bit (same tiles, the same products; rows of other sequences enter only as exact
    zeros), d(delta) up to its summation order; no element left unwritten (outputs NaN-poisoned)."""
    if delegated(kernels):
        return
    from pope.kernels.host import Packed
    from pope.testing import packed_inputs

    q, k, v, delta, grad_out, cu_q, cu_k = (
        t.to(DEVICE).float() if t.is_floating_point() else t.to(DEVICE)
        for t in packed_inputs(PACKED_Q, PACKED_K, 4, 2, 32, generator=torch.Generator().manual_seed(40))
    )
    packed = Packed(cu_q, cu_k, max(PACKED_Q), max(PACKED_K))
    out, dq, dk, dv, d_delta, lse = _packed_kernel_call(kernels, q, k, v, delta, grad_out, packed, causal)
    assert lse.shape == (4, q.shape[0])
    expected_d_delta = torch.zeros_like(delta)
    for b, (nq, _nk) in enumerate(zip(PACKED_Q, PACKED_K)):
        rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if nq == 0:  # keys no query sees: zero gradients
            assert not dk[rows_k].any() and not dv[rows_k].any()
            continue
        one = [x[rows].transpose(0, 1)[None] for x, rows in ((q, rows_q), (k, rows_k), (v, rows_k), (grad_out, rows_q))]
        theirs = _packed_kernel_call(kernels, *one[:3], delta, one[3], None, causal)
        for name, ours, expected in (
            ("out", out[rows_q], theirs[0]),
            ("dq", dq[rows_q], theirs[1]),
            ("dk", dk[rows_k], theirs[2]),
            ("dv", dv[rows_k], theirs[3]),
            ("lse", lse[:, rows_q], theirs[5][0]),
        ):
            expected = expected if name == "lse" else expected[0].transpose(0, 1)
            assert torch.equal(ours, expected), (name, b)
        expected_d_delta += theirs[4]
    torch.testing.assert_close(d_delta, expected_d_delta, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "dtype,n_kv_heads,head_dim,causal,magnitude,with_delta",
    [
        pytest.param(torch.bfloat16, 2, 32, True, "softplus", True, id="bf16-gqa-causal"),
        pytest.param(torch.float16, 1, 48, False, "relu", False, id="fp16-mqa-noncausal-d48-relu-nodelta"),
    ],
)
def test_packed_kernels_within_twice_the_references_error(
    kernels, monkeypatch, dtype, n_kv_heads, head_dim, causal, magnitude, with_delta
):
    """pope_attention_varlen(backend="triton"): output and every gradient within 2x the reference's error against
    float64, by one launch of each kernel for the whole batch (pre-pass + forward; pre-pass, dq, dk/dv, the d(delta)
    sum), not one per sequence and not the reference."""
    if delegated(kernels):
        return
    import pope.attention.api
    from pope.ops import triton_unsupported_reason
    from pope.testing import packed_inputs

    if not ON_GPU:  # pope.attention sends CPU tensors to the reference; let interpreted kernels take them
        monkeypatch.setattr(
            pope.attention.api,
            "_triton_unsupported_reason",
            lambda q, k, v, **options: triton_unsupported_reason(q, k, v, **options),
        )
    launches = recorded_launches(monkeypatch)
    q, k, v, delta, grad_out, cu_q, cu_k = (
        t.to(DEVICE) if t is not None else None
        for t in packed_inputs(
            PACKED_Q,
            PACKED_K,
            4,
            n_kv_heads,
            head_dim,
            with_delta=with_delta,
            generator=torch.Generator().manual_seed(41),
        )
    )
    options = dict(
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(PACKED_Q),
        max_seqlen_k=max(PACKED_K),
        causal=causal,
        magnitude=magnitude,
    )

    def varlen(q, k, v, delta, backend):
        return pope.attention.pope_attention_varlen(q, k, v, delta, **options, backend=backend)

    exact = outputs_and_gradients(varlen, q, k, v, delta, grad_out, torch.float64, dict(backend="reference"))
    theirs = outputs_and_gradients(varlen, q, k, v, delta, grad_out, dtype, dict(backend="reference"))
    assert not launches
    ours = outputs_and_gradients(varlen, q, k, v, delta, grad_out, dtype, dict(backend="triton"))
    assert launches == [  # the backward reuses the forward's q', k' (pope.settings' reuse_prepass): no pre-pass
        "_pope_transform_kernel",
        "_pope_fwd_kernel",
        "_pope_bwd_dq_kernel",
        "_pope_bwd_dkdv_kernel",
        *(["_d_delta_sum_kernel"] if with_delta else []),
    ], launches
    for name, a, b, c in zip(GRADIENT_NAMES, ours, theirs, exact):
        assert a.dtype == b.dtype and a.shape == c.shape, name
        result = check_within_rule(a.cpu(), b.cpu(), c.cpu(), dtype)
        assert result["ok"], (name, result)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf in the rows that see the non-finite key
def test_packed_sequences_do_not_reach_each_other(kernels):
    """Changing one sequence's values (finite) leaves every other sequence's output and gradients bit for bit; its
    keys and values made NaN / inf leave the others' outputs bit for bit (the forward masks other sequences' rows)."""
    if delegated(kernels):
        return
    from pope.kernels.host import Packed
    from pope.testing import packed_inputs

    lengths_q, lengths_k = [3, 5, 2], [33, 5, 4]  # sequence 0's last key block reads sequence 1's first rows
    inputs = [
        t.to(DEVICE).to(torch.bfloat16) if t.is_floating_point() else t.to(DEVICE)
        for t in packed_inputs(lengths_q, lengths_k, 2, 1, 32, generator=torch.Generator().manual_seed(42))
    ]
    q, k, v, delta, grad_out, cu_q, cu_k = inputs
    delta = delta.float()
    packed = Packed(cu_q, cu_k, 9, 40)  # bounds above the longest lengths (5, 33): the extra programs return at once
    clean = _packed_kernel_call(kernels, q, k, v, delta, grad_out, packed, True)[:4]
    k2, v2, q2 = k.clone(), v.clone(), q.clone()
    k2[33:38] += 1.0
    v2[33:38] -= 2.0
    q2[3:8] *= 0.5
    changed = _packed_kernel_call(kernels, q2, k2, v2, delta, grad_out, packed, True)[:4]
    others_q, others_k = (torch.cat([torch.arange(0, a), torch.arange(b, c)]) for a, b, c in ((3, 8, 10), (33, 38, 42)))
    for name, a, b, rows in zip(("out", "dq", "dk", "dv"), clean, changed, (others_q, others_q, others_k, others_k)):
        assert torch.equal(a[rows], b[rows]), name
        assert not torch.equal(a, b), name  # the changed sequence's own rows did change
    k2[33:38, :, 3], v2[33:38, :, 5] = float("nan"), float("inf")
    with torch.no_grad():
        dirty = kernels.forward(
            q2,
            k2,
            v2,
            delta,
            kernels.frequencies(32, 10000.0, q.device),
            causal=True,
            softmax_scale=32**-0.5,
            q_offset=0,
            magnitude="softplus",
            packed=packed,
        )[0]
    assert torch.equal(dirty[others_q], clean[0][others_q])
    assert not torch.isfinite(dirty[3:8]).all()


def test_packed_call_the_kernels_cannot_run_is_a_clear_error(kernels, monkeypatch):
    """backend="triton" on a packed call outside what the kernels do (float64, head dim > 128) says why."""
    if delegated(kernels):
        return
    import pope.attention.api
    from pope.ops import triton_unsupported_reason
    from pope.testing import packed_inputs

    if not ON_GPU:
        monkeypatch.setattr(
            pope.attention.api,
            "_triton_unsupported_reason",
            lambda q, k, v, **options: triton_unsupported_reason(q, k, v, **options),
        )
    for head_dim, dtype, message in (
        (16, torch.float64, "dtype torch.float64 is not supported"),
        (160, torch.bfloat16, "head_dim 160 > 128"),
    ):
        q, k, v, delta, _, cu_q, cu_k = packed_inputs([2, 3], [2, 4], 2, 1, head_dim)
        with pytest.raises(ValueError, match=f"backend='triton' cannot run this call: {message}"):
            pope.attention.pope_attention_varlen(
                q.to(dtype), k.to(dtype), v.to(dtype), delta, cu_q, cu_k, 3, 4, backend="triton"
            )


def test_packed_calls_through_the_operators_and_torch_compile(kernels, monkeypatch):
    """A packed call through the custom operators (what compiled code takes) gives the eager Function's bits; the
    forward operator with cu_seqlens passes opcheck; torch.compile traces a packed call with no graph break."""
    if delegated(kernels):
        return
    from pope import ops
    from pope.testing import packed_inputs

    lengths_q, lengths_k = [3, 0, 17], [5, 2, 17]
    q, k, v, delta, grad_out, cu_q, cu_k = (
        t.to(DEVICE) for t in packed_inputs(lengths_q, lengths_k, 2, 1, 16, generator=torch.Generator().manual_seed(43))
    )
    options = dict(base=10000.0, causal=True, softmax_scale=0.25, magnitude="softplus")

    def packed_call(q, k, v, delta):
        return ops.triton_pope_attention_varlen(q, k, v, delta, cu_q, cu_k, 17, 17, **options)

    eager = outputs_and_gradients(packed_call, q, k, v, delta, grad_out, torch.float32, {})
    monkeypatch.setattr(SETTINGS, "eager_autograd_function", False)
    operators = outputs_and_gradients(packed_call, q, k, v, delta, grad_out, torch.float32, {})
    for name, a, b in zip(GRADIENT_NAMES, eager, operators):
        assert torch.equal(a, b), name
    leaves = [t.float().requires_grad_() for t in (q, k, v, delta)]
    torch.library.opcheck(
        ops.flash_attention_forward,
        (*leaves, kernels.frequencies(16, 10000.0, q.device), True, 0.25, 0, "softplus", cu_q, cu_k, 17, 17),
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )
    compiled = torch.compile(lambda *x: packed_call(*x).square().sum(), backend="aot_eager", fullgraph=True)
    loss = compiled(*leaves)
    loss.backward()
    assert torch.allclose(loss.detach(), packed_call(*(t.detach() for t in leaves)).square().sum())
    assert torch.isfinite(leaves[3].grad).all()
