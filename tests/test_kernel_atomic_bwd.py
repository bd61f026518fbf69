"""The atomic backward (deterministic=False: pope.kernels.backward_atomic, dq summed by fp32 tl.atomic_add), on CPU
through Triton's interpreter (TRITON_INTERPRET=1), compiled on a GPU when one is present.

Checks: every gradient within 2x the pure-PyTorch reference's error against float64 (outputs NaN-poisoned, so an
unwritten element fails), batched and packed; close to the deterministic backward's gradients (fp32 summation order
only, not bit for bit); the option reaches the kernels through pope_attention, pope_attention_varlen, the eager
Function and the custom operators; a non-bool option is a TypeError; the reference backend ignores it; the default
backward stays bitwise reproducible. The interpreter runs a kernel's programs one after another, so its atomics add
in a fixed order: run-to-run differences of dq are a GPU matter (scripts/gpu_kernel_check.py --checks atomic).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from pope.testing import kernel_test_setup  # before anything imports Triton

ON_GPU, DEVICE, INTERPRETER_IN_PROCESS = kernel_test_setup()

import pope.attention  # noqa: E402
from pope.attention import reference_pope_attention  # noqa: E402
from pope.settings import SETTINGS, override  # noqa: E402
from pope.testing import (GRADIENT_NAMES, assert_passed_in_subprocess, attention_inputs,  # noqa: E402
                          check_within_rule, interpreter_subprocess_results, outputs_and_gradients, packed_inputs)

# the kernels only the atomic backward launches (its main kernel is bwd's dk/dv kernel given a dq' accumulator)
ATOMIC_KERNELS = ["_row_statistics_kernel", "_dq_from_accumulator_kernel"]


@pytest.fixture(scope="module")
def subprocess_results():
    """Triton was imported in compiled mode before this module (no GPU): the module's results in a fresh
    TRITON_INTERPRET=1 process (pope.testing.interpreter_subprocess_results)."""
    return None if INTERPRETER_IN_PROCESS else interpreter_subprocess_results(__file__, timeout=600)


@pytest.fixture(autouse=True)
def kernels(request, subprocess_results, monkeypatch):
    """pope.kernels (interpreted on CPU), outputs NaN-poisoned, pope.attention sending CPU tensors to the kernels;
    None when this test already ran in the interpreter subprocess (it asserts that it passed there)."""
    if subprocess_results is not None:
        assert_passed_in_subprocess(request.node.name, subprocess_results)
        yield None
        return
    import pope.kernels
    from pope.ops import triton_unsupported_reason

    assert ON_GPU or pope.kernels.INTERPRET, "pope.kernels was imported before TRITON_INTERPRET was set"
    if not ON_GPU:  # pope.attention sends CPU tensors to the reference; let the interpreted kernels take them
        monkeypatch.setattr(pope.attention, "_triton_unsupported_reason",
                            lambda q, k, v, **options: triton_unsupported_reason(q, k, v, **options))
    with override(poison_outputs=True):
        yield pope.kernels


@pytest.fixture
def launches(monkeypatch):
    """The names of the kernels launched, in order."""
    from pope.kernels import direct_launch, host

    names, original = [], direct_launch.launch
    monkeypatch.setattr(direct_launch, "launch", lambda kernel, *args, **meta: (
        names.append(kernel.__name__), original(kernel, *args, **meta))[1])
    return names


def _attention(q, k, v, delta, **options):
    return pope.attention.pope_attention(q, k, v, delta, **options)


CASES = [
    # (batch, Hq, Hkv, Nq, Nk, d, causal, dtype, magnitude, delta): lengths not multiples of the interpreter's 32
    pytest.param(1, 4, 2, 37, 70, 48, True, torch.bfloat16, "softplus", True, id="gqa-causal-Nq<Nk-d48-bf16"),
    pytest.param(2, 2, 1, 45, 45, 32, False, torch.float32, "relu", True, id="mqa-noncausal-45-fp32-relu"),
    pytest.param(1, 2, 2, 40, 40, 64, False, torch.bfloat16, "identity", False, id="noncausal-d64-bf16-nodelta"),
    pytest.param(1, 2, 1, 33, 33, 128, True, torch.float32, "softplus", True, id="mqa-causal-33-d128-fp32"),
]


@pytest.mark.parametrize("batch,n_q_heads,n_kv_heads,seq_q,seq_k,head_dim,causal,dtype,magnitude,with_delta", CASES)
def test_gradients_within_twice_reference_error_and_close_to_the_deterministic_ones(
        kernels, launches, batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal, dtype, magnitude,
        with_delta):
    if kernels is None:
        return
    generator = torch.Generator().manual_seed(seq_q * 1000 + seq_k + head_dim)
    inputs = [t.to(DEVICE) if t is not None else None for t in attention_inputs(
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, with_delta=with_delta, generator=generator)]
    options = dict(base=10000.0, causal=causal, softmax_scale=0.7 * head_dim ** -0.5, q_offset=seq_k - seq_q,
                   magnitude=magnitude, rotary_dim=None)
    exact = outputs_and_gradients(reference_pope_attention, *inputs, torch.float64, options)
    reference = outputs_and_gradients(reference_pope_attention, *inputs, dtype, options)
    options = dict(options, backend="triton")
    atomic = outputs_and_gradients(_attention, *inputs, dtype, dict(options, deterministic=False))
    # forward; D; q' k'; dk dv dq'; dq; d(delta) summed in bwd's fixed order
    assert launches == ["_pope_transform_kernel", "_pope_fwd_kernel", "_row_statistics_kernel",
                        "_pope_transform_kernel", "_pope_bwd_dkdv_kernel",
                        "_dq_from_accumulator_kernel"] + ["_backward_epilogue_kernel"] * with_delta
    launches.clear()
    deterministic = outputs_and_gradients(_attention, *inputs, dtype, options)
    assert "_pope_bwd_dq_kernel" in launches and not set(ATOMIC_KERNELS) & set(launches)
    for name, ours, theirs, truth, same in zip(GRADIENT_NAMES, atomic, reference, exact, deterministic):
        assert ours.dtype == theirs.dtype and ours.shape == truth.shape, name
        errors = check_within_rule(ours.cpu(), theirs.cpu(), truth.cpu(), dtype)
        assert errors["ok"], f"{name}: kernel error {errors['kernel']:.3e} > 2 x reference {errors['reference']:.3e}"
        # the two backwards differ only in the order fp32 additions sum dq' (and a 16-bit rounding after it)
        tolerance = (1e-5 if dtype == torch.float32 else 1e-2) * same.abs().max().item()
        torch.testing.assert_close(ours, same, rtol=0, atol=tolerance, msg=name)


@pytest.mark.parametrize("causal,q_offset", [(True, 7), (False, 10**6)])
def test_explicit_query_offset_within_twice_reference_error(kernels, causal, q_offset):
    """Queries at positions q_offset.. (chunked prefill, and a million positions in: exact angles), Nq < Nk, GQA:
    the phases of the atomic backward's dq epilogue and pre-pass follow q_offset."""
    if kernels is None:
        return
    inputs = [t.to(DEVICE) for t in attention_inputs(1, 4, 2, 20, 45, 32, generator=torch.Generator().manual_seed(11))]
    options = dict(base=10000.0, causal=causal, softmax_scale=32 ** -0.5, q_offset=q_offset, magnitude="softplus",
                   rotary_dim=None)
    exact = outputs_and_gradients(reference_pope_attention, *inputs, torch.float64, options)
    reference = outputs_and_gradients(reference_pope_attention, *inputs, torch.bfloat16, options)
    atomic = outputs_and_gradients(_attention, *inputs, torch.bfloat16,
                                   dict(options, backend="triton", deterministic=False))
    for name, ours, theirs, truth in zip(GRADIENT_NAMES, atomic, reference, exact):
        errors = check_within_rule(ours.cpu(), theirs.cpu(), truth.cpu(), torch.bfloat16)
        assert errors["ok"], f"{name}: kernel error {errors['kernel']:.3e} > 2 x reference {errors['reference']:.3e}"


@pytest.mark.parametrize("dtype,causal", [(torch.bfloat16, True), (torch.float32, False)])
def test_packed_batch_within_twice_reference_error(kernels, launches, dtype, causal):
    """pope_attention_varlen(deterministic=False): empty, length-1 and odd-length sequences, GQA, one launch of each
    atomic kernel for the whole batch; the rows past a sequence's keys (the next sequence's, which no causal mask
    hides when causal=False) reach no dq."""
    if kernels is None:
        return
    lengths_q, lengths_k = [0, 1, 37, 3], [5, 1, 40, 33]
    q, k, v, delta, grad_out, cu_q, cu_k = (t.to(DEVICE) for t in packed_inputs(
        lengths_q, lengths_k, 4, 2, 32, generator=torch.Generator().manual_seed(44)))
    options = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=37, max_seqlen_k=40, causal=causal)

    def varlen(q, k, v, delta, **more):
        return pope.attention.pope_attention_varlen(q, k, v, delta, **options, **more)

    exact = outputs_and_gradients(varlen, q, k, v, delta, grad_out, torch.float64, dict(backend="reference"))
    reference = outputs_and_gradients(varlen, q, k, v, delta, grad_out, dtype, dict(backend="reference"))
    assert not launches
    ours = outputs_and_gradients(varlen, q, k, v, delta, grad_out, dtype,
                                 dict(backend="triton", deterministic=False))
    assert launches == ["_pope_transform_kernel", "_pope_fwd_kernel", "_row_statistics_kernel",
                        "_pope_transform_kernel", "_pope_bwd_dkdv_kernel", "_dq_from_accumulator_kernel",
                        "_backward_epilogue_kernel"], launches
    for name, a, b, c in zip(GRADIENT_NAMES, ours, reference, exact):
        result = check_within_rule(a.cpu(), b.cpu(), c.cpu(), dtype)
        assert result["ok"], (name, result)


def test_operators_and_eager_function_take_the_option(kernels, launches, monkeypatch):
    """Compiled code's path (the custom operators) runs the atomic backward too, with the eager Function's
    gradients; both operators pass opcheck with deterministic=False."""
    if kernels is None:
        return
    from pope import ops

    generator = torch.Generator().manual_seed(7)
    inputs = [t.to(DEVICE) for t in attention_inputs(1, 4, 2, 33, 33, 16, generator=generator)]
    options = dict(base=10000.0, causal=True, softmax_scale=0.25, q_offset=0, magnitude="softplus", rotary_dim=None,
                   backend="triton", deterministic=False)
    eager = outputs_and_gradients(_attention, *inputs, torch.float32, options)
    monkeypatch.setattr(SETTINGS, "eager_autograd_function", False)
    operators = outputs_and_gradients(_attention, *inputs, torch.float32, options)
    assert launches.count("_dq_from_accumulator_kernel") == 2, launches
    for name, a, b in zip(GRADIENT_NAMES, eager, operators):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    q, k, v, delta = (t.float().requires_grad_() for t in inputs[:4])
    theta = kernels.frequencies(16, 10000.0, q.device)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(ops.flash_attention_forward, (q, k, v, delta, theta, True, 0.25, 0, "softplus",
                                                        None, None, 0, 0, False), test_utils=utils)
    with torch.no_grad():
        out, lse = ops.flash_attention_forward(q, k, v, delta, theta, True, 0.25, 0, "softplus")
    torch.library.opcheck(ops.flash_attention_backward, (inputs[4].float(), q.detach(), k.detach(), v.detach(),
                                                         delta.detach(), out, lse, theta, True, 0.25, 0, "softplus",
                                                         None, None, 0, 0, False),
                          test_utils=("test_schema", "test_faketensor"))


def test_default_backward_stays_bitwise_reproducible(kernels, launches):
    """deterministic=True (the default) runs the two-kernel backward, and two runs give the same bits."""
    if kernels is None:
        return
    generator = torch.Generator().manual_seed(8)
    inputs = [t.to(DEVICE) for t in attention_inputs(1, 4, 2, 45, 45, 32, generator=generator)]
    options = dict(causal=True, backend="triton")
    first = outputs_and_gradients(_attention, *inputs, torch.bfloat16, options)
    second = outputs_and_gradients(_attention, *inputs, torch.bfloat16, dict(options, deterministic=True))
    assert "_pope_bwd_dkdv_kernel" in launches and not set(ATOMIC_KERNELS) & set(launches)
    for name, a, b in zip(GRADIENT_NAMES, first, second):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("value", [1, 0, None, "false", torch.tensor(True)])
def test_non_bool_option_is_a_clear_error(kernels, value):
    if kernels is None:
        return
    q, k, v, delta, _ = attention_inputs(1, 2, 1, 5, 5, 8)
    with pytest.raises(TypeError, match=r"deterministic must be True .* or False .*; got"):
        pope.attention.pope_attention(q, k, v, delta, deterministic=value)
    q, k, v, delta, _, cu_q, cu_k = packed_inputs([2, 3], [2, 4], 2, 1, 8)
    with pytest.raises(TypeError, match="deterministic must be True"):
        pope.attention.pope_attention_varlen(q, k, v, delta, cu_q, cu_k, 3, 4, deterministic=value)


def test_reference_backend_accepts_the_option_without_effect(kernels):
    if kernels is None:
        return
    inputs = attention_inputs(1, 2, 1, 9, 12, 8, generator=torch.Generator().manual_seed(9))
    options = dict(causal=True, backend="reference")
    plain = outputs_and_gradients(_attention, *inputs, torch.float32, options)
    atomic = outputs_and_gradients(_attention, *inputs, torch.float32, dict(options, deterministic=False))
    for name, a, b in zip(GRADIENT_NAMES, plain, atomic):
        assert torch.equal(a, b), name


_REGISTER_REPORT = """
import sys
sys.path.insert(0, sys.argv[1])
import kernel_registers
from pope.kernels import bwd, bwd_atomic

kernel_registers.FLOAT32_POINTERS.add("DQAcc")
for head_dim, tile in bwd_atomic.ATOMIC_TILES.items():
    for varlen in (False, True):
        constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_D=head_dim,
                          CAUSAL=True, MAGNITUDE=0, PRECISION="tf32", KEYS_FROM_PREPASS=True, IS_VARLEN=varlen)
        if not varlen:
            constexprs.update(CuSeqlensQ=None, CuSeqlensK=None)
        line = kernel_registers.report(bwd._pope_bwd_dkdv_kernel, constexprs, tile.num_warps,
                                       tile.num_stages, None)
        print(f"d={head_dim} varlen={varlen}: {line}")
"""


def test_atomic_kernel_compiles_for_hopper_within_an_sm_and_without_spills():
    """Compiled for sm_90a here (Triton's bundled ptxas, no GPU): the shipped 16-bit tiles fit an SM's shared memory
    (bwd's dk/dv tiles do not, at d = 128) and spill nothing batched; d = 64 holds two programs per SM."""
    import re

    root = os.path.join(os.path.dirname(__file__), os.pardir)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(root, "src")
    run = subprocess.run([sys.executable, "-c", _REGISTER_REPORT, os.path.join(root, "scripts")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 4, run.stdout
    for line in lines:
        resident = int(re.search(r"programs per SM (\d+)", line).group(1))
        assert resident >= (2 if line.startswith("d=64 varlen=False") else 1), line
        if "varlen=False" in line or line.startswith("d=64"):
            assert " 0 bytes spill stores" in line, line


def test_backward_buffers_peak_at_ten_q(kernels, monkeypatch):
    """What the atomic backward allocates (MHA, bf16, d = 64) peaks at 10 |q| at once: dk + dv + q' + k' + the fp32
    dq' accumulator (4 |q|) during the main kernel; dq is made only after q' and k' are freed (else 11 |q|)."""
    if kernels is None:
        return
    import weakref

    from pope.kernels import bwd_atomic, host

    q, k, v, delta, grad_out = (t.to(DEVICE) for t in attention_inputs(1, 2, 2, 40, 40, 64,
                                                                       generator=torch.Generator().manual_seed(10)))
    q, k, v, grad_out = (t.to(torch.bfloat16) for t in (q, k, v, grad_out))
    theta = kernels.frequencies(64, 10000.0, q.device)
    options = dict(causal=True, softmax_scale=0.125, q_offset=0, magnitude="softplus")
    out, lse = kernels.forward(q, k, v, delta.float(), theta, **options)
    q_bytes, live, peak = q.numel() * 2, [], [0]

    def recording(make):
        def allocate(*args, **kwargs):
            buffer = make(*args, **kwargs)
            live.append((weakref.ref(buffer), buffer.numel() * buffer.element_size()))
            peak[0] = max(peak[0], sum(size for ref, size in live if ref() is not None and size >= q_bytes))
            return buffer
        return allocate

    monkeypatch.setattr(host, "empty", recording(host.empty))
    monkeypatch.setattr(bwd_atomic.torch, "zeros", recording(torch.zeros))
    grads = kernels.backward_atomic(grad_out, q, k, v, delta.float(), out, lse, theta, **options)
    assert all(torch.isfinite(g).all() for g in grads)
    assert peak[0] == 10 * q_bytes, f"the atomic backward held {peak[0] / q_bytes:.2f} |q| at once"


@pytest.mark.parametrize("head_dim", [64, 128])
def test_shipped_hopper_tiles_within_twice_reference_error(kernels, head_dim):
    """The atomic backward with the tiles it runs on a GPU (ATOMIC_TILES: BLOCK_M = 16, whose lse and D come in
    32-row TMA boxes, of which the kernel keeps the first 16), not the interpreter's: gradients by the 2x rule."""
    if kernels is None:
        return
    from pope.kernels import bwd_atomic

    inputs = [t.to(DEVICE) for t in attention_inputs(1, 2, 1, 50, 70, head_dim,
                                                     generator=torch.Generator().manual_seed(head_dim))]
    options = dict(causal=True, softmax_scale=head_dim ** -0.5, q_offset=20, magnitude="softplus")
    reference_options = dict(options, base=10000.0, rotary_dim=None)
    exact = outputs_and_gradients(reference_pope_attention, *inputs, torch.float64, reference_options)
    reference = outputs_and_gradients(reference_pope_attention, *inputs, torch.bfloat16, reference_options)
    q, k, v, grad_out = (t.to(torch.bfloat16) for t in (inputs[0], inputs[1], inputs[2], inputs[4]))
    delta = inputs[3].float()
    theta = kernels.frequencies(head_dim, 10000.0, q.device)
    out, lse = kernels.forward(q, k, v, delta, theta, **options)
    grads = kernels.backward_atomic(grad_out, q, k, v, delta, out, lse, theta, **options,
                                    atomic_config=tuple(bwd_atomic.ATOMIC_TILES[head_dim]))
    for name, ours, theirs, truth in zip(GRADIENT_NAMES[1:], grads, reference[1:], exact[1:]):
        errors = check_within_rule(ours.cpu(), theirs.cpu(), truth.cpu(), torch.bfloat16)
        assert errors["ok"], f"{name}: kernel error {errors['kernel']:.3e} > 2 x reference {errors['reference']:.3e}"


def test_tma_box_not_a_multiple_of_128_bytes_is_a_clear_error(kernels):
    """direct_launch.descriptor refuses a box whose pipeline stages would sit at misaligned shared-memory addresses
    (a 16-row fp32 statistics box: 64 bytes), and the statistics descriptors of 16-row query blocks are 128 bytes."""
    if kernels is None:
        return
    from pope.kernels import bwd, direct_launch

    rows = torch.zeros(6, 1024)
    with pytest.raises(ValueError, match=r"TMA box \[1, 16\] of torch.float32 is 64 bytes, not a multiple of 128"):
        direct_launch.descriptor(rows, [1, 16])
    for block_m, box in ((16, [1, 32]), (32, [1, 32]), (64, [1, 64])):
        assert [d.block_shape for d in bwd.statistics_descriptors(rows, rows, block_m)] == [box, box], block_m


# Records the atomic backward's launches on CPU tensors (Triton in compiled mode, nothing run), compiles its main
# kernel for sm_90a as Triton would specialise it on those arguments, and prints, per case, every TMA copy's
# shared-memory buffer (TTGIR) and every constant shared-memory offset a cp.async.bulk.tensor writes to (PTX).
_TMA_ALIGNMENT_REPORT = r"""
import itertools, json, re, torch
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
for case in json.loads(__import__("sys").argv[1]):
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
    kernels.backward_atomic(torch.randn_like(q), q, k, v, torch.randn(n_q_heads, head_dim), torch.randn_like(q), lse,
                            kernels.frequencies(head_dim, 10000.0, "cpu"), causal=True, softmax_scale=0.125,
                            q_offset=0, magnitude="softplus", packed=packed)
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


def test_atomic_kernel_tma_destinations_are_128_byte_aligned_on_hopper():
    """The atomic main kernel, compiled for sm_90a as Triton specialises it on the launcher's real arguments at the
    GPU check's shapes (d = 64 and 128, ATOMIC_TILES; batched and packed): every buffer a pipelined TMA copy fills is a multiple of 128
    bytes and every constant shared-memory destination of a cp.async.bulk.tensor is 128-byte aligned, as the
    hardware requires (with 16-row fp32 statistics boxes the second stage sat 64 bytes off: 'misaligned address'
    on an H200)."""
    import json

    root = os.path.join(os.path.dirname(__file__), os.pardir)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(root, "src")
    cases = [[8, 12, 12, 1024, 1024, 64], [1, 2, 2, 4096, 4096, 128],
             [[0, 1, 7, 300, 1000, 2047, 130], [5, 1, 900, 300, 1000, 2047, 130], 8, 2, 64]]
    run = subprocess.run([sys.executable, "-c", _TMA_ALIGNMENT_REPORT, json.dumps(cases)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["case"] for r in reports] == cases
    for report in reports:
        assert report["tiles"][0] == 16 and report["tiles"][3] > 1, report  # the shipped, pipelined tiles
        stage_buffers = [b for b in report["buffers"] if b[2]]
        assert any(shape.endswith("f32") for shape, _, _ in stage_buffers), report  # lse and D are among them
        misaligned = [b for b in stage_buffers if b[1] % 128]
        assert not misaligned, f"{report['case']}: TMA stage buffers not 128-byte multiples: {misaligned}"
        assert report["offsets"] and all(offset % 128 == 0 for offset in report["offsets"]), report
