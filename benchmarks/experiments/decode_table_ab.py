"""Experiment: the shipped tensor-core decode kernel vs the shared-key-phase-table variant
(decode_shared_phase_table.patch applied to a copy of the kernel module), plus materialised 2d-channel cache + SDPA,
GQA shapes, one process:
    cp src/pope/kernels/pope_flash.py /tmp/decode_table.py
    patch /tmp/decode_table.py benchmarks/experiments/decode_shared_phase_table.patch
    PYTHONPATH=src python3 benchmarks/experiments/decode_table_ab.py /tmp/decode_table.py   (writes $OUT/decode_table_ab.json)"""
import importlib.util
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


table = load("decode_table", sys.argv[1])
from pope.kernels import pope_flash as head  # noqa: E402

SHAPES = [(8, 32, 8, 16384, 128), (8, 32, 4, 16384, 64), (8, 64, 8, 16384, 128), (8, 16, 4, 16384, 64)]
TILES = {128: [(32, 4, 3), (32, 4, 2), (64, 4, 2), (64, 8, 2), (64, 8, 3), (16, 4, 3)],
         64: [(64, 8, 3), (64, 4, 2), (128, 8, 2), (32, 4, 3), (64, 8, 2)]}
rows = []
for B, Hq, Hkv, Nk, d in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(B, Hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, Nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    delta = -2 * math.pi * torch.rand(Hq, d, device="cuda")
    theta = head.frequencies(d, 10000.0, q.device)
    bd = head._block_d(d)
    kp = head.transform(k, theta, None, position_offset=0, magnitude="softplus").view(B, Hkv, Nk, 2 * bd)
    qp = head.transform(q, theta, delta, position_offset=Nk - 1, magnitude="softplus").view(B, Hq, 1, 2 * bd)
    ms = do_bench(lambda: F.scaled_dot_product_attention(qp, kp, v, scale=d ** -0.5, enable_gqa=Hq > Hkv),
                  warmup=25, rep=100, return_mode="median")
    rows.append(dict(shape=(B, Hq, Hkv, Nk, d), what="materialised+sdpa", ms=ms))
    print(rows[-1], flush=True)
    for magnitude in ("identity", "softplus"):  # identity = the model's cache of magnitudes
        opts = dict(causal=True, softmax_scale=d ** -0.5, q_offset=Nk - 1, magnitude=magnitude, method="tensor_cores")
        reference, _ = head.decode_forward(q, k, v, delta, theta, **opts)
        # Both kernels over the same tiles: a gain must come from the kernel, not from the tile.
        candidates = [(label, module, {}) for label, module in (("head", head), ("table", table))] + [
            (label, module, dict(block_n=bn, num_warps=w, stages=s))
            for bn, w, s in TILES[d] for label, module in (("head", head), ("table", table))]
        for label, module, extra in candidates:
            try:
                out, _ = module.decode_forward(q, k, v, delta, theta, **opts, **extra)
                diff = (out.float() - reference.float()).abs().max().item()
                ms = do_bench(lambda: module.decode_forward(q, k, v, delta, theta, **opts, **extra),
                              warmup=25, rep=100, return_mode="median")
            except Exception as error:  # a tile that does not fit
                ms, diff = float("nan"), repr(error)[:160]
            rows.append(dict(shape=(B, Hq, Hkv, Nk, d), what=f"{label} {magnitude}", extra=extra, ms=ms,
                             max_abs_diff_vs_head=diff))
            print(rows[-1], flush=True)
out_dir = os.environ.get("OUT", ".")
json.dump(rows, open(os.path.join(out_dir, os.environ.get("AB_NAME", "decode_table_ab") + ".json"), "w"), indent=1, default=str)
