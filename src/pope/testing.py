"""What the kernel tests and the GPU checks share: the acceptance rule, input builders, the float64 formula.

The rule (flash-attention's): against a float64 computation, a low-precision result (the kernels' output and every
gradient) may be off by at most 2x what plain PyTorch (pope.attention's reference, in the same dtype) is off,
plus, for fp32, a rounding-sized floor so that 2x of almost nothing passes. `check_within_rule` applies it.
`tf32_reference` makes that reference TF32 arithmetic for fp32 checks under TF32.
Used by tests/test_kernel_*.py, tests/test_core_attention.py and scripts/gpu_check.py; also
`load_kernels`, which loads a kernel package (or an old single-file kernel module) from any source tree, for
scripts that compare versions. Importing this module imports torch only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

import pope.attention.reference
from pope.optional import require

GRADIENT_NAMES = ("out", "dq", "dk", "dv", "d_delta")


def check_within_rule(ours: torch.Tensor, theirs: torch.Tensor, truth: torch.Tensor, dtype: torch.dtype) -> dict:
    """{"kernel": max |ours - truth|, "reference": max |theirs - truth|, "ok": the 2x rule and finite}.

    ours: the result under test, theirs: plain PyTorch's in the same dtype, truth: float64."""
    our_error = (ours.double() - truth).abs().max().item()
    reference_error = (theirs.double() - truth).abs().max().item()
    floor = 1e-5 * truth.abs().max().item() if dtype == torch.float32 else 0.0
    ok = bool(torch.isfinite(ours).all()) and our_error <= 2 * reference_error + floor
    return {"kernel": our_error, "reference": reference_error, "ok": ok}


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 x rounded to TF32 (10-bit mantissa) to nearest, ties away, in integers: a TF32 matmul's operand."""
    return ((x.float().contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


class _TF32GradientRounding(torch.autograd.Function):
    """Identity forward; the incoming gradient rounded to TF32, as a TF32 matmul's backward reads it."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _tf32(grad)


def _tf32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b as a TF32 matmul computes it (emulated): both operands rounded to TF32, fp32 sums; its backward's
    products likewise."""

    def rounded(x):  # TF32 values forward; the gradient passes unchanged to x
        return x + (_tf32(x) - x).detach()

    return _TF32GradientRounding.apply(rounded(a) @ rounded(b))


def _tf32_sdpa(
    q, k, v, *, causal: bool, softmax_scale: float, q_offset: int | None = None, attn_bias=None, dropout_p: float = 0.0
) -> torch.Tensor:
    """pope.attention.sdpa in TF32 arithmetic, as SDPA's math backend computes fp32 attention under TF32 where cuBLAS
    runs its matmuls in TF32: scores and P V by TF32 matmuls (operands rounded), mask and softmax in fp32.
    q (B, Hq, Nq, e), k (B, Hkv, Nk, e), v (B, Hkv, Nk, dv)."""
    if attn_bias is not None or dropout_p:
        raise ValueError("the TF32 reference emulates plain causal / full attention only")
    seq_q, seq_k = q.shape[2], k.shape[2]
    q_offset = seq_k - seq_q if q_offset is None else q_offset
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = _tf32_matmul(q, k.transpose(-1, -2)) * softmax_scale  # (B, Hq, Nq, Nk)
    if causal:
        positions_q = torch.arange(seq_q, device=q.device) + q_offset
        visible = torch.arange(seq_k, device=q.device)[None, :] <= positions_q[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
    return _tf32_matmul(torch.softmax(scores, -1), v)


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) inside, the previous setting restored after."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@contextlib.contextmanager
def tf32_reference():
    """While active, pope.attention's reference computes fp32 attention in TF32 arithmetic, the reference of a TF32
    kernel check, on any device (`_tf32_sdpa`): every matmul's operands rounded to TF32 (to nearest, ties away),
    fp32 products and sums, mask and softmax in fp32. That is what cuBLAS's TF32 matrix products compute, but not
    what PyTorch gives for every attention: SDPA's fused fp32 kernels ignore TF32, and cuBLAS computes a
    matrix-vector product (one query row) in exact fp32 even under TF32 (docs/kernels.md). Float64 calls are
    unchanged."""
    original = pope.attention.reference.sdpa

    def emulated(q, k, v, **options):
        return (_tf32_sdpa if q.dtype == torch.float32 else original)(q, k, v, **options)

    pope.attention.reference.sdpa = emulated
    try:
        yield
    finally:
        pope.attention.reference.sdpa = original


def attention_inputs(
    batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, *, with_delta=True, generator=None, device="cpu"
):
    """Fresh random float64 (q, k, v, delta or None, grad_out) on device, drawn in that order from generator:
    q (B, Hq, Nq, d), k and v (B, Hkv, Nk, d), N(0, 1); delta (Hq, d) uniform in [-2 pi, 0]; grad_out like q."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, device=device)

    q, k, v = (
        randn(batch, n_q_heads, seq_q, head_dim),
        randn(batch, n_kv_heads, seq_k, head_dim),
        randn(batch, n_kv_heads, seq_k, head_dim),
    )
    delta = (
        -2 * math.pi * torch.rand(n_q_heads, head_dim, generator=generator, dtype=torch.float64, device=device)
        if with_delta
        else None
    )
    grad_out = randn(batch, n_q_heads, seq_q, head_dim)
    return q, k, v, delta, grad_out


def packed_inputs(
    lengths_q, lengths_k, n_q_heads, n_kv_heads, head_dim, *, with_delta=True, generator=None, device="cpu"
):
    """A packed (varlen) batch of fresh random float64 inputs, drawn as attention_inputs draws them: (q (total_q,
    Hq, d), k and v (total_k, Hkv, d), delta (Hq, d) or None, grad_out like q, cu_seqlens_q, cu_seqlens_k int32)."""
    q, k, v, delta, grad_out = attention_inputs(
        1,
        n_q_heads,
        n_kv_heads,
        sum(lengths_q),
        sum(lengths_k),
        head_dim,
        with_delta=with_delta,
        generator=generator,
        device=device,
    )
    q, k, v, grad_out = (t[0].transpose(0, 1).contiguous() for t in (q, k, v, grad_out))
    cu_seqlens_q, cu_seqlens_k = (
        torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=device) for n in (lengths_q, lengths_k)
    )
    return q, k, v, delta, grad_out, cu_seqlens_q, cu_seqlens_k


def outputs_and_gradients(fn, q, k, v, delta, grad_out, dtype, options) -> list:
    """[out, dq, dk, dv(, d_delta)] of fn(q, k, v, delta, **options) on copies of the inputs cast to dtype (delta
    in fp32, or float64 for float64), all detached."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    delta_leaf = None
    if delta is not None:
        delta_leaf = delta.detach().to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
        leaves.append(delta_leaf)
    out = fn(*leaves[:3], delta_leaf, **options)
    grads = torch.autograd.grad(out, leaves, grad_out.to(dtype))
    return [out.detach()] + [g.detach() for g in grads]


def formula_attention(
    q,
    k,
    v,
    delta,
    *,
    base=10000.0,
    causal=True,
    q_offset=None,
    magnitude=F.softplus,
    rotary_dim=None,
    softmax_scale=None,
) -> torch.Tensor:
    """The paper's score written out channel by channel in float64, the mask applied by selection, then softmax and
    the value average: what pope_attention must compute. q (B, Hq, Nq, d), k/v (B, Hkv, Nk, d), delta (Hq, r)."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    r = rotary_dim or d
    q_offset = nk - nq if q_offset is None else q_offset
    theta = torch.tensor([base ** (-(c - 1) / r) for c in range(1, r + 1)], dtype=torch.float64, device=q.device)
    t = torch.arange(nq, dtype=torch.float64, device=q.device) + q_offset
    s = torch.arange(nk, dtype=torch.float64, device=q.device)
    rel = s[None, :] - t[:, None]  # (Nq, Nk): s - t
    out = torch.empty(b, hq, nq, d, dtype=torch.float64, device=q.device)
    for h in range(hq):
        g = h // (hq // hkv)
        dl = torch.zeros(r, dtype=torch.float64, device=q.device) if delta is None else delta[h].double()
        phase = rel[..., None] * theta + dl  # (Nq, Nk, r)
        mq, mk = magnitude(q[:, h, :, :r]), magnitude(k[:, g, :, :r])  # (B, Nq, r), (B, Nk, r)
        score = torch.einsum("bic,bjc,ijc->bij", mq, mk, torch.cos(phase))
        score = score + q[:, h, :, r:] @ k[:, g, :, r:].transpose(-1, -2)
        score = score * (softmax_scale or 1 / math.sqrt(d))
        if causal:
            score = score.masked_fill(s[None, :] > t[:, None], float("-inf"))
        out[:, h] = torch.softmax(score, dim=-1) @ v[:, g]
    return out


class RecordingKernel:
    """Stands in for a @triton.jit function in launch-path tests: kernel[grid](*args, **meta) counts a launch through
    Triton's path and returns a compiled kernel whose `run` records what a direct launch passes it."""

    class Compiled:
        function, packed_metadata = "function", "packed"

        def __init__(self):
            self.calls = []

        @property
        def run(self):
            return lambda *launch_args: self.calls.append(launch_args)

    def __init__(self, arg_names: list):
        self.arg_names = arg_names
        self.triton_launches = 0
        self.compiled = self.Compiled()

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.triton_launches += 1
            return self.compiled

        return launch


def kernel_test_setup() -> tuple[bool, str, bool]:
    """A kernel test module's first step, before anything imports Triton: on a machine without a GPU, Triton's
    interpreter (TRITON_INTERPRET=1, unless set); the module skipped without Triton. Returns (on a GPU, the tests'
    device, whether this process can run the kernels: on a GPU, or Triton's library made in interpreter mode; if
    not, Triton was imported in compiled mode earlier: `interpreter_subprocess_results`)."""
    pytest = require("pytest")
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton", reason="the Triton kernels need pip install 'pope-attention[triton]'")
    tl = require("triton.language")  # after TRITON_INTERPRET is set: Triton reads it when first imported
    return on_gpu, "cuda" if on_gpu else "cpu", on_gpu or type(tl.zeros).__name__ == "InterpretedFunction"


def interpreter_subprocess_results(test_file: str, timeout: float) -> tuple[dict, str]:
    """({test name: passed}, the output's last 4000 characters) of the test module test_file run again by pytest in
    a fresh process with TRITON_INTERPRET=1: for a kernel test module in a process that imported Triton in compiled
    mode before it (no GPU), where the interpreter can no longer be switched on."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", test_file],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = {
        line.split("::", 1)[-1].split(" ")[0]: line.startswith("PASSED ")
        for line in run.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    return results, run.stdout[-4000:]


def assert_passed_in_subprocess(test_name: str, subprocess_results: tuple[dict, str]) -> None:
    """Fails unless test_name passed in `interpreter_subprocess_results`' run (its log in the message)."""
    results, log = subprocess_results
    assert results.get(test_name) is True, f"{test_name} did not pass in the TRITON_INTERPRET=1 subprocess:\n{log}"


def load_kernels(path: str, name: str):
    """A kernel implementation loaded from a source tree under its own module name, beside this process's own:
    path is a kernels package directory (e.g. OLD/src/pope/kernels) or a single-file kernel module (an old
    pope_flash.py). The package's own modules are loaded from path; what it imports from the rest of pope
    (settings, magnitudes) is this process's."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        init = os.path.join(path, "__init__.py")
        if not os.path.exists(init):
            raise ValueError(f"{path} is not a kernels package (no __init__.py)")
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[path])
    elif os.path.isfile(path):
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        raise ValueError(f"no kernel package or module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the package's relative imports look it up by name
    spec.loader.exec_module(module)
    return module


__all__ = [
    "GRADIENT_NAMES",
    "check_within_rule",
    "attention_inputs",
    "outputs_and_gradients",
    "formula_attention",
    "load_kernels",
    "RecordingKernel",
    "kernel_test_setup",
    "interpreter_subprocess_results",
    "assert_passed_in_subprocess",
]
