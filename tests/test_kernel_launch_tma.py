"""How the fused kernels meet TMA's rules: layouts TMA cannot read directly (unaligned bases and strides, a
stride-0 output gradient), tensor descriptors checked as Triton checks them, TMA boxes that are not a multiple of
128 bytes, and the dk/dv kernel's TMA destinations when compiled for Hopper with 16-row query blocks. The rest of
the launch path: tests/test_kernel_launch.py.

Shared set-up (Triton's interpreter on CPU, outputs poisoned with NaN) and the acceptance rule:
tests/kernel_fixtures.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_fixtures import (  # before pope's imports: it sets Triton's interpreter up
    ON_GPU,
    delegated,
    kernel_inputs,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
    triton_attention,
)

from pope.attention import reference_pope_attention
from pope.testing import GRADIENT_NAMES, check_within_rule, outputs_and_gradients


def test_layouts_tma_cannot_read_directly(kernels):
    """The kernels read some tiles by TMA, which needs 16-byte-aligned bases and strides: a head dim of 36
    (72-byte rows), q/k/v as views one element into wider rows (unaligned base and strides), and the stride-0
    output gradient that `out.sum()` gives must still come out right (the launchers copy such tensors)."""
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(5)
    batch, heads, seq, head_dim, dtype = 1, 2, 45, 36, torch.bfloat16
    q, k, v, delta, _ = kernel_inputs(batch, heads, heads, seq, seq, head_dim, dtype, True, generator)
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
    fused = grads(triton_attention, dtype, True)
    for name, ours, theirs, truth in zip(GRADIENT_NAMES, fused, reference, exact):
        assert torch.isfinite(ours).all(), name
        errors = check_within_rule(ours, theirs, truth, dtype)  # bf16: no floor, exactly 2x
        assert errors["ok"], f"{name}: {errors['kernel']:.3e} > 2 x {errors['reference']:.3e}"


@pytest.mark.parametrize("head_dim,seq", [(48, 37), (64, 40)])
def test_descriptors_pass_tritons_checks(kernels, monkeypatch, head_dim, seq):
    """The launchers build TMA descriptors without TensorDescriptor's own checks (host time): every descriptor
    they make must still pass those checks (16-byte alignment, strides, block shape)."""
    if delegated(kernels):
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
    q, k, v, delta, grad_out = kernel_inputs(2, 4, 2, seq, seq, head_dim, torch.bfloat16, True, generator)
    options = dict(
        base=10000.0, causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None
    )
    outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    # d <= 64: the dk/dv kernel also reads its key block (k') and v by TMA; with the dq kernel's tiles (as here,
    # and at d=64 on the GPU) it reuses the dq kernel's q', k' and v descriptors and makes only dO's, lse's and D's.
    assert len(made) == 9, f"expected 3 forward + 3 dq + 3 dk/dv descriptors, got {len(made)}"
    assert direct_launch.UNCHECKED_DESCRIPTORS, "this Triton's TensorDescriptor changed: descriptors take the slow path"


def test_tma_box_not_a_multiple_of_128_bytes_is_a_clear_error(kernels):
    """direct_launch.descriptor refuses a box whose pipeline stages would sit at misaligned shared-memory addresses
    (a 16-row fp32 statistics box: 64 bytes), and the dk/dv kernel's lse and D descriptors of 16-row query blocks
    (fp32 at d = 128, or a tile override) are 128-byte boxes of which the kernel keeps the first 16 entries."""
    if delegated(kernels):
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
