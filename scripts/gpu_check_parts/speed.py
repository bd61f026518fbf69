"""The GPU check's speed rows: each value is a ratio measured in this process, so the GPU's own speed cancels.

Attention rows are PoPE's time over a baseline's (lower is better); training-step rows are PoPE's tokens/s over
RoPE's (higher is better). Times are medians (triton.testing.do_bench for kernels; for training, the median of 20
back-to-back steps each timed by CUDA events, after the compile and warm-up steps). Attention at up to
GRAPH_TIMED_MAX_TOKENS tokens is timed as CUDA-graph replays, its rows marked "[CUDA graphs]": an eager call there
spends more time in Python and launches than on the GPU (about 1 ms against SDPA's 0.2), so an eager ratio would
measure the host, and a model step that is not host-bound sees the GPU time.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch
import torch.nn.functional as F

from pope.attention import pope_attention
from pope.data import indirect_indexing
from pope.frequencies import rope_frequencies
from pope.ops import cudnn_unsupported_reason, flash_attn_4_unsupported_reason

# (batch, Hq, Hkv, N, d): GPT-2's shape, long MHA at d = 64 and 128, a Llama GQA shape. bf16, causal.
ATTENTION_SHAPES = [(8, 12, 12, 1024, 64), (4, 16, 16, 4096, 64), (4, 16, 16, 4096, 128), (2, 32, 8, 4096, 128)]
SMOKE_ATTENTION_SHAPES = [(1, 2, 1, 64, 32)]
# Each preset's own model at a batch of about 16K tokens (the presets' own batches, where smaller).
PRESET_BATCHES = {"indirect-indexing": 64, "jsb": 4, "maestro": 8, "genome": 16}
TRAIN_STEPS = 20
WARMUP_STEPS = 5  # after compilation: CUDA-graph recording and the allocator's first growth happen here
GRAPH_TIMED_MAX_TOKENS = 1024


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


_compiled_rope = torch.compile(_rope)


def _attention_times(
    batch: int, hq: int, hkv: int, n: int, d: int, *, bench_ms, smoke: bool, device: str, cuda_graph: bool
) -> dict:
    """{provider: (forward ms, forward+backward ms)} for SDPA without PE, compiled RoPE + SDPA and PoPE: backend
    "auto" (what a user gets), and each backend it chooses from ("cudnn" and "flash-attn-4" where they can run)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, hq, n, d, device=device, dtype=dtype, generator=g, requires_grad=True)
    k, v = (torch.randn(batch, hkv, n, d, device=device, dtype=dtype, generator=g, requires_grad=True) for _ in "kv")
    delta = torch.rand(hq, d, device=device, generator=g).mul(-6.28).requires_grad_()
    grad = torch.randn_like(q)
    leaves = (q, k, v, delta)  # their gradients start from None each call, as in training
    angles = torch.outer(torch.arange(n, device=device, dtype=torch.float32), rope_frequencies(d, device=device))
    cos, sin = (torch.cat([t, t], -1) for t in (angles.cos(), angles.sin()))
    gqa = hkv != hq
    providers = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa),
        "rope": lambda: F.scaled_dot_product_attention(
            _compiled_rope(q, cos, sin), _compiled_rope(k, cos, sin), v, is_causal=True, enable_gqa=gqa
        ),
        "pope": lambda: pope_attention(q, k, v, delta, causal=True, backend="auto"),
        "pope triton": lambda: pope_attention(q, k, v, delta, causal=True, backend="triton"),
    }
    if device == "cuda" and cudnn_unsupported_reason(q, k, v, causal=True, q_offset=0) is None:
        providers["pope cudnn"] = lambda: pope_attention(q, k, v, delta, causal=True, backend="cudnn")
    # flash-attn-4 is timed eagerly only: its capture in a CUDA graph is not tried.
    flash_attn_4_runs = flash_attn_4_unsupported_reason(q, k, v, causal=True, q_offset=0) is None
    if device == "cuda" and not cuda_graph and flash_attn_4_runs:
        providers["pope flash-attn-4"] = lambda: pope_attention(q, k, v, delta, causal=True, backend="flash-attn-4")
    times = {}
    for name, fn in providers.items():
        with torch.no_grad():
            fn()  # compiles and tunes outside any CUDA-graph capture, the forward alone ...
        fn().backward(grad)  # ... and differentiated
        with torch.no_grad():
            forward = bench_ms(fn, smoke=smoke, cuda_graph=cuda_graph)
        both = bench_ms(lambda fn=fn: fn().backward(grad), smoke=smoke, cuda_graph=cuda_graph, grad_to_none=leaves)
        times[name] = (forward, both)
    return times


def attention_rows(*, bench_ms, smoke: bool, device: str):
    for batch, hq, hkv, n, d in SMOKE_ATTENTION_SHAPES if smoke else ATTENTION_SHAPES:
        cuda_graph = device == "cuda" and n <= GRAPH_TIMED_MAX_TOKENS
        times = _attention_times(
            batch, hq, hkv, n, d, bench_ms=bench_ms, smoke=smoke, device=device, cuda_graph=cuda_graph
        )
        (pope_fwd, pope_both), (sdpa_fwd, sdpa_both), rope_both = times["pope"], times["sdpa"], times["rope"][1]
        label = f"{batch}x{hq}/{hkv}x{n}x{d}"
        timing = " [CUDA graphs]" if cuda_graph else ""
        both = f"SDPA {sdpa_both:.3f}, RoPE {rope_both:.3f}, PoPE {pope_both:.3f}"
        print(f"   {label}{timing}: fwd+bwd ms {both}", flush=True)
        yield f"attention fwd {label}: PoPE / SDPA{timing}", pope_fwd / sdpa_fwd, "time ratio"
        yield f"attention fwd+bwd {label}: PoPE / SDPA{timing}", pope_both / sdpa_both, "time ratio"
        yield f"attention fwd+bwd {label}: PoPE / compiled RoPE+SDPA{timing}", pope_both / rope_both, "time ratio"
        # Each backend on its own, so that "auto" choosing one cannot hide the other's regression.
        for backend in ("triton", "cudnn", "flash-attn-4"):
            if f"pope {backend}" in times:
                fwd, both = times[f"pope {backend}"]
                print(f"   {label}: PoPE {backend} fwd {fwd:.3f} ms, fwd+bwd {both:.3f} ms", flush=True)
                yield f"attention fwd {label}: PoPE {backend} / SDPA{timing}", fwd / sdpa_fwd, "time ratio"
                yield f"attention fwd+bwd {label}: PoPE {backend} / SDPA{timing}", both / sdpa_both, "time ratio"


def _gpt_step_ms(preset: str, pe: str, batch: int, *, mode: str, smoke: bool, device: str) -> list[float]:
    """Milliseconds of each timed compiled training step (bf16 autocast, fused AdamW) of a preset's GPT on random
    tokens, in order."""
    from pope.model import GPT
    from pope.presets import get_preset

    recipe = get_preset(preset).recipe
    # Presets whose vocabulary comes from the data: indirect indexing's task vocabulary is fixed.
    vocab = {"vocab_size": indirect_indexing.VOCAB_SIZE} if preset.startswith("indirect-indexing") else {}
    config = get_preset(preset).model_config(pe=pe, **vocab)
    seq_len = recipe.seq_len
    if smoke:
        config, seq_len, batch = replace(config, n_layer=1, d_model=32, n_head=2, max_seq_len=32), 32, 2
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    compiled = torch.compile(model, mode=mode, backend="inductor" if device == "cuda" else "aot_eager")
    idx = torch.randint(0, config.vocab_size, (batch, seq_len), device=device)

    def step():
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            _, loss = compiled(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    steps = 2 if smoke else TRAIN_STEPS
    for _ in range(WARMUP_STEPS):
        step()
    if device != "cuda":
        import time

        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for event in events[1:]:
        step()
        event.record()
    torch.cuda.synchronize()
    return [begin.elapsed_time(end) for begin, end in zip(events, events[1:])]


def _pope_over_rope(preset: str, batch: int, *, mode: str, smoke: bool, device: str) -> float:
    """PoPE's tokens/s over RoPE's = RoPE's median step time over PoPE's. Medians, because the mean of 20 steps of
    the same code read 23 to 27 ms a step from one run to the next (torch.compile default mode, one H100), and a few
    slow steps do not move a median; the slowest step is printed beside it."""
    rope, pope = (_gpt_step_ms(preset, pe, batch, mode=mode, smoke=smoke, device=device) for pe in ("rope", "pope"))
    spread = ", ".join(
        f"{name} {statistics.median(times):.2f} ms/step (slowest {max(times):.2f})"
        for name, times in (("RoPE", rope), ("PoPE", pope))
    )
    print(f"   {preset} [{mode}]: {spread}", flush=True)
    return statistics.median(rope) / statistics.median(pope)


def gpt2_rows(*, bench_ms, smoke: bool, device: str):
    for mode in ("default", "reduce-overhead") if device == "cuda" else ("default",):
        value = _pope_over_rope("owt-124m", 8, mode=mode, smoke=smoke, device=device)
        yield f"GPT-2 124M train step 8x1024 [{mode}]: PoPE / RoPE tokens/s", value, "speed ratio"


def preset_rows(*, bench_ms, smoke: bool, device: str):
    for preset, batch in PRESET_BATCHES.items() if not smoke else [("jsb", 2)]:
        value = _pope_over_rope(preset, batch, mode="reduce-overhead" if device == "cuda" else "default",
                                smoke=smoke, device=device)  # fmt: skip
        yield f"{preset} model train step (CUDA graphs): PoPE / RoPE tokens/s", value, "speed ratio"


def hf_rows(*, bench_ms, smoke: bool, device: str):
    """A ~125M Llama (GPT-2 small's shape, 12 x 768) with PoPE against the same Llama with RoPE + SDPA, eager."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import pope.hf

    shape = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12)
    if smoke:
        shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    llama = LlamaConfig(vocab_size=50304, max_position_embeddings=2048, tie_word_embeddings=True, **shape)
    batch, seq = (2, 32) if smoke else (8, 1024)
    ids = torch.randint(0, llama.vocab_size, (batch, seq), device=device)
    times = {}
    for name in ("rope", "pope"):
        torch.manual_seed(0)
        if name == "rope":
            llama._attn_implementation = "sdpa"
            model = LlamaForCausalLM(llama)
        else:
            model = pope.hf.PoPELlamaForCausalLM(pope.hf.from_llama_config(llama))
        model = model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")

        def step(model=model, optimizer=optimizer):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                loss = model(ids, labels=ids, use_cache=False).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        times[name] = bench_ms(step, smoke=smoke, rep_ms=2000)  # ~45 ms eager steps: about 40 of them
        del model, optimizer
    print(f"   HF Llama 125M eager: RoPE {times['rope']:.2f} ms/step, PoPE {times['pope']:.2f} ms/step", flush=True)
    yield "HF Llama 125M train step 8x1024 (eager): PoPE / RoPE tokens/s", times["rope"] / times["pope"], "speed ratio"
