"""benchmarks/attention.py --varlen: packed variable-length batches (lengths drawn from a fixed seed, about
VARLEN_TOKENS tokens per batch) through pope_attention_varlen's packed launch, one pope_attention call per sequence,
pope_attention over the padded batch and SDPA over the padded batch: forward and forward+backward ms and real
tokens/s per provider (bench_varlen), and their bar plot (plot_varlen, OUT/attention_varlen.png).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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
