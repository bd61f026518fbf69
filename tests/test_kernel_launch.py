"""How the fused kernels are launched: layouts TMA cannot read directly, tensor descriptors and TMA boxes (checked
as Triton checks them), the direct launch path against Triton's launcher, specialisation sites, the backward's
buffers against SDPA's peak, tile configurations from JSON, and register use when compiled for Hopper.

Shared set-up (Triton's interpreter on CPU, outputs poisoned with NaN) and the acceptance rule:
tests/kernel_fixtures.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

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
from pope.settings import SETTINGS
from pope.testing import (
    GRADIENT_NAMES,
    RecordingKernel,
    check_within_rule,
    outputs_and_gradients,
)


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


@pytest.mark.parametrize("head_dim", [32, 128])  # dk/dv kernel: key block from k' (d <= 64), or in registers
def test_backward_buffers_stay_within_sdpas_peak(kernels, monkeypatch, head_dim):
    """Peak memory: the gradients and q'/k' pre-pass buffers that the backward allocates never hold
    more than 5 |q| at once (MHA, |q| = |k|): dq + q' + k' while dq runs, dq + dk + dv + q' while dk/dv run, as
    SDPA's dq, dk, dv and fp32 dq accumulator. A buffer kept alive too long (a TMA descriptor kept k' alive once,
    commit c6429b1) or made too early (dk, dv before part 1) makes it 7 |q|. The forward's q' and k' and the
    backward's buffers all die with the call."""
    if delegated(kernels):
        return
    import weakref

    generator = torch.Generator().manual_seed(3)
    q, k, v, delta, grad_out = kernel_inputs(1, 2, 2, 40, 40, head_dim, torch.bfloat16, True, generator)
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
    outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    assert phase[0] == "backward", "the backward did not go through pope.kernels.backward"
    assert peak["backward"] <= 5 * q_bytes, f"backward held {peak['backward'] / q_bytes:.2f} |q| at once"
    assert peak["forward"] <= 5 * q_bytes, f"forward held {peak['forward'] / q_bytes:.2f} |q| at once"
    prepass = [ref for _, ref, size in made if size >= 2 * q_bytes]
    assert len(prepass) == 4, "expected the forward's q' and k', then the backward's q' and k'"
    assert all(ref() is None for ref in prepass), "a pre-pass buffer outlived the call"


def test_queries_and_keys_pre_pass_in_one_launch_equals_two(kernels):
    """transform_queries_and_keys (one launch) writes exactly what two transform calls write: q with delta at
    positions q_offset.., k without delta from 0, with GQA heads and Nq != Nk (either longer), d=48 (padded)."""
    if delegated(kernels):
        return
    generator = torch.Generator().manual_seed(5)
    theta = kernels.frequencies(48, 10000.0, DEVICE)
    for seq_q, seq_k, q_offset in ((37, 97, 60), (97, 37, 0)):
        q, k, _, delta, _ = kernel_inputs(2, 4, 2, seq_q, seq_k, 48, torch.bfloat16, True, generator)
        q, k, delta = q.to(torch.bfloat16), k.to(torch.bfloat16), delta.float()
        q_prime, k_prime = kernels.transform_queries_and_keys(
            q, k, theta, delta, q_offset=q_offset, magnitude="softplus"
        )
        assert torch.equal(q_prime, kernels.transform(q, theta, delta, position_offset=q_offset, magnitude="softplus"))
        assert torch.equal(k_prime, kernels.transform(k, theta, None, position_offset=0, magnitude="softplus"))


def test_specialization_site_separates_what_triton_specialises_on(kernels):
    """Decode launches are keyed by _specialization_site instead of shapes: two argument lists with equal keys must
    get the same specialisation from Triton itself (native_specialize_impl: type, and alignment / divisibility)."""
    if delegated(kernels):
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
    if delegated(kernels):
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
    if delegated(kernels):
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


def test_tile_configs_load_from_json(kernels, tmp_path, monkeypatch):
    if delegated(kernels):
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
