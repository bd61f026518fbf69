"""The split-K decode kernels (tensor cores, lanes) against the full forward kernel, and the key-phase table
they keep across eager decode steps.

Shared set-up (Triton's interpreter on CPU, outputs poisoned with NaN) and the acceptance rule:
tests/kernel_fixtures.py.
"""

from __future__ import annotations

import pytest
import torch
from kernel_fixtures import (  # before pope's imports: it sets Triton's interpreter up
    DEVICE,
    delegated,
    kernel_inputs,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
)

from pope.settings import SETTINGS


@pytest.mark.parametrize("method,n_q_heads,seq_q", [("tensor_cores", 4, 2), ("lanes", 2, 1), ("lanes", 4, 2)])
def test_decode_kernel_agrees_with_the_full_kernel(kernels, method, n_q_heads, seq_q):
    """The split-K decode kernels and the block kernel compute the same output and log-sum-exp."""
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(3)
    q, k, v, delta, _ = kernel_inputs(1, n_q_heads, 2, seq_q, 150, 64, torch.float32, True, generator)
    q, k, v, delta = q.float(), k.float(), v.float(), delta.float()
    theta = kernels.frequencies(64, 10000.0, q.device)
    options = dict(causal=True, softmax_scale=0.125, q_offset=150 - seq_q, magnitude="softplus")
    out_block, lse_block = kernels.forward(q, k, v, delta, theta, **options)
    out_decode, lse_decode = kernels.decode_forward(q, k, v, delta, theta, method=method, num_splits=3, **options)
    assert torch.allclose(out_block, out_decode, rtol=1e-5, atol=1e-6)
    assert torch.allclose(lse_block, lse_decode, rtol=1e-5, atol=1e-6)
    # Queries at positions 40(, 41): keys 42.. are invisible, so the later splits see no key at all.
    options["q_offset"] = 40
    out_block, lse_block = kernels.forward(q, k, v, delta, theta, **options)
    out_decode, lse_decode = kernels.decode_forward(q, k, v, delta, theta, method=method, num_splits=4, **options)
    assert torch.allclose(out_block, out_decode, rtol=1e-5, atol=1e-6)
    assert torch.allclose(lse_block, lse_decode, rtol=1e-5, atol=1e-6)


def test_decode_keeps_its_key_phase_table_and_gives_the_same_bits(kernels, monkeypatch):
    """keep_phase_table=True: the first decode call with a theta builds a power-of-two table, later calls (a cache
    growing within it) launch no table pre-pass and give the same bits as building the table per call; a longer
    cache gets a new table beside the old (a captured CUDA graph may still read it); changing theta in place
    rebuilds."""
    if delegated(kernels):
        return
    from pope.kernels import phase_tables, prepass

    monkeypatch.setattr(SETTINGS.caches, "phase_tables", {})
    monkeypatch.setattr(phase_tables, "MIN_PHASE_TABLE_ROWS", 64)
    builds = []
    transform = kernels.transform
    monkeypatch.setattr(prepass, "transform", lambda *a, **kw: builds.append(a[0].shape) or transform(*a, **kw))
    generator = torch.Generator().manual_seed(4)
    theta = kernels.frequencies(64, 10000.0, DEVICE)
    for dtype, magnitude in ((torch.bfloat16, "identity"), (torch.float16, "softplus")):
        for seq_k, table_rows in ((40, 64), (64, None), (65, 128), (90, None)):  # None: no new table
            q, k, v, delta, _ = kernel_inputs(1, 8, 2, 1, seq_k, 64, dtype, True, generator)
            q, k, v, delta = q.to(dtype), k.to(dtype), v.to(dtype), delta.float()
            options = dict(
                causal=True,
                softmax_scale=0.125,
                q_offset=seq_k - 1,
                magnitude=magnitude,
                method="tensor_cores",
                num_splits=2,
            )
            builds.clear()
            kept, _ = kernels.decode_forward(q, k, v, delta, theta, keep_phase_table=True, **options)
            assert [b[2] for b in builds] == ([table_rows] if table_rows else []), (seq_k, builds)
            per_call, _ = kernels.decode_forward(q, k, v, delta, theta, **options)
            assert torch.equal(kept, per_call), seq_k
        assert sorted(key[-1] for key in SETTINGS.caches.phase_tables if key[2] == dtype) == [64, 128]
    assert kernels.release_phase_tables() == 4 and not SETTINGS.caches.phase_tables
    kernels.decode_forward(q, k, v, delta, theta, keep_phase_table=True, **options)  # kept again (fp16, 128 rows)
    theta.copy_(kernels.frequencies(64, 5000.0, DEVICE))  # in place (another base): the kept table no longer matches it
    builds.clear()
    kept, _ = kernels.decode_forward(q, k, v, delta, theta, keep_phase_table=True, **options)
    assert [b[2] for b in builds] == [128]
    per_call, _ = kernels.decode_forward(q, k, v, delta, theta, **options)
    assert torch.equal(kept, per_call)
