"""GPU check of the bwd-autows experiment (autows_bwd.py) on one Hopper GPU: correctness, then speed of the dq and
dk/dv kernels, experimental against shipped.

    PYTHONPATH=src python3 benchmarks/experiments/2026-12-01-bwd-autows/gpu_check.py --out $OUT

Variants (VARIANTS; tiles (BLOCK_M, BLOCK_N, warps, stages) per head dim; every one runs through the shipped
launcher pope.kernels.bwd.backward, so the kernels get the launcher's real arguments):
  shipped      the shipped kernels and tiles;
  one-loop     the experimental kernels untagged, at the shipped tiles (the loop shape alone);
  autows-dkdv  dk/dv tagged for the automatic warp specialisation at a 4-warp tile where it engages compile-only
               (d = 128: key block from k' by TMA, the only d = 128 form in which the pass does not fail), dq as in
               one-loop (the tagged dq kernel fails to compile at 4 warps);
  autows-dkdv-m32  the same with 32-row query blocks (d = 128: fewer spills).
(a) Correctness ("check" group): bf16, fresh random inputs, softplus magnitudes with delta; dq, dk, dv, d(delta)
    against the float64 reference within 2x plain PyTorch bf16's error (pope.testing.check_within_rule); the
    backward run twice must be bitwise equal (deterministic). Shapes incl. N = 4096 d = 128 and odd N.
(b) Speed (one group per shape (4,16,4096,64), (4,16,4096,128), (2,16,8192,128), causal, bf16): each variant's dq
    and dk/dv launches are recorded during one backward and replayed alone (triton.testing.do_bench, median ms), and
    the whole backward is timed. Replays of a dk/dv kernel that writes over its k' rows (keys from the pre-pass) read
    its own earlier output as keys after the first: the work per launch does not depend on the values.
Each group runs in a child process with a time limit: a hang or crash is a reported row. Writes OUT/gpu_check.json,
prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

# name -> {head dim bucket: (dq tile, dk/dv tile, experimental_kernels options or None for the shipped kernels)}
VARIANTS = {
    "shipped": {64: (None, None, None), 128: (None, None, None)},
    "one-loop": {64: (None, None, dict(dq_tagged=False, dkdv_tagged=False)),
                 128: (None, None, dict(dq_tagged=False, dkdv_tagged=False))},
    "autows-dkdv": {64: (None, (64, 64, 4, 3), dict(dq_tagged=False, dkdv_tagged=True)),
                    128: (None, (64, 64, 4, 2), dict(dq_tagged=False, dkdv_tagged=True, keys_from_prepass=True))},
    # 32-row query blocks: at d = 128 the warp-specialised tile with the fewest spills (588 B against 1212 B)
    "autows-dkdv-m32": {64: (None, (32, 64, 4, 2), dict(dq_tagged=False, dkdv_tagged=True)),
                        128: (None, (32, 64, 4, 2), dict(dq_tagged=False, dkdv_tagged=True, keys_from_prepass=True))},
}
CHECK_SHAPES = [(1, 4, 4, 4096, 4096, 128, True), (1, 4, 2, 777, 777, 128, False), (1, 4, 4, 2049, 2049, 128, True),
                (2, 4, 4, 1000, 1000, 64, True), (2, 2, 1, 333, 401, 64, True)]  # (B, Hq, Hkv, Nq, Nk, d, causal)
TIMING_SHAPES = {"time-4x16x4096x64": (4, 16, 4096, 64), "time-4x16x4096x128": (4, 16, 4096, 128),
                 "time-2x16x8192x128": (2, 16, 8192, 128)}
LIMITS_S = {"check": 70, **{group: 35 for group in TIMING_SHAPES}}  # 175 s in all at most


def run_backward(variant: str, head_dim: int, *args, **options):
    """(dq, dk, dv, d_delta) of `variant` through the shipped launcher."""
    from pope.kernels import bwd

    import autows_bwd

    dq_tile, dkdv_tile, experimental = VARIANTS[variant][64 if head_dim <= 64 else 128]
    if experimental is None:
        return bwd.backward(*args, dq_config=dq_tile, dkdv_config=dkdv_tile, **options)
    return autows_bwd.backward(*args, dq_config=dq_tile, dkdv_config=dkdv_tile, **options, **experimental)


def forward_and_options(q, k, v, delta, causal):
    from pope.kernels import forward, frequencies

    theta = frequencies(q.shape[-1], 10000.0, q.device)
    options = dict(causal=causal, softmax_scale=q.shape[-1] ** -0.5, q_offset=k.shape[-2] - q.shape[-2],
                   magnitude="softplus")
    out, lse = forward(q, k, v, delta, theta, **options)
    return out, lse, theta, options


def check(shapes=CHECK_SHAPES, device: str = "cuda") -> list[dict]:
    from pope.attention import reference_pope_attention
    from pope.testing import GRADIENT_NAMES, attention_inputs, check_within_rule, outputs_and_gradients

    rows = []
    for seed, (batch, hq, hkv, nq, nk, d, causal) in enumerate(shapes):
        inputs = attention_inputs(batch, hq, hkv, nq, nk, d, generator=torch.Generator(device).manual_seed(seed),
                                  device=device)
        q64, k64, v64, delta64, grad_out = inputs
        options = dict(base=10000.0, causal=causal, softmax_scale=d ** -0.5, q_offset=nk - nq, magnitude="softplus",
                       rotary_dim=None)
        exact = outputs_and_gradients(reference_pope_attention, *inputs, torch.float64, options)[1:]
        plain = outputs_and_gradients(reference_pope_attention, *inputs, torch.bfloat16, options)[1:]
        q, k, v, do = (t.to(torch.bfloat16) for t in (q64, k64, v64, grad_out))
        delta = delta64.float()
        out, lse, theta, kernel_options = forward_and_options(q, k, v, delta, causal)
        for variant in VARIANTS:
            first, second = (run_backward(variant, d, do, q, k, v, delta, out, lse, theta, **kernel_options)
                             for _ in range(2))
            row = {"group": "check", "variant": variant, "shape": [batch, hq, hkv, nq, nk, d], "causal": causal,
                   "deterministic": all(torch.equal(a, b) for a, b in zip(first, second))}
            for name, ours, theirs, truth in zip(GRADIENT_NAMES[1:], first, plain, exact):
                row[name] = check_within_rule(ours, theirs, truth, torch.bfloat16)
            row["ok"] = row["deterministic"] and all(row[name]["ok"] for name in GRADIENT_NAMES[1:])
            rows.append(row)
            print(json.dumps(row), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def time_shape(group: str) -> list[dict]:
    import triton.testing

    from pope.kernels import direct_launch

    batch, heads, seq, d = TIMING_SHAPES[group]
    generator = torch.Generator("cuda").manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, generator=generator)
                   for _ in range(4))
    delta = -6.283 * torch.rand(heads, d, device="cuda", generator=generator)
    out, lse, theta, options = forward_and_options(q, k, v, delta, True)
    rows = []
    for variant in VARIANTS:
        recorded = {}
        launch = direct_launch.launch

        def record(kernel, grid, site, args, **meta):
            if site is not None and site[-1] in ("dq", "dk dv"):
                recorded[site[-1]] = (kernel, grid, args, meta)
            return launch(kernel, grid, site, args, **meta)
        direct_launch.launch = record
        try:
            run_backward(variant, d, do, q, k, v, delta, out, lse, theta, **options)
        finally:
            direct_launch.launch = launch
        row = {"group": group, "variant": variant, "shape": [batch, heads, seq, d]}
        row["backward_ms"] = triton.testing.do_bench(
            lambda: run_backward(variant, d, do, q, k, v, delta, out, lse, theta, **options))
        for name, (kernel, grid, args, meta) in recorded.items():
            row[f"{name.replace(' ', '')}_ms"] = triton.testing.do_bench(lambda: kernel[grid](*args, **meta))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del recorded
    return rows


def child(group: str, path: str) -> int:
    rows = check() if group == "check" else time_shape(group)
    with open(path, "w") as f:
        json.dump(rows, f)
    return 0


def table(rows: list[dict]) -> str:
    lines = ["| group | variant | shape | result |", "|---|---|---|---|"]
    shipped = {row["group"]: row for row in rows if row.get("variant") == "shipped" and "backward_ms" in row}
    for row in rows:
        if "error" in row:
            result = row["error"]
        elif row["group"] == "check":
            worst = max(row[n]["kernel"] / max(row[n]["reference"], 1e-30) for n in ("dq", "dk", "dv", "d_delta"))
            result = f"{'ok' if row['ok'] else 'FAIL'} (worst error / PyTorch bf16's {worst:.2f}, deterministic " \
                     f"{row['deterministic']})"
        else:
            base = shipped.get(row["group"], row)
            result = ", ".join(f"{key} {row[key]:.3f} ({row[key] / base[key]:.2f}x shipped)"
                               for key in ("dq_ms", "dkdv_ms", "backward_ms") if key in row and key in base)
        lines.append(f"| {row['group']} | {row.get('variant', '-')} | {row.get('shape', '-')} "
                     f"{'causal' if row.get('causal', True) else 'non-causal'} | {result} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--groups", default=",".join(LIMITS_S), help=f"comma-separated subset of {list(LIMITS_S)}")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.child_json)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA GPU (an H100 / H200: the kernels are tuned for sm_90)")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for group in args.groups.split(","):
        if group not in LIMITS_S:
            raise SystemExit(f"unknown group {group!r}; choose from {list(LIMITS_S)}")
        path = os.path.join(args.out, f"{group}.json")
        started = time.time()
        try:
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out, "--child", group,
                                  "--child-json", path], timeout=LIMITS_S[group], check=False)
            if run.returncode == 0 and os.path.exists(path):
                with open(path) as f:
                    rows += json.load(f)
            else:
                rows.append({"group": group, "error": f"child exited with {run.returncode}"})
        except subprocess.TimeoutExpired:
            rows.append({"group": group, "error": f"no result within {LIMITS_S[group]} s (hang or slow compile)"})
        print(f"group {group}: {time.time() - started:.0f} s", flush=True)
    environment = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                            cwd=HERE).stdout.strip()}
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump({"environment": environment, "rows": rows}, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
