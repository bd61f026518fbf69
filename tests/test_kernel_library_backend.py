"""Backends "cudnn" and "flash-attn-4": the pre-pass (pope::cartesian) and its gradient pass (pope::cartesian_backward)
around a library attention kernel. On CPU the passes run under Triton's interpreter and SDPA's math kernel stands in
for cuDNN's and flash-attn-4's, so these tests hold what is ours (the passes, the autograd wiring, the call's options,
the layouts handed over, the compiled graph); the GPU check (scripts/gpu_check.py) holds the same rule with the
libraries themselves.

Shared set-up and the acceptance rule: tests/kernel_fixtures.py.
"""

from __future__ import annotations

import sys

import pytest
import torch
from kernel_fixtures import (  # before pope's imports: it sets Triton's interpreter up
    DEVICE,
    assert_library_backend_within_rule,
    delegated,
    kernel_inputs,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
)

from pope.attention import pope_attention, pope_attention_varlen, reference_pope_attention
from pope.testing import check_within_rule, deterministic_algorithms, outputs_and_gradients


def library_attention(q, k, v, delta, **options):
    from pope.ops import cudnn_pope_attention

    options = {name: value for name, value in options.items() if name != "rotary_dim"}
    return cudnn_pope_attention(q, k, v, delta, **options)


@pytest.mark.parametrize(
    ("shape", "dtype", "with_delta", "magnitude"),
    [
        ((2, 4, 4, 33, 33, 32), torch.bfloat16, True, "softplus"),
        ((1, 4, 2, 40, 40, 64), torch.float16, True, "softplus"),
        ((1, 2, 1, 17, 17, 128), torch.bfloat16, True, "softplus"),
        ((1, 2, 2, 24, 24, 48), torch.bfloat16, False, "relu"),
    ],
    ids=["mha-d32-bf16", "gqa-d64-fp16", "gqa-d128-bf16", "d48-padded-no-delta-relu"],
)
def test_library_backend_within_twice_the_reference_error(kernels, shape, dtype, with_delta, magnitude):
    """Output, dq, dk, dv and d(delta) against float64, within 2x plain PyTorch's error in the same dtype; head dims
    whose halves are padded (48 -> 64 channels) and 128 (the chain rule in quarters) included."""
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(sum(shape))
    q, k, v, delta, grad_out = kernel_inputs(*shape, torch.float64, with_delta, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=shape[-1] ** -0.5, q_offset=0, magnitude=magnitude)
    reference = dict(options, rotary_dim=None)
    truth = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, reference)
    theirs = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, dtype, reference)
    ours = outputs_and_gradients(library_attention, q, k, v, delta, grad_out, dtype, options)
    names = ["out", "dq", "dk", "dv", "d_delta"]
    for name, mine, plain, exact in zip(names, ours, theirs, truth):
        result = check_within_rule(mine, plain, exact, dtype)
        assert result["ok"], (name, result)


def test_cartesian_operators_pass_opcheck(kernels):
    """Schema, fake (meta) implementation and autograd registration of the pre-pass operator."""
    if delegated(kernels):
        return
    from pope.ops import cartesian, cartesian_backward

    generator = torch.Generator().manual_seed(9)
    q, k, _, delta, _ = kernel_inputs(1, 4, 2, 17, 17, 32, torch.float32, True, generator)
    # q and k as views of a (B, N, H, d) projection, as a model hands them over: the fake outputs' strides must be
    # the kernel's (contiguous), or a compiled graph asserts on them.
    q, k = (t.float().transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k))
    args = (
        q.requires_grad_(),
        k.requires_grad_(),
        delta.float().requires_grad_(),
        kernels.frequencies(32, 10000.0, q.device),
        0,
        "softplus",
    )
    torch.library.opcheck(cartesian, args, test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    q_wide, k_wide = (torch.randn_like(t) for t in cartesian(*args))
    backward_args = (q_wide, k_wide, *(t.detach() for t in args[:3]), *args[3:])
    torch.library.opcheck(cartesian_backward, backward_args, test_utils=("test_schema", "test_faketensor"))


def test_library_backend_compiles_to_one_graph(kernels):
    """torch.compile traces the pre-pass operators and SDPA under its backend choice with no graph break, and the
    compiled call gives the eager call's output and gradients."""
    if delegated(kernels):
        return
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(10)
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16  # cuDNN takes fp16 / bf16 only
    q, k, v, delta, grad_out = kernel_inputs(1, 4, 2, 24, 24, 32, dtype, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=0, magnitude="softplus")
    explanation = torch._dynamo.explain(library_attention)(q.to(dtype), k.to(dtype), v.to(dtype), delta, **options)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(library_attention, backend="aot_eager", fullgraph=True)
    eager = outputs_and_gradients(library_attention, q, k, v, delta, grad_out, dtype, options)
    traced = outputs_and_gradients(compiled, q, k, v, delta, grad_out, dtype, options)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)  # dq: atomics
    for name, a, b in zip(["out", "dq", "dk", "dv", "d_delta"], eager, traced):
        torch.testing.assert_close(b, a, **tolerance, msg=name)


def test_library_backend_says_what_it_cannot_run(kernels):
    """Calls backend "cudnn" cannot take are refused in one line naming the reason and the way out, never run wrong:
    CPU tensors, fp32, bottom-right causal alignment (fewer queries than keys), packed batches."""
    if delegated(kernels):
        return
    from pope.ops import cudnn_unsupported_reason

    generator = torch.Generator().manual_seed(11)
    q, k, v, delta, _ = kernel_inputs(1, 2, 2, 8, 8, 32, torch.bfloat16, True, generator)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match=r"backend='cudnn' cannot run this call: .*CUDA.*Use backend='triton'"):
            pope_attention(q, k, v, delta, backend="cudnn")
    assert "float16 and bfloat16" in cudnn_unsupported_reason(q.float(), k.float(), v.float(), causal=True, q_offset=0)
    fewer_queries = cudnn_unsupported_reason(q[:, :, :3], k, v, causal=True, q_offset=5)
    assert "as many queries as keys" in fewer_queries
    assert cudnn_unsupported_reason(q[:, :, :3], k, v, causal=False, q_offset=5) is None
    assert cudnn_unsupported_reason(q, k, v, causal=True, q_offset=0) is None
    packed = q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()
    cu_seqlens = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="does not take packed"):
        pope_attention_varlen(*packed, delta, cu_seqlens, cu_seqlens, 8, 8, backend="cudnn")


@pytest.fixture
def fake_flash_attn_4(monkeypatch):
    """A stand-in for flash-attn-4's module flash_attn.cute (not installable on a CPU machine): its flash_attn_func
    takes flash-attn's (B, N, H, channels) layout and computes with SDPA's math kernel, and records each call's
    layouts and options; what the tests hold is ours (layout, scale, masking, the gradient passes, the options)."""
    import importlib.machinery
    import types

    from pope.ops import flash_attn_4_installed

    calls = []

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, deterministic=False):
        calls.append(dict(strides=[t.stride() for t in (q, k, v)], causal=causal, deterministic=deterministic))
        assert all(t.stride(-1) == 1 for t in (q, k, v)) and q.shape[-1] == k.shape[-1]
        out = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)),
            is_causal=causal,
            scale=softmax_scale,
            enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2), None

    package, module = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.cute")
    package.__path__ = []
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn.cute", None)
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", module)
    flash_attn_4_installed.cache_clear()
    yield calls
    flash_attn_4_installed.cache_clear()


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((2, 4, 4, 33, 33, 32), torch.bfloat16), ((1, 2, 2, 17, 17, 128), torch.float16)],
    ids=["mha-d32-bf16", "mha-d128-fp16"],
)
def test_flash_attn_4_backend_within_twice_the_reference_error(kernels, fake_flash_attn_4, shape, dtype):
    """Backend "flash-attn-4": output, dq, dk, dv and d(delta) against float64 within 2x plain PyTorch's error, the
    library handed q', k' and v as transposed views (no copy) and the options asked for."""
    if delegated(kernels):
        return
    from pope.ops import flash_attn_4_pope_attention

    seed = sum(shape) + 1
    q, k, v, delta, options = assert_library_backend_within_rule(flash_attn_4_pope_attention, shape, dtype, seed)
    batch, heads, seq, _ = q.shape
    wide = 2 * shape[-1]  # q' and k' of these head dims are not padded
    q_strides, _, v_strides = fake_flash_attn_4[0]["strides"]
    assert q_strides == (heads * seq * wide, wide, seq * wide, 1)  # a (B, N, H, 2d) view of the (B, H, N, 2d) buffer
    assert v_strides == (heads * seq * shape[-1], shape[-1], seq * shape[-1], 1)
    assert fake_flash_attn_4[0]["causal"] and not fake_flash_attn_4[0]["deterministic"]
    with torch.no_grad(), deterministic_algorithms():
        flash_attn_4_pope_attention(q.to(dtype), k.to(dtype), v.to(dtype), delta.float(), **options)
    assert fake_flash_attn_4[-1]["deterministic"]  # its ordered dq sums, asked for when the user asks for determinism


def test_flash_attn_4_backend_says_what_it_cannot_run(kernels, fake_flash_attn_4):
    """Calls backend "flash-attn-4" cannot take are refused in one line naming the reason and the way out: not
    installed, CPU tensors, fp32, causal with the last query short of the last key, packed batches; "auto" never
    picks it off CUDA."""
    if delegated(kernels):
        return
    from pope.ops import flash_attn_4_installed, flash_attn_4_unsupported_reason

    generator = torch.Generator().manual_seed(12)
    q, k, v, delta, _ = kernel_inputs(1, 4, 2, 8, 8, 32, torch.bfloat16, True, generator)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))

    def reason(q, k, v, causal=True, q_offset=0):
        return flash_attn_4_unsupported_reason(q, k, v, causal=causal, q_offset=q_offset)

    assert "float16 and bfloat16" in reason(q.float(), k.float(), v.float())
    assert "last query at the last key" in reason(q[:, :, :3], k, v, q_offset=0)
    mha = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    if DEVICE == "cpu":
        assert "CUDA tensors only" in reason(q[:, :, :3], k, v, q_offset=5)
        assert "CUDA tensors only" in reason(q, *mha)
        with pytest.raises(ValueError, match=r"^backend='flash-attn-4' cannot run this call: .*CUDA.*Use backend="):
            pope_attention(q, *mha, delta, backend="flash-attn-4")
        assert fake_flash_attn_4 == []  # nothing reached the library, "auto" included
        pope_attention(q, *mha, delta, backend="auto")
        assert fake_flash_attn_4 == []
    sys.modules.pop("flash_attn.cute")
    flash_attn_4_installed.cache_clear()
    assert "pip install 'pope-attention[flash-attn-4]'" in reason(q, *mha)
    packed = q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()
    cu_seqlens = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="does not take packed"):
        pope_attention_varlen(*packed, delta, cu_seqlens, cu_seqlens, 8, 8, backend="flash-attn-4")
