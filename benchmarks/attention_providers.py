"""The attention providers of benchmarks/attention.py and the timing of one: the benchmark shapes (SHAPES), the
provider names (PROVIDERS) and make_provider (each provider as a zero-argument callable over the same q, k, v and
delta leaves; the RoPE providers' cos/sin tables and rotation), the attention FLOP formula, the --shapes parser,
bench_provider (forward and forward+backward medians, eager or CUDA-graph replays, peak memory, TFLOP/s) and
profile_provider (--profile's torch.profiler table). What each provider is: attention.py's docstring.
"""

from __future__ import annotations

import math
import os

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
    "flash-attn-4",
    "pope flash-attn-4",
    "flash-attn-4 on q'k'",
]


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

        q_wide, k_wide = (t.requires_grad_() for t in _wide_queries_and_keys(q, k, delta))

        def library_kernel():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(
                    q_wide, k_wide, v, is_causal=True, scale=head_dim**-0.5, enable_gqa=gqa
                )

        library_kernel.leaves = [q_wide, k_wide, v]
        return library_kernel
    if name.startswith("flash-attn-4") or name == "pope flash-attn-4":
        return _flash_attn_4_provider(name, q, k, v, delta)
    raise ValueError(f"unknown provider {name!r}; choose from {PROVIDERS}")


def _wide_queries_and_keys(q, k, delta):
    """PoPE's q', k' (B, H, N, 2d) of the leaves, made once by the pre-pass outside any graph: the "on q'k'" providers'
    inputs, so that they time the library kernel alone."""
    from pope import kernels
    from pope.frequencies import pope_turn_words

    theta = pope_turn_words(q.shape[-1], BASE, device=q.device)
    with torch.no_grad():
        return kernels.transform_queries_and_keys(q, k, theta, delta.detach(), q_offset=0, magnitude="softplus")


def _flash_attn_4_provider(name, q, k, v, delta):
    """The flash-attn-4 providers (the optional pip package flash-attn-4: CuTe DSL kernels, (B, N, H, d) layout).
    "flash-attn-4": its kernel without positional encoding, on (B, N, H, d) leaves. "flash-attn-4 on q'k'": on q', k'
    made beforehand, (B, N, H, 2d) leaves, d-channel v. "pope flash-attn-4": pope_attention(backend="flash-attn-4")
    (the pre-pass, flash-attn-4 on q', k', the gradient pass)."""
    from flash_attn.cute import flash_attn_func  # ImportError when not installed: the rows are left out

    head_dim = q.shape[-1]
    if name == "pope flash-attn-4":
        from pope.attention import pope_attention

        def pope_flash_attn_4():
            return pope_attention(q, k, v, delta, base=BASE, causal=True, backend="flash-attn-4")

        return pope_flash_attn_4
    if name == "flash-attn-4":
        leaves = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
        scale = None
    else:
        q_wide, k_wide = _wide_queries_and_keys(q, k, delta)
        leaves = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q_wide, k_wide, v.detach())]
        scale = head_dim**-0.5

    def library_kernel():
        return flash_attn_func(*leaves, softmax_scale=scale, causal=True)[0]

    library_kernel.leaves = leaves
    library_kernel.transposed = True
    # flash-attn-4 refuses the backward of a grouped-query call on q', k' (d_qk = 2d != d_v): that row times the
    # forward alone (bench_provider). Backend "flash-attn-4" repeats k, v to as many heads as q there.
    if name != "flash-attn-4" and q.shape[1] != k.shape[1]:
        library_kernel.no_backward = "flash-attn-4's grouped-query backward needs d_qk = d_v (q', k' have 2d channels)"
    return library_kernel


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

    no_backward = getattr(provider, "no_backward", None)  # why the provider has no backward here, or None
    if no_backward is not None:
        print(f"{name} {shape}: no backward ({no_backward}); forward only", flush=True)
        return _forward_only_row(name, shape, provider, cuda_graph=cuda_graph)
    forward_backward()  # compile / autotune outside the timed region
    torch.cuda.synchronize()
    for leaf in leaves:
        leaf.grad = None
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    forward_backward()
    torch.cuda.synchronize()
    peak_mb = (torch.cuda.max_memory_allocated() - before) / 2**20
    fwd_ms = _median_ms(provider, cuda_graph=cuda_graph)
    fwd_bwd_ms = _median_ms(forward_backward, cuda_graph=cuda_graph, grad_to_none=leaves)
    return _row(name, shape, fwd_ms, fwd_bwd_ms, peak_mb)


def _median_ms(fn, *, cuda_graph: bool, grad_to_none=None) -> float:
    """Median ms of fn(): with cuda_graph GPU time only (many calls captured in one CUDA graph and replayed, no host
    work in between), else eager calls timed by CUDA events."""
    from triton.testing import do_bench, do_bench_cudagraph

    if cuda_graph:
        return do_bench_cudagraph(fn, rep=100, grad_to_none=grad_to_none, return_mode="median")
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def _forward_only_row(name, shape, provider, *, cuda_graph):
    """The row of a provider whose backward is refused: its forward timed without autograd (an inference call, so a
    call the backend takes only when no gradient is asked for runs), fwd+bwd ms and peak memory NaN."""
    with torch.no_grad():
        provider()
        torch.cuda.synchronize()
        fwd_ms = _median_ms(provider, cuda_graph=cuda_graph)
    return _row(name, shape, fwd_ms, math.nan, math.nan)


def _row(name, shape, fwd_ms, fwd_bwd_ms, peak_mb) -> dict:
    batch, heads, _, seq, head_dim = heads_of(shape)
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
