"""The fp32 path's speed on a GPU: PoPE's kernels with fp32 inputs at exact dots ("highest") and under TF32 ("high",
operands rounded to TF32 first), beside bf16 and PyTorch's fp32 SDPA (no positional encoding), fwd+bwd, causal.
--truncate runs the TF32 kernels without their operand rounding (jit_math._tf32_rounded replaced by the identity,
before anything compiles): the rounding's cost is the difference between two runs, one with and one without.

    PYTHONPATH=src python benchmarks/experiments/2026-12-02-tf32-check/speed.py [--truncate] [--shapes 4x16x4096x64]

Prints one row per (shape, provider): median ms of forward + backward (triton.testing.do_bench) and the ratio to
fp32 SDPA's.
"""
import argparse
import math
import sys

import torch
import triton
import triton.language as tl  # noqa: F401  (visible to the jit function below)

import pope.kernels.jit_math as jit_math
from pope.attention import pope_attention

SHAPES = ["4x16x4096x64", "2x16x4096x128"]  # B x H x N x d


@triton.jit
def _unrounded(x):
    return x


def fwd_bwd_ms(shape: str, provider: str) -> float:
    from triton.testing import do_bench

    batch, heads, seq, head_dim = (int(n) for n in shape.split("x"))
    dtype = torch.bfloat16 if provider == "pope bf16" else torch.float32
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    delta = (-2 * math.pi * torch.rand(heads, head_dim, device="cuda")).requires_grad_()
    grad_out = torch.randn_like(q)
    torch.set_float32_matmul_precision("high" if provider == "pope fp32 tf32" else "highest")
    try:
        if provider == "sdpa fp32":
            def run():
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            def run():
                return pope_attention(q, k, v, delta, causal=True, backend="triton")

        def forward_backward():
            torch.autograd.backward(run(), grad_out)

        forward_backward()  # compile outside the timed region
        return do_bench(forward_backward, warmup=25, rep=100, grad_to_none=[q, k, v, delta], return_mode="median")
    finally:
        torch.set_float32_matmul_precision("highest")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--truncate", action="store_true", help="the TF32 kernels without their operand rounding")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="BxHxNxd, comma-separated")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("speed.py: needs a CUDA GPU (it times the compiled kernels); none is visible", file=sys.stderr)
        return 2
    if args.truncate:
        jit_math._tf32_rounded = _unrounded  # before the first compile: _dot resolves it at compile time
    providers = ["sdpa fp32", "pope fp32 exact", "pope fp32 tf32", "pope bf16"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"TF32 operands {'truncated' if args.truncate else 'rounded'}")
    print("shape | provider | fwd+bwd ms | / sdpa fp32")
    for shape in args.shapes.split(","):
        times = {provider: fwd_bwd_ms(shape, provider) for provider in providers}
        for provider, ms in times.items():
            print(f"{shape} | {provider} | {ms:.3f} | {ms / times['sdpa fp32']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
