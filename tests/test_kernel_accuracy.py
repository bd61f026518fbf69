"""The fused kernels' numbers: output and every gradient within 2x the PyTorch reference's error against float64
(every case of layout, GQA, dtype, magnitude, delta; 16-row query blocks; TF32 and fp32 dots; positions up to
a million), bitwise determinism, every registered magnitude, and masked non-finite keys reaching no output.

Shared set-up (Triton's interpreter on CPU, outputs poisoned with NaN) and the acceptance rule:
tests/kernel_fixtures.py.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from kernel_fixtures import (  # before pope's imports: it sets Triton's interpreter up
    DEVICE,
    ON_GPU,
    delegated,
    kernel_inputs,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
    triton_attention,
)

from pope.attention import reference_pope_attention
from pope.kernels.jit_math import _tf32_rounded  # noqa: F401  (called by a kernel defined in a test)
from pope.testing import (
    GRADIENT_NAMES,
    check_within_rule,
    outputs_and_gradients,
    tf32_reference,
)

CASES = [
    # (batch, Hq, Hkv, Nq, Nk, d, causal, dtype, magnitude, delta)
    pytest.param(1, 2, 2, 37, 37, 32, True, torch.bfloat16, "softplus", True, id="causal-37-d32-bf16"),
    pytest.param(1, 4, 2, 37, 97, 48, True, torch.bfloat16, "softplus", True, id="gqa-causal-Nq<Nk-d48-bf16"),
    pytest.param(2, 2, 1, 97, 97, 64, False, torch.float16, "softplus", True, id="mqa-noncausal-97-fp16"),
    pytest.param(1, 2, 2, 37, 97, 64, False, torch.float32, "relu", True, id="noncausal-Nq<Nk-fp32-relu"),
    pytest.param(1, 2, 1, 40, 40, 128, True, torch.bfloat16, "identity", False, id="causal-d128-identity-nodelta"),
    pytest.param(2, 4, 2, 97, 97, 48, True, torch.bfloat16, "softplus", True, id="gqa-causal-97-d48-bf16"),
    pytest.param(1, 2, 1, 70, 70, 64, True, torch.float16, "relu", True, id="mqa-causal-70-fp16-relu"),
    pytest.param(1, 2, 2, 65, 65, 128, True, torch.float32, "softplus", False, id="causal-65-d128-fp32-nodelta"),
    pytest.param(1, 8, 2, 1, 97, 64, True, torch.bfloat16, "softplus", True, id="decode-1-query-gqa"),
    pytest.param(2, 4, 4, 3, 97, 48, True, torch.float16, "softplus", True, id="decode-3-queries-d48"),
    pytest.param(1, 4, 1, 5, 70, 32, False, torch.float32, "relu", True, id="decode-noncausal-mqa-fp32-relu"),
    # a cache of magnitudes (the model's): k times a key-phase table in the input dtype, 16-bit products
    pytest.param(2, 8, 2, 1, 97, 64, True, torch.bfloat16, "identity", True, id="decode-gqa-identity-bf16"),
    pytest.param(1, 8, 2, 2, 70, 128, True, torch.float16, "identity", False, id="decode-gqa-identity-d128-fp16"),
    # one row per key head: the CUDA-core lanes decode kernel
    pytest.param(2, 3, 3, 1, 97, 48, True, torch.bfloat16, "softplus", True, id="decode-lanes-mha-d48-bf16"),
    pytest.param(1, 2, 2, 1, 70, 64, False, torch.float16, "identity", False, id="decode-lanes-noncausal-fp16"),
    pytest.param(1, 2, 2, 1, 45, 128, True, torch.float32, "relu", True, id="decode-lanes-d128-fp32-relu"),
]


@pytest.mark.parametrize("batch,n_q_heads,n_kv_heads,seq_q,seq_k,head_dim,causal,dtype,magnitude,with_delta", CASES)
def test_output_and_gradients_within_twice_reference_error(
    kernels, batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal, dtype, magnitude, with_delta
):
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(seq_q * 1000 + seq_k + head_dim)
    q, k, v, delta, grad_out = kernel_inputs(
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, dtype, with_delta, generator
    )
    options = dict(
        base=10000.0,
        causal=causal,
        softmax_scale=head_dim**-0.5,
        q_offset=seq_k - seq_q,
        magnitude=magnitude,
        rotary_dim=None,
    )
    exact = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    reference = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, dtype, options)
    fused = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, dtype, options)
    for name, ours, theirs, truth in zip(GRADIENT_NAMES, fused, reference, exact):
        assert ours.dtype == theirs.dtype and ours.shape == truth.shape, name
        assert torch.isfinite(ours).all(), f"{name}: non-finite values (an element left unwritten?)"
        # fp32 references land near 1e-7: the rule allows a rounding-sized floor so that 2x of almost nothing passes.
        errors = check_within_rule(ours, theirs, truth, dtype)
        assert errors["ok"], (
            f"{name}: kernel error {errors['kernel']:.3e} > 2 x reference error {errors['reference']:.3e}"
        )


def test_explicit_query_offset_matches_reference(kernels):
    """Chunked prefill: 20 queries at positions 30..49 of a 64-key cache (keys past them masked)."""
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(1)
    q, k, v, delta, grad_out = kernel_inputs(1, 2, 1, 20, 64, 32, torch.float32, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=0.3, q_offset=30, magnitude="softplus", rotary_dim=None)
    exact = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    fused = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.float32, options)
    for name, ours, truth in zip(["out", "dq", "dk", "dv", "d_delta"], fused, exact):
        assert torch.allclose(ours.double(), truth, rtol=1e-4, atol=1e-5), name
    # keys 50..63 are after every query: no gradient may reach them
    assert fused[2][:, :, 50:].abs().max() == 0 and fused[3][:, :, 50:].abs().max() == 0


def test_backward_is_bitwise_deterministic(kernels):
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(2)
    q, k, v, delta, grad_out = kernel_inputs(2, 4, 2, 97, 97, 48, torch.bfloat16, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=48**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None)
    first = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    second = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    for name, a, b in zip(["out", "dq", "dk", "dv", "d_delta"], first, second):
        assert torch.equal(a, b), f"{name} differs between two identical runs"


@pytest.mark.parametrize("head_dim,packed", [(64, False), (128, False), (64, True)])
def test_backward_with_16_row_query_blocks_within_twice_reference_error(kernels, head_dim, packed):
    """The dk/dv kernel at BLOCK_M = 16 (fp32's d = 128 tiles on a GPU, or a POPE_KERNEL_CONFIGS override; the
    interpreter's own tiles are 32 rows): its lse and D come in 32-row TMA boxes and it keeps the first 16
    (bwd._leading). Gradients by the 2x rule, batched and packed (empty and length-1 sequences)."""
    if delegated(kernels):
        return
    from pope.attention import pope_attention_varlen
    from pope.kernels.host import Packed
    from pope.testing import packed_inputs

    generator = torch.Generator().manual_seed(head_dim + packed)
    options = dict(causal=True, softmax_scale=head_dim**-0.5, magnitude="softplus")
    if packed:
        q, k, v, delta, grad_out, cu_q, cu_k = (
            t.to(DEVICE) for t in packed_inputs([0, 1, 37, 3], [5, 1, 40, 33], 4, 2, head_dim, generator=generator)
        )
        packing = (cu_q, cu_k, 37, 40)
        launch = dict(q_offset=0, packed=Packed(*packing))

        def reference(q, k, v, delta):
            return pope_attention_varlen(q, k, v, delta, *packing, causal=True, backend="reference")
    else:
        q, k, v, delta, grad_out = kernel_inputs(1, 2, 1, 50, 70, head_dim, torch.bfloat16, True, generator)
        launch = dict(q_offset=20)

        def reference(q, k, v, delta):
            return reference_pope_attention(q, k, v, delta, base=10000.0, q_offset=20, rotary_dim=None, **options)

    exact = outputs_and_gradients(reference, q, k, v, delta, grad_out, torch.float64, {})
    theirs = outputs_and_gradients(reference, q, k, v, delta, grad_out, torch.bfloat16, {})
    q, k, v, grad_out = (t.to(torch.bfloat16) for t in (q, k, v, grad_out))
    theta = kernels.frequencies(head_dim, 10000.0, q.device)
    out, lse = kernels.forward(q, k, v, delta.float(), theta, **options, **launch)
    grads = kernels.backward(
        grad_out,
        q,
        k,
        v,
        delta.float(),
        out,
        lse,
        theta,
        **options,
        **launch,
        dq_config=(16, 32, 4, 1),
        dkdv_config=(16, 32, 4, 1),
    )
    for name, ours, their, truth in zip(GRADIENT_NAMES[1:], grads, theirs[1:], exact[1:]):
        errors = check_within_rule(ours.cpu(), their.cpu(), truth.cpu(), torch.bfloat16)
        assert errors["ok"], f"{name}: kernel error {errors['kernel']:.3e} > 2 x reference {errors['reference']:.3e}"


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp32_tf32x3_tiles_within_twice_reference_error_on_packed_gqa_batches(kernels, head_dim):
    """fp32 inputs at "highest" take a tile per kernel on a GPU (configs.TF32X3_TILES: 16-row query or key
    blocks, a 128-row dq block at d = 128), which the interpreter's own tiles never exercise: those tiles, passed
    explicitly, on a packed GQA batch (empty, length-1 and Nq < Nk sequences). Output and gradients by the 2x rule
    against float64, beside the fp32 reference (the interpreter multiplies tf32x3 operands exactly: this checks the
    tiles' masking, packing and head mapping, not the dots' precision; a GPU checks that)."""
    if delegated(kernels):
        return
    from pope.attention import pope_attention_varlen
    from pope.kernels.configs import MEASURED_ARCHITECTURE, TF32X3_TILES
    from pope.kernels.host import Packed
    from pope.testing import packed_inputs

    tiles = {kind: tuple(table[(MEASURED_ARCHITECTURE, head_dim)]) for kind, table in TF32X3_TILES.items()}
    generator = torch.Generator().manual_seed(head_dim)
    q, k, v, delta, grad_out, cu_q, cu_k = (
        t.to(DEVICE) for t in packed_inputs([0, 1, 37, 20], [5, 1, 40, 33], 4, 2, head_dim, generator=generator)
    )
    packing = (cu_q, cu_k, 37, 40)
    options = dict(causal=True, softmax_scale=head_dim**-0.5, magnitude="softplus")

    def reference(q, k, v, delta):
        return pope_attention_varlen(q, k, v, delta, *packing, causal=True, backend="reference")

    exact = outputs_and_gradients(reference, q, k, v, delta, grad_out, torch.float64, {})
    theirs = outputs_and_gradients(reference, q, k, v, delta, grad_out, torch.float32, {})
    q, k, v, grad_out, delta = (t.float() for t in (q, k, v, grad_out, delta))
    theta = kernels.frequencies(head_dim, 10000.0, q.device)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        assert kernels.host.precision(torch.float32, q.device) == "tf32x3"
        out, lse = kernels.forward(
            q, k, v, delta, theta, **options, q_offset=0, packed=Packed(*packing), config=tiles["fwd"]
        )
        grads = kernels.backward(
            grad_out,
            q,
            k,
            v,
            delta,
            out,
            lse,
            theta,
            **options,
            q_offset=0,
            packed=Packed(*packing),
            dq_config=tiles["dq"],
            dkdv_config=tiles["dkdv"],
        )
    finally:
        torch.set_float32_matmul_precision(previous)
    for name, ours, their, truth in zip(GRADIENT_NAMES, (out, *grads), theirs, exact):
        errors = check_within_rule(ours.cpu(), their.cpu(), truth.cpu(), torch.float32)
        assert errors["ok"], f"{name}: kernel error {errors['kernel']:.3e} > 2 x reference {errors['reference']:.3e}"


def test_kernel_angles_at_long_positions_within_a_few_times_the_small_position_error(kernels):
    """cos and sin of the angles the kernels form (the pre-pass over ones, magnitude identity: the decode kernel's
    key-phase table; the lanes decode kernel's per-tile base angle is the same helper) at positions 2^20, 10^7 and
    2^30 - 64: within 3x of their error at positions 0..63 against float64 (it was 0.8 at 10^7 with the plain fp32
    product), and their angles are the reference's (pope.frequencies.angles in float32) bit for bit."""
    if delegated(kernels):
        return
    from pope.frequencies import angles, pope_frequencies

    d, n = 64, 64
    theta64 = pope_frequencies(d, 10000.0, dtype=torch.float64)
    words = kernels.frequencies(d, 10000.0, DEVICE)
    ones = torch.ones(1, 1, n, d, device=DEVICE)

    def error(start):
        rows = kernels.transform(ones, words, None, position_offset=start, magnitude="identity")[0, 0].double().cpu()
        exact = angles(torch.arange(start, start + n), theta64)
        reference = angles(torch.arange(start, start + n), theta64, dtype=torch.float32).double()
        # the kernel's sincos against torch's cos/sin of the same fp32 angles: about an ulp, no more
        assert (rows - torch.cat([reference.cos(), reference.sin()], dim=-1)).abs().max() < 3e-7
        return (rows - torch.cat([exact.cos(), exact.sin()], dim=-1)).abs().max().item()

    small = error(0)
    for start in (2**20, 10**7, 2**30 - n):
        assert error(start) <= 3 * small, (start, error(start), small)


LONG_CASES = [
    # (Hq, Hkv, Nq, Nk, dtype): block kernels with gradients, then the tensor-core and lanes decode kernels
    pytest.param(2, 1, 24, 40, torch.bfloat16, id="block-bf16"),
    pytest.param(2, 2, 24, 40, torch.float16, id="block-fp16"),
    pytest.param(2, 1, 24, 40, torch.float32, id="block-fp32"),
    pytest.param(8, 2, 2, 40, torch.bfloat16, id="decode-tensor-cores-bf16"),
    pytest.param(2, 2, 1, 40, torch.float16, id="decode-lanes-fp16"),
]


@pytest.mark.parametrize("n_q_heads,n_kv_heads,seq_q,seq_k,dtype", LONG_CASES)
def test_two_x_rule_at_query_offset_a_million(kernels, n_q_heads, n_kv_heads, seq_q, seq_k, dtype):
    """Queries at positions 10^6.. against keys 0..Nk-1: output (and, through the block kernels, every gradient)
    within 2x the reference's error in the same dtype against the float64 formula."""
    if delegated(kernels):
        return
    from pope.testing import formula_attention

    generator = torch.Generator().manual_seed(21)
    q, k, v, delta, grad_out = kernel_inputs(1, n_q_heads, n_kv_heads, seq_q, seq_k, 32, dtype, True, generator)
    options = dict(
        base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=10**6, magnitude="softplus", rotary_dim=None
    )
    if seq_q > 16:  # the block kernels: out and every gradient
        exact = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
        ours = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, dtype, options)
        theirs = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, dtype, options)
    else:  # decode: forward only (training calls take the block kernels)
        exact = [formula_attention(q, k, v, delta, q_offset=10**6, softmax_scale=32**-0.5)]
        with torch.no_grad():
            args = (q.to(dtype), k.to(dtype), v.to(dtype), delta.float())
            ours, theirs = [triton_attention(*args, **options)], [reference_pope_attention(*args, **options)]
    for name, a, b, c in zip(GRADIENT_NAMES, ours, theirs, exact):
        result = check_within_rule(a.cpu(), b.cpu(), c.cpu(), dtype)
        assert result["ok"], (name, result)


def test_tf32_operands_are_rounded_to_nearest_ties_away(kernels):
    """jit_math._tf32_rounded against TF32 rounding computed in float64 (ties away from zero), on halfway cases,
    both signs, subnormals, the fp32 maximum (to inf) and non-finite values (kept)."""
    if delegated(kernels):
        return
    import triton
    import triton.language as tl

    @triton.jit
    def round_kernel(X, Y, N: tl.constexpr):
        offsets = tl.arange(0, N)
        tl.store(Y + offsets, _tf32_rounded(tl.load(X + offsets)))

    step = 2.0**-10  # a TF32 mantissa step at 1
    values = [
        1 + step / 2,
        1 + step / 2 - 2**-23,
        1 + 1.5 * step,
        3.0e-39,
        -(1 + step / 2),
        2.0**-130 * 3,
        torch.finfo(torch.float32).max,
        1.0,
        -0.0,
        65504.5,
        1 / 3,
        -math.pi,
    ]
    x = torch.tensor(values + [0.0] * (32 - len(values)), dtype=torch.float32)
    x = torch.cat(
        [
            x,
            torch.randn(96, generator=torch.Generator().manual_seed(5))
            * 10.0 ** torch.randint(-30, 30, (96,), generator=torch.Generator().manual_seed(6)).float(),
        ]
    )
    x = torch.cat([x, torch.tensor([float("inf"), float("-inf"), float("nan")] + [0.0] * 125)])
    y = torch.empty_like(x)
    round_kernel[(1,)](x.to(DEVICE), y_device := y.to(DEVICE), N=x.numel())
    y = y_device.cpu()

    def expected(value):
        if not math.isfinite(value) or value == 0:
            return value
        exponent = math.frexp(abs(value))[1] - 1
        unit = 2.0 ** (max(exponent, -126) - 10)  # one TF32 step at this binade (subnormals: the fixed step)
        rounded = math.copysign(math.floor(abs(value) / unit + 0.5) * unit, value)
        return rounded if abs(rounded) <= torch.finfo(torch.float32).max else math.copysign(math.inf, value)

    for value, got in zip(x.tolist(), y.tolist()):
        want = expected(value)
        assert (math.isnan(want) and math.isnan(got)) or got == want, (value, got, want)
    assert y[0] == 1 + step and y[1] == 1.0 and y[4] == -(1 + step) and y[6] == math.inf


@contextlib.contextmanager
def _matmul_precision(setting):
    """torch's float32 matmul precision (what the kernels' fp32 dots follow) set to setting, restored after."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize(
    "shape",
    [(1, 2, 2, 97, 97, 64, True), (1, 4, 1, 5, 70, 32, False)],
    ids=["block-causal-97-d64", "decode-noncausal-mqa-d32"],
)
def test_tf32_kernels_within_twice_pytorch_tf32(kernels, shape):
    """fp32 inputs under set_float32_matmul_precision("high"): the kernels' TF32 dots against float64, within 2x
    of the error of attention in TF32 arithmetic (pope.testing.tf32_reference). The tensor cores truncate an
    fp32 operand (the interpreter does too, pope.kernels.interpreter), so without the kernels' rounding the same
    comparison fails, by 2-5x on these shapes."""
    if delegated(kernels):
        return
    batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal = shape
    generator = torch.Generator().manual_seed(7)
    q, k, v, delta, grad_out = kernel_inputs(
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, torch.float32, True, generator
    )
    options = dict(
        base=10000.0,
        causal=causal,
        softmax_scale=head_dim**-0.5,
        q_offset=seq_k - seq_q,
        magnitude="softplus",
        rotary_dim=None,
    )
    exact = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    full_fp32 = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float32, options)
    with _matmul_precision("high"):
        fused = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.float32, options)
        with tf32_reference():
            reference = outputs_and_gradients(
                reference_pope_attention, q, k, v, delta, grad_out, torch.float32, options
            )
    for name, ours, theirs, truth, fp32 in zip(GRADIENT_NAMES, fused, reference, exact, full_fp32):
        errors = check_within_rule(ours, theirs, truth, torch.float32)
        assert errors["ok"], (name, errors)
        # TF32 really ran (kernels and reference): errors far above exact fp32's
        assert min(errors["kernel"], errors["reference"]) > 30 * (fp32.double() - truth).abs().max().item(), name


def test_tf32_one_key_row_gets_an_exact_zero_gradient(kernels):
    """A causal row that sees one key has P = 1 and dS = P (dP - D) = 0 exactly, so dq = 0 in float64. Under TF32 the
    kernels' D takes dO rounded to TF32 as the dots' dP do, so the two cancel to fp32 rounding; from the unrounded dO
    the row's dq would carry dO's TF32 rounding error (~1e-3 here)."""
    if delegated(kernels):
        return
    q, k, v, delta, grad_out = kernel_inputs(
        1, 2, 2, 24, 24, 32, torch.float32, True, torch.Generator().manual_seed(13)
    )
    v, grad_out = 4 * v, 4 * grad_out  # a larger dO . v: a larger rounding error for the test to see
    options = dict(base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None)
    exact = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    with _matmul_precision("high"):
        dq = outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.float32, options)[1]
    assert exact[1][:, :, 0].abs().max().item() < 1e-12  # float64: row 0's dq is zero
    assert (dq[:, :, 1:].double() - exact[1][:, :, 1:]).abs().max().item() > 1e-4  # TF32 ran
    assert dq[:, :, 0].abs().max().item() < 2e-5, dq[:, :, 0].abs().max().item()


def test_kernels_compute_each_registered_magnitude(kernels):
    """The pre-pass with each pope.magnitudes entry's kernel code computes that entry's torch function."""
    if delegated(kernels):
        return
    from pope.frequencies import angles, pope_frequencies
    from pope.magnitudes import MAGNITUDES

    x = torch.randn(1, 2, 40, 32, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    phase = angles(torch.arange(40), pope_frequencies(32)).to(DEVICE)
    for name, entry in MAGNITUDES.items():
        ours = kernels.transform(x, kernels.frequencies(32, 10000.0, DEVICE), None, position_offset=0, magnitude=name)
        f = entry.function(x)
        expected = torch.cat([f * phase.cos(), f * phase.sin()], dim=-1)
        assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-5), name


def _forward_only(q, k, v, delta, **options):
    with torch.no_grad():
        return triton_attention(
            q,
            k,
            v,
            delta,
            base=10000.0,
            softmax_scale=q.shape[-1] ** -0.5,
            magnitude="softplus",
            rotary_dim=None,
            **options,
        )


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf in the rows that see the key
def test_masked_nonfinite_keys_do_not_reach_kernel_outputs(kernels, value):
    """A NaN / inf in a key masked from a query leaves that query's output bit for bit as it was: the block forward
    (masked scores by tl.where), the tensor-core decode kernel (the same) and the lanes decode kernel (keys past its
    row's position are never loaded, values included)."""
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(9)
    cases = [  # (Hq, Hkv, Nq, Nk, q_offset, position, values too, rows that cannot see it)
        (2, 2, 40, 40, 0, 25, False, 25),  # block kernels
        (8, 2, 2, 70, 68, 69, False, 1),  # tensor-core decode: query 0 (position 68) cannot see key 69
        (2, 2, 1, 70, 50, 60, True, 1),  # lanes decode: key 60 (and its value) past the query's position 50
    ]
    for n_q_heads, n_kv_heads, seq_q, seq_k, q_offset, position, values_too, unseen in cases:
        q, k, v, delta, _ = kernel_inputs(1, n_q_heads, n_kv_heads, seq_q, seq_k, 32, torch.bfloat16, True, generator)
        q, k, v, delta = q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), delta.float()
        clean = _forward_only(q, k, v, delta, causal=True, q_offset=q_offset)
        k[0, 1, position, 3] = value
        if values_too:
            v[0, 1, position, 5] = value
        dirty = _forward_only(q, k, v, delta, causal=True, q_offset=q_offset)
        assert torch.equal(dirty[:, :, :unseen], clean[:, :, :unseen]), (n_q_heads, seq_q, seq_k)
        assert not torch.isfinite(dirty[:, :, unseen:]).all() or seq_q == unseen  # the rows that see it do


def test_garbage_past_the_cache_reaches_nothing(kernels, monkeypatch):
    """pope_attention drops the keys past every query's position before the kernels run: NaN in k and v there (a
    preallocated cache's unused rows) changes no output and no gradient, and those keys get zero gradients."""
    if delegated(kernels):
        return
    import pope.attention.api
    from pope.ops import triton_unsupported_reason

    if not ON_GPU:  # pope.attention sends CPU tensors to the reference; let the interpreted kernels take them
        monkeypatch.setattr(
            pope.attention.api,
            "_triton_unsupported_reason",
            lambda q, k, v, **options: triton_unsupported_reason(q, k, v, **options),
        )
    generator = torch.Generator().manual_seed(10)
    q, k, v, delta, grad_out = kernel_inputs(1, 2, 1, 20, 64, 32, torch.bfloat16, True, generator)
    options = dict(causal=True, q_offset=30, backend="triton")
    clean = outputs_and_gradients(pope.attention.pope_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    k[:, :, 50:], v[:, :, 50:] = float("nan"), float("inf")  # queries sit at 30..49
    dirty = outputs_and_gradients(pope.attention.pope_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    for name, a, b in zip(GRADIENT_NAMES, clean, dirty):
        assert torch.equal(a, b), name
    assert dirty[2][:, :, 50:].abs().max() == 0 and dirty[3][:, :, 50:].abs().max() == 0
