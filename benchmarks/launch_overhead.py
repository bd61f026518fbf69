"""Host (Python + launch) overhead of one pope_attention call, against SDPA, on a shape too small for the
GPU to matter: what limits eager-mode PoPE at short sequences (the 8x12x1024x64 benchmark row).

Prints per-call wall time (CUDA-synchronised, mean of many calls) of forward and forward+backward for
SDPA and for pope_attention(backend="triton"), then the cProfile functions where PoPE's host time goes.

    PYTHONPATH=src python benchmarks/launch_overhead.py [--calls 300] [--out DIR]
With --out the printout is also DIR/launch_overhead.txt, its provenance on the first line.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from triton import cdiv as triton_cdiv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_io import printed_to  # noqa: E402  (same directory: shared benchmark helpers)


def per_call_ms(fn, calls: int, *, host_only: bool = False) -> float:
    """Mean wall time per call; host_only: stop the clock before the final synchronize (Python + launch time
    alone, as long as the GPU queue does not fill up)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter()
    torch.cuda.synchronize()
    return ((host if host_only else time.perf_counter()) - start) / calls * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shape", default="1x2x128x64", help="B x H x N x d")
    parser.add_argument("--out", default=None, help="also write the printout to DIR/launch_overhead.txt")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/launch_overhead.py needs a CUDA GPU")
    with printed_to(args.out, "launch_overhead.txt"):
        measure(args)


def measure(args) -> None:
    from pope.attention import pope_attention

    batch, heads, seq, head_dim = (int(x) for x in args.shape.split("x"))
    q, k, v = (
        torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    delta = (-2 * math.pi * torch.rand(heads, head_dim, device="cuda")).requires_grad_()
    grad = torch.randn_like(q)
    calls = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "pope triton": lambda: pope_attention(q, k, v, delta, causal=True, backend="triton"),
    }
    print(f"shape {args.shape}, bf16, causal; ms per call (host-bound at this size)")
    for name, fn in calls.items():
        with torch.no_grad():
            forward = per_call_ms(fn, args.calls)
        both = per_call_ms(lambda: torch.autograd.backward(fn(), grad), args.calls)  # noqa: B023
        host = per_call_ms(lambda: torch.autograd.backward(fn(), grad), args.calls, host_only=True)  # noqa: B023
        print(
            f"{name:>12}: forward {forward:.3f} ms, forward+backward {both:.3f} ms "
            f"(host time before the final synchronize: {host:.3f} ms)"
        )
    # The layers of a PoPE call, innermost first: one Triton launch, the launchers, the custom operators.
    import pope.kernels as kernels
    from pope import ops
    from pope.kernels import configs, direct_launch, prepass
    from pope.settings import SETTINGS

    theta = kernels.frequencies(head_dim, 10000.0, q.device)
    opts = dict(causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus")
    out, lse = kernels.forward(q.detach(), k.detach(), v.detach(), delta.detach(), theta, **opts)
    layers = {
        "one transform launch": lambda: kernels.transform(
            k.detach(), theta, None, position_offset=0, magnitude="softplus"
        ),
        "kernels.forward": lambda: kernels.forward(q.detach(), k.detach(), v.detach(), delta.detach(), theta, **opts),
        "kernels.backward": lambda: kernels.backward(
            grad, q.detach(), k.detach(), v.detach(), delta.detach(), out, lse, theta, **opts
        ),
        "custom op forward": lambda: ops.flash_attention_forward(
            q.detach(), k.detach(), v.detach(), delta.detach(), theta, True, head_dim**-0.5, 0, "softplus"
        ),
        "custom op backward": lambda: ops.flash_attention_backward(
            grad,
            q.detach(),
            k.detach(),
            v.detach(),
            delta.detach(),
            out,
            lse,
            theta,
            True,
            head_dim**-0.5,
            0,
            "softplus",
        ),
    }
    for name, fn in layers.items():
        print(f"{name:>22}: {per_call_ms(fn, args.calls):.3f} ms")
    # The operators (what a compiled model calls) with direct launches through Triton's Python launcher (which
    # encodes every TMA descriptor again) and through the C launcher with kept encodings (direct_launch.RawLaunch),
    # host time only (no_grad, as in a compiled graph), alternating over 10 rounds: this host's speed drifts by tens of
    # percent within a run, so the minimum over rounds is the cost and the median shows the spread.
    timings = {False: [], True: []}
    with torch.no_grad():
        for _ in range(10):
            for raw in (False, True):
                SETTINGS.raw_launch = raw
                SETTINGS.caches.direct_launches.clear()
                timings[raw].append(
                    (
                        per_call_ms(layers["custom op forward"], args.calls, host_only=True),
                        per_call_ms(layers["custom op backward"], args.calls, host_only=True),
                    )
                )
    for raw, label in ((False, "Triton's launcher"), (True, "C launcher, kept TMA encodings")):
        (fwd_min, fwd_median), (bwd_min, bwd_median) = (
            (min(t[i] for t in timings[raw]), statistics.median(t[i] for t in timings[raw])) for i in (0, 1)
        )
        print(
            f"custom ops, direct launches via {label}: forward {fwd_min:.3f} ms (median {fwd_median:.3f}), "
            f"backward {bwd_min:.3f} ms (median {bwd_median:.3f}) host, min over 10 rounds"
        )
    # Triton's per-launch Python path (binder, cache key, checks) against calling the compiled kernel directly.
    x = k.detach()
    out_buffer = torch.empty(*x.shape[:3], 2 * head_dim, device=x.device, dtype=x.dtype)
    grid = (triton_cdiv(seq, configs.TRANSFORM_ROWS), batch * heads)
    # Keys unused (n_programs = every program is a query-side one): the arguments the launcher passes for them.
    positional = (
        x,
        theta,
        theta,
        out_buffer,
        *x.stride()[:3],
        heads,
        seq,
        0,
        batch * heads,
        x,
        out_buffer,
        *x.stride()[:3],
        heads,
        seq,
    )
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_R=configs.TRANSFORM_ROWS, HAS_DELTA=False, MAGNITUDE=0)
    compiled = prepass._pope_transform_kernel[grid](*positional, **constexprs, num_warps=4)
    ordered = positional + tuple(constexprs.values())
    direct_grid = (*grid, 1)
    host_calls = {
        "transform via run()": lambda: prepass._pope_transform_kernel[grid](*positional, **constexprs, num_warps=4),
        "transform compiled[]": lambda: compiled[direct_grid](*ordered),
        "torch.empty x1": lambda: torch.empty(16, device=x.device),
    }
    for name, fn in host_calls.items():
        print(f"{name:>22}: {per_call_ms(fn, args.calls, host_only=True):.4f} ms host")
    # Eager pope_attention through the custom operators' autograd instead of the autograd.Function.
    SETTINGS.eager_autograd_function = False
    both = per_call_ms(lambda: torch.autograd.backward(calls["pope triton"](), grad), args.calls)
    SETTINGS.eager_autograd_function = True
    print(f"{'via custom-op autograd':>22}: forward+backward {both:.3f} ms")
    # Where the host time of one eager fwd+bwd goes, by wall clock (no profiler): each layer's inclusive time.
    segments = {
        name: 0.0
        for name in (
            "pope_attention (forward)",
            "_check_inputs",
            "_triton_unsupported_reason",
            "ops.triton_pope_attention",
            "ops._forward",
            "kernels.forward",
            "autograd.backward",
            "ops._backward_kernels",
            "kernels.backward",
            "kernel launches (forward)",
            "kernel launches (backward)",
        )
    }

    def timed(owner, attribute, name):
        original = getattr(owner, attribute)

        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                segments[name] += time.perf_counter() - start

        setattr(owner, attribute, wrapper)
        return original

    import pope.attention.api as attention_module

    patches = [
        (ops.fused, "_forward", "ops._forward"),
        (ops.fused, "_backward_kernels", "ops._backward_kernels"),
        (kernels, "forward", "kernels.forward"),
        (kernels, "backward", "kernels.backward"),
        (attention_module, "check_inputs", "_check_inputs"),
        (attention_module, "_triton_unsupported_reason", "_triton_unsupported_reason"),
        (ops, "triton_pope_attention", "ops.triton_pope_attention"),
    ]
    originals = [(owner, attribute, timed(owner, attribute, name)) for owner, attribute, name in patches]
    # Every kernel launch goes through direct_launch.launch: count it under the pass it is called from.
    launch = direct_launch.launch
    in_backward = [False]

    def launch_timed(*a, **kw):
        start = time.perf_counter()
        try:
            return launch(*a, **kw)
        finally:
            segments["kernel launches (backward)" if in_backward[0] else "kernel launches (forward)"] += (
                time.perf_counter() - start
            )

    direct_launch.launch = launch_timed
    backward_layer = kernels.backward

    def backward_flagged(*a, **kw):
        in_backward[0] = True
        try:
            return backward_layer(*a, **kw)
        finally:
            in_backward[0] = False

    kernels.backward = backward_flagged
    originals.append((direct_launch, "launch", launch))
    originals.append((kernels, "backward", originals[3][2]))
    for _ in range(10):
        torch.autograd.backward(calls["pope triton"](), grad)
    torch.cuda.synchronize()
    for key in segments:
        segments[key] = 0.0
    for _ in range(args.calls):
        start = time.perf_counter()
        out = attention_module.pope_attention(q, k, v, delta, causal=True, backend="triton")
        middle = time.perf_counter()
        torch.autograd.backward(out, grad)
        segments["pope_attention (forward)"] += middle - start
        segments["autograd.backward"] += time.perf_counter() - middle
    torch.cuda.synchronize()
    for owner, attribute, original in originals:
        setattr(owner, attribute, original)
    print("host time per eager fwd+bwd by layer (inclusive, ms):")
    for name, seconds in segments.items():
        print(f"{name:>26}: {seconds / args.calls * 1e3:.3f}")
    # Host time of the same loop under conditions that would explain a slow real path.
    import gc

    def loop_host_ms(fn, calls=args.calls):
        return per_call_ms(fn, calls, host_only=True)

    def fwd_bwd():
        torch.autograd.backward(attention_module.pope_attention(q, k, v, delta, causal=True, backend="triton"), grad)

    def fwd_only():
        attention_module.pope_attention(q, k, v, delta, causal=True, backend="triton")

    print("host ms per call, eager pope triton:")
    print(f"{'fwd+bwd':>40}: {loop_host_ms(fwd_bwd):.3f}")
    SETTINGS.direct_launch = False
    print(f"{'fwd+bwd, every launch via Triton':>40}: {loop_host_ms(fwd_bwd):.3f}")
    SETTINGS.direct_launch = True
    print(f"{'fwd only (grad on, output dropped)':>40}: {loop_host_ms(fwd_only):.3f}")
    with torch.no_grad():
        print(f"{'fwd only (no_grad)':>40}: {loop_host_ms(fwd_only):.3f}")
    gc.disable()
    print(f"{'fwd+bwd, gc disabled':>40}: {loop_host_ms(fwd_bwd):.3f}")
    gc.enable()
    torch.autograd.set_multithreading_enabled(False)
    print(f"{'fwd+bwd, autograd on the calling thread':>40}: {loop_host_ms(fwd_bwd):.3f}")
    torch.autograd.set_multithreading_enabled(True)
    sdpa_fwd_bwd = lambda: torch.autograd.backward(F.scaled_dot_product_attention(q, k, v, is_causal=True), grad)  # noqa: E731
    print(f"{'sdpa fwd+bwd':>40}: {loop_host_ms(sdpa_fwd_bwd):.3f}")

    class Doubling(torch.autograd.Function):  # the cheapest Python autograd.Function: one aten op each way
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    trivial = lambda: torch.autograd.backward(Doubling.apply(q), grad)  # noqa: E731
    print(f"{'trivial autograd.Function fwd+bwd':>40}: {loop_host_ms(trivial):.3f}")
    torch.autograd.set_multithreading_enabled(False)
    print(f"{'  the same, autograd on the calling thread':>40}: {loop_host_ms(trivial):.3f}")
    print(f"{'sdpa fwd+bwd, autograd on calling thread':>40}: {loop_host_ms(sdpa_fwd_bwd):.3f}")
    torch.autograd.set_multithreading_enabled(True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        torch.autograd.backward(calls["pope triton"](), grad)
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print(f"cProfile of {args.calls} pope triton forward+backward calls (tottime order):")
    print(text.getvalue()[-6000:])
    # The CUDA-runtime side of the same calls (launches, allocations, any synchronisation), per call.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            torch.autograd.backward(calls["pope triton"](), grad)
        torch.cuda.synchronize()
    print("torch.profiler, 20 pope triton forward+backward calls (self CPU time order):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
