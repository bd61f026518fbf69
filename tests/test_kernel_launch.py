"""How the fused kernels are launched: the backward's buffers against SDPA's peak, the one-launch q'/k' pre-pass,
specialisation sites, the direct launch path against Triton's launcher, tile configurations from JSON, and register
use when compiled for Hopper. Layouts, descriptors and boxes for TMA: tests/test_kernel_launch_tma.py.

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
    delegated,
    kernel_inputs,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
    triton_attention,
)

from pope.settings import SETTINGS
from pope.testing import RecordingKernel, outputs_and_gradients


# dk/dv kernel: key block from k' (d <= 64: 7 |q|), or transformed in registers (5 |q|); with the forward's q', k'
# kept for the backward (reuse_prepass), both live through it: 7 |q|.
@pytest.mark.parametrize(
    "head_dim, reuse_prepass, backward_peak", [(32, False, 7), (128, False, 5), (32, True, 7), (128, True, 7)]
)
def test_backward_buffers_peak_where_documented(kernels, monkeypatch, head_dim, reuse_prepass, backward_peak):
    """Peak memory: the gradients and q'/k' pre-pass buffers live during the backward never hold more than
    pope.kernels.bwd documents (MHA, |q| = |k|). Its own pre-pass, d > 64: dq + q' + k' while dq runs, dq + q' + dk +
    dv while dk/dv run (k' freed): 5 |q|, as SDPA's dq, dk, dv and fp32 dq accumulator; d <= 64: the dk/dv kernel
    reads its keys from k', so dq + q' + k' + dk + dv: 7 |q|. The forward's q', k' (pope.settings' reuse_prepass):
    no pre-pass, and q' + k' + dq + dk + dv: 7 |q| at any d. A buffer kept alive too long (a TMA descriptor held k'
    once) or made too early (dk, dv before part 1) exceeds it. Every pre-pass buffer dies with the call."""
    if delegated(kernels):
        return
    import weakref

    from pope.kernels import buffers

    monkeypatch.setattr(SETTINGS, "reuse_prepass", reuse_prepass)
    generator = torch.Generator().manual_seed(3)
    q, k, v, delta, grad_out = kernel_inputs(1, 2, 2, 40, 40, head_dim, torch.bfloat16, True, generator)
    q_bytes = q.numel() * 2  # |q| in bf16, the dtype the kernels run in (the test's inputs are fp64 masters)
    prime_width = 2 * buffers.block_d(head_dim)
    made = []  # (phase, weakref, bytes, pre-pass buffer?) of every buffer the launchers allocate
    peak = {"forward": 0, "backward": 0}
    phase = ["forward"]
    original_empty, original_backward = buffers.empty, kernels.backward

    def live_bytes():  # buffers of at least |q| (gradients, q', k', out; not the row statistics) the phase holds
        return sum(
            size
            for when, ref, size, prime in made
            if ref() is not None and size >= q_bytes and (when == phase[0] or prime)
        )

    def recording_empty(shape, *, device, dtype):
        out = original_empty(shape, device=device, dtype=dtype)
        made.append((phase[0], weakref.ref(out), out.numel() * out.element_size(), shape[-1] == prime_width))
        peak[phase[0]] = max(peak[phase[0]], live_bytes())
        return out

    def recording_backward(*args, **kwargs):
        phase[0] = "backward"
        return original_backward(*args, **kwargs)

    from pope.kernels import host

    monkeypatch.setattr(host, "empty", recording_empty)  # the launchers' buffers
    monkeypatch.setattr(buffers, "empty", recording_empty)  # the pre-pass's (buffers.prime_buffer)
    monkeypatch.setattr(kernels, "backward", recording_backward)
    options = dict(
        base=10000.0, causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus", rotary_dim=None
    )
    outputs_and_gradients(triton_attention, q, k, v, delta, grad_out, torch.bfloat16, options)
    assert phase[0] == "backward", "the backward did not go through pope.kernels.backward"
    assert peak["backward"] <= backward_peak * q_bytes, f"backward held {peak['backward'] / q_bytes:.2f} |q| at once"
    assert peak["forward"] <= 5 * q_bytes, f"forward held {peak['forward'] / q_bytes:.2f} |q| at once"
    prepass = [ref for _, ref, _, prime in made if prime]
    expected = 2 if reuse_prepass else 4
    assert len(prepass) == expected, f"expected {expected} pre-pass buffers (q', k' per pre-pass), got {len(prepass)}"
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
