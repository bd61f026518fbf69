"""What the kernel test modules (tests/test_kernel_*.py) share: the fused PoPE Triton kernels run on CPU through
Triton's interpreter (TRITON_INTERPRET=1), compiled on CUDA when a GPU is present. Each kernel test module
imports this module first, before anything imports Triton.

Acceptance rule (flash-attention's): against a float64 computation, the kernel's output and every
gradient may be off by at most 2x what the pure-PyTorch reference makes in the same dtype. Every buffer a
kernel writes starts NaN-filled, so an element the kernel forgets to write fails the check.

Interpreter mode is fixed when a @triton.jit function is created: Triton's own library functions
(tl.zeros, ...) when triton is first imported, ours when pope.kernels' modules are. The whole suite runs
in one pytest process, so tests/conftest.py (and this module, for a test module run on its own) sets
TRITON_INTERPRET=1 on CPU-only machines before anything imports triton. If something imported triton earlier in
compiled mode, the interpreter cannot be switched on in this process any more: a test module's tests then run in
one subprocess started with TRITON_INTERPRET=1, and each test asserts its own result there.
"""

from __future__ import annotations

import pytest

from pope.testing import kernel_test_setup  # before anything imports Triton

ON_GPU, DEVICE, INTERPRETER_IN_PROCESS = kernel_test_setup()

from pope.settings import override  # noqa: E402
from pope.testing import (  # noqa: E402
    assert_passed_in_subprocess,
    attention_inputs,  # noqa: E402
    interpreter_subprocess_results,
)


@pytest.fixture(scope="module", name="subprocess_results")
def subprocess_results_fixture(request):
    """Fallback: the test module's results in a fresh TRITON_INTERPRET=1 process (pope.testing)."""
    return None if INTERPRETER_IN_PROCESS else interpreter_subprocess_results(request.module.__file__, timeout=900)


@pytest.fixture(autouse=True, name="kernels")
def kernels_fixture(request, subprocess_results):
    """The kernel module, interpreted on CPU; outputs poisoned with NaN."""
    if subprocess_results is not None:
        assert_passed_in_subprocess(request.node.name, subprocess_results)
        yield None  # the test body sees None and returns: its checks already ran in the subprocess
        return
    import pope.kernels
    from pope.kernels import fwd

    assert ON_GPU or pope.kernels.INTERPRET, "pope.kernels was imported before TRITON_INTERPRET was set"
    assert ON_GPU or type(fwd._pope_fwd_kernel).__name__ == "InterpretedFunction"
    with override(poison_outputs=True):
        yield pope.kernels


def delegated(kernels) -> bool:
    """True when this test's checks already ran (and passed) in the interpreter subprocess."""
    return kernels is None


def kernel_inputs(batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, dtype, with_delta, generator):
    inputs = attention_inputs(
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, with_delta=with_delta, generator=generator
    )
    return tuple(t.to(DEVICE) if t is not None else None for t in inputs)


def assert_library_backend_within_rule(attention, shape, dtype, seed: int):
    """A library backend's output, dq, dk, dv and d(delta) (attention: pope.ops' flash_attn_4_pope_attention or
    alike) against float64 within 2x plain PyTorch's error, causal, softplus, for shape (B, Hq, Hkv, Nq, Nk, d)."""
    import torch

    from pope.attention import reference_pope_attention
    from pope.testing import check_within_rule, outputs_and_gradients

    q, k, v, delta, grad_out = kernel_inputs(*shape, torch.float64, True, torch.Generator().manual_seed(seed))
    options = dict(base=10000.0, causal=True, softmax_scale=shape[-1] ** -0.5, q_offset=0, magnitude="softplus")
    reference = dict(options, rotary_dim=None)
    truth = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, reference)
    theirs = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, dtype, reference)
    ours = outputs_and_gradients(attention, q, k, v, delta, grad_out, dtype, options)
    for name, mine, plain, exact in zip(["out", "dq", "dk", "dv", "d_delta"], ours, theirs, truth):
        result = check_within_rule(mine, plain, exact, dtype)
        assert result["ok"], (name, result)
    return q, k, v, delta, options


def triton_attention(q, k, v, delta, **options):
    from pope.ops import triton_pope_attention

    return triton_pope_attention(q, k, v, delta, **options)


def recorded_launches(monkeypatch) -> list:
    """The names of the kernels launched from now on, in order (every launch still runs)."""
    from pope.kernels import direct_launch

    launches = []
    original_launch = direct_launch.launch

    def recording_launch(kernel, *args, **meta):
        launches.append(kernel.__name__)
        return original_launch(kernel, *args, **meta)

    monkeypatch.setattr(direct_launch, "launch", recording_launch)
    return launches
