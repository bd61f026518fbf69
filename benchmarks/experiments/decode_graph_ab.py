"""Decode A/B in CUDA-graph replay: kernel modules side by side in one process, with their error against float64.

Why graphs: an eager decode call launches three to four kernels, and at d = 64 the GPU waits on the host between
them, so eager do_bench medians of the same call read ~0.095 or 0.16-0.20 ms from one run to the next
(docs/kernels.md, decode) while the kernels themselves repeat within 2% (torch.profiler). Replaying a captured
call times the GPU work alone.

    PYTHONPATH=src python3 benchmarks/experiments/decode_graph_ab.py --module new=/tmp/new/src/pope/kernels \
        [--dtype bf16] [--magnitudes identity,softplus] [--rounds 5]
Each shape is one query per head against Nk cached keys (the model's cache holds magnitudes f(k): magnitude
"identity" with q and k positive; "softplus": raw keys). Rows: SDPA over a materialised 2d-channel cache (q', k'
made once, outside the timing), then each module's decode_forward. Rounds alternate the providers; the median of
the rounds' per-replay times is reported. Errors: max |out - exact| with exact the float64 reference, next to the
pure-PyTorch reference's own error in the same dtype (the 2x rule). Writes $OUT/<--name>.json.
"""
import argparse
import inspect
import itertools
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F

from pope.attention import reference_pope_attention
import pope.kernels as head
from pope.kernels.host import block_d

from decode_table_ab import DTYPES, SHAPES, load  # this folder: the same shapes and module loader


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream, as torch.cuda.graph asks)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def replay_ms(graph, replays=50):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", default=[], help="name=path of a kernel module to compare")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--magnitudes", default="identity,softplus")
    parser.add_argument("--shapes", default=None, help="e.g. 8x32x8x16384x128,8x32x4x16384x64 (B x Hq x Hkv x Nk x d)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiles", default=None,
                        help="also time each module at these decode tiles, e.g. 64,4,2;32,4,3 (block_n,warps,stages)")
    parser.add_argument("--keep-table", action="store_true",
                        help="also time modules whose decode_forward can keep its key-phase table with it kept")
    parser.add_argument("--name", default="decode_graph_ab")
    args = parser.parse_args(argv)
    modules = {"head": head}
    for item in args.module:
        name, path = item.split("=", 1)
        modules[name] = load(f"ab_{name}", path)
    dtype = DTYPES[args.dtype]
    shapes = SHAPES if args.shapes is None else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for B, Hq, Hkv, Nk, d in shapes:
        for magnitude in args.magnitudes.split(","):
            torch.manual_seed(0)
            q64 = torch.randn(B, Hq, 1, d, device="cuda", dtype=torch.float64)
            k64 = torch.randn(B, Hkv, Nk, d, device="cuda", dtype=torch.float64)
            if magnitude == "identity":  # the model's cache: magnitudes f(q), f(k) (positive), rounded to dtype
                q64, k64 = F.softplus(q64), F.softplus(k64)
            q, k = q64.to(dtype), k64.to(dtype)
            v = torch.randn(B, Hkv, Nk, d, device="cuda", dtype=dtype)
            delta = -2 * math.pi * torch.rand(Hq, d, device="cuda")
            theta = head.frequencies(d, 10000.0, q.device)
            options = dict(base=10000.0, causal=True, softmax_scale=d ** -0.5, q_offset=Nk - 1, magnitude=magnitude,
                           rotary_dim=None)
            exact = reference_pope_attention(q.double(), k.double(), v.double(), delta.double(), **options)
            reference_error = (reference_pope_attention(q, k, v, delta, **options).double() - exact).abs().max().item()
            bd = block_d(d)
            kp = head.transform(k, theta, None, position_offset=0, magnitude=magnitude).view(B, Hkv, Nk, 2 * bd)
            qp = head.transform(q, theta, delta, position_offset=Nk - 1, magnitude=magnitude).view(B, Hq, 1, 2 * bd)
            calls = {"materialised+sdpa": lambda: F.scaled_dot_product_attention(
                qp, kp, v, scale=d ** -0.5, enable_gqa=Hq > Hkv)}
            errors = {}
            variants = [("", {})] + [
                (f" tile {t}", dict(zip(("block_n", "num_warps", "stages"), map(int, t.split(",")))))
                for t in (args.tiles.split(";") if args.tiles else [])]
            for (module_name, module), (label, extra) in itertools.product(modules.items(), variants):
                keep = [False] + ([True] if args.keep_table and "keep_phase_table" in
                                  inspect.signature(module.decode_forward).parameters else [])
                for kept in keep:
                    name = module_name + label + (" kept table" if kept else "")
                    opts = dict(causal=True, softmax_scale=d ** -0.5, q_offset=Nk - 1, magnitude=magnitude, **extra,
                                **({"keep_phase_table": True} if kept else {}))
                    out, _ = module.decode_forward(q, k, v, delta, theta, **opts)
                    errors[name] = (out.double() - exact).abs().max().item()
                    calls[name] = lambda module=module, opts=opts: module.decode_forward(q, k, v, delta, theta, **opts)
            graphs = {name: graph_of(fn) for name, fn in calls.items()}
            times = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, graph in graphs.items():
                    times[name].append(replay_ms(graph))
            for name in calls:
                row = dict(shape=f"{B}x{Hq}x{Hkv}x{Nk}x{d}", dtype=args.dtype, magnitude=magnitude, provider=name,
                           ms=statistics.median(times[name]), rounds=times[name],
                           error=errors.get(name), reference_error=reference_error)
                rows.append(row)
                ratio = row["ms"] / statistics.median(times["materialised+sdpa"])
                error = "" if name not in errors else (
                    f"  error {errors[name]:.2e} = {errors[name] / reference_error:.2f}x the reference's")
                print(f"{row['shape']:>18s} {args.dtype} {magnitude:9s} {name:30s} {row['ms']:.4f} ms "
                      f"({ratio:.2f}x materialised){error}", flush=True)
            del graphs, exact
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), args.name + ".json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
