"""Decode A/B on one GPU, one process: a previous version of the kernel module ("old") against this tree's ("head"),
the tensor-core decode kernel at GQA shapes (one query per head, 16K keys), plus SDPA over a materialised
2d-channel cache, for a raw cache (softplus in the kernel) and a cache of magnitudes (magnitude "identity").

    git show 4f519dd:src/pope/kernels/pope_flash.py > /tmp/old.py   # or a kernels package directory
    PYTHONPATH=src python3 benchmarks/experiments/decode_table_ab.py /tmp/old.py [--dtype bf16] [--default-tiles-only]
Each module runs at its default tiles and (unless --default-tiles-only) at every tile of TILES, so that a gain is
the kernel's, not a tile's. Writes $OUT/<--name>.json (default decode_ab_<dtype>).

History: benchmarks/experiments/2026-11-30-decode-phase-table/decode_table_ab_4f519dd.json and benchmarks/experiments/2026-11-30-decode-phase-table/decode_table_ab_same_tiles_4f519dd.json come from this script's first
form at 4f519dd, whose rows say "head" for 4f519dd's kernel and "table" for the shared key-phase-table kernel (then
a patch, shipped in 8575259). benchmarks/experiments/2026-11-30-decode-phase-table/fp32_decode_8575259.log and benchmarks/experiments/2026-11-30-decode-phase-table/fp16_decode_b90054b.log come from an ad-hoc equivalent of
--default-tiles-only --dtype fp32 / fp16 ("old" 4f519dd's kernel, "new" that commit's).
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import pope.kernels as head
from pope.kernels.host import block_d

SHAPES = [(8, 32, 8, 16384, 128), (8, 32, 4, 16384, 64), (8, 64, 8, 16384, 128), (8, 16, 4, 16384, 64)]
TILES = {128: [(32, 4, 3), (32, 4, 2), (64, 4, 2), (64, 8, 2), (64, 8, 3), (16, 4, 3)],
         64: [(64, 8, 3), (64, 4, 2), (128, 8, 2), (32, 4, 3), (64, 8, 2)]}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def load(name, path):
    """A kernel module (an old single file) or package (a src/pope/kernels directory) from path."""
    from pope.testing import load_kernels

    return load_kernels(path, name)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="path of the kernel module to compare against")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--default-tiles-only", action="store_true")
    parser.add_argument("--name", default=None, help="output file name without .json")
    parser.add_argument("--old-label", default="old", help="what to call the other module in the rows")
    args = parser.parse_args(argv)
    old = load("old_pope_flash", args.old)
    dtype = DTYPES[args.dtype]
    rows = []
    for B, Hq, Hkv, Nk, d in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(B, Hq, 1, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(B, Hkv, Nk, d, device="cuda", dtype=dtype) for _ in range(2))
        delta = -2 * math.pi * torch.rand(Hq, d, device="cuda")
        theta = head.frequencies(d, 10000.0, q.device)
        bd = block_d(d)
        kp = head.transform(k, theta, None, position_offset=0, magnitude="softplus").view(B, Hkv, Nk, 2 * bd)
        qp = head.transform(q, theta, delta, position_offset=Nk - 1, magnitude="softplus").view(B, Hq, 1, 2 * bd)
        ms = do_bench(lambda: F.scaled_dot_product_attention(qp, kp, v, scale=d ** -0.5, enable_gqa=Hq > Hkv),
                      warmup=25, rep=100, return_mode="median")
        rows.append(dict(shape=(B, Hq, Hkv, Nk, d), dtype=args.dtype, what="materialised+sdpa", ms=ms))
        print(rows[-1], flush=True)
        tiles = [{}] + ([] if args.default_tiles_only else
                        [dict(block_n=bn, num_warps=w, stages=s) for bn, w, s in TILES[d]])
        for magnitude in ("identity", "softplus"):
            opts = dict(causal=True, softmax_scale=d ** -0.5, q_offset=Nk - 1, magnitude=magnitude,
                        method="tensor_cores")
            reference, _ = old.decode_forward(q, k, v, delta, theta, **opts)
            for extra in tiles:  # both modules at the same tiles, side by side
                for label, module in ((args.old_label, old), ("head", head)):
                    try:
                        out, _ = module.decode_forward(q, k, v, delta, theta, **opts, **extra)
                        diff = (out.float() - reference.float()).abs().max().item()
                        ms = do_bench(lambda: module.decode_forward(q, k, v, delta, theta, **opts, **extra),  # noqa: B023
                                      warmup=25, rep=100, return_mode="median")
                    except Exception as error:  # a tile that does not fit
                        ms, diff = float("nan"), repr(error)[:160]
                    rows.append(dict(shape=(B, Hq, Hkv, Nk, d), dtype=args.dtype, what=f"{label} {magnitude}",
                                     extra=extra, ms=ms, max_abs_diff_vs_old=diff))
                    print(rows[-1], flush=True)
    name = args.name or f"decode_ab_{args.dtype}"
    with open(os.path.join(os.environ.get("OUT", "."), name + ".json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
