"""The fused PoPE kernels on a CUDA GPU: correctness in bf16 / fp16 / fp32 / tf32 at the benchmark sizes, a
determinism check, and (with --sweep) timings of candidate tile configurations.

Correctness rule (pope.testing, as in the CPU tests): against float64, the kernel's output and every gradient are
off by at most 2x what pope.attention's pure-PyTorch reference makes in the same dtype (+ a rounding-sized floor
for fp32). Outputs are NaN-poisoned before each run.
The float64 reference materialises (B, H, N, N) scores, so the long shapes run with fewer heads.

    PYTHONPATH=src python scripts/gpu_kernel_check.py [--sweep] [--checks batched,varlen] [--out DIR]
        [--isolate | --no-isolate]
Packed (varlen) batches (VARLEN_SHAPES) are checked in every dtype by the same rule, plus bitwise equality with the
launchers run on each sequence alone.
A check that raises is a failed row saying what it raised, and the others still run. On a GPU (or with --isolate)
the checks run in child processes of this script: a CUDA fault (e.g. "misaligned address") is sticky, so after a
check that leaves the CUDA context broken the remaining checks run in a fresh process, and a check whose process
dies is a failed row too. (A fault surfaces at the next synchronising call: CUDA_LAUNCH_BLOCKING=1 names the launch.)
Writes DIR/gpu_kernel_check.json (DIR is made if missing) and prints a table (passed / total per check group, then
one line per failure); exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch

import pope.kernels as kernels
from pope.attention import reference_pope_attention
from pope.kernels.configs import DECODE_LANES_MAXNREG_CANDIDATES
from pope.ops import triton_pope_attention, triton_pope_attention_varlen
from pope.settings import SETTINGS, override
from pope.testing import (
    GRADIENT_NAMES,
    attention_inputs,
    check_within_rule,
    outputs_and_gradients,
    packed_inputs,
    tf32_reference,
)

# (batch, Hq, Hkv, Nq, Nk, d, causal): the benchmark sizes (fewer heads where the float64
# reference would not fit), plus GQA, decode, odd lengths and d = 32 / 48.
CHECK_SHAPES = [
    (8, 12, 12, 1024, 1024, 64, True),
    (1, 2, 2, 4096, 4096, 64, True),
    (1, 2, 2, 8192, 8192, 64, True),
    (1, 1, 1, 16384, 16384, 64, True),
    (1, 2, 2, 4096, 4096, 128, True),
    (2, 8, 2, 1000, 1000, 64, True),
    (2, 4, 4, 777, 1999, 48, False),
    (2, 8, 8, 333, 1025, 32, True),
    (4, 16, 4, 1, 5000, 128, True),
    (4, 12, 12, 7, 3001, 64, True),
    (8, 12, 12, 1, 3001, 64, True),  # one row per key head: the lanes decode kernel
    (4, 16, 16, 1, 16384, 128, True),
    # decode over a cache of magnitudes (the model's; magnitude "identity"): k times a table in the input dtype
    (4, 32, 8, 1, 16384, 128, True, "identity"),
    (4, 16, 4, 2, 5000, 64, True, "identity"),
    # long positions (exact angles): queries at q_offset 10^6 / 10^7 / 2^20 + Nk against keys 0..Nk-1
    (2, 8, 2, 1000, 1000, 64, True, "softplus", 10**6),
    (1, 2, 2, 4096, 4096, 128, True, "softplus", 10**7),
    (4, 16, 4, 1, 5000, 128, True, "softplus", 2**20 + 5000),
    (8, 12, 12, 1, 3001, 64, True, "softplus", 10**7),  # the lanes decode kernel
    (4, 32, 8, 1, 16384, 128, True, "identity", 10**7),
]
# Packed (varlen) batches, (lengths_q, lengths_k, Hq, Hkv, d, causal): one launch per kernel for all sequences;
# empty, length-1, few-query, Nq < Nk and odd-length sequences, GQA / MQA, d = 48 / 64 / 128.
VARLEN_SHAPES = [
    ([0, 1, 7, 300, 1000, 2047, 130], [5, 1, 900, 300, 1000, 2047, 130], 8, 2, 64, True),
    ([513, 0, 1, 999, 4096], [513, 0, 1, 1500, 4096], 4, 1, 128, True),
    ([100, 777, 250, 1], [300, 777, 251, 1], 4, 4, 48, False),
    ([128, 3000, 1000, 2500, 4000, 700], [128, 3000, 1000, 2500, 4000, 700], 8, 2, 128, True),
]
# fp16 and fp32 at these rows of CHECK_SHAPES (each dtype x head dim is a separate compile).
OTHER_DTYPE_ROWS = (0, 4, 6, 8, 10, 12, 14, 16, 17)
# "tf32": fp32 inputs under torch.set_float32_matmul_precision("high"), so the kernels' dots and the reference's fp32
# matmuls both run on TF32 tensor cores (pope.kernels.host.precision); the other names run at "highest". The tf32
# reference is pope.testing.tf32_reference, TF32 arithmetic (rounded operands, fp32 sums) on any device: SDPA's fp32
# fused kernels ignore TF32, and cuBLAS computes one query row's matrix-vector products in exact fp32 under TF32
# too, so neither is "the same precision" (docs/kernels.md).
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
# TRITON_INTERPRET=1 python scripts/gpu_kernel_check.py --smoke runs tiny shapes on CPU (checks this script).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


_grads = outputs_and_gradients


def check_correctness(shape, dtype_name, seed=0):
    """shape: (batch, Hq, Hkv, Nq, Nk, d, causal[, magnitude[, q_offset]]), magnitude "softplus" and q_offset
    Nk - Nq unless given."""
    batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal, *extra = shape
    magnitude = extra[0] if extra else "softplus"
    q_offset = extra[1] if len(extra) > 1 else seq_k - seq_q
    dtype = DTYPES[dtype_name]
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v, delta, grad_out = attention_inputs(
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, generator=g, device=DEVICE
    )
    options = dict(
        base=10000.0,
        causal=causal,
        softmax_scale=head_dim**-0.5,
        q_offset=q_offset,
        magnitude=magnitude,
        rotary_dim=None,
    )
    exact = _grads(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
    reference = _grads(reference_pope_attention, q, k, v, delta, grad_out, dtype, options)
    fused = _grads(triton_pope_attention, q, k, v, delta, grad_out, dtype, options)
    # A second call takes the compiled kernels directly (pope.kernels.direct_launch): it must give the same bits.
    again = _grads(triton_pope_attention, q, k, v, delta, grad_out, dtype, options)
    result = {
        "shape": shape,
        "dtype": dtype_name,
        "second_call_bitwise_equal": all(torch.equal(a, b) for a, b in zip(fused, again)),
    }
    result["passed"] = result["second_call_bitwise_equal"]
    del again
    for name, ours, theirs, truth in zip(GRADIENT_NAMES, fused, reference, exact):
        result[name] = check_within_rule(ours, theirs, truth, dtype)
        result["passed"] &= result[name]["ok"]
    del exact, reference, fused
    torch.cuda.empty_cache()
    return result


def check_varlen(shape, dtype_name, seed=0):
    """A packed batch through the packed kernels (pope.ops.triton_pope_attention_varlen) against float64 by the 2x rule (the reference
    runs one call per sequence), a second call bitwise equal, and out, dq, dk, dv bitwise equal to the launchers run
    on each sequence alone (the same block kernels; d(delta) is summed in another order, so it is not compared)."""
    from pope.attention import pope_attention_varlen

    lengths_q, lengths_k, n_q_heads, n_kv_heads, head_dim, causal = shape
    dtype = DTYPES[dtype_name]
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v, delta, grad_out, cu_q, cu_k = packed_inputs(
        lengths_q, lengths_k, n_q_heads, n_kv_heads, head_dim, generator=g, device=DEVICE
    )
    packing = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))

    def varlen(q, k, v, delta, backend):
        if backend == "reference":
            return pope_attention_varlen(q, k, v, delta, **packing, causal=causal, backend=backend)
        # (the kernels' entry point: pope_attention_varlen sends CPU tensors, the --smoke run's, to the reference)
        return triton_pope_attention_varlen(
            q,
            k,
            v,
            delta,
            *packing.values(),
            base=10000.0,
            causal=causal,
            softmax_scale=head_dim**-0.5,
            magnitude="softplus",
        )

    exact = _grads(varlen, q, k, v, delta, grad_out, torch.float64, dict(backend="reference"))
    reference = _grads(varlen, q, k, v, delta, grad_out, dtype, dict(backend="reference"))
    fused = _grads(varlen, q, k, v, delta, grad_out, dtype, dict(backend="triton"))
    again = _grads(varlen, q, k, v, delta, grad_out, dtype, dict(backend="triton"))
    result = {
        "shape": shape,
        "dtype": dtype_name,
        "varlen": True,
        "second_call_bitwise_equal": all(torch.equal(a, b) for a, b in zip(fused, again)),
    }
    del again
    # The launchers on each sequence alone (batch of one), against the packed call's rows.
    theta = kernels.frequencies(head_dim, 10000.0, q.device)
    low = [t.to(dtype) for t in (q, k, v, grad_out)]
    delta32 = delta.float()
    per_sequence_equal = True
    for b, (nq, nk) in enumerate(zip(lengths_q, lengths_k)):
        if nq == 0:
            continue
        rows_q, rows_k = (
            slice(sum(lengths_q[:b]), sum(lengths_q[: b + 1])),
            slice(sum(lengths_k[:b]), sum(lengths_k[: b + 1])),
        )
        one = [x[rows].transpose(0, 1)[None] for x, rows in zip(low, (rows_q, rows_k, rows_k, rows_q))]
        options = dict(causal=causal, softmax_scale=head_dim**-0.5, q_offset=nk - nq, magnitude="softplus")
        out, lse = kernels.forward(*one[:3], delta32, theta, **options)
        dq, dk, dv, _ = kernels.backward(one[3], *one[:3], delta32, out, lse, theta, **options)
        for ours, theirs, rows in (
            (fused[0], out, rows_q),
            (fused[1], dq, rows_q),
            (fused[2], dk, rows_k),
            (fused[3], dv, rows_k),
        ):
            per_sequence_equal &= torch.equal(ours[rows], theirs[0].transpose(0, 1))
    result["per_sequence_kernels_bitwise_equal"] = bool(per_sequence_equal)
    result["passed"] = result["second_call_bitwise_equal"] and result["per_sequence_kernels_bitwise_equal"]
    for name, ours, theirs, truth in zip(GRADIENT_NAMES, fused, reference, exact):
        result[name] = check_within_rule(ours, theirs, truth, dtype)
        result["passed"] &= result[name]["ok"]
    del exact, reference, fused
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return result


def check_determinism(shape=(2, 16, 4, 4096, 4096, 64, True)):
    batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal = shape
    torch.manual_seed(1)
    q = torch.randn(batch, n_q_heads, seq_q, head_dim, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, n_kv_heads, seq_k, head_dim, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    delta = -2 * math.pi * torch.rand(n_q_heads, head_dim, device=DEVICE)
    grad_out = torch.randn_like(q)
    options = dict(
        base=10000.0, causal=causal, softmax_scale=None, q_offset=None, magnitude="softplus", rotary_dim=None
    )
    runs = [_grads(triton_pope_attention, q, k, v, delta, grad_out, torch.bfloat16, options) for _ in range(3)]
    identical = all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))
    return {"shape": shape, "bitwise_identical_over_3_runs": identical, "passed": identical}


def check_decode_growing_cache(seq_ks=range(1000, 1040), head_dim=64):
    """Decode steps over a cache that grows a key a step (its length crossing multiples of 16, the divisibility
    Triton specialises on): the direct launches (sites keyed by direct_launch.specialization_site) give the same bits as
    Triton's own launch path, for both decode kernels."""
    torch.manual_seed(2)
    mismatches = []
    for n_q_heads, method in ((8, "lanes"), (32, "tensor_cores")):
        q = torch.randn(2, n_q_heads, 1, head_dim, device=DEVICE, dtype=torch.bfloat16).abs()
        cache_k = torch.randn(2, 8, seq_ks[-1], head_dim, device=DEVICE, dtype=torch.bfloat16).abs()
        cache_v = torch.randn_like(cache_k)
        delta = -2 * math.pi * torch.rand(n_q_heads, head_dim, device=DEVICE)
        theta = kernels.frequencies(head_dim, 10000.0, q.device)
        for seq_k in seq_ks:
            k, v = cache_k[:, :, :seq_k], cache_v[:, :, :seq_k]
            options = dict(
                causal=True,
                softmax_scale=head_dim**-0.5,
                q_offset=seq_k - 1,
                magnitude="identity",
                method=method,
                keep_phase_table=True,
            )
            outputs = []
            for direct in (True, False):
                with override(direct_launch=direct):
                    outputs.append(kernels.decode_forward(q, k, v, delta, theta, **options))
            if not all(torch.equal(a, b) for a, b in zip(*outputs)):
                mismatches.append((method, seq_k))
    return {"seq_ks": [seq_ks[0], seq_ks[-1]], "head_dim": head_dim, "mismatches": mismatches, "passed": not mismatches}


# The first entry of each list is the shipped config (pope.kernels.configs.TILES), so a sweep compares against it.
SWEEP_CANDIDATES = {
    64: {
        "fwd": [(128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)],
        "dq": [(64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 2)],
        "dkdv": [(64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 4)],
    },
    # d=128 dq / dk-dv: the tiles that compile spill-free (or nearly) since the chain rule runs in channel quarters
    # (benchmarks/experiments/2026-12-01-d128-registers): dq (64, 32, 4, 2) is the one with two programs per SM.
    128: {
        "fwd": [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 2)],
        "dq": [(128, 32, 8, 3), (128, 32, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2)],
        "dkdv": [(64, 64, 8, 3), (64, 64, 8, 2), (32, 64, 8, 3), (32, 64, 8, 2)],
    },
}


def sweep_configs(shapes=((4, 16, 4096, 64), (4, 16, 4096, 128)), kinds=None):
    """Time each candidate tile config of each kernel (bf16, causal; fwd = forward, dq / dkdv = the whole
    backward with that kernel's config changed); with apply_best, the fastest are used for the rest of the run
    (main writes them to OUT/kernel_configs.json and points POPE_KERNEL_CONFIGS at it)."""
    from triton.testing import do_bench

    rows, best = [], {}
    for batch, heads, seq, head_dim in shapes:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(batch, heads, seq, head_dim, device=DEVICE, dtype=torch.bfloat16) for _ in range(4))
        delta = -2 * math.pi * torch.rand(heads, head_dim, device=DEVICE)
        theta = kernels.frequencies(head_dim, 10000.0, q.device)
        opts = dict(causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus")
        out, lse = kernels.forward(q, k, v, delta, theta, **opts)
        for kind, configs in SWEEP_CANDIDATES[head_dim].items():
            if kinds is not None and kind not in kinds:
                continue
            timings = []
            for config in configs:
                if kind == "fwd":
                    fn = lambda: kernels.forward(q, k, v, delta, theta, config=config, **opts)  # noqa: E731
                elif kind == "dq":
                    fn = lambda: kernels.backward(do, q, k, v, delta, out, lse, theta, dq_config=config, **opts)  # noqa: E731
                else:
                    fn = lambda: kernels.backward(do, q, k, v, delta, out, lse, theta, dkdv_config=config, **opts)  # noqa: E731
                try:
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                except Exception as err:  # a config can exceed shared memory: record and move on
                    ms = float("nan")
                    print(f"  {kind} {config}: {type(err).__name__}: {str(err)[:120]}", file=sys.stderr)
                timings.append((ms, config))
                rows.append({"shape": (batch, heads, seq, head_dim), "kernel": kind, "config": config, "ms": ms})
                print(f"  sweep {(batch, heads, seq, head_dim)} {kind:5s} {config}: {ms:.3f} ms", flush=True)
            fastest = min((t for t in timings if t[0] == t[0]), default=None)
            if fastest is not None:
                best.setdefault(kind, {})[str(head_dim)] = list(fastest[1])
    return rows, best


DECODE_SWEEP_SHAPES = (
    (8, 16, 16, 16384, 64),
    (8, 16, 16, 16384, 128),
    (8, 32, 8, 16384, 128),
    (8, 32, 4, 16384, 64),
)  # (B, Hq, Hkv, Nk, d)


def sweep_decode(
    shapes=DECODE_SWEEP_SHAPES, tensor_cores_only=False, dtype_name="bf16", methods=None, cuda_graph=False
):
    """Time decode_forward's kernels, key tiles, warps and register caps on one query per head, for a raw cache
    (softplus in the kernel) and a magnitude cache (f(k) cached, magnitude "identity"). methods: a subset of
    ("tensor_cores", "lanes"); cuda_graph: time CUDA-graph replays (GPU time, no host launch cost)."""
    import itertools

    from triton.testing import do_bench, do_bench_cudagraph

    rows = []
    for batch, n_q_heads, n_kv_heads, seq_k, head_dim in shapes:
        torch.manual_seed(0)
        dtype = DTYPES[dtype_name]
        q = torch.randn(batch, n_q_heads, 1, head_dim, device=DEVICE, dtype=dtype)
        k, v = (torch.randn(batch, n_kv_heads, seq_k, head_dim, device=DEVICE, dtype=dtype) for _ in range(2))
        delta = -2 * math.pi * torch.rand(n_q_heads, head_dim, device=DEVICE)
        theta = kernels.frequencies(head_dim, 10000.0, q.device)
        tc_block_n, tc_warps, _ = kernels.decode_tile(head_dim, dtype, "tensor_cores")
        tiles = [("tensor_cores", tc_block_n, tc_warps, stages, None) for stages in (2, 3)]
        # A register cap: more programs resident per SM.
        tiles += [("tensor_cores", tc_block_n, tc_warps, 2, cap) for cap in (168, 128)]
        tiles += [
            ("tensor_cores", block_n, warps, stages, None)
            for block_n, warps, stages in (
                [(32, 4, 2), (128, 4, 2), (64, 8, 2), (64, 4, 1)]
                if head_dim <= 64
                else [(16, 4, 2), (64, 4, 2), (32, 8, 2), (32, 4, 1)]
            )
        ]
        if not tensor_cores_only:
            tiles += [
                ("lanes", block_n, warps, stages, None)
                for block_n, warps, stages in (
                    [(64, 4, 3), (32, 4, 3), (32, 4, 4), (64, 8, 3)]
                    if head_dim <= 64
                    else [(32, 4, 3), (16, 4, 3), (16, 4, 4), (32, 8, 3)]
                )
            ]
            # The lanes kernel's shipped tile uncapped (0) and under the register caps to decide on.
            lanes_tile = kernels.decode_tile(head_dim, dtype, "lanes")
            tiles += [("lanes", *lanes_tile, cap) for cap in (0, *DECODE_LANES_MAXNREG_CANDIDATES[head_dim])]
        tiles = [tile for tile in tiles if methods is None or tile[0] in methods]
        for magnitude, (method, block_n, warps, stages, maxnreg) in itertools.product(("softplus", "identity"), tiles):
            opts = dict(
                causal=True,
                softmax_scale=head_dim**-0.5,
                q_offset=seq_k - 1,
                magnitude=magnitude,
                method=method,
                block_n=block_n,
                num_warps=warps,
                stages=stages,
                maxnreg=maxnreg,
            )
            try:
                call = lambda: kernels.decode_forward(q, k, v, delta, theta, **opts)  # noqa: B023, E731
                ms = (
                    do_bench_cudagraph(call, rep=100, return_mode="median")
                    if cuda_graph
                    else do_bench(call, warmup=25, rep=100, return_mode="median")
                )
            except Exception as err:
                ms = float("nan")
                print(f"  decode {opts}: {type(err).__name__}: {str(err)[:120]}", file=sys.stderr)
            rows.append(
                {"shape": (batch, n_q_heads, n_kv_heads, seq_k, head_dim), "dtype": dtype_name, **opts, "ms": ms}
            )
            print(
                f"  decode sweep {rows[-1]['shape']} {dtype_name} {magnitude:8s} {method:12s} block_n={block_n:3d} warps={warps} "
                f"stages={stages} maxnreg={maxnreg}: "
                f"{ms:.4f} ms",
                flush=True,
            )
    return rows


SMOKE_CHECK_SHAPES = [
    (1, 2, 1, 37, 37, 32, True),
    (1, 2, 2, 5, 40, 48, False),
    (1, 2, 2, 40, 40, 64, True),
    (1, 2, 2, 40, 40, 64, True),
    (1, 4, 2, 1, 50, 64, True),
    (1, 2, 2, 3, 33, 64, True),
    (1, 2, 2, 20, 40, 48, False),
    (1, 2, 2, 20, 40, 48, False),
    (1, 4, 2, 1, 50, 64, True),
    (1, 2, 2, 7, 40, 64, True),
    (1, 2, 2, 1, 50, 64, True),
    (1, 2, 2, 1, 40, 128, True),
    (1, 8, 2, 1, 50, 128, True, "identity"),
    (1, 4, 2, 2, 45, 64, True, "identity"),
    (1, 4, 2, 24, 40, 64, True, "softplus", 10**6),
    (1, 2, 2, 20, 40, 128, True, "softplus", 10**7),
    (1, 4, 2, 1, 50, 64, True, "softplus", 2**20 + 50),
    (1, 4, 4, 1, 50, 64, True, "softplus", 10**7),
    (1, 8, 2, 1, 50, 128, True, "identity", 10**7),
]
SMOKE_VARLEN_SHAPES = [([0, 1, 5, 12, 0], [3, 1, 40, 12, 0], 2, 1, 32, True)]
CHECKS = {
    "batched": check_correctness,
    "varlen": check_varlen,
    "determinism": lambda shape, dtype_name: check_determinism(shape),
    "decode_growing_cache": lambda seq_ks, dtype_name: check_decode_growing_cache(range(*seq_ks)),
}
CORRECTNESS_GROUPS = ("batched", "varlen")
CUDA_BROKEN = 3  # a check process's exit status when a CUDA error left its context unusable


def table_rows(text: str, table: list, option: str) -> list[int]:
    """The comma-separated row numbers of `option` ('4,5'), each an index of table; one clear line otherwise."""
    try:
        rows = [int(r) for r in text.split(",")]
    except ValueError:
        rows = None
    if rows is None or not all(0 <= r < len(table) for r in rows):
        raise SystemExit(
            f"gpu_kernel_check.py: {option} takes comma-separated row numbers from 0 to {len(table) - 1}"
            f" (rows of the table it selects from); got {text!r}"
        )
    return rows


def work_items(args) -> list:
    """(group, dtype name, shape) of every check of this run, in the order they run: per dtype the --checks groups'
    rows, then the determinism check and the decode kernels' growing-cache check."""
    items = []
    checks = args.checks.split(",")
    unknown = [c for c in checks if c not in CORRECTNESS_GROUPS]
    if unknown:
        raise SystemExit(
            f"gpu_kernel_check.py: --checks takes {', '.join(CORRECTNESS_GROUPS)} (comma-separated); "
            f"got {', '.join(map(repr, unknown))}"
        )
    bf16_rows = (
        range(len(CHECK_SHAPES)) if args.bf16_rows is None else table_rows(args.bf16_rows, CHECK_SHAPES, "--bf16-rows")
    )
    other_rows = (
        OTHER_DTYPE_ROWS if args.other_rows is None else table_rows(args.other_rows, CHECK_SHAPES, "--other-rows")
    )
    varlen = (
        VARLEN_SHAPES
        if args.varlen_rows is None
        else [VARLEN_SHAPES[i] for i in table_rows(args.varlen_rows, VARLEN_SHAPES, "--varlen-rows")]
    )
    unknown = [name for name in args.dtypes.split(",") if name not in DTYPES]
    if unknown:
        raise SystemExit(
            f"gpu_kernel_check.py: --dtypes takes {', '.join(DTYPES)} (comma-separated); "
            f"got {', '.join(map(repr, unknown))}"
        )
    for dtype_name in args.dtypes.split(","):
        rows = bf16_rows if dtype_name == "bf16" else other_rows
        if "batched" in checks:
            items += [("batched", dtype_name, CHECK_SHAPES[i]) for i in rows]
        if "varlen" in checks:
            items += [("varlen", dtype_name, shape) for shape in varlen]
    items.append(
        ("determinism", "bf16", (1, 4, 2, 97, 97, 48, True) if args.smoke else (2, 16, 4, 4096, 4096, 64, True))
    )
    # (smoke: lengths 47, 48, 49 cross a multiple of 16, what Triton specialises on; each is ~1 s interpreted)
    items.append(("decode_growing_cache", "bf16", (47, 50) if args.smoke else (1000, 1040)))
    return items


def describe(result: dict) -> str:
    """One line: PASS / FAIL, what was checked and, for a failure, what failed."""
    group, dtype_name, shape = result["group"], result["dtype"], result["shape"]
    label = {
        "batched": f"{dtype_name} {shape}",
        "varlen": f"{dtype_name} varlen {shape[:2]} Hq={shape[2]} Hkv={shape[3]} d={shape[4]} causal={shape[5]}"
        if isinstance(shape, (list, tuple)) and len(shape) == 6
        else f"{dtype_name} varlen {shape}",
    }.get(group, f"{group} {shape}")
    if "error" in result:
        return f"FAIL {label}: {result['error']}"
    if not result["passed"]:
        failed = [
            f"{name} {result[name]['kernel']:.1e} > 2 x reference {result[name]['reference']:.1e}"
            for name in GRADIENT_NAMES
            if name in result and not result[name]["ok"]
        ]
        failed += [
            f"{key} False"
            for key in (
                "second_call_bitwise_equal",
                "per_sequence_kernels_bitwise_equal",
                "bitwise_identical_over_3_runs",
            )
            if result.get(key) is False
        ]
        failed += [f"mismatches {result['mismatches']}"] if result.get("mismatches") else []
        return f"FAIL {label}: " + "; ".join(failed or ["failed"])
    if group in CORRECTNESS_GROUPS:
        extra = f"per-sequence bitwise {result.get('per_sequence_kernels_bitwise_equal')} " if group == "varlen" else ""
        return f"PASS {label} {extra}" + " ".join(
            f"{n}={result[n]['kernel']:.1e}/{result[n]['reference']:.1e}" for n in GRADIENT_NAMES
        )
    if group == "determinism":
        return f"PASS {label}: bitwise identical over 3 runs"
    return f"PASS {label}: direct launches give Triton's path's bits at every cache length"


def cuda_context_broken() -> bool:
    """Whether this process can still run CUDA work (a fault such as a misaligned address is sticky: every later
    call in the process fails with it)."""
    if DEVICE != "cuda":
        return False
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device=DEVICE).add_(1).item() != 2.0
    except Exception:
        return True


def reference_backend(dtype_name: str):
    """TF32 arithmetic as the reference of the tf32 checks (pope.testing.tf32_reference); SDPA's own choice
    otherwise."""
    return tf32_reference() if dtype_name == "tf32" else contextlib.nullcontext()


def run_items(items, first: int, args, record) -> int:
    """Runs items[first:] in this process, each check's exception made a failed row (record(index, row)); returns
    the index after the last item run: len(items), or earlier when a CUDA error broke the process's context."""
    for index in range(first, len(items)):
        group, dtype_name, shape = items[index]
        try:
            if index in args.raise_in_items:
                raise RuntimeError(f"simulated failure of item {index} (--raise-in-items)")
            if index in args.die_in_items:
                os._exit(134)  # a process that dies mid-check (as a hard CUDA fault can)
            torch.set_float32_matmul_precision("high" if dtype_name == "tf32" else "highest")
            with reference_backend(dtype_name):
                row = CHECKS[group](shape, dtype_name)
        except Exception as error:
            message = str(error).strip().splitlines()
            row = {
                "shape": shape,
                "dtype": dtype_name,
                "passed": False,
                "error": f"raised {type(error).__name__}: {message[-1] if message else ''}",
            }
        row.update(group=group, dtype=dtype_name, shape=shape)
        print(describe(row), flush=True)
        record(index, row)
        if "error" in row and cuda_context_broken():
            print(
                f"  the CUDA context is broken after item {index}: the remaining checks run in a fresh process",
                flush=True,
            )
            return index + 1
    return len(items)


def run_isolated(items, argv: list) -> dict:
    """{index: row} of every item, run by child processes of this script (--first-item): a child whose CUDA context
    broke exits and the next one carries on after the item that broke it; an item whose process died is a failed
    row saying so."""
    import subprocess
    import tempfile

    rows, first = {}, 0
    with tempfile.TemporaryDirectory() as scratch:
        while first < len(items):
            path = os.path.join(scratch, f"rows-{first}.jsonl")
            with open(os.path.join(scratch, "stderr"), "w+") as stderr:
                run = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), *argv, "--first-item", str(first), "--rows-file", path],
                    stderr=stderr,
                )
                stderr.seek(0)
                errors = stderr.read()
            sys.stderr.write(errors)
            if os.path.exists(path):
                with open(path) as f:
                    for line in f:
                        index, row = json.loads(line)
                        rows[index] = dict(row, shape=items[index][2])  # (JSON made its tuples lists)
            done = max([first - 1, *rows]) + 1
            if done < len(items) and run.returncode != CUDA_BROKEN:  # died during item `done`
                group, dtype_name, shape = items[done]
                last = errors.strip().splitlines()[-1:] or [""]
                rows[done] = {
                    "group": group,
                    "dtype": dtype_name,
                    "shape": shape,
                    "passed": False,
                    "error": f"the check process died (exit status {run.returncode}): {last[0][:300]}",
                }
                print(describe(rows[done]), flush=True)
                done += 1
            first = done
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="first time candidate tile configs, install the fastest, write OUT/kernel_configs.json",
    )
    parser.add_argument(
        "--sweep-shapes", default=None, help="e.g. 8x12x1024x64,4x16x4096x64 (default 4x16x4096x{64,128})"
    )
    parser.add_argument(
        "--sweep-install",
        action="store_true",
        help="install the fastest configs for the checks below also when --sweep-shapes is given",
    )
    parser.add_argument("--sweep-kinds", default=None, help="e.g. fwd,fused (default all)")
    parser.add_argument("--decode-sweep", action="store_true", help="time decode kernel variants first")
    parser.add_argument("--bf16-rows", default=None, help="comma-separated CHECK_SHAPES rows for bf16 (default all)")
    parser.add_argument("--other-rows", default=None, help="rows for fp16/fp32 (default %s)" % (OTHER_DTYPE_ROWS,))
    parser.add_argument(
        "--varlen-rows", default=None, help="VARLEN_SHAPES rows for the varlen check, e.g. 1 (default all)"
    )
    parser.add_argument("--out", default=".", help="directory for gpu_kernel_check.json (made if missing)")
    parser.add_argument(
        "--dtypes",
        default="bf16,fp16,fp32",
        help="of bf16, fp16, fp32, tf32 (fp32 inputs, TF32 products); default %(default)s",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter smoke test)")
    parser.add_argument(
        "--checks",
        default="batched,varlen",
        help="which correctness checks: batched (CHECK_SHAPES), varlen (VARLEN_SHAPES), comma-separated",
    )
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the checks in child processes, a fresh one after a check that broke the CUDA "
        "context (default: on a GPU)",
    )
    parser.add_argument(
        "--decode-lanes-max-rows",
        type=int,
        default=None,
        help="route decode calls with up to this many rows per key head to the lanes kernel",
    )
    parser.add_argument(
        "--decode-sweep-tensor-cores-only", action="store_true", help="sweep only the tensor-core decode kernel's tiles"
    )
    parser.add_argument(
        "--decode-sweep-methods",
        default=None,
        help="decode kernels to sweep: tensor_cores, lanes or both (default both)",
    )
    parser.add_argument(
        "--decode-sweep-cuda-graph",
        action="store_true",
        help="time the decode sweep as CUDA-graph replays (GPU time without host launch cost)",
    )
    parser.add_argument("--decode-sweep-dtypes", default="bf16", help="dtypes of the decode sweep, e.g. bf16,fp32")
    parser.add_argument(
        "--decode-sweep-shapes", default=None, help="rows of DECODE_SWEEP_SHAPES to sweep, e.g. 2,3 (default all)"
    )
    # A child process of --isolate: run the items from this one on, each row appended to the rows file.
    parser.add_argument("--first-item", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rows-file", default=None, help=argparse.SUPPRESS)
    # Tests of the failure reporting: these items raise / kill their process instead of running.
    parser.add_argument(
        "--raise-in-items", type=lambda s: {int(i) for i in s.split(",")}, default=set(), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--die-in-items", type=lambda s: {int(i) for i in s.split(",")}, default=set(), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    global CHECK_SHAPES, VARLEN_SHAPES
    if args.smoke:
        CHECK_SHAPES, VARLEN_SHAPES = SMOKE_CHECK_SHAPES, SMOKE_VARLEN_SHAPES
    if args.decode_lanes_max_rows is not None:
        SETTINGS.decode_lanes_max_rows = args.decode_lanes_max_rows
    items = work_items(args)
    if args.first_item is not None:  # a child process: the checks only
        SETTINGS.poison_outputs = True
        with open(args.rows_file, "a") as rows_file:

            def record(index, row):
                rows_file.write(json.dumps([index, row], default=str) + "\n")
                rows_file.flush()

            return 0 if run_items(items, args.first_item, args, record) == len(items) else CUDA_BROKEN

    os.makedirs(args.out, exist_ok=True)  # DIR/gpu_kernel_check.json (and the sweep's configs) go in it
    started = time.time()
    sweep = None
    if args.sweep:
        shapes = (
            ((4, 16, 4096, 64), (4, 16, 4096, 128))
            if args.sweep_shapes is None
            else [tuple(int(x) for x in s.split("x")) for s in args.sweep_shapes.split(",")]
        )
        sweep, best = sweep_configs(shapes, kinds=None if args.sweep_kinds is None else args.sweep_kinds.split(","))
        path = os.path.abspath(f"{args.out}/kernel_configs.json")
        with open(path, "w") as f:
            json.dump(best, f)
        if args.sweep_shapes is None or args.sweep_install:  # the default shapes: check the fastest tiles below
            os.environ["POPE_KERNEL_CONFIGS"] = path
            print(f"fastest configs installed (POPE_KERNEL_CONFIGS={path}): {best}", flush=True)
    sweep_shapes = (
        DECODE_SWEEP_SHAPES
        if args.decode_sweep_shapes is None
        else [DECODE_SWEEP_SHAPES[int(i)] for i in args.decode_sweep_shapes.split(",")]
    )
    decode_sweep = (
        [
            row
            for dtype_name in args.decode_sweep_dtypes.split(",")
            for row in sweep_decode(
                sweep_shapes,
                args.decode_sweep_tensor_cores_only,
                dtype_name,
                None if args.decode_sweep_methods is None else args.decode_sweep_methods.split(","),
                args.decode_sweep_cuda_graph,
            )
        ]
        if args.decode_sweep
        else None
    )
    results = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter)",
        "torch": torch.__version__,
    }
    import triton

    results["triton"] = triton.__version__
    from pope.provenance import commit_label

    results["commit"] = commit_label() or "unknown"
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    isolate = DEVICE == "cuda" if args.isolate is None else args.isolate
    if isolate:  # the children get the checks' arguments (the sweeps ran here; their configs by environment)
        child_argv = [a for a in argv if a not in ("--sweep", "--decode-sweep", "--isolate")]
        rows = run_isolated(items, child_argv)
    else:
        rows = {}
        SETTINGS.poison_outputs = True
        broken_at = run_items(items, 0, args, rows.__setitem__)
        SETTINGS.poison_outputs = False
        for index in range(broken_at, len(items)):  # this process cannot run them (--isolate can)
            group, dtype_name, shape = items[index]
            rows[index] = {
                "group": group,
                "dtype": dtype_name,
                "shape": shape,
                "passed": False,
                "error": "not run: an earlier check broke this process's CUDA context (use --isolate)",
            }
            print(describe(rows[index]), flush=True)
    ordered = [rows[i] for i in range(len(items))]
    results["correctness"] = [r for r in ordered if r["group"] in CORRECTNESS_GROUPS]
    results["determinism"], results["decode_growing_cache"] = (
        next(r for r in ordered if r["group"] == group) for group in ("determinism", "decode_growing_cache")
    )
    if sweep is not None:
        results["sweep"] = sweep
    if decode_sweep is not None:
        results["decode_sweep"] = decode_sweep
    results["seconds"] = time.time() - started
    with open(f"{args.out}/gpu_kernel_check.json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    print_summary(ordered, results["seconds"])
    return 1 if any(not r["passed"] for r in ordered) else 0


def print_summary(rows: list, seconds: float) -> None:
    """The final table: passed / total per check group, then one line per failure saying what failed."""
    groups = list(dict.fromkeys(r["group"] for r in rows))
    print(f"\n{'check':22s} passed / total")
    for group in groups:
        mine = [r for r in rows if r["group"] == group]
        print(f"{group:22s} {sum(r['passed'] for r in mine):6d} / {len(mine)}")
    failed = [r for r in rows if not r["passed"]]
    for row in failed:
        print(describe(row))
    correctness = [r for r in rows if r["group"] in CORRECTNESS_GROUPS]
    determinism = next((r for r in rows if r["group"] == "determinism"), {})
    print(
        f"correctness: {sum(r['passed'] for r in correctness)}/{len(correctness)} passed "
        f"(kernel error / reference error vs float64, max abs); determinism "
        f"{'OK' if determinism.get('bitwise_identical_over_3_runs') else 'FAILED'}; {len(failed)} failed; "
        f"{seconds:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
