"""Do tiles.py's fastest fp32 tiles, taken together, beat the shipped ones, and not only under tf32x3 dots? tiles.py
changed one kernel's tile at a time under PyTorch's "highest" (tf32x3 dots). The fp32 entries of pope.kernels.
configs.TILES also serve "high" (TF32 dots), so this times fwd+bwd (causal) with every kernel on its fastest tile
at once, beside the shipped tiles and fp32 SDPA, at both precisions, and checks the combined tiles under "highest"
by the 2x rule against float64 (tiles.py's check: one kernel on its candidate tile, the others on the shipped ones).

    PYTHONPATH=src python3 benchmarks/experiments/2026-12-04-fp32-tf32x3/combined.py          # on a GPU, ~1 min
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/experiments/2026-12-04-fp32-tf32x3/combined.py --smoke

Prints one row per (shape, precision, provider): median ms (triton.testing.do_bench) and the ratio to the
shipped tiles (TILES' fp32 entries, which every fp32 launch ran with when this was run; the package has taken
PROPOSED, as pope.kernels.configs.TF32X3_TILES, for tf32x3 dots since), then the check rows; exits 1 if a check fails. --smoke: one tiny shape on CPU through the
interpreter (it checks the script, not the speed).
"""
import argparse
import sys
from pathlib import Path

import torch

import pope.kernels as kernels
from pope.kernels.configs import MEASURED_ARCHITECTURE, TILES
from pope.testing import load_kernels as load  # a module from its file, under a name of ours

HERE = Path(__file__).resolve().parent
tiles = load(str(HERE / "tiles.py"), "fp32_tiles")

# Fastest per kernel in h200-tiles-2026-12-04.txt (one kernel changed at a time).
PROPOSED = {64: {"fwd": (64, 16, 4, 1), "dq": (32, 32, 4, 1), "dkdv": (16, 16, 4, 1)},
            128: {"fwd": (16, 32, 4, 1), "dq": (128, 16, 8, 1), "dkdv": (32, 16, 8, 1)}}


def shared_fp32_tiles(head_dim):
    """TILES' fp32 tile for each kernel at this head dim (one tile for all three kernels)."""
    bucket = 64 if head_dim <= 64 else 128
    return {kind: TILES[kind][(MEASURED_ARCHITECTURE, bucket, torch.float32)] for kind in PROPOSED[bucket]}


def fwd_bwd(tile_set, q, k, v, do, delta, theta, opts):
    """Forward then backward with the given tiles per kernel."""
    out, lse = kernels.forward(q, k, v, delta, theta, config=tile_set.get("fwd"), **opts)
    return kernels.backward(do, q, k, v, delta, out, lse, theta, dq_config=tile_set.get("dq"),
                            dkdv_config=tile_set.get("dkdv"), **opts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one tiny shape (the interpreter on CPU)")
    args = parser.parse_args()
    device, bench = tiles.timing("combined.py", args.smoke)
    if bench is None:
        return 2
    print("shape (B, H, N, d) | float32 matmul precision | provider | fwd+bwd ms | / shipped tiles")
    for shape in tiles.SMOKE_SHAPES if args.smoke else tiles.SHAPES:
        head_dim = shape[-1]
        q, k, v, delta, do = (t.float() for t in tiles.inputs(*shape, device))
        theta = kernels.frequencies(head_dim, 10000.0, q.device)
        opts = dict(causal=True, softmax_scale=head_dim ** -0.5, q_offset=0, magnitude="softplus")
        proposed, shared = PROPOSED[64 if head_dim <= 64 else 128], shared_fp32_tiles(head_dim)
        for precision in ("highest", "high"):
            torch.set_float32_matmul_precision(precision)
            times = {"pope, shipped tiles": bench(lambda: fwd_bwd(shared, q, k, v, do, delta, theta, opts)),
                     "pope, proposed tiles": bench(lambda: fwd_bwd(proposed, q, k, v, do, delta, theta, opts))}
            if not args.smoke:
                qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))

                def sdpa():
                    out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
                    torch.autograd.backward(out, do)
                times["sdpa fp32"] = bench(sdpa)
            for provider, ms in times.items():
                print(f"{shape} | {precision} | {provider} | {ms:.3f} | {ms / times['pope, shipped tiles']:.2f}",
                      flush=True)
    torch.set_float32_matmul_precision("highest")
    failed = 0
    print("proposed tiles under 'highest', 2x rule against float64 at (1, 2, 1000, d):")
    for head_dim, tile_set in PROPOSED.items():
        for kind, tile in tile_set.items():
            ok, errors = tiles.rule_check(kind, tile, head_dim, args.smoke, device)
            failed += not ok
            print(f"d={head_dim} | {kind} | {tile} | within 2x: {ok} ({errors})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
