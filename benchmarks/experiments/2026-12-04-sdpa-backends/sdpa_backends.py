"""Which kernel does PyTorch's default SDPA run on this GPU, and how fast is each backend?

benchmarks/attention.py's `sdpa` row calls F.scaled_dot_product_attention with PyTorch's default backend choice, and
its ratios are read as "against FlashAttention-2". On the H200 (torch 2.11) that row's d=128 forward took 0.47 ms at
4x16x4096x128 while the Gluon experiment's SDPA forced to the FLASH_ATTENTION backend took 0.91 ms on the same shape.
This script times the default and each forced backend (forward, forward+backward; bf16, causal) and names the CUDA
kernels the default launches (torch.profiler), so the benchmark's baseline can be named correctly.

    PYTHONPATH=src python3 benchmarks/experiments/2026-12-04-sdpa-backends/sdpa_backends.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import subprocess
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(4, 16, 16, 4096, 64), (4, 16, 16, 4096, 128), (2, 32, 8, 4096, 128)]  # B, Hq, Hkv, N, d
BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def inputs(batch, hq, hkv, n, d):
    g = torch.Generator(device="cuda").manual_seed(0)
    make = lambda h: torch.randn(batch, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    return [t.requires_grad_() for t in (make(hq), make(hkv), make(hkv))], make(hq)


def call(backend, q, k, v):
    """Causal SDPA restricted to ``backend`` (None: PyTorch's own choice)."""
    with sdpa_kernel(backend) if backend is not None else nullcontext():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def kernels_of(backend, q, k, v, grad):
    """CUDA kernel names launched by one forward+backward, in launch order, duplicates dropped."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call(backend, q, k, v).backward(grad)
        torch.cuda.synchronize()
    names = []
    for event in prof.events():
        if event.device_type.name == "CUDA" and event.name not in names:
            names.append(event.name)
    return [n[:120] for n in names]


def attention_kernels(names):
    """The names that look like attention kernels (flash, fmha, cudnn, sm90 ...), else all of them."""
    keys = ("flash", "fmha", "cudnn", "attention", "sm90", "mha", "fwd", "bwd")
    return [n for n in names if any(key in n.lower() for key in keys)] or names


def main() -> None:
    import triton

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_backends.py: no CUDA GPU here; run it on the GPU machine (it times CUDA kernels)")
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cudnn": torch.backends.cudnn.version(), "commit": commit or None}
    print(env, flush=True)
    rows = []
    for shape in SHAPES:
        (q, k, v), grad = inputs(*shape)
        for name, backend in BACKENDS.items():
            row = {"shape": "x".join(map(str, shape)), "backend": name}
            try:
                row["fwd_ms"] = triton.testing.do_bench(lambda: call(backend, q, k, v), warmup=10, rep=50,
                                                        return_mode="median")
                row["fwd_bwd_ms"] = triton.testing.do_bench(lambda: call(backend, q, k, v).backward(grad), warmup=10,
                                                            rep=50, grad_to_none=[q, k, v], return_mode="median")
                row["kernels"] = kernels_of(backend, q, k, v, grad)
            except Exception as error:  # a backend that refuses the shape is a result too
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "sdpa_backends.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print("\n| shape (B x Hq x Hkv x N x d) | backend | fwd ms | fwd+bwd ms | attention kernels (first 3) |\n|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['shape']} | {row['backend']} | - | - | {row['error']} |")
        else:
            print(f"| {row['shape']} | {row['backend']} | {row['fwd_ms']:.3f} | {row['fwd_bwd_ms']:.3f} | "
                  f"{'; '.join(attention_kernels(row['kernels'])[:3])} |")


if __name__ == "__main__":
    main()
