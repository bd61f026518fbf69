"""The GPU check's correctness rows: each value is the worst error over what the rule allows (<= 1 passes).

The rule (pope.testing.check_within_rule, the kernel tests' own): against float64, the kernels' output and every
gradient may be off by at most 2x what plain PyTorch (pope's reference backend) is off in the same dtype, plus a
rounding-sized floor in fp32. Inputs are fresh random draws for every row.
"""

from __future__ import annotations

import contextlib

import torch

import pope.attention.api
from pope.attention import pope_attention, pope_attention_varlen
from pope.ops import flash_attn_4_installed, triton_unsupported_reason
from pope.testing import (
    GRADIENT_NAMES,
    attention_inputs,
    check_within_rule,
    deterministic_algorithms,
    outputs_and_gradients,
    packed_inputs,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (batch, Hq, Hkv, Nq, Nk, d, q_offset or None): GPT-2's shape, GQA, head dim 128, odd lengths, long positions.
BATCHED = [
    ((8, 12, 12, 1024, 1024, 64, None), ("bf16", "fp16", "fp32")),
    ((2, 32, 8, 1024, 1024, 128, None), ("bf16", "fp16", "fp32")),
    ((2, 8, 2, 777, 1999, 64, None), ("bf16",)),
    ((2, 8, 2, 1000, 1000, 64, 10**6), ("bf16", "fp32")),
]
LIBRARY_BATCHED = [
    ((8, 12, 12, 1024, 1024, 64, None), ("bf16", "fp16")),
    ((2, 32, 8, 1024, 1024, 128, None), ("bf16", "fp16")),
    ((2, 8, 2, 777, 777, 80, None), ("bf16",)),
]
# flash-attn-4 trained at head dim 128: the backward on PoPE's own tiles (pope.ops.flash_attn_4_tiles), an odd length
FLASH_ATTN_4_TRAINED = [((2, 16, 16, 777, 777, 128, None), ("bf16", "fp16"))]
DECODE = [((4, 32, 8, 1, 8192, 128, None), ("bf16", "fp16", "fp32")), ((8, 12, 12, 1, 3001, 64, 10**7), ("bf16",))]
VARLEN = [(([0, 1, 7, 300, 1000, 2047, 130], [5, 1, 900, 300, 1000, 2047, 130], 8, 2, 64), ("bf16", "fp16", "fp32"))]
SMOKE_BATCHED = [((1, 2, 1, 17, 33, 32, None), ("bf16",))]
SMOKE_DECODE = [((1, 4, 2, 1, 40, 32, None), ("bf16",))]
SMOKE_VARLEN = [(([3, 0, 9], [5, 1, 9], 2, 1, 32), ("bf16",))]


@contextlib.contextmanager
def kernels_on_cpu():
    """--smoke: pope.attention sends CPU tensors to the reference; let the interpreted kernels take them instead, so
    the smoke run takes the GPU run's code path."""
    original = pope.attention.api._triton_unsupported_reason
    pope.attention.api._triton_unsupported_reason = lambda q, k, v, **options: triton_unsupported_reason(
        q, k, v, **options
    )
    try:
        yield
    finally:
        pope.attention.api._triton_unsupported_reason = original


def _generator(device: str) -> torch.Generator:
    """A fresh draw for every row, reproducible run to run (seeded by a counter)."""
    global _DRAWS
    _DRAWS += 1
    return torch.Generator(device=device).manual_seed(_DRAWS)


_DRAWS = 0


def worst_ratio(ours: list, theirs: list, exact: list, dtype: torch.dtype) -> float:
    """max over outputs of kernel error / allowed error (2x the reference's, plus the fp32 floor); inf if any fails
    to be finite."""
    worst = 0.0
    for mine, reference, truth in zip(ours, theirs, exact):
        result = check_within_rule(mine, reference, truth, dtype)
        if not result["ok"] and not torch.isfinite(mine).all():
            return float("inf")
        floor = 1e-5 * truth.abs().max().item() if dtype == torch.float32 else 0.0
        allowed = 2 * result["reference"] + floor
        worst = max(worst, result["kernel"] / allowed if allowed > 0 else (0.0 if result["ok"] else float("inf")))
    return worst


def batched_row(shape, dtype_name: str, device: str, *, decode: bool, backend: str = "triton") -> float:
    """decode: the output alone, no gradients (generation: the split-K decode kernels on backend "triton")."""
    batch, hq, hkv, nq, nk, d, q_offset = shape
    q, k, v, delta, grad_out = attention_inputs(batch, hq, hkv, nq, nk, d, device=device, generator=_generator(device))
    options = dict(causal=True, q_offset=q_offset)
    dtype = DTYPES[dtype_name]
    if decode:
        with torch.no_grad():
            exact, reference, ours = (
                [pope_attention(q.to(t), k.to(t), v.to(t), delta.to(dl), backend=b, **options)]
                for t, dl, b in (
                    (torch.float64, torch.float64, "reference"),
                    (dtype, torch.float32, "reference"),
                    (dtype, torch.float32, backend),
                )
            )
        return worst_ratio(ours, reference, exact, dtype)
    exact = outputs_and_gradients(
        pope_attention, q, k, v, delta, grad_out, torch.float64, {**options, "backend": "reference"}
    )
    reference = outputs_and_gradients(
        pope_attention, q, k, v, delta, grad_out, dtype, {**options, "backend": "reference"}
    )
    ours = outputs_and_gradients(pope_attention, q, k, v, delta, grad_out, dtype, {**options, "backend": backend})
    return worst_ratio(ours, reference, exact, dtype)


def deterministic_row(shape, backend: str, device: str) -> float:
    """Two differentiated bf16 calls under torch.use_deterministic_algorithms(True): 0 when output and every gradient
    are bitwise equal, 2 (a failure) when not."""
    batch, hq, hkv, nq, nk, d, q_offset = shape
    q, k, v, delta, grad_out = attention_inputs(batch, hq, hkv, nq, nk, d, device=device, generator=_generator(device))
    options = dict(causal=True, q_offset=q_offset, backend=backend)
    with deterministic_algorithms():
        first, second = (
            outputs_and_gradients(pope_attention, q, k, v, delta, grad_out, torch.bfloat16, options) for _ in "ab"
        )
    return 0.0 if all(torch.equal(a, b) for a, b in zip(first, second)) else 2.0


def varlen_row(shape, dtype_name: str, device: str) -> float:
    lengths_q, lengths_k, hq, hkv, d = shape
    q, k, v, delta, grad_out, cu_q, cu_k = packed_inputs(
        lengths_q, lengths_k, hq, hkv, d, device=device, generator=_generator(device)
    )
    packing = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    dtype = DTYPES[dtype_name]
    grads = [
        outputs_and_gradients(pope_attention_varlen, q, k, v, delta, grad_out, t, {**packing, "backend": b})
        for t, b in ((torch.float64, "reference"), (dtype, "reference"), (dtype, "triton"))
    ]
    exact, reference, ours = grads
    return worst_ratio(ours, reference, exact, dtype)


def compile_graphs_row(device: str, smoke: bool) -> float:
    """1 when PoPE's compiled GPT is one graph with no break, as RoPE's is; else the number of graphs (> 1 fails)."""
    from dataclasses import replace

    from pope.model import GPT
    from pope.presets import get_preset

    config = get_preset("owt-124m").model_config(pe="pope")
    if smoke:
        config = replace(config, n_layer=2, d_model=64, n_head=2, vocab_size=97, max_seq_len=32)
    torch._dynamo.reset()
    model = GPT(config).to(device)
    idx = torch.randint(0, config.vocab_size, (2, 32 if smoke else 256), device=device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        explanation = torch._dynamo.explain(model)(idx, idx)
    for reason in explanation.break_reasons:
        print(f"   graph break: {reason.reason}", flush=True)
    return float(explanation.graph_count + explanation.graph_break_count)


def hf_row(device: str, smoke: bool, dtype_name: str) -> float:
    """The Hugging Face PoPE Llama (GQA, head dim 64) through the kernels: logits and every parameter gradient."""
    from transformers import LlamaConfig

    import pope.hf

    size = (
        dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2)
        if smoke
        else dict(vocab_size=1024, hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8)
    )
    llama = LlamaConfig(**size, num_key_value_heads=size["num_attention_heads"] // 2, max_position_embeddings=2048)
    dtype = DTYPES[dtype_name]

    def model(backend, dtype, source=None):
        m = pope.hf.PoPELlamaForCausalLM(pope.hf.from_llama_config(llama, backend=backend, delta_init="uniform"))
        if source is not None:
            m.load_state_dict(source.state_dict())
        return m.to(device=device, dtype=dtype)

    def logits_and_grads(m):
        out = m(ids, labels=ids, use_cache=False)
        out.loss.backward()
        return [out.logits.detach(), torch.cat([p.grad.reshape(-1) for p in m.parameters()])]

    torch.manual_seed(0)
    ids = torch.randint(1, llama.vocab_size, (2, 24) if smoke else (4, 512), device=device)
    exact_model = model("reference", torch.float64)
    exact = logits_and_grads(exact_model)
    reference = logits_and_grads(model("reference", dtype, exact_model))
    ours = logits_and_grads(model("triton", dtype, exact_model))
    return worst_ratio(ours, reference, exact, dtype)


def rows(*, bench_ms, smoke: bool, device: str):
    """(check, value, unit) rows; value = worst error / allowed error (<= 1 passes)."""
    unit = "err/allowed"
    for shape, dtypes in SMOKE_BATCHED if smoke else BATCHED:
        for name in dtypes:
            yield f"kernels fwd+bwd {_label(shape)} {name}", batched_row(shape, name, device, decode=False), unit
    if device == "cuda":  # backend "cudnn": the pre-pass and its gradient around cuDNN's fused attention
        for shape, dtypes in LIBRARY_BATCHED:
            for name in dtypes:
                yield f"cudnn fwd+bwd {_label(shape)} {name}", batched_row(shape, name, device, decode=False,
                                                                           backend="cudnn"), unit  # fmt: skip
    if device == "cuda" and flash_attn_4_installed():  # backend "flash-attn-4" (optional)
        for shape, dtypes in LIBRARY_BATCHED + FLASH_ATTN_4_TRAINED:
            # A grouped-query call runs flash-attn-4's GQA forward without gradients, repeated k, v with them.
            for decode in (True, False) if shape[1] != shape[2] else (False,):
                for name in dtypes:
                    row = batched_row(shape, name, device, decode=decode, backend="flash-attn-4")
                    yield f"flash-attn-4 {'fwd' if decode else 'fwd+bwd'} {_label(shape)} {name}", row, unit
        shape = (2, 16, 16, 1024, 1024, 128, None)
        row = deterministic_row(shape, "flash-attn-4", device)
        yield f"flash-attn-4 deterministic mode {_label(shape)} bf16: repeat", row, "bitwise (0 = equal)"
    for shape, dtypes in SMOKE_DECODE if smoke else DECODE:
        for name in dtypes:
            yield f"kernels decode {_label(shape)} {name}", batched_row(shape, name, device, decode=True), unit
    for shape, dtypes in SMOKE_VARLEN if smoke else VARLEN:
        for name in dtypes:
            label = f"{len(shape[0])} seqs {sum(shape[0])} tokens Hq{shape[2]}/Hkv{shape[3]} d{shape[4]}"
            yield f"kernels varlen {label} {name}", varlen_row(shape, name, device), unit
    for name in ("bf16",) if smoke else ("bf16", "fp32"):
        yield f"hf PoPE Llama logits+grads {name}", hf_row(device, smoke, name), unit
    yield "compiled PoPE GPT: graphs + breaks (1 = one graph)", compile_graphs_row(device, smoke), "graphs"


def _label(shape) -> str:
    batch, hq, hkv, nq, nk, d, q_offset = shape
    label = f"{batch}x{hq}/{hkv}x{nq}x{nk}x{d}"
    return label + (f" at {q_offset:.0e}" if q_offset else "")


__all__ = ["GRADIENT_NAMES", "kernels_on_cpu", "rows"]
