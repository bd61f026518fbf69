"""The fused PoPE Triton kernels: on CPU through Triton's interpreter (TRITON_INTERPRET=1), on CUDA
compiled when a GPU is present.

Acceptance rule (flash-attention's): against a float64 computation, the kernel's output and every
gradient may be off by at most 2x what the pure-PyTorch reference makes in the same dtype. Every buffer a
kernel writes starts NaN-filled, so an element the kernel forgets to write fails the check.

Interpreter mode is fixed when a @triton.jit function is created: Triton's own library functions
(tl.zeros, ...) when triton is first imported, ours when pope.kernels' modules are. The whole suite runs
in one pytest process, so tests/conftest.py (and this module, run on its own) sets TRITON_INTERPRET=1 on
CPU-only machines before anything imports triton. If something imported triton earlier in compiled mode,
the interpreter cannot be switched on in this process any more: the module's tests then run in one
subprocess started with TRITON_INTERPRET=1, and each test here asserts its own result there.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from pope.testing import kernel_test_setup  # before anything imports Triton

ON_GPU, DEVICE, INTERPRETER_IN_PROCESS = kernel_test_setup()

from pope.attention import reference_pope_attention  # noqa: E402
from pope.kernels.jit_math import _tf32_rounded  # noqa: E402,F401  (called by a kernel defined in a test)
from pope.settings import SETTINGS, override  # noqa: E402
from pope.testing import (  # noqa: E402
    GRADIENT_NAMES,
    RecordingKernel,
    assert_passed_in_subprocess,
    attention_inputs,  # noqa: E402
    check_within_rule,
    interpreter_subprocess_results,
    outputs_and_gradients,
    tf32_reference,
)


@pytest.fixture(scope="module")
def subprocess_results():
    """Fallback: this module's results in a fresh TRITON_INTERPRET=1 process (pope.testing)."""
    return None if INTERPRETER_IN_PROCESS else interpreter_subprocess_results(__file__, timeout=900)


@pytest.fixture(autouse=True)
def kernels(request, subprocess_results):
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


def _delegated(kernels) -> bool:
    """True when this test's checks already ran (and passed) in the interpreter subprocess."""
    return kernels is None


def _inputs(batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, dtype, with_delta, generator):
    inputs = attention_inputs(
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, with_delta=with_delta, generator=generator
    )
    return tuple(t.to(DEVICE) if t is not None else None for t in inputs)


_run = outputs_and_gradients


def _triton(q, k, v, delta, **options):
    from pope.ops import triton_pope_attention

    return triton_pope_attention(q, k, v, delta, **options)


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
    if _delegated(kernels):
        return
    generator = torch.Generator().manual_seed(seq_q * 1000 + seq_k + head_dim)
    q, k, v, delta, grad_out = _inputs(
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
    exact = _run(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    reference = _run(reference_pope_attention, q, k, v, delta, grad_out, dtype, options)
    fused = _run(_triton, q, k, v, delta, grad_out, dtype, options)
    for name, ours, theirs, truth in zip(GRADIENT_NAMES, fused, reference, exact):
        assert ours.dtype == theirs.dtype and ours.shape == truth.shape, name
        assert torch.isfinite(ours).all(), f"{name}: non-finite values (an element left unwritten?)"
        # fp32 references land near 1e-7: the rule allows a rounding-sized floor so that 2x of almost nothing passes.
        errors = check_within_rule(ours, theirs, truth, dtype)
        assert errors["ok"], (
            f"{name}: kernel error {errors['kernel']:.3e} > 2 x reference error {errors['reference']:.3e}"
        )


def test_layouts_tma_cannot_read_directly(kernels):
    """The kernels read some tiles by TMA, which needs 16-byte-aligned bases and strides: a head dim of 36
    (72-byte rows), q/k/v as views one element into wider rows (unaligned base and strides), and the stride-0
    output gradient that `out.sum()` gives must still come out right (the launchers copy such tensors)."""
    if _delegated(kernels):
        return
    generator = torch.Generator().manual_seed(5)
    batch, heads, seq, head_dim, dtype = 1, 2, 45, 36, torch.bfloat16
    q, k, v, delta, _ = _inputs(batch, heads, heads, seq, seq, head_dim, dtype, True, generator)
    options = dict(
        base=10000.0, causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None
    )

    def grads(fn, dtype, unaligned):
        leaves, inputs = [], []
        for t in (q, k, v):
            if unaligned:  # a (B, H, N, 36) view starting one element into rows of 39
                wide = torch.zeros(*t.shape[:-1], head_dim + 3, dtype=dtype, device=t.device)
                wide[..., 1 : head_dim + 1] = t.to(dtype)
                wide.requires_grad_()
                leaves.append(wide)
                inputs.append(wide[..., 1 : head_dim + 1])
            else:
                leaves.append(t.detach().to(dtype).requires_grad_())
                inputs.append(leaves[-1])
        delta_leaf = delta.detach().to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
        out = fn(*inputs, delta_leaf, **options)
        result = torch.autograd.grad(out.float().sum(), inputs + [delta_leaf])  # dO: ones, expanded (stride 0)
        return [out.detach()] + [g.detach() for g in result]

    if not ON_GPU:
        unaligned_view = torch.zeros(1, 2, 3, head_dim + 3, dtype=dtype)[..., 1 : head_dim + 1]
        assert unaligned_view.data_ptr() % 16 != 0  # the case this test is about
    exact = grads(reference_pope_attention, torch.float64, False)
    reference = grads(reference_pope_attention, dtype, False)
    fused = grads(_triton, dtype, True)
    for name, ours, theirs, truth in zip(GRADIENT_NAMES, fused, reference, exact):
        assert torch.isfinite(ours).all(), name
        errors = check_within_rule(ours, theirs, truth, dtype)  # bf16: no floor, exactly 2x
        assert errors["ok"], f"{name}: {errors['kernel']:.3e} > 2 x {errors['reference']:.3e}"


def test_explicit_query_offset_matches_reference(kernels):
    """Chunked prefill: 20 queries at positions 30..49 of a 64-key cache (keys past them masked)."""
    if _delegated(kernels):
        return
    generator = torch.Generator().manual_seed(1)
    q, k, v, delta, grad_out = _inputs(1, 2, 1, 20, 64, 32, torch.float32, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=0.3, q_offset=30, magnitude="softplus", rotary_dim=None)
    exact = _run(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    fused = _run(_triton, q, k, v, delta, grad_out, torch.float32, options)
    for name, ours, truth in zip(["out", "dq", "dk", "dv", "d_delta"], fused, exact):
        assert torch.allclose(ours.double(), truth, rtol=1e-4, atol=1e-5), name
    # keys 50..63 are after every query: no gradient may reach them
    assert fused[2][:, :, 50:].abs().max() == 0 and fused[3][:, :, 50:].abs().max() == 0


def test_backward_is_bitwise_deterministic(kernels):
    if _delegated(kernels):
        return
    generator = torch.Generator().manual_seed(2)
    q, k, v, delta, grad_out = _inputs(2, 4, 2, 97, 97, 48, torch.bfloat16, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=48**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None)
    first = _run(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
    second = _run(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
    for name, a, b in zip(["out", "dq", "dk", "dv", "d_delta"], first, second):
        assert torch.equal(a, b), f"{name} differs between two identical runs"


@pytest.mark.parametrize("head_dim,seq", [(48, 37), (64, 40)])
def test_descriptors_pass_tritons_checks(kernels, monkeypatch, head_dim, seq):
    """The launchers build TMA descriptors without TensorDescriptor's own checks (host time): every descriptor
    they make must still pass those checks (16-byte alignment, strides, block shape)."""
    if _delegated(kernels):
        return
    from triton.tools.tensor_descriptor import TensorDescriptor

    made = []
    from pope.kernels import direct_launch

    original = direct_launch.descriptor

    def checked_descriptor(t, block_shape):
        descriptor = original(t, block_shape)
        TensorDescriptor.__post_init__(descriptor)  # raises AssertionError on a descriptor Triton would refuse
        made.append(descriptor)
        return descriptor

    monkeypatch.setattr(direct_launch, "descriptor", checked_descriptor)
    generator = torch.Generator().manual_seed(4)
    q, k, v, delta, grad_out = _inputs(2, 4, 2, seq, seq, head_dim, torch.bfloat16, True, generator)
    options = dict(
        base=10000.0, causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None
    )
    _run(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
    # d <= 64: the dk/dv kernel also reads its key block (k') and v by TMA; with the dq kernel's tiles (as here,
    # and at d=64 on the GPU) it reuses the dq kernel's q', k' and v descriptors and makes only dO's, lse's and D's.
    assert len(made) == 9, f"expected 3 forward + 3 dq + 3 dk/dv descriptors, got {len(made)}"
    assert direct_launch.UNCHECKED_DESCRIPTORS, "this Triton's TensorDescriptor changed: descriptors take the slow path"


def test_tma_box_not_a_multiple_of_128_bytes_is_a_clear_error(kernels):
    """direct_launch.descriptor refuses a box whose pipeline stages would sit at misaligned shared-memory addresses
    (a 16-row fp32 statistics box: 64 bytes), and the dk/dv kernel's lse and D descriptors of 16-row query blocks
    (fp32 at d = 128, or a tile override) are 128-byte boxes of which the kernel keeps the first 16 entries."""
    if _delegated(kernels):
        return
    from pope.kernels import bwd, direct_launch

    rows = torch.zeros(6, 1024)
    with pytest.raises(ValueError, match=r"TMA box \[1, 16\] of torch.float32 is 64 bytes, not a multiple of 128"):
        direct_launch.descriptor(rows, [1, 16])
    for block_m, box in ((16, [1, 32]), (32, [1, 32]), (64, [1, 64])):
        assert [d.block_shape for d in bwd.statistics_descriptors(rows, rows, block_m)] == [box, box], block_m


# Records the backward's launches on CPU tensors (Triton in compiled mode, nothing run) with 16-row dk/dv query
# blocks, compiles the dk/dv kernel for sm_90a as Triton would specialise it on those arguments, and prints, per
# case, every TMA copy's shared-memory buffer (TTGIR) and every constant shared-memory offset a
# cp.async.bulk.tensor writes to (PTX).
_TMA_ALIGNMENT_REPORT = r"""
import itertools, json, sys, torch
import re
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile, make_backend
from triton.runtime.jit import create_function_from_signature
import pope.kernels as kernels
from pope.kernels import direct_launch, host

launches = []
direct_launch.launch = lambda kernel, grid, site, args, **meta: launches.append((kernel, args, meta))
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8}
for case, tile in json.loads(sys.argv[1]):
    packed = None
    if isinstance(case[0], list):  # a packed batch: lengths_q, lengths_k, Hq, Hkv, d
        lengths_q, lengths_k, n_q_heads, n_kv_heads, head_dim = case
        q = torch.randn(sum(lengths_q), n_q_heads, head_dim, dtype=torch.bfloat16)
        k, v = (torch.randn(sum(lengths_k), n_kv_heads, head_dim, dtype=torch.bfloat16) for _ in range(2))
        lse = torch.randn(n_q_heads, sum(lengths_q))
        cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32) for n in (lengths_q, lengths_k))
        packed = host.Packed(cu_q, cu_k, max(lengths_q), max(lengths_k))
    else:
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim = case
        q = torch.randn(batch, n_q_heads, seq_q, head_dim, dtype=torch.bfloat16)
        k, v = (torch.randn(batch, n_kv_heads, seq_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
        lse = torch.randn(batch, n_q_heads, seq_q)
    launches.clear()
    kernels.backward(torch.randn_like(q), q, k, v, torch.randn(n_q_heads, head_dim), torch.randn_like(q), lse,
                     kernels.frequencies(head_dim, 10000.0, "cpu"), causal=True, softmax_scale=0.125, q_offset=0,
                     magnitude="softplus", packed=packed, dkdv_config=tuple(tile))
    kernel, args, meta = next(launch for launch in launches if launch[0].__name__ == "_pope_bwd_dkdv_kernel")
    bound, specialization, options = create_function_from_signature(kernel.signature, kernel.params, backend)(
        *args, **meta)
    options, signature, constexprs, attrs = kernel._pack_args(backend, dict(meta), bound, specialization, options)
    compiled = triton_compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    indexed = dict(re.findall(r"(%[\w.]+) = ttg\.memdesc_index (%[\w.]+)\[", ttgir))
    buffers = []
    for dest, shape in re.findall(r"async_tma_copy_global_to_local %\w+\[[^\]]*\] (%[\w.]+),.*?-> "
                                  r"!ttg\.memdesc<([0-9x]+[a-z]+\d+)", ttgir):
        *dims, dtype = shape.split("x")  # e.g. 16x128xbf16
        size = BYTES[dtype]
        for n in dims:
            size *= int(n)
        buffers.append((shape, size, dest in indexed))
    destinations = set(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared::cluster\.global\S* \[(%r\d+)\]", ptx))
    offsets = [int(offset) for register, offset in re.findall(r"add\.s32\s+(%r\d+), %r\d+, (\d+);", ptx)
               if register in destinations]
    print(json.dumps(dict(case=case, tiles=[
        meta["BLOCK_M"], meta["BLOCK_N"], meta["num_warps"], meta["num_stages"]], buffers=buffers,
        offsets=offsets)))
"""


def test_dkdv_kernel_tma_destinations_are_128_byte_aligned_on_hopper_with_16_row_query_blocks():
    """The dk/dv kernel with pipelined 16-row query blocks (a tile override), compiled for sm_90a as Triton
    specialises it on the launcher's real arguments (d = 64 and 128, batched and packed): every buffer a pipelined
    TMA copy fills is a multiple of 128 bytes and every constant shared-memory destination of a cp.async.bulk.tensor
    is 128-byte aligned, as the hardware requires. With 16-row fp32 lse and D boxes (64 bytes) the second stage sat
    64 bytes off: 'misaligned address' on an H200 (docs/kernels.md, "The atomic backward that lost")."""
    import json

    root = os.path.join(os.path.dirname(__file__), os.pardir)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(root, "src")
    cases = [
        [[8, 12, 12, 1024, 1024, 64], [16, 64, 4, 3]],
        [[1, 2, 2, 4096, 4096, 128], [16, 64, 8, 3]],
        [[[0, 1, 7, 300, 1000, 2047, 130], [5, 1, 900, 300, 1000, 2047, 130], 8, 2, 64], [16, 64, 4, 3]],
    ]
    run = subprocess.run(
        [sys.executable, "-c", _TMA_ALIGNMENT_REPORT, json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads(line) for line in run.stdout.splitlines()]
    assert [[r["case"], r["tiles"]] for r in reports] == cases
    for report in reports:
        stage_buffers = [b for b in report["buffers"] if b[2]]
        assert any(shape.endswith("f32") for shape, _, _ in stage_buffers), report  # lse and D are among them
        misaligned = [b for b in stage_buffers if b[1] % 128]
        assert not misaligned, f"{report['case']}: TMA stage buffers not 128-byte multiples: {misaligned}"
        assert report["offsets"] and all(offset % 128 == 0 for offset in report["offsets"]), report


@pytest.mark.parametrize("head_dim,packed", [(64, False), (128, False), (64, True)])
def test_backward_with_16_row_query_blocks_within_twice_reference_error(kernels, head_dim, packed):
    """The dk/dv kernel at BLOCK_M = 16 (fp32's d = 128 tiles on a GPU, or a POPE_KERNEL_CONFIGS override; the
    interpreter's own tiles are 32 rows): its lse and D come in 32-row TMA boxes and it keeps the first 16
    (bwd._leading). Gradients by the 2x rule, batched and packed (empty and length-1 sequences)."""
    if _delegated(kernels):
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
        q, k, v, delta, grad_out = _inputs(1, 2, 1, 50, 70, head_dim, torch.bfloat16, True, generator)
        launch = dict(q_offset=20)

        def reference(q, k, v, delta):
            return reference_pope_attention(q, k, v, delta, base=10000.0, q_offset=20, rotary_dim=None, **options)

    exact = _run(reference, q, k, v, delta, grad_out, torch.float64, {})
    theirs = _run(reference, q, k, v, delta, grad_out, torch.bfloat16, {})
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
    if _delegated(kernels):
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

    exact = _run(reference, q, k, v, delta, grad_out, torch.float64, {})
    theirs = _run(reference, q, k, v, delta, grad_out, torch.float32, {})
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


@pytest.mark.parametrize("head_dim", [32, 128])  # dk/dv kernel: key block from k' (d <= 64), or in registers
def test_backward_buffers_stay_within_sdpas_peak(kernels, monkeypatch, head_dim):
    """Peak memory: the gradients and q'/k' pre-pass buffers that the backward allocates never hold
    more than 5 |q| at once (MHA, |q| = |k|): dq + q' + k' while dq runs, dq + dk + dv + q' while dk/dv run, as
    SDPA's dq, dk, dv and fp32 dq accumulator. A buffer kept alive too long (a TMA descriptor kept k' alive once,
    commit c6429b1) or made too early (dk, dv before part 1) makes it 7 |q|. The forward's q' and k' and the
    backward's buffers all die with the call."""
    if _delegated(kernels):
        return
    import weakref

    generator = torch.Generator().manual_seed(3)
    q, k, v, delta, grad_out = _inputs(1, 2, 2, 40, 40, head_dim, torch.bfloat16, True, generator)
    q_bytes = q.numel() * 2  # |q| in bf16, the dtype the kernels run in (the test's inputs are fp64 masters)
    made = []  # (phase, weakref, bytes) of every buffer the launchers allocate
    peak = {"forward": 0, "backward": 0}
    phase = ["forward"]
    from pope.kernels import host

    original_empty, original_backward = host.empty, kernels.backward

    def recording_empty(shape, *, device, dtype):
        out = original_empty(shape, device=device, dtype=dtype)
        made.append((phase[0], weakref.ref(out), out.numel() * out.element_size()))
        # Buffers of at least |q| made in this phase (gradients, q', k', out); the row statistics are left out.
        live = sum(size for when, ref, size in made if when == phase[0] and ref() is not None and size >= q_bytes)
        peak[phase[0]] = max(peak[phase[0]], live)
        return out

    def recording_backward(*args, **kwargs):
        phase[0] = "backward"
        return original_backward(*args, **kwargs)

    monkeypatch.setattr(host, "empty", recording_empty)
    monkeypatch.setattr(kernels, "backward", recording_backward)
    options = dict(
        base=10000.0, causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None
    )
    _run(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
    assert phase[0] == "backward", "the backward did not go through pope.kernels.backward"
    assert peak["backward"] <= 5 * q_bytes, f"backward held {peak['backward'] / q_bytes:.2f} |q| at once"
    assert peak["forward"] <= 5 * q_bytes, f"forward held {peak['forward'] / q_bytes:.2f} |q| at once"
    prepass = [ref for _, ref, size in made if size >= 2 * q_bytes]
    assert len(prepass) == 4, "expected the forward's q' and k', then the backward's q' and k'"
    assert all(ref() is None for ref in prepass), "a pre-pass buffer outlived the call"


def test_queries_and_keys_pre_pass_in_one_launch_equals_two(kernels):
    """transform_queries_and_keys (one launch) writes exactly what two transform calls write: q with delta at
    positions q_offset.., k without delta from 0, with GQA heads and Nq != Nk (either longer), d=48 (padded)."""
    if _delegated(kernels):
        return
    generator = torch.Generator().manual_seed(5)
    theta = kernels.frequencies(48, 10000.0, DEVICE)
    for seq_q, seq_k, q_offset in ((37, 97, 60), (97, 37, 0)):
        q, k, _, delta, _ = _inputs(2, 4, 2, seq_q, seq_k, 48, torch.bfloat16, True, generator)
        q, k, delta = q.to(torch.bfloat16), k.to(torch.bfloat16), delta.float()
        q_prime, k_prime = kernels.transform_queries_and_keys(
            q, k, theta, delta, q_offset=q_offset, magnitude="softplus"
        )
        assert torch.equal(q_prime, kernels.transform(q, theta, delta, position_offset=q_offset, magnitude="softplus"))
        assert torch.equal(k_prime, kernels.transform(k, theta, None, position_offset=0, magnitude="softplus"))


def test_kernel_angles_at_long_positions_within_a_few_times_the_small_position_error(kernels):
    """cos and sin of the angles the kernels form (the pre-pass over ones, magnitude identity: the decode kernel's
    key-phase table; the lanes decode kernel's per-tile base angle is the same helper) at positions 2^20, 10^7 and
    2^30 - 64: within 3x of their error at positions 0..63 against float64 (it was 0.8 at 10^7 with the plain fp32
    product), and their angles are the reference's (pope.frequencies.angles in float32) bit for bit."""
    if _delegated(kernels):
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
    if _delegated(kernels):
        return
    from pope.testing import formula_attention

    generator = torch.Generator().manual_seed(21)
    q, k, v, delta, grad_out = _inputs(1, n_q_heads, n_kv_heads, seq_q, seq_k, 32, dtype, True, generator)
    options = dict(
        base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=10**6, magnitude="softplus", rotary_dim=None
    )
    if seq_q > 16:  # the block kernels: out and every gradient
        exact = _run(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
        ours = _run(_triton, q, k, v, delta, grad_out, dtype, options)
        theirs = _run(reference_pope_attention, q, k, v, delta, grad_out, dtype, options)
    else:  # decode: forward only (training calls take the block kernels)
        exact = [formula_attention(q, k, v, delta, q_offset=10**6, softmax_scale=32**-0.5)]
        with torch.no_grad():
            args = (q.to(dtype), k.to(dtype), v.to(dtype), delta.float())
            ours, theirs = [_triton(*args, **options)], [reference_pope_attention(*args, **options)]
    for name, a, b, c in zip(GRADIENT_NAMES, ours, theirs, exact):
        result = check_within_rule(a.cpu(), b.cpu(), c.cpu(), dtype)
        assert result["ok"], (name, result)


def test_tf32_operands_are_rounded_to_nearest_ties_away(kernels):
    """jit_math._tf32_rounded against TF32 rounding computed in float64 (ties away from zero), on halfway cases,
    both signs, subnormals, the fp32 maximum (to inf) and non-finite values (kept)."""
    if _delegated(kernels):
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
    if _delegated(kernels):
        return
    batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal = shape
    generator = torch.Generator().manual_seed(7)
    q, k, v, delta, grad_out = _inputs(
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
    exact = _run(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    full_fp32 = _run(reference_pope_attention, q, k, v, delta, grad_out, torch.float32, options)
    with _matmul_precision("high"):
        fused = _run(_triton, q, k, v, delta, grad_out, torch.float32, options)
        with tf32_reference():
            reference = _run(reference_pope_attention, q, k, v, delta, grad_out, torch.float32, options)
    for name, ours, theirs, truth, fp32 in zip(GRADIENT_NAMES, fused, reference, exact, full_fp32):
        errors = check_within_rule(ours, theirs, truth, torch.float32)
        assert errors["ok"], (name, errors)
        # TF32 really ran (kernels and reference): errors far above exact fp32's
        assert min(errors["kernel"], errors["reference"]) > 30 * (fp32.double() - truth).abs().max().item(), name


def test_tf32_one_key_row_gets_an_exact_zero_gradient(kernels):
    """A causal row that sees one key has P = 1 and dS = P (dP - D) = 0 exactly, so dq = 0 in float64. Under TF32 the
    kernels' D takes dO rounded to TF32 as the dots' dP do, so the two cancel to fp32 rounding; from the unrounded dO
    the row's dq would carry dO's TF32 rounding error (~1e-3 here)."""
    if _delegated(kernels):
        return
    q, k, v, delta, grad_out = _inputs(1, 2, 2, 24, 24, 32, torch.float32, True, torch.Generator().manual_seed(13))
    v, grad_out = 4 * v, 4 * grad_out  # a larger dO . v: a larger rounding error for the test to see
    options = dict(base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None)
    exact = _run(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    with _matmul_precision("high"):
        dq = _run(_triton, q, k, v, delta, grad_out, torch.float32, options)[1]
    assert exact[1][:, :, 0].abs().max().item() < 1e-12  # float64: row 0's dq is zero
    assert (dq[:, :, 1:].double() - exact[1][:, :, 1:]).abs().max().item() > 1e-4  # TF32 ran
    assert dq[:, :, 0].abs().max().item() < 2e-5, dq[:, :, 0].abs().max().item()


@pytest.mark.parametrize("method,n_q_heads,seq_q", [("tensor_cores", 4, 2), ("lanes", 2, 1), ("lanes", 4, 2)])
def test_decode_kernel_agrees_with_the_full_kernel(kernels, method, n_q_heads, seq_q):
    """The split-K decode kernels and the block kernel compute the same output and log-sum-exp."""
    if _delegated(kernels):
        return
    generator = torch.Generator().manual_seed(3)
    q, k, v, delta, _ = _inputs(1, n_q_heads, 2, seq_q, 150, 64, torch.float32, True, generator)
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
    if _delegated(kernels):
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
            q, k, v, delta, _ = _inputs(1, 8, 2, 1, seq_k, 64, dtype, True, generator)
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


def test_specialization_site_separates_what_triton_specialises_on(kernels):
    """Decode launches are keyed by _specialization_site instead of shapes: two argument lists with equal keys must
    get the same specialisation from Triton itself (native_specialize_impl: type, and alignment / divisibility)."""
    if _delegated(kernels):
        return
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from pope.kernels import direct_launch

    base = torch.zeros(64, dtype=torch.bfloat16)
    values = [
        0,
        1,
        2,
        15,
        16,
        17,
        32,
        48,
        2**31 - 16,
        2**31,
        2**31 + 1,
        2**40,
        2**63,
        -1,
        -16,
        -(2**31),
        -(2**31) - 16,
        True,
        False,
        None,
        0.5,
        1.0,
        base,
        base[1:],
        base[8:],
        base.float(),
        base.float()[2:],
        base.to(torch.int32),
    ]
    for a in values:
        for b in values:
            same_key = direct_launch.specialization_site("t", (a,), {}) == direct_launch.specialization_site(
                "t", (b,), {}
            )
            theirs = [native_specialize_impl(BaseBackend, x, False, True, True) for x in (a, b)]
            if same_key:
                assert theirs[0] == theirs[1], (a, b, theirs)
    # Launch options and constexprs are part of the key.
    site = direct_launch.specialization_site
    assert site("t", (16,), {"BLOCK": 32}) != site("t", (16,), {"BLOCK": 64})


def test_raw_launch_passes_what_tritons_launcher_passes(kernels, monkeypatch):
    """_RawLaunch calls the C launcher with exactly the arguments Triton's CudaLauncher.__call__ and its
    descriptor wrapper would (the real Triton code, run on a recording launcher), and encodes a descriptor again
    only for a new (parameter, pointer, shape, strides)."""
    if _delegated(kernels):
        return
    from pope.kernels import direct_launch

    driver = pytest.importorskip("triton.backends.nvidia.driver")
    expansions = []

    def expand(descriptor, metadata):  # stands in for cuTensorMapEncodeTiled (needs a GPU): a fresh object a call
        expansions.append(metadata["tag"])
        return [object(), *descriptor.shape, *descriptor.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", expand)
    calls = []

    class CLaunch:  # the compiled C launcher: records what it is given
        def __call__(self, *args):
            calls.append(args)

    signature = {
        "X": "*bf16",
        "XDesc": "tensordesc<bf16[1, 64, 128]>",
        "n": "i32",
        "YDesc": "tensordesc<fp32[1, 64]>",
        "BLOCK": "constexpr",
    }
    launcher = object.__new__(driver.CudaLauncher)  # a real CudaLauncher's state, without compiling C
    launcher.__dict__.update(
        num_ctas=1,
        global_scratch_size=0,
        global_scratch_align=1,
        profile_scratch_size=0,
        profile_scratch_align=1,
        launch_cooperative_grid=False,
        launch_pdl=True,
        launch=driver.wrap_handle_tensordesc(CLaunch(), signature, [{"tag": "x"}, {"tag": "y"}]),
    )
    compiled = type("Compiled", (), {"run": launcher})()
    raw = direct_launch.RawLaunch.of(compiled)
    assert raw is not None

    def params(x, y):
        return (x, direct_launch.descriptor(x, [1, 64, 128]), 7, direct_launch.descriptor(y, [1, 64]), 16)

    def same(triton_args, raw_args):  # tensor maps compared by identity (each launch path made its own)
        assert len(triton_args) == len(raw_args)
        for a, b in zip(triton_args, raw_args):
            assert a is b or (type(a) is not object and a == b) or (type(a) is object and type(b) is object)

    x, y = torch.zeros(2, 64, 128, dtype=torch.bfloat16), torch.zeros(2, 64)
    for new_y in (y, y, torch.zeros(2, 64)):
        launcher(5, 2, 1, 77, "function", "packed", None, None, None, *params(x, new_y))  # what _launch used to call
        raw(5, 2, 77, "function", "packed", params(x, new_y))
        same(calls[-2], calls[-1])
        assert calls[-1][:13] == (5, 2, 1, 77, "function", False, True, None, None, "packed", None, None, None)
        # x, [map, shape, strides] of x's descriptor, 7, [map, shape, strides] of y's, the constexpr
        assert calls[-1][13] is x and calls[-1][15:22] == (2, 64, 128, 8192, 128, 1, 7) and calls[-1][-1] == 16
    # Triton's path encodes both descriptors every call; the raw path both on its first, then only the new y.
    assert expansions == ["x", "y", "x", "y", "x", "y", "x", "y", "y"]
    launcher.global_scratch_size = 128  # scratch memory: the raw path declines
    assert direct_launch.RawLaunch.of(compiled) is None
    launcher.global_scratch_size, launcher.launch = 0, CLaunch()  # no descriptors: the C launcher as it is
    plain = direct_launch.RawLaunch.of(compiled)
    plain(3, 1, 9, "function", "packed", (x, 4))
    assert calls[-1] == (3, 1, 1, 9, "function", False, True, None, None, "packed", None, None, None, x, 4)
    assert direct_launch.RawLaunch.of(type("Compiled", (), {"run": lambda *a: None})()) is None


def test_direct_launch_reuses_the_compiled_kernel_per_site(kernels, monkeypatch):
    """_launch: Triton's path on a site's first call, then the compiled launcher with every parameter in order
    (constexprs included); a changed config or site=None goes back through Triton."""
    if _delegated(kernels):
        return
    from pope.kernels import direct_launch, host

    monkeypatch.setattr(direct_launch, "INTERPRET", False)
    monkeypatch.setattr(SETTINGS.caches, "direct_launches", {})
    monkeypatch.setattr(direct_launch, "current_stream", lambda device: 77)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kernel, x = RecordingKernel(["X", "n", "BLOCK", "FLAG"]), torch.zeros(3)
    for _ in range(3):
        direct_launch.launch(kernel, (5, 2), ("plan", "site"), (x, 9), BLOCK=16, FLAG=True, num_warps=4)
    assert kernel.triton_launches == 1 and len(kernel.compiled.calls) == 2
    assert kernel.compiled.calls[-1] == (5, 2, 1, 77, "function", "packed", None, None, None, x, 9, 16, True)
    direct_launch.launch(kernel, (5, 2), ("plan", "site"), (x, 9), BLOCK=32, FLAG=True, num_warps=4)  # new config
    direct_launch.launch(kernel, (5, 2), ("plan", "other site"), (x, 9), BLOCK=32, FLAG=True, num_warps=4)
    direct_launch.launch(kernel, (5, 2), None, (x, 9), BLOCK=32, FLAG=True, num_warps=4)
    assert kernel.triton_launches == 4 and len(kernel.compiled.calls) == 2
    direct_launch.launch(kernel, (5, 2), ("plan", "site"), (x, 9), BLOCK=32, FLAG=True, num_warps=4)
    assert kernel.triton_launches == 4 and kernel.compiled.calls[-1][-2:] == (32, True)
    # Plans see every input's layout: a transposed or misaligned view is another plan.
    base = torch.zeros(4, 8)
    assert host.plan(base, 1) != host.plan(base.t(), 1) != host.plan(base.view(-1)[1:].view(-1), 1)
    assert host.plan(base, 1) == host.plan(torch.ones(4, 8), 1)


def test_custom_ops_pass_opcheck(kernels):
    """Schema, fake (meta) implementation and autograd registration of the forward operator."""
    if _delegated(kernels):
        return
    from pope.ops import flash_attention_forward

    generator = torch.Generator().manual_seed(4)
    q, k, v, delta, _ = _inputs(1, 2, 1, 17, 17, 16, torch.float32, True, generator)
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
    torch.library.opcheck(
        flash_attention_forward, args, test_utils=("test_schema", "test_faketensor", "test_autograd_registration")
    )


def test_eager_function_and_custom_operators_agree_bitwise(kernels, monkeypatch):
    """Eager calls take the autograd.Function, compiled ones the custom operators: same launchers, same bits."""
    if _delegated(kernels):
        return

    generator = torch.Generator().manual_seed(6)
    q, k, v, delta, grad_out = _inputs(1, 4, 2, 33, 33, 32, torch.bfloat16, True, generator)
    options = dict(base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None)
    eager = _run(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
    monkeypatch.setattr(SETTINGS, "eager_autograd_function", False)
    operators = _run(_triton, q, k, v, delta, grad_out, torch.bfloat16, options)
    for name, a, b in zip(["out", "dq", "dk", "dv", "d_delta"], eager, operators):
        assert torch.equal(a, b), name


def test_torch_compile_traces_without_graph_break(kernels):
    if _delegated(kernels):
        return
    from pope.ops import triton_pope_attention

    generator = torch.Generator().manual_seed(5)
    q, k, v, delta, _ = _inputs(1, 2, 1, 17, 17, 16, torch.float32, True, generator)
    q, k, v, delta = (t.float().requires_grad_() for t in (q, k, v, delta))
    options = dict(base=10000.0, causal=True, softmax_scale=0.25, q_offset=0, magnitude="softplus", rotary_dim=None)

    def loss_fn(q, k, v, delta):
        return triton_pope_attention(q * 1.0, k, v, delta, **options).square().sum()

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)  # fullgraph: a break would raise

    SETTINGS.caches.frequencies.clear()
    loss = compiled(q, k, v, delta)
    loss.backward()
    # Compiled code computes the frequencies in its graph and never fills the eager cache: a cached tensor made
    # inside a CUDA-graph tree's warm-up call would stay live in the graph's private pool (pope.ops docstring).
    assert not SETTINGS.caches.frequencies, "a compiled call cached the frequencies"
    expected = loss_fn(q.detach(), k.detach(), v.detach(), delta.detach())
    assert SETTINGS.caches.frequencies, "an eager call should cache the frequencies"
    assert torch.allclose(loss.detach(), expected) and torch.isfinite(delta.grad).all()


def test_tile_configs_load_from_json(kernels, tmp_path, monkeypatch):
    if _delegated(kernels):
        return
    from pope.kernels import configs

    monkeypatch.setattr(configs, "INTERPRET", False)  # the interpreter always takes its own small tiles
    monkeypatch.setattr(configs, "architecture", lambda device: "sm_90")
    path = tmp_path / "configs.json"
    path.write_text('{"fwd": {"64": [32, 32, 4, 2]}}')
    monkeypatch.setenv("POPE_KERNEL_CONFIGS", str(path))
    assert configs.pick_tiles("fwd", 64, None, torch.bfloat16, DEVICE, "tf32") == (32, 32, 4, 2)
    bad = tmp_path / "bad.json"
    bad.write_text('{"bwd": {"64": [32, 32, 4, 2]}}')
    monkeypatch.setenv("POPE_KERNEL_CONFIGS", str(bad))
    with pytest.raises(ValueError, match="unknown kernel"):
        configs.pick_tiles("fwd", 64, None, torch.bfloat16, DEVICE, "tf32")


def test_unsupported_calls_have_reasons(kernels):
    if _delegated(kernels):
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
    if _delegated(kernels):
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


def test_kernels_compile_for_hopper_without_spills():
    """Compiled for sm_90a here (no GPU needed; Triton's bundled ptxas): the shipped forward tiles (d=64 and,
    since q' comes from the pre-pass into shared memory, d=128) keep everything in registers, and the d=64 one
    leaves room for two programs per SM; at d=64 so do the backward kernels, which read their fixed blocks from
    the pre-passes (dq 255 -> 192 registers, dk/dv 136 B of spills -> none). A kernel change that breaks any of
    this fails here before it costs GPU time."""
    script = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "kernel_registers.py")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), os.pardir, "src")
    run = subprocess.run(
        [sys.executable, script, "--kernels", "fwd,dq,dkdv", "--head-dims", "64,128"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for kernel in ("dq    ", "dkdv  "):
        line = next(line for line in run.stdout.splitlines() if line.startswith(f"{kernel} d=64 "))
        assert " 0 bytes spill stores" in line and "programs per SM 2" in line, line
    # d=128 dq: its chain-rule epilogue runs in channel quarters (bwd._chain_rule), which keeps it spill-free.
    line = next(line for line in run.stdout.splitlines() if line.startswith("dq     d=128"))
    assert " 0 bytes spill stores" in line, line
    for head_dim in ("64 ", "128"):
        line = next(line for line in run.stdout.splitlines() if line.startswith(f"fwd    d={head_dim}"))
        assert " 0 bytes spill stores" in line and "wgmma" in line, line
        if head_dim == "64 ":
            # Two programs per SM (121 registers, 105 KB shared at (128, 64, 8, 3)) is what made the q' pre-pass pay.
            resident = int(re.search(r"programs per SM (\d+)", line).group(1))
            assert resident >= 2, f"the d=64 forward no longer fits two programs per SM: {line}"


def test_fp32_kernels_compile_for_hopper_at_each_dot_precision():
    """kernel_registers.py --dtype fp32 compiles the fp32 specialisation: the TF32 forward at d=64 keeps everything
    in registers (a change that makes the TF32 path spill fails here); --precision without --dtype fp32, and a
    kernel it does not model, are refused in one line."""
    script = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "kernel_registers.py")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), os.pardir, "src")

    def run(*arguments):
        return subprocess.run(
            [sys.executable, script, "--kernels", "fwd", "--head-dims", "64", *arguments],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    compiled = run("--dtype", "fp32", "--precision", "tf32")
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    assert " 0 bytes spill stores" in compiled.stdout and "in loops 0," in compiled.stdout, compiled.stdout
    refused = run("--precision", "ieee")
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        "--precision goes with --dtype fp32 and --dtype fp32 needs it (ieee, tf32 or tf32x3): 16-bit dots have one "
        "precision"
    ]
    refused = subprocess.run(
        [sys.executable, script, "--kernels", "decode", "--dtype", "fp32", "--precision", "ieee"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode != 0 and "not 'decode'" in refused.stderr


def test_kernels_compute_each_registered_magnitude(kernels):
    """The pre-pass with each pope.magnitudes entry's kernel code computes that entry's torch function."""
    if _delegated(kernels):
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
        return _triton(
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
    if _delegated(kernels):
        return
    generator = torch.Generator().manual_seed(9)
    cases = [  # (Hq, Hkv, Nq, Nk, q_offset, position, values too, rows that cannot see it)
        (2, 2, 40, 40, 0, 25, False, 25),  # block kernels
        (8, 2, 2, 70, 68, 69, False, 1),  # tensor-core decode: query 0 (position 68) cannot see key 69
        (2, 2, 1, 70, 50, 60, True, 1),  # lanes decode: key 60 (and its value) past the query's position 50
    ]
    for n_q_heads, n_kv_heads, seq_q, seq_k, q_offset, position, values_too, unseen in cases:
        q, k, v, delta, _ = _inputs(1, n_q_heads, n_kv_heads, seq_q, seq_k, 32, torch.bfloat16, True, generator)
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
    if _delegated(kernels):
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
    q, k, v, delta, grad_out = _inputs(1, 2, 1, 20, 64, 32, torch.bfloat16, True, generator)
    options = dict(causal=True, q_offset=30, backend="triton")
    clean = _run(pope.attention.pope_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    k[:, :, 50:], v[:, :, 50:] = float("nan"), float("inf")  # queries sit at 30..49
    dirty = _run(pope.attention.pope_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    for name, a, b in zip(GRADIENT_NAMES, clean, dirty):
        assert torch.equal(a, b), name
    assert dirty[2][:, :, 50:].abs().max() == 0 and dirty[3][:, :, 50:].abs().max() == 0


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
    if _delegated(kernels):
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
    float64, by one launch of each kernel for the whole batch (pre-pass + forward; pre-pass, dq, dk/dv, epilogue),
    not one per sequence and not the reference."""
    if _delegated(kernels):
        return
    import pope.attention.api
    from pope.kernels import direct_launch
    from pope.ops import triton_unsupported_reason
    from pope.testing import packed_inputs

    if not ON_GPU:  # pope.attention sends CPU tensors to the reference; let interpreted kernels take them
        monkeypatch.setattr(
            pope.attention.api,
            "_triton_unsupported_reason",
            lambda q, k, v, **options: triton_unsupported_reason(q, k, v, **options),
        )
    launches = []
    original_launch = direct_launch.launch
    monkeypatch.setattr(
        direct_launch,
        "launch",
        lambda kernel, *args, **meta: (launches.append(kernel.__name__), original_launch(kernel, *args, **meta))[1],
    )
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

    exact = _run(varlen, q, k, v, delta, grad_out, torch.float64, dict(backend="reference"))
    theirs = _run(varlen, q, k, v, delta, grad_out, dtype, dict(backend="reference"))
    assert not launches
    ours = _run(varlen, q, k, v, delta, grad_out, dtype, dict(backend="triton"))
    assert launches == [
        "_pope_transform_kernel",
        "_pope_fwd_kernel",
        "_pope_transform_kernel",
        "_pope_bwd_dq_kernel",
        "_pope_bwd_dkdv_kernel",
        "_backward_epilogue_kernel",
    ], launches
    for name, a, b, c in zip(GRADIENT_NAMES, ours, theirs, exact):
        assert a.dtype == b.dtype and a.shape == c.shape, name
        result = check_within_rule(a.cpu(), b.cpu(), c.cpu(), dtype)
        assert result["ok"], (name, result)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf in the rows that see the non-finite key
def test_packed_sequences_do_not_reach_each_other(kernels):
    """Changing one sequence's values (finite) leaves every other sequence's output and gradients bit for bit; its
    keys and values made NaN / inf leave the others' outputs bit for bit (the forward masks other sequences' rows)."""
    if _delegated(kernels):
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
    if _delegated(kernels):
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
    if _delegated(kernels):
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

    eager = _run(packed_call, q, k, v, delta, grad_out, torch.float32, {})
    monkeypatch.setattr(SETTINGS, "eager_autograd_function", False)
    operators = _run(packed_call, q, k, v, delta, grad_out, torch.float32, {})
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
