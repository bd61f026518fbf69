"""The kernels as PyTorch operators (pope.ops): opcheck, the eager autograd.Function against the custom operators,
torch.compile without graph breaks, the reasons a call cannot run, and a GPT trained and sampled through them.

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
    kernel_inputs,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    recorded_launches,
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
    triton_attention,
)

from pope.settings import SETTINGS
from pope.testing import (
    outputs_and_gradients,
)


def test_custom_ops_pass_opcheck(kernels):
    """Schema, fake (meta) implementation and autograd registration of the forward operator."""
    if delegated(kernels):
        return
    from pope.ops import flash_attention_forward

    generator = torch.Generator().manual_seed(4)
    q, k, v, delta, _ = kernel_inputs(1, 2, 1, 17, 17, 16, torch.float32, True, generator)
    args = (
        q.float().requires_grad_(),
        k.float().requires_grad_(),
        v.float().requires_grad_(),
        delta.float().requires_grad_(),
        kernels.frequencies(16, 10000.0, q.device),
        True,
        0.25,
        0,
        "softplus",
    )
    for save_primes in (False, True):  # the forward's q', k' empty, or saved for the backward
        torch.library.opcheck(
            flash_attention_forward,
            (*args, None, None, 0, 0, save_primes),
            test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
        )


def test_eager_function_and_custom_operators_agree_bitwise(kernels, monkeypatch):
    """Eager calls take the autograd.Function, compiled ones the custom operators: same launchers, same bits."""
    if delegated(kernels):
        return

    generator = torch.Generator().manual_seed(6)
    q, k, v, delta, grad_out = kernel_inputs(1, 4, 2, 33, 33, 32, torch.bfloat16, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None)
    eager = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    monkeypatch.setattr(SETTINGS, "eager_autograd_function", False)
    operators = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    for name, a, b in zip(["out", "dq", "dk", "dv", "d_delta"], eager, operators):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("eager_function", [True, False], ids=["eager-function", "operators"])
def test_backward_reusing_the_forwards_prepass_agrees_bitwise(kernels, monkeypatch, eager_function):
    """pope.settings' reuse_prepass: the backward takes the forward's q', k' instead of running the pre-pass again
    (one launch fewer), with the same bits as without; a call nothing differentiates keeps no q', k'."""
    if delegated(kernels):
        return
    launches = recorded_launches(monkeypatch)
    monkeypatch.setattr(SETTINGS, "eager_autograd_function", eager_function)
    generator = torch.Generator().manual_seed(7)
    q, k, v, delta, grad_out = kernel_inputs(2, 4, 2, 40, 40, 32, torch.bfloat16, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None)
    results, transforms = {}, {}
    for reuse in (True, False):
        monkeypatch.setattr(SETTINGS, "reuse_prepass", reuse)
        launches.clear()
        results[reuse] = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
        transforms[reuse] = launches.count("_pope_transform_kernel")
    assert transforms == {True: 1, False: 2}, transforms
    for name, a, b in zip(["out", "dq", "dk", "dv", "d_delta"], results[True], results[False]):
        assert torch.equal(a, b), name
    if not eager_function:  # a call nothing differentiates asks the operator for no q', k'
        from pope.ops import fused

        asked = []
        monkeypatch.setattr(SETTINGS, "reuse_prepass", True)
        operator = fused.flash_attention_forward
        monkeypatch.setattr(
            fused, "flash_attention_forward", lambda *args: (asked.append(args[-1]), operator(*args))[1]
        )
        q, k, v, delta = (t.to(torch.bfloat16) for t in (q, k, v, delta))
        with torch.no_grad():
            triton_attention(q, k, v, delta, **options)
        triton_attention(q, k, v, delta.requires_grad_(), **options)
        assert asked == [False, True]


def test_torch_compile_traces_without_graph_break(kernels):
    if delegated(kernels):
        return
    from pope.ops import triton_pope_attention

    generator = torch.Generator().manual_seed(5)
    q, k, v, delta, _ = kernel_inputs(1, 2, 1, 17, 17, 16, torch.float32, True, generator)
    q, k, v, delta = (t.float().requires_grad_() for t in (q, k, v, delta))
    options = dict(base=10000.0, causal=True, softmax_scale=0.25, q_offset=0, magnitude="softplus", rotary_dim=None)

    def loss_fn(q, k, v, delta):
        return triton_pope_attention(q * 1.0, k, v, delta, **options).square().sum()

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)  # fullgraph: a break would raise

    SETTINGS.caches.frequencies.clear()
    loss = compiled(q, k, v, delta)
    loss.backward()
    # Compiled code computes the frequencies in its graph and never fills the eager cache: a cached tensor made
    # inside a CUDA-graph tree's warm-up call would stay live in the graph's private pool (pope.ops.fused docstring).
    assert not SETTINGS.caches.frequencies, "a compiled call cached the frequencies"
    expected = loss_fn(q.detach(), k.detach(), v.detach(), delta.detach())
    assert SETTINGS.caches.frequencies, "an eager call should cache the frequencies"
    assert torch.allclose(loss.detach(), expected) and torch.isfinite(delta.grad).all()


def test_unsupported_calls_have_reasons(kernels):
    if delegated(kernels):
        return
    import pope.attention.api
    from pope.ops import triton_unsupported_reason

    q = torch.randn(1, 2, 8, 64, device=DEVICE)
    assert triton_unsupported_reason(q, q, q, rotary_dim=None) is None
    assert "rotary" in triton_unsupported_reason(q, q, q, rotary_dim=32)
    assert "float64" in triton_unsupported_reason(q.double(), q.double(), q.double())
    wide = torch.randn(1, 2, 8, 256, device=DEVICE)
    assert "head_dim" in triton_unsupported_reason(wide, wide, wide)
    assert "dropout" in triton_unsupported_reason(q, q, q, dropout_p=0.1)
    # Invalid calls (a magnitude that does not exist, a negative q_offset) are refused once, by pope.attention,
    # before any backend is asked what it can do.
    for options in (dict(magnitude="exp"), dict(q_offset=-1)):
        with pytest.raises(ValueError, match="magnitude" if "magnitude" in options else "q_offset"):
            pope.attention.pope_attention(q, q, q, None, backend="triton", **options)


def test_gpt_trains_and_generates_through_the_kernels(kernels, monkeypatch):
    """A small GPT with pe='pope:backend=triton': torch.compile (aot_eager) traces it with no graph break,
    loss and every parameter gradient match the reference backend, and KV-cache generation (the decode
    kernel) produces the same tokens."""
    if delegated(kernels):
        return
    from torch._dynamo.utils import counters

    import pope.attention.api
    from pope.model import GPT
    from pope.ops import triton_unsupported_reason
    from pope.presets import get_preset

    if not ON_GPU:  # pope.attention sends CPU tensors to the reference; let interpreted kernels take them

        def reason(q, k, v, **options):
            return triton_unsupported_reason(q, k, v, **options)

        monkeypatch.setattr(pope.attention.api, "_triton_unsupported_reason", reason)

    def model(backend):
        config = get_preset("owt-124m").model_config(
            pe=f"pope:backend={backend}", n_layer=2, d_model=64, n_head=2, max_seq_len=64, vocab_size=100
        )
        torch.manual_seed(0)
        return GPT(config).to(DEVICE)

    calls = {"forward": 0, "decode_forward": 0}
    for name in calls:  # count kernel launches, so a silent fallback to the reference cannot pass

        def counted(*args, _launch=getattr(kernels, name), _name=name, **kwargs):  # noqa: B008 (bind now)
            calls[_name] += 1
            return _launch(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)

    fused, reference = model("triton"), model("reference")
    idx = torch.randint(0, 100, (2, 40), device=DEVICE)
    targets = torch.randint(0, 100, (2, 40), device=DEVICE)
    torch._dynamo.reset()
    counters.clear()
    _, loss = torch.compile(fused, backend="aot_eager")(idx, targets)
    loss.backward()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    _, loss_reference = reference(idx, targets)
    loss_reference.backward()
    assert torch.allclose(loss, loss_reference, rtol=1e-5)
    for (name, p), p_reference in zip(fused.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, p_reference.grad, rtol=1e-4, atol=1e-6), name
    assert torch.equal(
        fused.generate(idx[:, :5], max_new_tokens=4, top_k=1), reference.generate(idx[:, :5], max_new_tokens=4, top_k=1)
    )
    assert calls["forward"] >= 2 and calls["decode_forward"] >= 2, calls
