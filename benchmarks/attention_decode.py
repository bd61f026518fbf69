"""benchmarks/attention.py --decode: one query against a long KV cache (DECODE_SHAPES) through the split-K decode
kernels over a raw d-channel cache and over a magnitude cache, vs SDPA over a materialised 2d-channel cache and vs
RoPE's SDPA over a d-channel cache, each timed eagerly and as a CUDA-graph replay (bench_decode); and the decode plot
(plot_decode, OUT/decode.png; plot_decode_csv redraws it from decode.csv without a GPU, --plot-decode).
"""

from __future__ import annotations

import csv
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_providers import BASE  # noqa: E402  (same directory: the providers' RoPE/PoPE base)

DECODE_SHAPES = [
    (8, 16, 16, 1024, 64),
    (8, 16, 16, 4096, 64),
    (8, 16, 16, 16384, 64),
    (4, 16, 16, 65536, 64),
    (8, 16, 16, 16384, 128),
    (8, 32, 8, 16384, 128),
    (8, 32, 4, 16384, 64),
]  # (B, Hq, Hkv, Nk, d)


def bench_decode(shape):
    """One decode step (Nq = 1) against an Nk-key cache; returns rows for four approaches. Query-side transforms
    are made outside the timed calls for every approach (the materialised q', our magnitudes f(q)), as the caches
    are: each row times attention over the cache."""
    from triton.testing import do_bench

    from pope.attention import pope_attention
    from pope.frequencies import angles, pope_frequencies

    batch, n_q_heads, n_kv_heads, seq_k, head_dim = shape
    torch.manual_seed(0)
    dtype = torch.bfloat16
    q = torch.randn(batch, n_q_heads, 1, head_dim, device="cuda", dtype=dtype)
    k_cache, v_cache = (torch.randn(batch, n_kv_heads, seq_k, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    delta = -2 * math.pi * torch.rand(n_q_heads, head_dim, device="cuda")
    group = n_q_heads // n_kv_heads
    # Materialised 2d-channel caches, built outside the timed region.
    phase_k = angles(torch.arange(seq_k, device="cuda"), pope_frequencies(head_dim, BASE, device="cuda"))
    mag_k = F.softplus(k_cache.float())
    mag_cache = mag_k.to(dtype)
    mag_q_row = F.softplus(q.float()).to(dtype)
    k_prime = torch.cat([mag_k * phase_k.cos(), mag_k * phase_k.sin()], dim=-1).to(dtype)
    phase_q = angles(torch.tensor([seq_k - 1], device="cuda"), pope_frequencies(head_dim, BASE, device="cuda"))
    phase_q = phase_q[None] - delta[:, None, :]
    mag_q = F.softplus(q.float())
    q_prime = torch.cat([mag_q * phase_q.cos(), mag_q * phase_q.sin()], dim=-1).to(dtype)
    scale = head_dim**-0.5
    enable_gqa = group > 1
    approaches = {
        "pope triton decode (raw d-channel cache)": lambda: pope_attention(
            q, k_cache, v_cache, delta, base=BASE, causal=True, backend="triton"
        ),
        # The cache holds f(k) (d channels, content only); phases come from positions inside the kernel.
        "pope triton decode (magnitude cache)": lambda: pope_attention(
            mag_q_row, mag_cache, v_cache, delta, base=BASE, causal=True, magnitude="identity", backend="triton"
        ),
        "pope materialized cache (2d channels) + sdpa": lambda: F.scaled_dot_product_attention(
            q_prime, k_prime, v_cache, scale=scale, enable_gqa=enable_gqa
        ),
        "rope cache (d channels) + sdpa": lambda: F.scaled_dot_product_attention(
            q, k_cache, v_cache, scale=scale, enable_gqa=enable_gqa
        ),
    }
    reference = approaches["pope materialized cache (2d channels) + sdpa"]()
    rows = []
    for name, fn in approaches.items():
        out = fn()
        error = (out.float() - reference.float()).abs().max().item() if name.startswith("pope") else float("nan")
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        graph_ms = _graph_replay_ms(fn)
        cache_channels = 3 * head_dim if "2d" in name else 2 * head_dim
        cache_mb = batch * n_kv_heads * seq_k * cache_channels * 2 / 2**20
        rows.append(
            {
                "shape": "x".join(map(str, shape)),
                "approach": name,
                "ms": ms,
                "graph_ms": graph_ms,
                "cache_mb": cache_mb,
                "max_abs_diff_vs_materialized": error,
            }
        )
    return rows


def _graph_replay_ms(fn) -> float:
    """Median time of fn captured in a CUDA graph (GPU time without Python/launch overhead, as in a
    generation loop run under CUDA graphs)."""
    from triton.testing import do_bench

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=25, rep=100, return_mode="median")


def plot_decode(rows, path, title):
    """decode.csv rows of one run -> bars of each approach's CUDA-graph time per shape (log scale), and the time
    relative to SDPA over the materialised 2d-channel cache (the issue's decode target: <= 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    approaches = list(dict.fromkeys(r["approach"] for r in rows))
    graph_ms = {(r["shape"], r["approach"]): float(r["graph_ms"]) for r in rows}
    materialised = "pope materialized cache (2d channels) + sdpa"
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    width = 0.8 / len(approaches)
    for i, approach in enumerate(approaches):
        times = [graph_ms.get((s, approach), float("nan")) for s in shapes]
        ratios = [t / graph_ms.get((s, materialised), float("nan")) for t, s in zip(times, shapes)]
        for ax, values in zip(axes, (times, ratios)):
            ax.bar([j + i * width for j in range(len(shapes))], values, width, label=approach)
    for ax, name in zip(axes, ["CUDA-graph replay (ms, log)", "time / materialised cache + SDPA"]):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=15, fontsize=8)
        ax.set_title(name)
    axes[0].set_yscale("log")
    axes[1].axhline(1.0, color="black", linewidth=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_decode_csv(path_csv, path_png, commit=None):
    """Plot the decode.csv rows of one commit (default: the last commit in the file)."""
    with open(path_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path_csv} has no rows")
    commit = commit or rows[-1]["commit"]
    chosen = [r for r in rows if r["commit"] == commit]
    if not chosen:
        raise SystemExit(f"{path_csv} has no rows of commit {commit!r}")
    first = chosen[0]
    plot_decode(
        chosen,
        path_png,
        f"PoPE decode (Nq = 1 per head), bf16, {first['gpu']}, commit {commit}, {first['date']}, B x Hq x Hkv x Nk x d",
    )
