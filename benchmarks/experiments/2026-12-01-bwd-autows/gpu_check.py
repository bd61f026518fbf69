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
(b) Speed (one group per shape, "time-BxHxNxd" or "time-BxHqxHkvxNxd": TIMING_SHAPES, causal, bf16), on one set of
    fresh random inputs per shape: first each variant's dq, dk, dv, d(delta) on those inputs are checked against the
    float64 reference by the same 2x rule (the reference runs on the first key head's query-head group, all
    batches: the kernels' results for those heads do not depend on the others), twice for determinism, and compared
    with the shipped kernels' bits; then each variant's dq and dk/dv launches are recorded during one backward and
    replayed alone, and the whole backward is timed (triton.testing.do_bench, median ms, as benchmarks/attention.py
    times). Replays of a dk/dv kernel that writes over its k' rows (keys from the pre-pass) read its own earlier
    output as keys after the first: the work per launch does not depend on the values.
--variants picks the variants (default all; shipped is always run, the baseline of every ratio).
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
    # only the dk/dv kernel one-loop (its d = 128 spills 140 -> 40 B), the shipped dq kernel: what would ship
    "one-loop-dkdv": {64: (None, None, dict(dq=False, dkdv_tagged=False)),
                      128: (None, None, dict(dq=False, dkdv_tagged=False))},
    "autows-dkdv": {64: (None, (64, 64, 4, 3), dict(dq_tagged=False, dkdv_tagged=True)),
                    128: (None, (64, 64, 4, 2), dict(dq_tagged=False, dkdv_tagged=True, keys_from_prepass=True))},
    # 32-row query blocks: at d = 128 the warp-specialised tile with the fewest spills (588 B against 1212 B)
    "autows-dkdv-m32": {64: (None, (32, 64, 4, 2), dict(dq_tagged=False, dkdv_tagged=True)),
                        128: (None, (32, 64, 4, 2), dict(dq_tagged=False, dkdv_tagged=True, keys_from_prepass=True))},
}
CHECK_SHAPES = [(1, 4, 4, 4096, 4096, 128, True), (1, 4, 2, 777, 777, 128, False), (1, 4, 4, 2049, 2049, 128, True),
                (2, 4, 4, 1000, 1000, 64, True), (2, 2, 1, 333, 401, 64, True)]  # (B, Hq, Hkv, Nq, Nk, d, causal)
TIMING_SHAPES = {"time-4x16x4096x64": (4, 16, 16, 4096, 64), "time-4x16x4096x128": (4, 16, 16, 4096, 128),
                 "time-2x16x8192x128": (2, 16, 16, 8192, 128),
                 "time-2x32x8x4096x128": (2, 32, 8, 4096, 128)}  # (B, Hq, Hkv, N, d); the last a Llama GQA shape
LIMITS_S = {"check": 70, **{group: 50 for group in TIMING_SHAPES}}  # 270 s in all at most


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


def median_ms(fn, device: str) -> float:
    """scripts/kernel_variants.py's: triton.testing.do_bench's median on a GPU (as benchmarks/attention.py times);
    on CPU (the interpreter: a check of this script, its times mean nothing) the median of three calls."""
    scripts = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir, os.pardir, "scripts"))
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from kernel_variants import median_ms as kernel_variants_median_ms

    return kernel_variants_median_ms(fn, device)


def check_on_timing_inputs(group: str, shape, variants, device: str = "cuda", seed: int = 0):
    """Rows of the 2x rule for each variant on the timing inputs (see the module docstring), and the inputs
    (q, k, v, do, delta, out, lse, theta, options) for the timing. shape: (B, Hq, Hkv, N, d), causal."""
    from pope.attention import reference_pope_attention
    from pope.settings import override
    from pope.testing import GRADIENT_NAMES, attention_inputs, check_within_rule, outputs_and_gradients

    batch, hq, hkv, seq, d = shape
    group_size = hq // hkv
    q64, k64, v64, delta64, grad_out = attention_inputs(batch, hq, hkv, seq, seq, d, device=device,
                                                        generator=torch.Generator(device).manual_seed(seed))
    q, k, v, do = (t.to(torch.bfloat16) for t in (q64, k64, v64, grad_out))
    delta = delta64.float()
    out, lse, theta, options = forward_and_options(q, k, v, delta, True)
    # The reference on key head 0's query-head group, every batch.
    heads = (q64[:, :group_size], k64[:, :1], v64[:, :1], delta64[:group_size], grad_out[:, :group_size])
    reference_options = dict(base=10000.0, causal=True, softmax_scale=d ** -0.5, q_offset=0, magnitude="softplus",
                             rotary_dim=None)
    exact = outputs_and_gradients(reference_pope_attention, *heads, torch.float64, reference_options)[1:]
    plain = outputs_and_gradients(reference_pope_attention, *heads, torch.bfloat16, reference_options)[1:]
    del heads, q64, k64, v64, delta64, grad_out
    rows, shipped = [], None
    for variant in ["shipped", *[name for name in variants if name != "shipped"]]:
        with override(poison_outputs=True):  # NaN-poisoned outputs: a gradient element never written shows
            first, second = [run_backward(variant, d, do, q, k, v, delta, out, lse, theta, **options)
                             for _ in range(2)]
        shipped = first if shipped is None else shipped
        row = {"group": group, "variant": variant, "check": "timing inputs", "shape": list(shape), "causal": True,
               "deterministic": all(torch.equal(a, b) for a, b in zip(first, second)),
               "bitwise_equal_to_shipped": all(torch.equal(a, b) for a, b in zip(first, shipped)),
               "relative_difference_from_shipped": max(
                   ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()
                   for a, b in zip(first, shipped))}
        ours = (first[0][:, :group_size], first[1][:, :1], first[2][:, :1], first[3][:group_size])
        for name, mine, theirs, truth in zip(GRADIENT_NAMES[1:], ours, plain, exact):
            row[name] = check_within_rule(mine, theirs, truth, torch.bfloat16)
        row["ok"] = row["deterministic"] and all(row[name]["ok"] for name in GRADIENT_NAMES[1:])
        rows.append(row)
        print(json.dumps(row), flush=True)
        del first, second, ours
    del exact, plain, shipped
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows, (q, k, v, do, delta, out, lse, theta, options)


def time_shape(group: str, variants=None, device: str = "cuda") -> list[dict]:
    """Correctness on the timing inputs (check_on_timing_inputs), then ms of each variant: the whole backward and
    its dq and dk/dv launches replayed alone. A variant that fails the check is not timed."""
    from pope.kernels import direct_launch

    shape = TIMING_SHAPES.get(group) or timing_shape(group)
    variants = list(VARIANTS) if variants is None else variants
    rows, (q, k, v, do, delta, out, lse, theta, options) = check_on_timing_inputs(group, shape, variants, device)
    d = shape[-1]
    for variant in [row["variant"] for row in rows if row["ok"]]:
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
        row = {"group": group, "variant": variant, "shape": list(shape)}
        row["backward_ms"] = median_ms(
            lambda: run_backward(variant, d, do, q, k, v, delta, out, lse, theta, **options), device)  # noqa: B023
        for name, (kernel, grid, args, meta) in recorded.items():
            row[f"{name.replace(' ', '')}_ms"] = median_ms(lambda: kernel[grid](*args, **meta), device)  # noqa: B023
        rows.append(row)
        print(json.dumps(row), flush=True)
        del recorded
    return rows


def timing_shape(group: str) -> tuple:
    """(B, Hq, Hkv, N, d) of a group named time-BxHxNxd or time-BxHqxHkvxNxd."""
    try:
        dims = tuple(int(x) for x in group.removeprefix("time-").split("x"))
    except ValueError:
        dims = ()
    if not group.startswith("time-") or len(dims) not in (4, 5) or (len(dims) == 5 and dims[1] % dims[2]):
        raise SystemExit(f"unknown group {group!r}; choose from {list(LIMITS_S)} or time-BxHxNxd / "
                         f"time-BxHqxHkvxNxd")
    return (dims[0], dims[1], *dims[1:]) if len(dims) == 4 else dims


def child(group: str, path: str, variants) -> int:
    rows = check() if group == "check" else time_shape(group, variants)
    with open(path, "w") as f:
        json.dump(rows, f)
    return 0


def table(rows: list[dict]) -> str:
    lines = ["| group | variant | shape | result |", "|---|---|---|---|"]
    shipped = {row["group"]: row for row in rows if row.get("variant") == "shipped" and "backward_ms" in row}
    for row in rows:
        if "error" in row:
            result = row["error"]
        elif "ok" in row:
            worst = max(row[n]["kernel"] / max(row[n]["reference"], 1e-30) for n in ("dq", "dk", "dv", "d_delta"))
            result = f"{'ok' if row['ok'] else 'FAIL'} (worst error / PyTorch bf16's {worst:.2f}, deterministic " \
                     f"{row['deterministic']}"
            if "bitwise_equal_to_shipped" in row:
                result += f", bitwise shipped's {row['bitwise_equal_to_shipped']}" \
                          f" (max difference {row['relative_difference_from_shipped']:.1e} of the largest)"
            result += ")"
        else:
            base = shipped.get(row["group"], row)
            result = ", ".join(f"{key} {row[key]:.3f} ({row[key] / base[key]:.2f}x shipped)"
                               for key in ("dq_ms", "dkdv_ms", "backward_ms") if key in row and key in base)
        lines.append(f"| {row['group']} | {row.get('variant', '-')} | {row.get('shape', '-')} "
                     f"{'causal' if row.get('causal', True) else 'non-causal'} | {result} |")
    return "\n".join(lines)


def environment(argv) -> dict:
    """Provenance of a run: GPU, torch, triton, commit (POPE_GIT_COMMIT on a copy without .git), date, command."""
    import triton

    from pope.provenance import commit_label

    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
            "triton": triton.__version__, "commit": commit_label() or "unknown",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join([os.path.relpath(__file__), *argv])}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--groups", default=",".join(LIMITS_S),
                        help=f"comma-separated subset of {list(LIMITS_S)}, or time-BxHqxHkvxNxd")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {list(VARIANTS)} (shipped always runs)")
    parser.add_argument("--limit-s", type=float, default=None,
                        help="each group's time limit in seconds (default LIMITS_S, 50 for a time-... group)")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown:
        raise SystemExit(f"gpu_check.py: unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    groups = args.groups.split(",")
    for group in groups:
        if group not in LIMITS_S:
            timing_shape(group)  # a clear error for a name that is neither
    if args.child:
        return child(args.child, args.child_json, variants)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA GPU (an H100 / H200: the kernels are tuned for sm_90)")
    os.makedirs(args.out, exist_ok=True)
    rows, provenance = [], environment(argv)
    print(f"provenance: {json.dumps(provenance)}", flush=True)
    for group in groups:
        path = os.path.join(args.out, f"{group}.json")
        limit = args.limit_s or LIMITS_S.get(group, 50)
        started = time.time()
        try:
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out, "--child", group,
                                  "--child-json", path, "--variants", args.variants], timeout=limit, check=False)
            if run.returncode == 0 and os.path.exists(path):
                with open(path) as f:
                    rows += json.load(f)
            else:
                rows.append({"group": group, "error": f"child exited with {run.returncode}"})
        except subprocess.TimeoutExpired:
            rows.append({"group": group, "error": f"no result within {limit:.0f} s (hang or slow compile)"})
        print(f"group {group}: {time.time() - started:.0f} s", flush=True)
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:  # after every group: a cut run keeps them
            json.dump({"environment": provenance, "rows": rows}, f, indent=1)
    print(table(rows))
    return 1 if any("error" in row or row.get("ok") is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
