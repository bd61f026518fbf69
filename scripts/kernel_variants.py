"""Time versions of the kernel module side by side on one GPU: forward and backward medians per shape and tile.

A developer tool for kernel work and tile tuning: put the version to compare against in a directory (e.g.
`git archive REV src | tar -x -C old`), then

    PYTHONPATH=src python3 scripts/kernel_variants.py --module old=old/src/pope/kernels --module new=src/pope/kernels \
        --shapes 4x16x4096x64,1x16x16384x64 --dkdv 128,128,8,2 --dkdv 64,64,4,2 --out DIR

A module is a kernels package directory, or a single-file kernel module of the commits before the package
(`git show REV:src/pope/kernels/pope_flash.py > old.py`).
Each (module, shape, tile) row times its forward and backward (bf16, causal, softplus, delta)
with triton.testing.do_bench (median ms; --cuda-graph: CUDA-graph replays, GPU time without host overhead), after
checking that the module's forward output and gradients agree with the first module's to bf16 rounding. Tiles not
given are the module's defaults. Prints a table; writes DIR/kernel_variants.json. A tile that wins becomes a
POPE_KERNEL_CONFIGS file (pope.kernels.configs) for that GPU.
`TRITON_INTERPRET=1 ... --device cpu --shapes 1x2x40x32` runs it on CPU through Triton's interpreter (a check of
this script: its timings mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import triton

from pope.testing import load_kernels


def load_module(name: str, path: str):
    return load_kernels(path, f"pope_kernels_{name}")


def tile(text: str) -> tuple:
    values = tuple(int(x) for x in text.split(","))
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"a tile is BLOCK_M,BLOCK_N,warps,stages; got {text!r}")
    return values


def inputs(shape, device, seed=0):
    batch, heads, seq, head_dim = shape
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (
        torch.randn(batch, heads, seq, head_dim, device=device, dtype=torch.bfloat16, generator=g) for _ in range(4)
    )
    delta = -6.28 * torch.rand(heads, head_dim, device=device, generator=g)
    return q, k, v, do, delta


def median_ms(fn, device, cuda_graph=False) -> float:
    if device == "cuda" and cuda_graph:  # GPU time only: the launches replayed from a CUDA graph, no host work
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    if device == "cuda":
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(module, shape, device, fwd=None, dq=None, dkdv=None, cuda_graph=False):
    q, k, v, do, delta = inputs(shape, device)
    theta = module.frequencies(shape[3], 10000.0, device)
    options = dict(causal=True, softmax_scale=shape[3] ** -0.5, q_offset=0, magnitude="softplus")
    out, lse = module.forward(q, k, v, delta, theta, config=fwd, **options)
    grads = module.backward(do, q, k, v, delta, out, lse, theta, dq_config=dq, dkdv_config=dkdv, **options)
    fwd_ms = median_ms(lambda: module.forward(q, k, v, delta, theta, config=fwd, **options), device, cuda_graph)
    bwd_ms = median_ms(
        lambda: module.backward(do, q, k, v, delta, out, lse, theta, dq_config=dq, dkdv_config=dkdv, **options),
        device,
        cuda_graph,
    )
    return [out, *grads], fwd_ms, bwd_ms


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--module",
        action="append",
        required=True,
        help="NAME=PATH of a kernel version (package directory or module file)",
    )
    parser.add_argument("--shapes", default="4x16x4096x64", help="comma-separated BxHxNxd")
    parser.add_argument("--fwd", action="append", type=tile, default=[], help="forward tile (repeatable)")
    parser.add_argument("--dq", action="append", type=tile, default=[], help="dq tile (repeatable)")
    parser.add_argument("--dkdv", action="append", type=tile, default=[], help="dk/dv tile (repeatable)")
    parser.add_argument(
        "--variant-tiles-only",
        default=None,
        help="apply the tile options only to this module (others run their defaults)",
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="time CUDA-graph replays (GPU time without host overhead: short sequences)",
    )
    parser.add_argument("--out", required=True, help="directory for kernel_variants.json")
    args = parser.parse_args(argv)
    modules = [(spec.split("=", 1)[0], load_module(*spec.split("=", 1))) for spec in args.module]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for shape in shapes:
        baseline = None
        for name, module in modules:
            plans = [dict()]
            if args.variant_tiles_only in (None, name):
                plans += (
                    [dict(fwd=t) for t in args.fwd] + [dict(dq=t) for t in args.dq] + [dict(dkdv=t) for t in args.dkdv]
                )
            for plan in plans:
                try:
                    tensors, fwd_ms, bwd_ms = run(module, shape, args.device, cuda_graph=args.cuda_graph, **plan)
                except Exception as error:  # a tile that does not compile or fit: report it, go on
                    rows.append({"shape": shape, "module": name, "plan": plan, "error": repr(error)[:300]})
                    print(f"{shape} {name} {plan}: {repr(error)[:120]}", flush=True)
                    continue
                if baseline is None:
                    baseline = tensors
                # Same function: every output within a few bf16 roundings of the first module's default run.
                agree = all(
                    torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2 * b.float().abs().max().item())
                    for a, b in zip(tensors, baseline)
                    if a is not None
                )
                rows.append(
                    {
                        "shape": shape,
                        "module": name,
                        "plan": {k: list(v) for k, v in plan.items()},
                        "fwd_ms": fwd_ms,
                        "bwd_ms": bwd_ms,
                        "agrees_with_first": agree,
                    }
                )
                print(
                    f"{'x'.join(map(str, shape)):>16} {name:>8} {str(plan):<34} fwd {fwd_ms:7.3f}  bwd {bwd_ms:7.3f}"
                    f"  total {fwd_ms + bwd_ms:7.3f}  {'ok' if agree else 'DIFFERS'}",
                    flush=True,
                )
    result = {
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "modules": args.module,
        "timing": "cuda graph replay" if args.cuda_graph else "triton.testing.do_bench",
        "rows": rows,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(f"{args.out}/kernel_variants.json", "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
