"""Attention benchmark: the fused PoPE Triton kernels against the alternatives, one GPU, one run.

Shapes (B, H, N, d): (8,12,1024,64), (4,16,4096,64), (2,16,8192,64), (1,16,16384,64), (4,16,4096,128), and the
GQA shapes of Llama models written B x Hq x Hkv x N x d: (2,32,8,4096,128), (1,32,8,8192,128), (2,32,4,4096,128)
(issue 22); bf16, causal. Providers, side by side in the same process:
    sdpa               F.scaled_dot_product_attention without positional encoding, PyTorch's default backend
                       choice (GQA shapes with enable_gqa=True, as every provider below that calls SDPA). Not
                       FlashAttention-2 on a Hopper GPU with cuDNN 9: there PyTorch picks cuDNN's sm90 kernel
                       (a profiler names it)
    cudnn sdpa         the same restricted to the cuDNN backend (torch.nn.attention.sdpa_kernel); a row is left out,
                       with the error printed, where this torch has no cuDNN attention for the shape
    flash sdpa         the same restricted to the FLASH_ATTENTION backend (PyTorch's FlashAttention-2 kernels): the
                       FlashAttention-2 baseline that "1.5x sdpa = FlashAttention-2 efficiency" assumed
    rope+sdpa          rotate-half RoPE in eager PyTorch (cos/sin tables cached, as models do) + SDPA
    rope compiled+sdpa the same rotation through torch.compile (one fused kernel per tensor and direction, what a
                       torch.compile user gets) + SDPA: the stricter RoPE baseline
    pope materialized  pope.attention's reference: 2d-channel q'/k' built in eager PyTorch + SDPA
    pope-pytorch       PoPE_pytorch 0.2.1's fused Triton kernel (flash_attn, its (B, N, H, d) layout;
                       autotuning off unless --pope-pytorch-autotune, to keep the run short)
    pope triton        this project's kernels via pope_attention(backend="triton")
    pope cudnn         pope_attention(backend="cudnn"): the Triton pre-pass, cuDNN's fused attention on q', k' (through
                       SDPA, d_qk = 2d, d_v = d) and the Triton pass from dq', dk' back to dq, dk, d(delta)
    cudnn on q'k'      cuDNN's fused attention alone on q', k' made beforehand (leaves): the library kernel's own time
                       on PoPE's math, the bar a fused PoPE kernel is held to (no pre- or post-pass)
Per provider: forward and forward+backward median time (triton.testing.do_bench), peak memory allocated
above the inputs during forward+backward, and TFLOP/s with the provider's own attention FLOPs: PoPE
forward 6*B*H*N^2*d (the QK product has 2d channels), standard 4*B*H*N^2*d, halved when causal;
backward 2.5x forward. Targets, as ratios in this run (targets(): each stated MET or MISSED and by how much):
pope triton fwd+bwd <= 1.5x sdpa at d = 64 and N >= 4096 (issue 5), <= 1.6x at d > 64 and N >= 4096 and at the GQA
shapes (issue 22), the same limits against flash sdpa (what the issues meant by "FlashAttention-2 efficiency"; on
the H200 the default sdpa is cuDNN's faster kernel, so both are stated), at 1K tokens no slower relative to sdpa
than before the GQA work (EARLIER_RATIOS), <= 1.0x rope+sdpa and rope compiled+sdpa; peak memory <= 1.15x sdpa;
>= 20x faster than pope-pytorch. Rows of providers since removed (REMOVED_PROVIDERS) in older CSVs are left out
of the tables and targets, and the summary says so.

With --decode: one query against a long KV cache (generation), through the split-K decode kernels over a
raw d-channel cache and over a cache of magnitudes f(k) (what the model's KV cache holds), vs SDPA over a
materialised 2d-channel k' cache (q' precomputed: a lower bound for that approach) and vs RoPE's SDPA
over a d-channel cache. --decode-only skips the attention shapes.

With --autograd-calling-thread every provider's backward runs on the calling thread instead of autograd's
CUDA device thread (shape labels say so): at short sequences eager PoPE is host-bound, and most of that
host time is its Python backward running on the device thread. With --cuda-graph the timings are CUDA-graph
replays (triton.testing.do_bench_cudagraph): what each provider costs the GPU, with no host overhead at all.

With --varlen: packed variable-length batches (flash-attn's varlen layout; lengths drawn from a fixed seed, summing
to about 32K tokens; GQA 32/8, d = 64 and 128; bf16 causal): pope_attention_varlen's single packed launch per kernel
vs one pope_attention call per sequence vs pope_attention over the padded batch (B, H, longest, d), and SDPA over
the padded batch (no positional encoding) as the reference point; forward and forward+backward ms and real
tokens/s, appended to OUT/attention_varlen.csv and plotted to OUT/attention_varlen.png. --varlen-only skips
everything else.

    PYTHONPATH=src python benchmarks/attention.py [--decode] [--varlen] [--out benchmarks/results]
Appends to OUT/attention.csv (and OUT/decode.csv) with GPU, versions, commit and date; plots OUT/attention.png (and
OUT/decode.png; --plot-decode [COMMIT] re-plots a decode.csv without a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import math
import os
import sys

import torch
import torch.nn.functional as F

SHAPES = [
    (8, 12, 1024, 64),
    (4, 16, 4096, 64),
    (2, 16, 8192, 64),
    (1, 16, 16384, 64),
    (4, 16, 4096, 128),
    (2, 32, 8, 4096, 128),
    (1, 32, 8, 8192, 128),
    (2, 32, 4, 4096, 128),
]  # (B, H, N, d) or (B, Hq, Hkv, N, d)
PROVIDERS = [
    "sdpa",
    "cudnn sdpa",
    "flash sdpa",
    "rope+sdpa",
    "rope compiled+sdpa",
    "pope materialized",
    "pope-pytorch",
    "pope triton",
    "pope cudnn",
    "cudnn on q'k'",
]
# Providers of earlier runs whose code is gone: the atomic backward (deterministic=False, issue 22), slower than the
# default at every shape on an H200 and removed (docs/kernels.md, "The atomic backward that lost"). Their rows in
# committed CSVs are history: summary_from leaves them out and says how many.
REMOVED_PROVIDERS = ("pope triton atomic", "pope varlen packed atomic")
# pope triton's fwd+bwd / sdpa's before the GQA and d=128 work of issue 22 (one H200), where the target is "no
# slower than before" (the 1K-token shapes): compared as ratios to this run's sdpa, which moves less between runs
# than ms do.
EARLIER_RATIOS = {"8x12x1024x64": 3.29}
DECODE_SHAPES = [
    (8, 16, 16, 1024, 64),
    (8, 16, 16, 4096, 64),
    (8, 16, 16, 16384, 64),
    (4, 16, 16, 65536, 64),
    (8, 16, 16, 16384, 128),
    (8, 32, 8, 16384, 128),
    (8, 32, 4, 16384, 64),
]  # (B, Hq, Hkv, Nk, d)
BASE = 10000.0


def attention_flops(batch, heads, seq, head_dim, *, pope: bool, causal: bool = True) -> tuple[float, float]:
    """(forward, forward+backward) FLOPs of the attention core."""
    forward = (6 if pope else 4) * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    return forward, forward * 3.5


def _rope_tables(seq, head_dim, device, dtype):
    from pope.frequencies import angles, rope_frequencies

    phase = angles(torch.arange(seq, device=device), rope_frequencies(head_dim, BASE, device=device))  # (N, d/2) fp32
    phase = torch.cat([phase, phase], dim=-1)
    return phase.cos().to(dtype), phase.sin().to(dtype)


def _rope_rotate(x, cos, sin):
    """Rotate-half RoPE of x (B, H, N, d) with (N, d) cos/sin tables in x's dtype."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def make_provider(name, q, k, v, delta, *, autotune_pope_pytorch=False):
    """A zero-argument callable computing the causal attention output from the given leaves: q (B, Hq, N, d),
    k/v (B, Hkv, N, d), Hkv dividing Hq (SDPA-based providers get enable_gqa=True when Hkv < Hq)."""
    seq, head_dim = q.shape[2], q.shape[3]
    gqa = q.shape[1] != k.shape[1]
    if name == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if name in ("cudnn sdpa", "flash sdpa"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.CUDNN_ATTENTION if name == "cudnn sdpa" else SDPBackend.FLASH_ATTENTION

        def one_backend_sdpa():  # the backward runs the backend the forward chose (its autograd node)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

        return one_backend_sdpa
    if name in ("rope+sdpa", "rope compiled+sdpa"):
        cos, sin = _rope_tables(seq, head_dim, q.device, q.dtype)
        if name == "rope+sdpa":
            rotate = _rope_rotate
        else:
            # One graph per input shape (q and k differ under GQA): more shapes than dynamo's default limit of 8,
            # past which it would silently run the rotation eagerly; raise the limit and fail instead of that.
            import torch._dynamo.config as dynamo_config

            dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 64)
            if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
                dynamo_config.fail_on_recompile_limit_hit = True
            rotate = torch.compile(_rope_rotate, fullgraph=True, dynamic=False)

        def rope_sdpa():
            return F.scaled_dot_product_attention(
                rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True, enable_gqa=gqa
            )

        return rope_sdpa
    if name == "pope materialized":
        from pope.attention import reference_pope_attention

        return lambda: reference_pope_attention(
            q,
            k,
            v,
            delta,
            base=BASE,
            causal=True,
            softmax_scale=head_dim**-0.5,
            q_offset=0,
            magnitude="softplus",
            rotary_dim=None,
        )
    if name == "pope-pytorch":
        if gqa:
            raise ValueError("pope-pytorch 0.2.1's flash_attn takes as many key/value heads as query heads (no GQA)")
        if not autotune_pope_pytorch:
            os.environ["POPE_NO_AUTOTUNE"] = "1"
        from PoPE_pytorch.triton_pope_flash_attn import flash_attn

        from pope.frequencies import angles, pope_frequencies

        freqs = angles(torch.arange(seq, device=q.device), pope_frequencies(head_dim, BASE, device=q.device))
        # Its layout is (B, N, H, d): hand it that layout (a model using it would produce it directly).
        q_t, k_t, v_t = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        provider = lambda: flash_attn(q_t, k_t, v_t, freqs=freqs, pope_bias=delta, causal=True)  # noqa: E731
        provider.leaves = [q_t, k_t, v_t, delta]
        provider.transposed = True
        return provider
    if name == "pope triton":
        from pope.attention import pope_attention

        return lambda: pope_attention(q, k, v, delta, base=BASE, causal=True, backend="triton")
    if name == "pope cudnn":
        from pope.attention import pope_attention

        return lambda: pope_attention(q, k, v, delta, base=BASE, causal=True, backend="cudnn")
    if name == "cudnn on q'k'":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from pope import kernels
        from pope.frequencies import pope_turn_words

        theta = pope_turn_words(head_dim, BASE, device=q.device)
        with torch.no_grad():
            q_wide, k_wide = kernels.transform_queries_and_keys(
                q, k, theta, delta.detach(), q_offset=0, magnitude="softplus"
            )
        q_wide, k_wide = q_wide.requires_grad_(), k_wide.requires_grad_()

        def library_kernel():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(
                    q_wide, k_wide, v, is_causal=True, scale=head_dim**-0.5, enable_gqa=gqa
                )

        library_kernel.leaves = [q_wide, k_wide, v]
        return library_kernel
    raise ValueError(f"unknown provider {name!r}; choose from {PROVIDERS}")


def parse_shape(text: str) -> tuple:
    """'BxHxNxd' or 'BxHqxHkvxNxd' (GQA) -> a tuple of ints; a clear error for anything else."""
    try:
        shape = tuple(int(x) for x in text.strip().split("x"))
    except ValueError:
        shape = ()
    if len(shape) not in (4, 5) or min(shape) < 1 or (len(shape) == 5 and shape[1] % shape[2]):
        raise ValueError(
            f"a shape is BxHxNxd or BxHqxHkvxNxd with Hkv dividing Hq, e.g. 4x16x4096x128 or "
            f"2x32x8x4096x128; got {text!r}"
        )
    return shape


def heads_of(shape) -> tuple:
    """(B, Hq, Hkv, N, d) of a (B, H, N, d) or (B, Hq, Hkv, N, d) shape."""
    return (shape[0], shape[1], shape[1], *shape[2:]) if len(shape) == 4 else tuple(shape)


def bench_provider(name, shape, *, autotune_pope_pytorch=False, cuda_graph=False):
    from triton.testing import do_bench, do_bench_cudagraph

    batch, heads, kv_heads, seq, head_dim = heads_of(shape)
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(batch, h, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for h in (heads, kv_heads, kv_heads)
    )
    delta = (-2 * math.pi * torch.rand(heads, head_dim, device="cuda")).requires_grad_()
    provider = make_provider(name, q, k, v, delta, autotune_pope_pytorch=autotune_pope_pytorch)
    leaves = getattr(provider, "leaves", [q, k, v, delta])
    grad_out = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    grad_out = grad_out if getattr(provider, "transposed", False) else grad_out.transpose(1, 2).contiguous()

    def forward_backward():
        torch.autograd.backward(provider(), grad_out)

    forward_backward()  # compile / autotune outside the timed region
    torch.cuda.synchronize()
    for leaf in leaves:
        leaf.grad = None
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    forward_backward()
    torch.cuda.synchronize()
    peak_mb = (torch.cuda.max_memory_allocated() - before) / 2**20
    if cuda_graph:  # GPU time only: many calls captured in one CUDA graph and replayed, no host work in between
        fwd_ms = do_bench_cudagraph(provider, rep=100, return_mode="median")
        fwd_bwd_ms = do_bench_cudagraph(forward_backward, rep=100, grad_to_none=leaves, return_mode="median")
    else:
        fwd_ms = do_bench(provider, warmup=25, rep=100, return_mode="median")
        fwd_bwd_ms = do_bench(forward_backward, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
    pope = name.startswith("pope") or name.endswith("on q'k'")  # 2d-channel scores
    flops_fwd, flops_fwd_bwd = attention_flops(batch, heads, seq, head_dim, pope=pope)
    return {
        "shape": "x".join(map(str, shape)),
        "provider": name,
        "fwd_ms": fwd_ms,
        "fwd_bwd_ms": fwd_bwd_ms,
        "peak_mb": peak_mb,
        "fwd_tflops": flops_fwd / fwd_ms / 1e9,
        "fwd_bwd_tflops": flops_fwd_bwd / fwd_bwd_ms / 1e9,
    }


# (name, (low, high) of the lengths drawn uniformly, or a single length) at about VARLEN_TOKENS tokens per batch.
VARLEN_DISTRIBUTIONS = [("uniform 128-4096", (128, 4096)), ("uniform 64-1024", (64, 1024)), ("all 2048", (2048, 2048))]
VARLEN_HEADS = [(32, 8, 64), (32, 8, 128)]  # (Hq, Hkv, d)
VARLEN_TOKENS = 32768
VARLEN_PROVIDERS = ["pope varlen packed", "pope per-sequence calls", "pope padded batch", "sdpa padded batch"]


def varlen_lengths(low: int, high: int, total: int = VARLEN_TOKENS, seed: int = 0) -> list[int]:
    """Sequence lengths uniform in [low, high] (fixed seed) until they sum to about `total` (the last one cut)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(int(torch.randint(low, high + 1, (), generator=generator)), total - sum(lengths)))
    return lengths


def bench_varlen(distribution: str, lengths: list[int], n_q_heads: int, n_kv_heads: int, head_dim: int) -> list[dict]:
    """Rows (fwd / fwd+bwd ms, real tokens per second) of VARLEN_PROVIDERS on one packed batch."""
    from triton.testing import do_bench

    from pope.attention import pope_attention, pope_attention_varlen

    torch.manual_seed(0)
    total, batch, longest = sum(lengths), len(lengths), max(lengths)
    starts = [sum(lengths[:i]) for i in range(batch)]
    cu_seqlens = torch.tensor([0, *[s + n for s, n in zip(starts, lengths)]], dtype=torch.int32, device="cuda")
    packed = [
        torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for heads in (n_q_heads, n_kv_heads, n_kv_heads)
    ]
    delta = (-2 * math.pi * torch.rand(n_q_heads, head_dim, device="cuda")).requires_grad_()

    def padded(x):  # (total, H, d) -> (B, H, longest, d), zeros past each sequence (a padded batch's layout)
        out = x.new_zeros(batch, longest, x.shape[1], head_dim)
        for b, (start, n) in enumerate(zip(starts, lengths)):
            out[b, :n] = x[start : start + n]
        return out.transpose(1, 2).detach().requires_grad_()

    padded_leaves = [padded(x) for x in packed]
    q, k, v = packed
    providers = {
        "pope varlen packed": (
            lambda: pope_attention_varlen(q, k, v, delta, cu_seqlens, cu_seqlens, longest, longest, backend="triton"),
            packed,
        ),
        "pope per-sequence calls": (
            lambda: torch.cat(
                [
                    pope_attention(
                        *(x[start : start + n].transpose(0, 1)[None] for x in packed), delta, backend="triton"
                    )[0].transpose(0, 1)
                    for start, n in zip(starts, lengths)
                ]
            ),
            packed,
        ),
        "pope padded batch": (lambda: pope_attention(*padded_leaves, delta, backend="triton"), padded_leaves),
        "sdpa padded batch": (
            lambda: F.scaled_dot_product_attention(*padded_leaves, is_causal=True, enable_gqa=True),
            padded_leaves,
        ),
    }
    rows = []
    for name, (provider, leaves) in providers.items():
        grad_out = torch.randn_like(provider())
        leaves = leaves + ([delta] if name.startswith("pope") else [])

        def forward_backward():
            torch.autograd.backward(provider(), grad_out)  # noqa: B023

        forward_backward()
        fwd_ms = do_bench(provider, warmup=25, rep=100, return_mode="median")
        fwd_bwd_ms = do_bench(forward_backward, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
        rows.append(
            {
                "distribution": distribution,
                "sequences": batch,
                "tokens": total,
                "longest": longest,
                "heads": f"{n_q_heads}/{n_kv_heads}",
                "head_dim": head_dim,
                "provider": name,
                "fwd_ms": fwd_ms,
                "fwd_bwd_ms": fwd_bwd_ms,
                "fwd_tokens_per_s": total / fwd_ms * 1e3,
                "fwd_bwd_tokens_per_s": total / fwd_bwd_ms * 1e3,
            }
        )
        print(
            f"varlen {distribution:>16} {batch:3d} seqs {n_q_heads}/{n_kv_heads} d={head_dim:<3d} {name:>24}: "
            f"fwd {fwd_ms:.3f} ms, fwd+bwd {fwd_bwd_ms:.3f} ms, {rows[-1]['fwd_bwd_tokens_per_s'] / 1e6:.2f} M "
            f"tokens/s",
            flush=True,
        )
        torch.cuda.empty_cache()
    return rows


def plot_varlen(rows, path, title):
    """Bars of forward+backward time per (distribution, heads, d) and provider."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(f"{r['distribution']}\n{r['heads']} d={r['head_dim']}" for r in rows))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(VARLEN_PROVIDERS)
    for i, provider in enumerate(VARLEN_PROVIDERS):
        times = {
            f"{r['distribution']}\n{r['heads']} d={r['head_dim']}": r["fwd_bwd_ms"]
            for r in rows
            if r["provider"] == provider
        }
        ax.bar(
            [j + i * width for j in range(len(cases))],
            [times.get(c, float("nan")) for c in cases],
            width,
            label=provider,
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, fontsize=8)
    ax.set_ylabel("forward+backward (ms)")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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


def profile_provider(name, shape):
    """torch.profiler table (CPU and CUDA time per op) of 10 forward+backward calls."""
    from torch.profiler import ProfilerActivity, profile

    batch, heads, kv_heads, seq, head_dim = heads_of(shape)
    q, k, v = (
        torch.randn(batch, h, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for h in (heads, kv_heads, kv_heads)
    )
    delta = (-2 * math.pi * torch.rand(heads, head_dim, device="cuda")).requires_grad_()
    provider = make_provider(name, q, k, v, delta)
    grad_out = torch.randn_like(q)
    for _ in range(3):
        torch.autograd.backward(provider(), grad_out)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            torch.autograd.backward(provider(), grad_out)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)


def provenance() -> dict:
    """The benchmark CSVs' provenance columns (commit from git, or POPE_GIT_COMMIT on a copy without .git)."""
    from pope.provenance import commit_label, device_name, library_versions

    versions = library_versions()
    return {
        "gpu": device_name("cuda"),
        "torch": versions["torch"],
        "triton": versions["triton"],
        "commit": commit_label() or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def append_csv(path, rows, meta):
    """Append rows (each with the provenance columns ``meta``) to the CSV at path. A file whose header lacks a
    column of the new rows is rewritten first with the union of the columns (earlier rows keep their values and
    leave the new columns empty), so a benchmark that gains a column never writes rows under the wrong header."""
    fields = list(meta) + [key for key in rows[0] if key not in meta]
    if os.path.exists(path):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header, earlier = list(reader.fieldnames or []), list(reader)
        missing = [field for field in fields if field not in header]
        if missing:
            header += missing
            with open(path + ".partial", "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=header)
                writer.writeheader()
                writer.writerows(earlier)
            os.replace(path + ".partial", path)  # the earlier rows are never half-written
        fields = header
    else:
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writeheader()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        for row in rows:
            writer.writerow({**meta, **row})


class _Tee:
    """A text stream that writes to several (the terminal and a file)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def printed_to(out_dir, name):
    """For benchmarks whose result is what they print: inside the block, stdout also goes to OUT_DIR/NAME (the
    file is rewritten) with the provenance columns on its first line; out_dir None prints only."""
    if out_dir is None:
        yield
        return
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        f.write("# " + ", ".join(f"{k}={v}" for k, v in provenance().items()) + "\n")
        with contextlib.redirect_stdout(_Tee(sys.stdout, f)):
            yield
    print(f"wrote {path}")


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    providers = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(providers)
    for i, provider in enumerate(providers):
        for ax, key in zip(axes, ["fwd_bwd_ms", "peak_mb"]):
            values = [
                next((r[key] for r in rows if r["shape"] == s and r["provider"] == provider), float("nan"))
                for s in shapes
            ]
            ax.bar([j + i * width for j in range(len(shapes))], values, width, label=provider)
    for ax, title in zip(axes, ["forward+backward (ms, log)", "peak memory above inputs (MB)"]):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=15, fontsize=8)
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle("PoPE attention, bf16 causal, one GPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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


def verdict(value: float, limit: float, *, at_least: bool = False) -> str:
    """'MET <=1.60x (0.12x under)' / 'MISSED <=1.60x by 0.93x (58%)': value against a limit (at_least: >= limit)."""
    met = value >= limit if at_least else value <= limit
    sign = ">=" if at_least else "<="
    gap = abs(value - limit)
    if met:
        return f"MET {sign}{limit:g}x ({gap:.2f}x {'over' if at_least else 'under'})"
    return f"MISSED {sign}{limit:g}x by {gap:.2f}x ({gap / limit:.0%})"


def speed_target(shape_label: str):
    """(limit, source) of pope triton's fwd+bwd / sdpa at a shape, or (None, why not): d = 64 at N >= 4096 1.5x
    (issue 5), d > 64 at N >= 4096 and every GQA shape 1.6x (issue 22)."""
    dims = [int(x) for x in shape_label.split(" ")[0].split("x")]
    seq, head_dim, gqa = dims[-2], dims[-1], len(dims) == 5 and dims[1] != dims[2]
    if gqa:
        return 1.6, "issue 22, GQA"
    if seq >= 4096:
        return (1.5, "issue 5, d=64") if head_dim <= 64 else (1.6, f"issue 22, d={head_dim}")
    return None, "no ratio target at N<4096"


def targets(rows) -> list[str]:
    """The issues' targets, each stated MET or MISSED and by how much, per shape; then a count of MET / MISSED.
    Rows of other providers (REMOVED_PROVIDERS in older CSVs) are not looked at."""
    lines = []
    by = {(r["shape"], r["provider"]): r for r in rows}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        ours = by.get((shape, "pope triton"))
        if ours is None:
            continue
        parts = []
        if (shape, "sdpa") in by:
            ratio = ours["fwd_bwd_ms"] / by[(shape, "sdpa")]["fwd_bwd_ms"]
            mem = ours["peak_mb"] / by[(shape, "sdpa")]["peak_mb"]
            limit, source = speed_target(shape)
            before = EARLIER_RATIOS.get(shape)  # (eager rows only: a labelled row's shape is not a key)
            if limit is not None:
                parts.append(f"fwd+bwd {ratio:.2f}x sdpa ({verdict(ratio, limit)}, {source})")
            elif before is not None:
                parts.append(
                    f"fwd+bwd {ratio:.2f}x sdpa (no slower than {before:.2f}x before issue 22: "
                    f"{verdict(ratio, before)})"
                )
            else:
                parts.append(f"fwd+bwd {ratio:.2f}x sdpa ({source})")
            parts.append(f"peak mem {mem:.2f}x sdpa ({verdict(mem, 1.15)})")
        if (shape, "flash sdpa") in by:
            # The issues' ratio targets were written as "FlashAttention-2 efficiency" (1.5x its time for PoPE's 1.5x
            # FLOPs); on a GPU where PyTorch's default SDPA is another kernel, this is the comparison they meant.
            ratio = ours["fwd_bwd_ms"] / by[(shape, "flash sdpa")]["fwd_bwd_ms"]
            limit, source = speed_target(shape)
            if limit is not None:
                parts.append(
                    f"{ratio:.2f}x flash sdpa ({verdict(ratio, limit)}, FlashAttention-2 efficiency, {source})"
                )
            else:
                parts.append(f"{ratio:.2f}x flash sdpa (no target)")
        if (shape, "cudnn sdpa") in by:
            parts.append(f"{ours['fwd_bwd_ms'] / by[(shape, 'cudnn sdpa')]['fwd_bwd_ms']:.2f}x cudnn sdpa (no target)")
        for rope in ("rope+sdpa", "rope compiled+sdpa"):
            if (shape, rope) in by:
                ratio = ours["fwd_bwd_ms"] / by[(shape, rope)]["fwd_bwd_ms"]
                parts.append(f"{ratio:.2f}x {rope} ({verdict(ratio, 1.0)})")
        if (shape, "pope-pytorch") in by:
            speedup = by[(shape, "pope-pytorch")]["fwd_bwd_ms"] / ours["fwd_bwd_ms"]
            parts.append(f"{speedup:.1f}x faster than pope-pytorch ({verdict(speedup, 20, at_least=True)})")
        lines.append(f"{shape}: " + "; ".join(parts))
    text = " ".join(lines)
    lines.append(f"targets: {text.count('MET <=') + text.count('MET >=')} MET, {text.count('MISSED')} MISSED")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument(
        "--shapes", default=None, help="e.g. 8x12x1024x64,2x32x8x4096x128 (BxHxNxd or BxHqxHkvxNxd; default: SHAPES)"
    )
    parser.add_argument("--decode", action="store_true", help="also run the decode benchmark")
    parser.add_argument("--decode-only", action="store_true", help="only the decode benchmark")
    parser.add_argument("--varlen", action="store_true", help="also run the packed variable-length benchmark")
    parser.add_argument("--varlen-only", action="store_true", help="only the packed variable-length benchmark")
    parser.add_argument(
        "--plot-decode",
        nargs="?",
        const="",
        default=None,
        metavar="COMMIT",
        help="only plot OUT/decode.csv's rows of COMMIT (default: its last) to OUT/decode.png; no GPU",
    )
    parser.add_argument(
        "--autograd-calling-thread",
        action="store_true",
        help="every provider's backward on the calling thread (torch.autograd."
        "set_multithreading_enabled(False)), not autograd's CUDA device thread; rows are "
        "labelled so (docs/kernels.md: eager host overhead)",
    )
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="time CUDA-graph replays of forward and forward+backward: the GPU time without host "
        "overhead (rows labelled so; pope-pytorch is left out)",
    )
    parser.add_argument("--pope-pytorch-autotune", action="store_true")
    parser.add_argument(
        "--summary-from",
        default=None,
        metavar="DIR",
        help="only print the tables and targets of DIR/attention.csv and DIR/attention_varlen.csv "
        "(all their rows: one run's --out); no GPU",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also write OUT/profile.txt: torch.profiler of pope triton fwd+bwd, first two shapes",
    )
    args = parser.parse_args(argv)
    if args.plot_decode is not None:
        plot_decode_csv(
            os.path.join(args.out, "decode.csv"), os.path.join(args.out, "decode.png"), args.plot_decode or None
        )
        return
    try:
        shapes = SHAPES if args.shapes is None else [parse_shape(s) for s in args.shapes.split(",")]
    except ValueError as error:
        raise SystemExit(f"benchmarks/attention.py: {error}") from None
    providers = args.providers.split(",")
    unknown = [name for name in providers if name not in PROVIDERS]
    if unknown:
        raise SystemExit(f"benchmarks/attention.py: unknown provider(s) {unknown}; choose from {PROVIDERS}")
    if args.summary_from is not None:
        print("\n".join(summary_from(args.summary_from)))
        return
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/attention.py needs a CUDA GPU")
    os.makedirs(args.out, exist_ok=True)
    if args.decode_only:
        shapes, args.decode = [], True
    if args.varlen_only:
        shapes, args.decode, args.varlen = [], False, True
    label = ""
    if args.autograd_calling_thread:
        torch.autograd.set_multithreading_enabled(False)
        label = " [autograd on calling thread]"
    if args.cuda_graph:
        providers = [name for name in providers if name != "pope-pytorch"]
        label += " [CUDA graph]"
    meta = provenance()
    rows = []
    for shape in shapes:
        for name in providers:
            try:
                row = bench_provider(
                    name, shape, autotune_pope_pytorch=args.pope_pytorch_autotune, cuda_graph=args.cuda_graph
                )
            except Exception as err:  # e.g. pope-pytorch not installed: say so, keep going
                print(f"{name} {shape}: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr, flush=True)
                continue
            row["shape"] += label
            rows.append(row)
            append_csv(os.path.join(args.out, "attention.csv"), [row], meta)  # row by row: a run cut short keeps them
            print(
                f"{row['shape']:>16} {name:>18}: fwd {row['fwd_ms']:.3f} ms, fwd+bwd {row['fwd_bwd_ms']:.3f} ms, "
                f"peak {row['peak_mb']:.0f} MB, {row['fwd_bwd_tflops']:.0f} TFLOP/s",
                flush=True,
            )
            torch.cuda.empty_cache()
    if args.profile:
        with open(os.path.join(args.out, "profile.txt"), "w") as f:
            for shape in shapes[:2]:
                f.write(f"pope triton fwd+bwd x10, shape {shape}\n{profile_provider('pope triton', shape)}\n\n")
    if rows:
        plot(rows, os.path.join(args.out, "attention.png"))
    decode_rows = []
    if args.decode:
        for shape in DECODE_SHAPES:
            decode_rows += bench_decode(shape)
            torch.cuda.empty_cache()
        append_csv(os.path.join(args.out, "decode.csv"), decode_rows, meta)
        plot_decode_csv(os.path.join(args.out, "decode.csv"), os.path.join(args.out, "decode.png"), meta["commit"])
    varlen_rows = []
    if args.varlen:
        for distribution, (low, high) in VARLEN_DISTRIBUTIONS:
            for n_q_heads, n_kv_heads, head_dim in VARLEN_HEADS:
                case = bench_varlen(distribution, varlen_lengths(low, high), n_q_heads, n_kv_heads, head_dim)
                append_csv(os.path.join(args.out, "attention_varlen.csv"), case, meta)  # case by case, as above
                varlen_rows += case
        plot_varlen(
            varlen_rows,
            os.path.join(args.out, "attention_varlen.png"),
            f"PoPE packed variable-length attention, bf16 causal, ~{VARLEN_TOKENS} tokens per batch, "
            f"{meta['gpu']}, commit {meta['commit']}",
        )
    print(f"\n{meta}")
    print("\n".join(rows_table(rows)))
    for r in decode_rows:
        print(
            f"decode {r['shape']:>18} {r['approach']:>46}: {r['ms']:.4f} ms (graph {r['graph_ms']:.4f}), "
            f"cache {r['cache_mb']:.0f} MB, "
            f"diff {r['max_abs_diff_vs_materialized']:.1e}"
        )
    print("\n".join(varlen_summary(varlen_rows)))
    print("\ntargets (issues 5 and 22; ratios in this run):")
    print("\n".join(targets(rows)))


def rows_table(rows) -> list[str]:
    """Lines of a fixed-width table: shape, provider, fwd / fwd+bwd ms, peak MB, fwd+bwd TFLOP/s."""
    lines = [f"{'shape':>16} {'provider':>18} {'fwd ms':>8} {'f+b ms':>8} {'peak MB':>8} {'f+b TF/s':>8}"]
    for r in rows:
        lines.append(
            f"{r['shape']:>16} {r['provider']:>18} {r['fwd_ms']:8.3f} {r['fwd_bwd_ms']:8.3f} "
            f"{r['peak_mb']:8.0f} {r['fwd_bwd_tflops']:8.0f}"
        )
    return lines


def varlen_summary(rows) -> list[str]:
    """Per packed batch (distribution, heads, d): every provider's fwd+bwd tokens/s, then packed against padded
    (issue 22: packed vs padded tokens/s)."""
    lines = []
    cases = dict.fromkeys((r["distribution"], r["heads"], r["head_dim"]) for r in rows)
    for distribution, heads, head_dim in cases:
        mine = {
            r["provider"]: r
            for r in rows
            if (r["distribution"], r["heads"], r["head_dim"]) == (distribution, heads, head_dim)
        }
        for name, r in mine.items():
            lines.append(
                f"varlen {distribution:>16} {heads} d={int(head_dim):<3d} {name:>26}: "
                f"f+b {r['fwd_bwd_ms']:8.3f} ms, {r['fwd_bwd_tokens_per_s'] / 1e6:6.2f} M tokens/s"
            )
        packed = mine.get("pope varlen packed")
        if packed is None:
            continue
        parts = [
            f"{packed['fwd_bwd_tokens_per_s'] / mine[name]['fwd_bwd_tokens_per_s']:.2f}x the tokens/s of {name}"
            for name in ("pope padded batch", "pope per-sequence calls", "sdpa padded batch")
            if name in mine
        ]
        lines.append(f"varlen {distribution} {heads} d={head_dim}: packed " + ", ".join(parts))
    return lines


def read_csv_rows(path: str) -> list[dict]:
    """A benchmark CSV's rows with its numeric columns as floats (what targets() and the summaries read)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in ("head_dim", "tokens", "sequences"):
                row[key] = int(value)
            elif key.endswith(("_ms", "_mb", "_tflops", "_per_s")):
                row[key] = float(value)
    return rows


def summary_from(directory: str) -> list[str]:
    """The tables and targets of the attention_varlen.csv and attention.csv under directory (all their rows: one
    run's --out), without a GPU, the targets last; a missing file is said so, and so are rows of REMOVED_PROVIDERS
    (older runs'), which are left out."""
    lines = []
    for name in ("attention_varlen.csv", "attention.csv"):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            lines.append(f"{path}: not written (that part did not run or measured nothing)")
            continue
        rows = read_csv_rows(path)
        first = rows[0] if rows else {}
        lines.append(
            f"{path}: {len(rows)} rows; {first.get('gpu')}, torch {first.get('torch')}, triton "
            f"{first.get('triton')}, commit {first.get('commit')}, {first.get('date')}"
        )
        removed = {}
        for row in rows:
            if row["provider"] in REMOVED_PROVIDERS:
                removed[row["provider"]] = removed.get(row["provider"], 0) + 1
        if removed:
            rows = [row for row in rows if row["provider"] not in REMOVED_PROVIDERS]
            lines.append(
                "  left out (removed providers, docs/kernels.md): "
                + ", ".join(f"{name!r} ({n} rows)" for name, n in removed.items())
            )
        if name == "attention.csv":
            # (kept short: the device output's tail; every provider's row is in the run's output and the CSV)
            lines += rows_table([r for r in rows if r["provider"] in ("sdpa", "pope triton")])
            lines += ["targets (issues 5 and 22; ratios in this run):"] + targets(rows)
        else:  # one line per packed batch here (every provider's line is in the run's own output)
            lines += [line for line in varlen_summary(rows) if ": packed " in line]
    return lines


if __name__ == "__main__":
    main()
