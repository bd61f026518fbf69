"""GPU check of the Gluon attention forward (gluon_attention.py) on one Hopper GPU: correctness, then speed.

    PYTHONPATH=src python3 benchmarks/experiments/2026-12-01-gluon-hopper/gpu_check.py --out $OUT

Inputs are what the shipped forward feeds its main pass: q' and k' made by pope's own pre-pass
(pope.kernels.prepass.transform_queries_and_keys: softplus magnitudes, PoPE's frequencies, a random delta) from fresh
random q, k (B, H, N, d = 128), and v, all bf16; flattened to (B*H, N, 2d) / (B*H, N, d).

(a) Correctness, per variant (Gluon "plain", "ws" and "ws-overlap"; "autows": plain Triton with tl.range(warp_specialize=True) at
    4 warps, triton_autows.py) and shape (N = 33, 1000, 2049, 4096 causal and 777 non-causal, BH 2-4):
    o against a float64 softmax(q'k'^T / sqrt(d)) v computed from the same bf16 q', k', v, within 2x the error of
    plain PyTorch bf16 attention (bf16 matmuls and softmax) on the same inputs (pope.testing.check_within_rule); lse
    against float64 likewise (and, for information, beside fp32 PyTorch's lse error). The shipped Triton main pass
    runs the same check (a check of the harness).
(b) Speed, at (B, H, N) = (4, 16, 4096), (2, 16, 8192), (1, 16, 16384), d = 128, causal, bf16: the forward's main
    pass on the same q'/k'/v, the three variants against the shipped Triton main pass (pope.kernels.fwd._pope_fwd_kernel
    launched on precomputed q'/k' -- the shipped launcher always runs the pre-pass, so this script launches the
    kernel itself with the launcher's descriptors and tiles); for context the pre-pass alone, the whole shipped pope
    forward (pre-pass + main pass), and SDPA's FlashAttention backend on plain (q, k, v) (the issue's baseline).
    triton.testing.do_bench, median ms.
Each provider group runs in its own child process with a time limit, so a kernel that hangs (an mbarrier protocol
bug would) costs that group only. Writes OUT/gpu_check.json and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

CHECK_SHAPES = [(2, 33, True), (3, 1000, True), (2, 2049, True), (4, 4096, True), (2, 777, False)]  # (BH, N, causal)
TIMING_SHAPES = [(4, 16, 4096), (2, 16, 8192), (1, 16, 16384)]  # (B, H, N), d = 128
HEAD_DIM = 128
GROUPS = {"gluon-plain": ("plain",), "gluon-ws": ("ws",), "gluon-ws-overlap": ("ws-overlap",),
          "triton-autows": ("autows",), "shipped": ()}
CHILD_TIMEOUT_S = 60


def primed_inputs(batch, heads, seq, seed, device="cuda"):
    """(q', k' (B*H, N, 2d), v (B*H, N, d), q, k, v (B, H, N, d)) in bf16, q'/k' from pope's pre-pass."""
    from pope.kernels import host, prepass
    from pope.testing import attention_inputs

    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, delta, _ = attention_inputs(batch, heads, heads, seq, seq, HEAD_DIM, generator=g, device=device)
    q, k, v, delta = q.bfloat16(), k.bfloat16(), v.bfloat16(), delta.float()
    theta = host.frequencies(HEAD_DIM, 10000.0, device)
    q_prime, k_prime = prepass.transform_queries_and_keys(q, k, theta, delta, q_offset=0, magnitude="softplus")
    flat = lambda t: t.reshape(batch * heads, seq, t.shape[-1])  # noqa: E731
    return flat(q_prime), flat(k_prime), flat(v), (q, k, v, delta, theta)


def attention_math(q_prime, k_prime, v, causal, dtype):
    """(o, lse) of softmax(q'k'^T / sqrt(d)) v with every operation in dtype (float64: the truth; bf16: plain PyTorch)."""
    q_prime, k_prime, v = q_prime.to(dtype), k_prime.to(dtype), v.to(dtype)
    scores = (q_prime @ k_prime.transpose(-1, -2)) * (1.0 / math.sqrt(v.shape[-1]))
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=v.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def shipped_main_pass(q_prime, k_prime, v, causal):
    """The shipped forward kernel on precomputed q'/k' (B*H, N, 2d) and v (B*H, N, d): the descriptors, tiles and
    arguments pope.kernels.fwd.forward gives it, minus the pre-pass. Returns (o, lse) like the Gluon kernel."""
    from pope.kernels import direct_launch, fwd, host
    from pope.kernels.configs import pick_tiles

    heads, seq, _ = q_prime.shape
    block_m, block_n, num_warps, num_stages = pick_tiles("fwd", HEAD_DIM, None, v.dtype, v.device,
                                                          host.precision(v.dtype, v.device))
    block_d = host.block_d(HEAD_DIM)
    v4 = v.view(1, heads, seq, HEAD_DIM)
    out = torch.empty_like(v4)
    lse = torch.empty((1, heads, seq), device=v.device, dtype=torch.float32)
    fwd._pope_fwd_kernel[(host.cdiv(seq, block_m), heads)](
        direct_launch.descriptor(q_prime, [1, block_m, 2 * block_d]),
        direct_launch.descriptor(k_prime, [1, block_n, 2 * block_d]),
        direct_launch.descriptor(v4, [1, 1, block_n, block_d]), out, lse, *host.strides(out),
        heads, 1, seq, seq, 0, HEAD_DIM ** -0.5, None, None,
        HEAD_DIM=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, CAUSAL=causal, PRECISION="tf32",
        IS_VARLEN=False, num_warps=num_warps, num_stages=num_stages)
    return out[0], lse[0]


def main_pass(provider: str):
    import gluon_attention

    if provider == "shipped":
        return shipped_main_pass
    if provider == "autows":  # plain Triton, tl.range(warp_specialize=True) at 4 warps (triton_autows.py)
        import triton_autows
        return lambda qp, kp, v, causal: triton_autows.attention_forward(qp, kp, v, causal=causal)
    return lambda qp, kp, v, causal: gluon_attention.attention_forward(qp, kp, v, causal=causal, variant=provider)


def check(provider: str) -> list:
    from pope.testing import check_within_rule

    rows = []
    for seed, (heads, seq, causal) in enumerate(CHECK_SHAPES):
        q_prime, k_prime, v, _ = primed_inputs(1, heads, seq, seed=100 + seed)
        exact_o, exact_lse = attention_math(q_prime, k_prime, v, causal, torch.float64)
        plain_o, plain_lse = attention_math(q_prime, k_prime, v, causal, torch.bfloat16)
        o, lse = main_pass(provider)(q_prime, k_prime, v, causal)
        torch.cuda.synchronize()
        row = {"provider": provider, "bh": heads, "n": seq, "causal": causal,
               "o": check_within_rule(o, plain_o, exact_o, torch.bfloat16),
               "lse": check_within_rule(lse, plain_lse, exact_lse, torch.bfloat16)}
        row["passed"] = row["o"]["ok"] and row["lse"]["ok"]
        # Information, not a gate: the kernel keeps lse in fp32, so also how it compares with fp32 PyTorch's error.
        _, fp32_lse = attention_math(q_prime, k_prime, v, causal, torch.float32)
        row["lse_vs_fp32_pytorch"] = check_within_rule(lse, fp32_lse, exact_lse, torch.float32)
        rows.append(row)
        print(f"  check {provider:8s} BH {heads} N {seq:5d} causal {causal}: o err {row['o']['kernel']:.2e} "
              f"(bf16 PyTorch {row['o']['reference']:.2e}), lse err {row['lse']['kernel']:.2e} "
              f"(bf16 PyTorch {row['lse']['reference']:.2e}, fp32 PyTorch {row['lse_vs_fp32_pytorch']['reference']:.2e}) "
              f"{'ok' if row['passed'] else 'FAIL'}", flush=True)
        del exact_o, exact_lse, plain_o, plain_lse
        torch.cuda.empty_cache()
    return rows


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_group(group: str) -> list:
    """Median ms per timing shape of the group's providers (gluon variants: the main pass, checked against the
    shipped main pass on the same inputs; shipped: main pass, pre-pass, whole forward, SDPA flash)."""
    from pope.attention import pope_attention
    from pope.kernels import prepass

    rows = []
    for batch, heads, seq in TIMING_SHAPES:
        q_prime, k_prime, v, (q, k, v4, delta, theta) = primed_inputs(batch, heads, seq, seed=7)
        row = {"shape": [batch, heads, seq, HEAD_DIM]}
        if group == "shipped":
            row["shipped main pass"] = bench(lambda: shipped_main_pass(q_prime, k_prime, v, True))
            row["shipped pre-pass"] = bench(lambda: prepass.transform_queries_and_keys(
                q, k, theta, delta, q_offset=0, magnitude="softplus"))
            row["shipped pope forward"] = bench(lambda: pope_attention(q, k, v4, delta, causal=True, backend="triton"))
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                row["SDPA flash (q, k, v)"] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v4, is_causal=True))
        else:
            variant = GROUPS[group][0]
            ours = main_pass(variant)
            o, _ = ours(q_prime, k_prime, v, True)
            ref, _ = shipped_main_pass(q_prime, k_prime, v, True)
            row[f"{group} max abs(o - shipped)"] = (o.float() - ref.float()).abs().max().item()
            row[f"{group} main pass"] = bench(lambda: ours(q_prime, k_prime, v, True))
        rows.append(row)
        print(f"  time {group} {row}", flush=True)
        del q_prime, k_prime, v, q, k, v4
        torch.cuda.empty_cache()
    return rows


def child(group: str, out_dir: str) -> int:
    result = {"group": group, "checks": [], "timings": [], "error": None}
    try:
        result["checks"] = check("shipped" if group == "shipped" else GROUPS[group][0])
        result["timings"] = time_group(group)
    except Exception as error:  # report it in the table; the other groups still run
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    with open(os.path.join(out_dir, f"group_{group}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


def table(results: dict) -> str:
    lines = ["| group | checks passed | error |", "|---|---|---|"]
    for group, result in results.items():
        checks = result.get("checks", [])
        lines.append(f"| {group} | {sum(r['passed'] for r in checks)}/{len(checks)} of {len(CHECK_SHAPES)} | "
                     f"{result.get('error') or '-'} |")
    by_shape = {}
    for result in results.values():
        for row in result.get("timings", []):
            by_shape.setdefault(tuple(row["shape"]), {}).update(row)
    lines += ["", "| B, H, N, d | provider | ms (median) | / shipped main pass | / SDPA flash |", "|---|---|---|---|---|"]
    for shape, row in by_shape.items():
        base, sdpa = row.get("shipped main pass"), row.get("SDPA flash (q, k, v)")
        for name, value in row.items():
            if name == "shape" or "max abs(o" in name:
                continue
            ratio = f"{value / base:.2f}x" if base else "-"
            versus = f"{value / sdpa:.2f}x" if sdpa else "-"
            lines.append(f"| {', '.join(map(str, shape))} | {name} | {value:.3f} | {ratio} | {versus} |")
        for name, value in row.items():
            if "max abs(o" in name:
                lines.append(f"| {', '.join(map(str, shape))} | {name} | {value:.2e} | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json (created if missing)")
    parser.add_argument("--child", choices=list(GROUPS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        raise SystemExit("gpu_check.py needs a Hopper GPU (sm_90: H100 / H200); the Gluon kernel is written for it")
    if args.child:
        return child(args.child, args.out)
    started = time.time()
    results = {}
    for group in GROUPS:
        print(f"[{group}]", flush=True)
        try:
            subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out, "--child", group],
                           timeout=CHILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            results[group] = {"error": f"timed out after {CHILD_TIMEOUT_S} s (a kernel hang, e.g. an mbarrier protocol error, or a compile slower than that)"}
            continue
        path = os.path.join(args.out, f"group_{group}.json")
        results[group] = json.load(open(path)) if os.path.exists(path) else {"error": "child wrote no result"}
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "seconds": round(time.time() - started)}
    try:
        import triton
        env["triton"] = triton.__version__
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=HERE).stdout.strip()
    except Exception:
        pass
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump({"env": env, "results": results}, f, indent=1)
    print(json.dumps(env))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
