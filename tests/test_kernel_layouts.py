"""Outputs and gradients in their inputs' layouts: q, k, v that are (B, N, H, d) projections transposed to
(B, H, N, d) get out, dq, dk, dv laid out the same way (as SDPA returns its output), so a model's transpose back to
(B, N, H * d) is a view and torch.compile adds no copy. Same bits as contiguous inputs; the fake implementations give
the same strides.

Shared set-up (Triton's interpreter on CPU, outputs poisoned with NaN): tests/kernel_fixtures.py.
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
    triton_attention,
)

from pope.kernels.buffers import empty_in_layout_of, heads_inner
from pope.testing import outputs_and_gradients


def heads_inner_copy(t: torch.Tensor) -> torch.Tensor:
    """The same values as t (B, H, N, d), stored as a (B, N, H, d) buffer and shown transposed."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def test_buffers_follow_a_transposed_projection_and_nothing_else():
    x = torch.empty(2, 5, 3, 8)  # (B, N, H, d)
    assert heads_inner(x.transpose(1, 2))
    for other in (x, x.transpose(1, 2).contiguous(), x[..., ::2].transpose(1, 2), x[:, :, :1].transpose(1, 2)):
        assert not heads_inner(other)  # contiguous, strided channels, one head
    buffer = empty_in_layout_of(x.transpose(1, 2))
    assert buffer.shape == (2, 3, 5, 8) and buffer.stride() == x.transpose(1, 2).stride()
    assert empty_in_layout_of(x).is_contiguous() and empty_in_layout_of(torch.empty(7, 3, 8)).is_contiguous()


# d = 32: the dk/dv kernel reads its keys from the pre-pass's k'; d = 80: it transforms them in registers.
@pytest.mark.parametrize("head_dim", [32, 80])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_outputs_and_gradients_in_the_inputs_layout_same_bits(kernels, head_dim, heads):
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(11)
    q, k, v, delta, grad_out = kernel_inputs(2, *heads, 40, 40, head_dim, torch.bfloat16, True, generator)
    options = dict(
        base=10000.0, causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None
    )
    contiguous = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    q_t, k_t, v_t = (heads_inner_copy(t.to(torch.bfloat16)) for t in (q, k, v))
    leaves = [t.detach().requires_grad_() for t in (q_t, k_t, v_t)]
    delta_leaf = delta.detach().float().requires_grad_()
    out = triton_attention(*leaves, delta_leaf, **options)
    grads = torch.autograd.grad(out, [*leaves, delta_leaf], grad_out.to(torch.bfloat16))
    for name, got, like in zip(["out", "dq", "dk", "dv"], [out, *grads[:3]], [q_t, q_t, k_t, v_t]):
        assert got.stride() == like.stride(), f"{name} is not laid out as its input"
    for name, got, expected in zip(["out", "dq", "dk", "dv", "d_delta"], [out, *grads], contiguous):
        assert torch.equal(got, expected), name


def test_fake_implementations_give_the_kernels_strides(kernels):
    """opcheck on transposed inputs (its fake-tensor test compares strides), and a compiled call (torch.compile
    asserts every operator output's strides against the fake implementation's)."""
    if delegated(kernels):
        return
    from pope.ops import flash_attention_forward

    generator = torch.Generator().manual_seed(12)
    q, k, v, delta, _ = kernel_inputs(1, 4, 2, 17, 17, 16, torch.float32, True, generator)
    q, k, v = (heads_inner_copy(t.float()).requires_grad_() for t in (q, k, v))
    theta = kernels.frequencies(16, 10000.0, q.device)
    args = (q, k, v, delta.float().requires_grad_(), theta, True, 0.25, 0, "softplus")
    torch.library.opcheck(flash_attention_forward, args, test_utils=("test_faketensor", "test_autograd_registration"))

    options = dict(base=10000.0, causal=True, softmax_scale=0.25, q_offset=0, magnitude="softplus", rotary_dim=None)

    def attention(x):  # x (B, N, 3 H d): the projections, transposed as a model does
        q, k, v = x.view(1, 17, 3, 4, 16).unbind(2)
        return triton_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, **options)

    x = torch.randn(1, 17, 3 * 4 * 16, device=DEVICE, generator=generator.manual_seed(13)).requires_grad_()
    compiled = torch.compile(attention, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    out.transpose(1, 2).sum().backward()
    expected = attention(x.detach())
    assert out.stride() == expected.stride() and torch.equal(out.detach(), expected)
    assert torch.isfinite(x.grad).all()


# What the operators return, for each contract version (pope.ops.OPERATOR_CONTRACT). PyTorch's compile caches key a
# graph on operator names, not on fake implementations: a layout change under an unchanged name lets a cached graph
# assert the old strides (reproduced on CPU: a graph cached by the contiguous-output operators, then run by the
# heads-inner ones, fails "expected ... stride 32==2048 at dim=1").
OUTPUT_STRIDES = {
    "v3": {  # q (2, 4, 5, 8), k and v (2, 2, 5, 8): GQA; decode: one query over 9 keys; q', k' empty unless saved
        "forward, heads inner": [(160, 8, 32, 1), (20, 5, 1), (1,), (1,)],
        "forward, contiguous": [(160, 40, 8, 1), (20, 5, 1), (1,), (1,)],
        "forward, saving q' k'": [(160, 8, 32, 1), (20, 5, 1), (640, 160, 32, 1), (320, 160, 32, 1)],
        "forward, packed, saving q' k'": [(32, 8, 1), (10, 1), (128, 32, 128, 1), (64, 32, 64, 1)],
        "forward, decode": [(32, 8, 8, 1), (4, 1, 1), (1,), (1,)],
        "backward, heads inner": [(160, 8, 32, 1), (80, 8, 16, 1), (80, 8, 16, 1), (8, 1)],
        "backward, contiguous": [(160, 40, 8, 1), (80, 40, 8, 1), (80, 40, 8, 1), (8, 1)],
    }
}


def test_operator_names_carry_their_output_layouts():
    """The fake implementations' output strides (meta tensors, no kernel runs) are the ones recorded for the
    operators' contract version: a change of layout must come with a new version, hence new operator names."""
    from pope.ops import OPERATOR_CONTRACT

    operators = torch.ops.pope
    forward = getattr(operators, f"flash_attention_forward_{OPERATOR_CONTRACT}").default
    backward = getattr(operators, f"flash_attention_backward_{OPERATOR_CONTRACT}").default

    def projections(batch, rows, heads, head_dim):  # (B, N, H, d) buffers seen as (B, H, N, d)
        return torch.empty(batch, rows, heads, head_dim, device="meta").transpose(1, 2)

    theta = torch.empty(2, 8, dtype=torch.int32, device="meta")
    options = (theta, True, 0.3, 0, "softplus")
    delta = torch.empty(4, 8, device="meta")
    q, k, v = projections(2, 5, 4, 8), projections(2, 5, 2, 8), projections(2, 5, 2, 8)  # GQA
    q_c, k_c, v_c = (t.contiguous() for t in (q, k, v))
    decode_q = torch.empty(2, 4, 1, 8, device="meta")
    decode_kv = torch.empty(2, 2, 9, 8, device="meta")
    out, lse, *no_primes = forward(q, k, v, delta, *options)
    out_c, lse_c, *no_primes_c = forward(q_c, k_c, v_c, delta, *options)
    packed_q, packed_kv = torch.empty(10, 4, 8, device="meta"), torch.empty(10, 2, 8, device="meta")
    cu_seqlens = torch.empty(3, dtype=torch.int32, device="meta")
    packed = forward(packed_q, packed_kv, packed_kv, delta, *options, cu_seqlens, cu_seqlens, 5, 5, True)
    seen = {
        "forward, heads inner": [t.stride() for t in (out, lse, *no_primes)],
        "forward, contiguous": [t.stride() for t in (out_c, lse_c, *no_primes_c)],
        "forward, saving q' k'": [t.stride() for t in forward(q, k, v, delta, *options, None, None, 0, 0, True)],
        "forward, packed, saving q' k'": [t.stride() for t in packed],
        "forward, decode": [t.stride() for t in forward(decode_q, decode_kv, decode_kv, None, *options)],
        "backward, heads inner": [t.stride() for t in backward(out, q, k, v, delta, out, lse, *options)],
        "backward, contiguous": [t.stride() for t in backward(out_c, q_c, k_c, v_c, delta, out_c, lse_c, *options)],
    }
    assert seen == OUTPUT_STRIDES[OPERATOR_CONTRACT], (
        "the operators' output layouts changed: bump pope.ops.OPERATOR_CONTRACT (new operator names) and record the "
        "new layouts in OUTPUT_STRIDES"
    )
