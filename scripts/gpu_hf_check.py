"""pope.hf on a CUDA GPU: PoPELlamaForCausalLM through the Triton kernels against the reference backend, and
the training throughput of a ~125M-parameter PoPE Llama vs the same Llama with RoPE + SDPA.

Correctness (the kernel tests' rule): against the same weights in float64 (reference backend), the Triton
model's logits, parameter gradients and cached-decode logits are off by at most 2x what the reference
backend makes in the same dtype, plus a rounding-sized floor (4 eps(dtype) x the largest float64 value).
Greedy generation (fp32, 32 tokens) must give the same tokens with both backends; 20 AdamW steps (bf16
autocast) must lower the loss, with final losses of the two backends within 5% of each other.
Throughput: tokens/s of a full training step (forward, backward, fused AdamW; bf16 autocast, fp32 weights;
batch x 1024 tokens), optionally under torch.compile.

    PYTHONPATH=src python scripts/gpu_hf_check.py [--compile] [--out DIR]
    TRITON_INTERPRET=1 PYTHONPATH=src python scripts/gpu_hf_check.py --smoke    (CPU, tiny: that the script
        runs, with the "triton" model's attention through Triton's interpreter; without TRITON_INTERPRET=1 the
        "triton" rows are the reference backend. The numbers mean nothing on the CPU)
Writes DIR/gpu_hf_check.json, prints two tables; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is built from configs: never reach the hub
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import pope.hf  # noqa: E402

TARGET_RATIO = 0.9  # PoPE Llama tokens/s over Llama RoPE + SDPA (our own GPT reaches 0.92x)


def llama_config(smoke: bool, *, size: str) -> LlamaConfig:
    if smoke:
        return LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )
    if size == "check":  # GQA, head_dim 64
        return LlamaConfig(
            vocab_size=1024,
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=2048,
        )
    # ~125M (GPT-2 small's shape as a Llama: 12 x 768, 12 heads, SwiGLU 2048, tied 50304-token embeddings)
    return LlamaConfig(
        vocab_size=50304,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def route_cpu_to_interpreter() -> bool:
    """--smoke under TRITON_INTERPRET=1: let pope_attention send CPU tensors to the Triton kernels (interpreted;
    it sends only CUDA tensors otherwise), so the smoke run takes the GPU run's code path. True if routed."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return False
    import pope.attention.api
    import pope.ops

    if not hasattr(pope.attention.api, "_triton_unsupported_reason"):
        raise RuntimeError(
            "scripts/gpu_hf_check.py --smoke: pope.attention.api._triton_unsupported_reason is gone; "
            "update route_cpu_to_interpreter"
        )
    pope.attention.api._triton_unsupported_reason = pope.ops.triton_unsupported_reason  # same keyword-only options
    return True


KERNELS_ON_CPU = False  # set by main: --smoke routes CPU tensors to the interpreted kernels


def pope_model(llama: LlamaConfig, backend: str, device, dtype=torch.float32, source=None):
    if backend == "triton" and device.type != "cuda" and not KERNELS_ON_CPU:
        backend = "auto"  # --smoke without the interpreter: pope_attention runs CPU tensors through the reference
    model = pope.hf.PoPELlamaForCausalLM(
        pope.hf.from_llama_config(llama, backend=backend, delta_init="uniform", base=10000.0)
    )
    if source is not None:
        model.load_state_dict(source.state_dict())
    return model.to(device=device, dtype=dtype)


def _error(x, exact):
    return (x.double() - exact).abs().max().item()


def _check(name, triton_err, reference_err, exact_scale, dtype) -> dict:
    floor = 4 * torch.finfo(dtype).eps * exact_scale
    passed = triton_err <= 2 * reference_err + floor
    return {
        "check": name,
        "dtype": str(dtype).replace("torch.", ""),
        "triton_err": triton_err,
        "reference_err": reference_err,
        "bound": 2 * reference_err + floor,
        "passed": bool(passed),
    }


def _forward_backward(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return out.logits.detach(), grads


def _cached_decode(model, ids, prefill: int):
    with torch.no_grad():
        out = model(ids[:, :prefill], use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        pieces = [out.logits]
        for t in range(prefill, ids.shape[1]):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            pieces.append(out.logits)
    return torch.cat(pieces, 1)


def correctness(args, device) -> list[dict]:
    llama = llama_config(args.smoke, size="check")
    batch, seq = (2, 24) if args.smoke else (4, 512)
    dtypes = [torch.float32] if args.smoke else [torch.bfloat16, torch.float32]
    torch.manual_seed(0)
    exact = pope_model(llama, "reference", device, torch.float64)
    ids = torch.randint(1, llama.vocab_size, (batch, seq), device=device)  # no pad id (0): generate infers no padding
    exact_logits, exact_grads = _forward_backward(exact, ids)
    exact_decode = _cached_decode(exact, ids, seq - 8)
    rows = []
    for dtype in dtypes:
        triton = pope_model(llama, "triton", device, dtype, source=exact)
        reference = pope_model(llama, "reference", device, dtype, source=exact)
        (lt, gt), (lr, gr) = _forward_backward(triton, ids), _forward_backward(reference, ids)
        rows.append(
            _check("logits", _error(lt, exact_logits), _error(lr, exact_logits), exact_logits.abs().max().item(), dtype)
        )
        rows.append(
            _check("gradients", _error(gt, exact_grads), _error(gr, exact_grads), exact_grads.abs().max().item(), dtype)
        )
        dt, dr = _cached_decode(triton, ids, seq - 8), _cached_decode(reference, ids, seq - 8)
        rows.append(
            _check(
                "cached decode",
                _error(dt, exact_decode),
                _error(dr, exact_decode),
                exact_decode.abs().max().item(),
                dtype,
            )
        )
    # Greedy generation, fp32: the same tokens through the kernels (prefill + decode) and the reference.
    prompt = ids[:2, :16]
    generated = {}
    for backend in ("triton", "reference"):
        model = pope_model(llama, backend, device, torch.float32, source=exact).eval()
        generated[backend] = model.generate(
            prompt, max_new_tokens=8 if args.smoke else 32, do_sample=False, pad_token_id=0
        )
    same = torch.equal(generated["triton"], generated["reference"])
    rows.append(
        {
            "check": "greedy generate",
            "dtype": "float32",
            "passed": bool(same),
            "tokens": generated["triton"].shape[1] - prompt.shape[1],
        }
    )
    rows.append(training_check(llama, ids, device, steps=3 if args.smoke else 20, smoke=args.smoke))
    return rows


def training_check(llama, ids, device, *, steps: int, smoke: bool) -> dict:
    losses = {}
    for backend in ("triton", "reference"):
        torch.manual_seed(1)
        model = pope_model(llama, backend, device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        curve = []
        for _ in range(steps):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = model(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            curve.append(loss.item())
        losses[backend] = curve
    t, r = losses["triton"], losses["reference"]
    passed = t[-1] < t[0] and abs(t[-1] - r[-1]) <= 0.05 * abs(r[-1])
    return {
        "check": f"{steps} training steps",
        "dtype": "bf16 autocast" if device.type == "cuda" else "float32",
        "passed": bool(passed),
        "loss_triton": [t[0], t[-1]],
        "loss_reference": [r[0], r[-1]],
    }


def throughput(args, device) -> list[dict]:
    llama = llama_config(args.smoke, size="125m")
    batch, seq = (2, 16) if args.smoke else (args.batch, 1024)
    warmup, steps = (1, 2) if args.smoke else (5, 20)
    ids = torch.randint(0, llama.vocab_size, (batch, seq), device=device)
    rows = []
    for name in ("PoPE Llama (pope.hf, Triton)", "Llama RoPE + SDPA"):
        torch.manual_seed(0)
        if name.startswith("PoPE"):
            model = pope_model(llama, "triton", device)
        else:
            model = AutoModelForCausalLM.from_config(llama, attn_implementation="sdpa").to(device)
            assert isinstance(model, LlamaForCausalLM)
        params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        model.train()
        step_model, compiled = (torch.compile(model), True) if args.compile else (model, False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = step_model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        try:
            for _ in range(warmup):
                step()
        except Exception as err:  # report a compile failure as a row, and time the eager model instead
            if not args.compile:
                raise
            print(
                f"torch.compile failed for {name}: {type(err).__name__}: {err}; timing it uncompiled", file=sys.stderr
            )
            step_model, compiled = model, False
            for _ in range(warmup):
                step()
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        elapsed = time.perf_counter() - start
        rows.append(
            {
                "model": name,
                "params": params,
                "tokens_per_s": batch * seq * steps / elapsed,
                "step_ms": 1000 * elapsed / steps,
                "compile": compiled,
                "batch": batch,
                "seq": seq,
            }
        )
        del model, step_model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rows[0]["ratio_vs_rope"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    rows[0]["meets_target"] = rows[0]["ratio_vs_rope"] >= TARGET_RATIO
    return rows


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU: that the script runs (no kernels)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile both models for the throughput rows")
    parser.add_argument("--batch", type=int, default=16, help="sequences of 1024 tokens per training step (default 16)")
    parser.add_argument("--out", default="gpu-hf-check", help="output directory (default ./gpu-hf-check)")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU, or pass --smoke (with TRITON_INTERPRET=1) for a CPU run", file=sys.stderr)
        return 2
    global KERNELS_ON_CPU
    KERNELS_ON_CPU = args.smoke and route_cpu_to_interpreter()
    import transformers

    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "kernels": (
            "triton"
            if device.type == "cuda"
            else "triton interpreter"
            if KERNELS_ON_CPU
            else "reference (no TRITON_INTERPRET=1)"
        ),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "correctness": correctness(args, device),
        "throughput": throughput(args, device),
    }
    print("| check | dtype | triton err | reference err | bound | passed |\n|---|---|---|---|---|---|")
    for row in result["correctness"]:
        errs = [f"{row[k]:.3g}" if k in row else "—" for k in ("triton_err", "reference_err", "bound")]
        extra = (
            f" (losses triton {row['loss_triton']}, reference {row['loss_reference']})" if "loss_triton" in row else ""
        )
        print(f"| {row['check']} | {row['dtype']} | {' | '.join(errs)} | {row['passed']} |{extra}")
    print("\n| model | params | tokens/s | step ms | vs RoPE+SDPA |\n|---|---|---|---|---|")
    for row in result["throughput"]:
        ratio = f"{row['ratio_vs_rope']:.3f}x" if "ratio_vs_rope" in row else "1x"
        print(
            f"| {row['model']}{' (compiled)' if row['compile'] else ''} | {row['params'] / 1e6:.1f}M | "
            f"{row['tokens_per_s']:,.0f} | {row['step_ms']:.1f} | {ratio} |"
        )
    ratio = result["throughput"][0]["ratio_vs_rope"]
    print(
        f"\nPoPE / RoPE tokens/s: {ratio:.3f}x (target >= {TARGET_RATIO}x: "
        f"{'met' if ratio >= TARGET_RATIO else 'NOT met'}{'; CPU smoke, meaningless' if args.smoke else ''})"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_hf_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out / 'gpu_hf_check.json'}")
    return 0 if all(row["passed"] for row in result["correctness"]) else 1


if __name__ == "__main__":
    sys.exit(main())
