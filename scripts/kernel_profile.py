"""Drive the fused PoPE kernels for a profiler: forward + backward at one shape, a few times.

A developer tool. Nothing is timed here; run it under Nsight Compute to read where a kernel's time goes (the
profiler writes DIR/profile.ncu-rep), e.g.

    ncu --clock-control none -k regex:_pope_ --launch-skip 4 --launch-count 4 -o DIR/profile \
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \
        python3 scripts/kernel_profile.py --shape 4x16x4096x64

Each iteration launches the k' pre-pass and the forward kernel, then the k' pre-pass, dq kernel, q' pre-pass
and dk/dv kernel (the first iteration compiles: skip its launches). With --decode Q:KV (e.g. 32:8), one decode
step instead: one query per head against a cache of N keys (magnitudes f(k), as the model caches them), i.e. a
decode kernel and the combine kernel per iteration.
"""

from __future__ import annotations

import argparse

import torch

import pope.kernels as kernels


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4x16x4096x64", help="BxHxNxd (MHA, causal)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--decode", default=None, help="query heads:key heads, e.g. 32:8 (H in --shape is ignored)")
    args = parser.parse_args(argv)
    batch, heads, seq, head_dim = (int(x) for x in args.shape.split("x"))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    if args.decode:
        n_q_heads, n_kv_heads = (int(x) for x in args.decode.split(":"))
        q = torch.randn(batch, n_q_heads, 1, head_dim, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, n_kv_heads, seq, head_dim, device="cuda", dtype=dtype) for _ in range(2))
        delta = -6.28 * torch.rand(n_q_heads, head_dim, device="cuda")
        theta = kernels.frequencies(head_dim, 10000.0, "cuda")
        for _ in range(args.iters):
            kernels.decode_forward(
                q, k, v, delta, theta, causal=True, softmax_scale=head_dim**-0.5, q_offset=seq - 1, magnitude="identity"
            )
        torch.cuda.synchronize()
        return
    q, k, v, do = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype) for _ in range(4))
    delta = -6.28 * torch.rand(heads, head_dim, device="cuda")
    theta = kernels.frequencies(head_dim, 10000.0, "cuda")
    options = dict(causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus")
    for _ in range(args.iters):
        out, lse = kernels.forward(q, k, v, delta, theta, **options)
        kernels.backward(do, q, k, v, delta, out, lse, theta, **options)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
