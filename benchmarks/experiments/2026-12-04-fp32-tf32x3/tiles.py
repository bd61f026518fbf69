"""Which fp32 tiles suit tf32x3 dots? The fp32 tiles (pope.kernels.configs.TILES) were chosen for exact FMA dots;
compiled with tf32x3 for sm_90a they spill 200-1,150 instructions in their loops, while tiles of 16 query rows
spill little or nothing (README.md, `scripts/kernel_registers.py --dtype fp32 --precision tf32x3`). This times each
candidate tile of each kernel on a GPU, fp32 inputs at PyTorch's "highest" (the package's tf32x3 dots), causal:
fwd = the forward with that tile; dq / dkdv = the whole backward with that kernel's tile changed. The first
candidate of each list is the shipped tile (TILES' shared fp32 entry; tf32x3 dots have taken pope.kernels.configs.
TF32X3_TILES since this ran), so every row's ratio is against it. The fastest tile of each kernel
is then checked by the 2x rule (pope.testing.check_within_rule): its results against float64, beside
pope.attention's pure-PyTorch reference in fp32.

    PYTHONPATH=src python3 benchmarks/experiments/2026-12-04-fp32-tf32x3/tiles.py          # on a GPU, ~3 min
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/experiments/2026-12-04-fp32-tf32x3/tiles.py --smoke

Prints one row per (shape, kernel, tile): median ms (triton.testing.do_bench) and the ratio to the shipped tile,
then the fastest tile per (kernel, head dim) and its 2x-rule check; exits 1 if a check fails or a shipped tile
does not run. --smoke: one tiny shape, two tiles each, on CPU through the interpreter (it checks the script, not
the speed).
"""
import argparse
import math
import sys

import torch

import pope.kernels as kernels
from pope.kernels.configs import MEASURED_ARCHITECTURE, TILES
from pope.attention import reference_pope_attention
from pope.testing import GRADIENT_NAMES, attention_inputs, check_within_rule, outputs_and_gradients


def shipped(kind, bucket):
    """The fp32 tile the package runs `kind` with (on the H200's architecture)."""
    return tuple(TILES[kind][(MEASURED_ARCHITECTURE, bucket, torch.float32)])


# Spill-light at compile time: 16-row tiles, and the few larger ones that compile to wgmma (Hopper's warpgroup
# tensor-core instructions). The comments give each tile's spill instructions in loops (README.md's tile grid).
CANDIDATES = {
    64: {"fwd": [shipped("fwd", 64), (16, 32, 4, 1), (16, 64, 8, 1), (16, 16, 4, 1),  # 201, 0, 0, 0
                 (128, 16, 8, 1), (64, 16, 4, 1)],  # 35 and 53, wgmma
         "dq": [shipped("dq", 64), (16, 16, 8, 1), (16, 32, 8, 1), (16, 64, 8, 1),  # 313, 0, 5, 20
                (16, 32, 4, 1)],  # 41
         "dkdv": [shipped("dkdv", 64), (16, 16, 8, 1), (32, 16, 8, 1), (16, 16, 4, 1)]},  # 1147, 137, 203, 215
    128: {"fwd": [shipped("fwd", 128), (16, 64, 8, 1), (16, 32, 8, 1),  # 269, 238, 247
                  (128, 16, 8, 1), (64, 16, 4, 1)],  # 510 and 526, wgmma
          "dq": [shipped("dq", 128), (16, 16, 8, 1), (16, 32, 8, 1), (128, 16, 8, 1)],  # 1090, 356, 436, 970 wgmma
          "dkdv": [shipped("dkdv", 128), (16, 16, 8, 1), (32, 16, 8, 1)]},  # 1054, 171, 278
}
SHAPES = [(4, 16, 4096, 64), (2, 16, 4096, 128)]  # B, H, N, d
SMOKE_SHAPES = [(1, 2, 40, 32)]


def inputs(batch, heads, seq, head_dim, device):
    """float64 (q, k, v, delta, grad_out) as the kernel checks draw them (pope.testing.attention_inputs, seed 0)."""
    generator = torch.Generator(device=device).manual_seed(0)
    return attention_inputs(batch, heads, heads, seq, seq, head_dim, generator=generator, device=device)


def run(kind, tile, q, k, v, do, delta, theta, opts, out=None, lse=None):
    """The launch a kind's tile changes: the forward, or the whole backward with that kernel's tile."""
    if kind == "fwd":
        return kernels.forward(q, k, v, delta, theta, config=tile, **opts)
    if out is None:
        out, lse = kernels.forward(q, k, v, delta, theta, **opts)
    tiles = {"dq_config": tile} if kind == "dq" else {"dkdv_config": tile}
    return kernels.backward(do, q, k, v, delta, out, lse, theta, **tiles, **opts)


def check(kind, tile, shape, device):
    """The 2x rule at one shape (B, H, N, d): this tile's results (out for fwd, the four gradients for dq / dkdv)
    against float64, beside pope.attention's pure-PyTorch reference in fp32 (its error is the rule's yardstick)."""
    q, k, v, delta, grad_out = inputs(*shape, device)
    head_dim = shape[-1]
    options = dict(base=10000.0, causal=True, softmax_scale=head_dim ** -0.5, q_offset=0, magnitude="softplus",
                   rotary_dim=None)
    truth, plain = (outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, dtype, options)
                    for dtype in (torch.float64, torch.float32))
    theta = kernels.frequencies(head_dim, 10000.0, q.device)
    opts = dict(causal=True, softmax_scale=options["softmax_scale"], q_offset=0, magnitude="softplus")
    results = run(kind, tile, *(t.float() for t in (q, k, v, grad_out, delta)), theta, opts)
    checked = slice(0, 1) if kind == "fwd" else slice(1, 5)  # out, or dq, dk, dv, d_delta
    ours = results[:1] if kind == "fwd" else results
    return [(name, check_within_rule(a, b, t, torch.float32))
            for name, a, b, t in zip(GRADIENT_NAMES[checked], ours, plain[checked], truth[checked])]


def rule_check(kind, tile, head_dim, smoke, device):
    """(passed, "name error vs reference's, ..."): `check` at (1, 2, 1000, head_dim), or 40 rows with smoke."""
    rows = check(kind, tile, (1, 2, 40 if smoke else 1000, head_dim), device)
    errors = ", ".join(f"{name} {row['kernel']:.2g} vs {row['reference']:.2g}" for name, row in rows)
    return all(row["ok"] for _, row in rows), errors


def timing(script, smoke):
    """(device, bench): bench(fn) runs fn once (compiling it), then gives its median ms by triton.testing.do_bench;
    with smoke, the CPU and a bench that only runs fn (NaN ms). Prints the GPU's name; bench is None (and a line
    says why) when there is no GPU and no smoke."""
    if smoke:
        def run_once(fn):
            fn()
            return float("nan")
        return "cpu", run_once
    if not torch.cuda.is_available():
        print(f"{script}: needs a CUDA GPU (or pass --smoke with TRITON_INTERPRET=1)", file=sys.stderr)
        return "cuda", None
    from triton.testing import do_bench

    def bench(fn):
        fn()  # compile outside the timed region
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    return "cuda", bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one tiny shape, two tiles each (the interpreter)")
    args = parser.parse_args()
    device, bench = timing("tiles.py", args.smoke)
    if bench is None:
        return 2
    torch.set_float32_matmul_precision("highest")
    print("shape (B, H, N, d) | kernel | tile (BM, BN, warps, stages) | ms | / shipped")
    best, failed = {}, 0
    for shape in SMOKE_SHAPES if args.smoke else SHAPES:
        head_dim = shape[-1]
        q, k, v, delta, do = (t.float() for t in inputs(*shape, device))
        theta = kernels.frequencies(head_dim, 10000.0, q.device)
        opts = dict(causal=True, softmax_scale=head_dim ** -0.5, q_offset=0, magnitude="softplus")
        out, lse = kernels.forward(q, k, v, delta, theta, **opts)
        for kind, tiles in CANDIDATES[64 if head_dim <= 64 else 128].items():
            shipped_ms = None
            for tile in tiles[:2] if args.smoke else tiles:
                try:
                    ms = bench(lambda: run(kind, tile, q, k, v, do, delta, theta, opts, out, lse))
                except Exception as error:  # a tile can exceed shared memory: a row saying so, the rest still run
                    print(f"{shape} | {kind} | {tile} | {type(error).__name__}: {str(error)[:100]} | -")
                    failed += tile == tiles[0]  # but the shipped tile must run
                    continue
                shipped_ms = ms if shipped_ms is None else shipped_ms
                print(f"{shape} | {kind} | {tile} | {ms:.3f} | {ms / shipped_ms:.2f}", flush=True)
                if not ms > best.get((kind, shape), (math.inf,))[0]:
                    best[(kind, shape)] = (ms, tile)
    print("fastest tile per (kernel, shape), checked by the 2x rule against float64 at (1, 2, 1000, d):")
    for (kind, shape), (ms, tile) in best.items():
        ok, errors = rule_check(kind, tile, shape[-1], args.smoke, device)
        failed += not ok
        print(f"{shape} | {kind} | {tile} | {ms:.3f} ms | within 2x: {ok} ({errors})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
