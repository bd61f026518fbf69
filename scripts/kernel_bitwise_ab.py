"""Bitwise A/B of the kernels of two source trees: same inputs, same calls, every output tensor compared bit for bit.

    PYTHONPATH=src python scripts/kernel_bitwise_ab.py --old OLD/src --new src --out DIR                # CUDA
    TRITON_INTERPRET=1 python scripts/kernel_bitwise_ab.py --old OLD/src --new src --small --out DIR   # CPU
A developer tool: a change meant to leave the kernels' arithmetic alone (a refactor, a launch path) should pass it
(e.g. `git archive REV src | tar -x -C OLD` gives OLD/src). Each tree runs in its own subprocess, with only
that tree's `src` on the path, through the entry points both trees have: pope.ops.flash_attention_forward
(out and lse) and pope.ops.triton_pope_attention under autograd (out, dq, dk, dv, d_delta), each case called twice
(the second call takes the direct launch path where there is one; its tensors are compared too, suffix "@2").
Inputs come from fixed seeds on the CPU, so both trees see the same bits. Cases: the five benchmark shapes
(8x12x1024x64, 4x16x4096x64, 2x16x8192x64, 1x16x16384x64, 4x16x4096x128, bf16, causal, softplus, delta), a GQA
shape and two decode shapes (tensor-core kernel over a cache of magnitudes, lanes kernel over raw keys); --small
runs small shapes of the same kinds (plus fp16 / fp32 and an explicit q_offset) for the interpreter.
Prints one line per case and tensor, saves DIR/kernel_bitwise_ab.json; exits 1 on any mismatch (or a missing
tensor), 0 when every tensor is bitwise equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# (name, batch, Hq, Hkv, Nq, Nk, d, dtype, magnitude, causal, q_offset or None = Nk - Nq)
CASES = [
    ("8x12x1024x64", 8, 12, 12, 1024, 1024, 64, "bf16", "softplus", True, None),
    ("4x16x4096x64", 4, 16, 16, 4096, 4096, 64, "bf16", "softplus", True, None),
    ("2x16x8192x64", 2, 16, 16, 8192, 8192, 64, "bf16", "softplus", True, None),
    ("1x16x16384x64", 1, 16, 16, 16384, 16384, 64, "bf16", "softplus", True, None),
    ("4x16x4096x128", 4, 16, 16, 4096, 4096, 128, "bf16", "softplus", True, None),
    ("gqa 2x16:4x4096x64", 2, 16, 4, 4096, 4096, 64, "bf16", "softplus", True, None),
    ("decode gqa 4x32:8x1x16384x128 identity", 4, 32, 8, 1, 16384, 128, "bf16", "identity", True, None),
    ("decode lanes 8x16x1x4096x64", 8, 16, 16, 1, 4096, 64, "bf16", "softplus", True, None),
]
SMALL_CASES = [
    ("1x2x40x32", 1, 2, 2, 40, 40, 32, "bf16", "softplus", True, None),
    ("1x2x70x64", 1, 2, 2, 70, 70, 64, "bf16", "softplus", True, None),
    ("1x2:1x37x128 identity", 1, 2, 1, 37, 37, 128, "bf16", "identity", True, None),
    ("gqa 1x4:2x45x64 fp16", 1, 4, 2, 45, 45, 64, "fp16", "softplus", True, None),
    ("1x2x33x48 fp32 relu noncausal", 1, 2, 2, 33, 33, 48, "fp32", "relu", False, None),
    ("1x2x20/64x32 q_offset 30", 1, 2, 2, 20, 64, 32, "bf16", "softplus", True, 30),
    ("decode gqa 1x8:2x1x97x64 identity", 1, 8, 2, 1, 97, 64, "bf16", "identity", True, None),
    ("decode lanes 1x2x1x70x64", 1, 2, 2, 1, 70, 64, "bf16", "softplus", True, None),
]


def worker(save: str, small: bool, device: str) -> None:
    """Run every case with the pope on sys.path (one tree); torch.save {case: {tensor name: tensor}} to save."""
    import torch

    try:  # the kernels' own theta: the package's (fixed-point turn words), or an older single-file module's fp32
        from pope.kernels import frequencies as kernel_theta
    except ImportError:
        from pope.kernels.pope_flash import frequencies as kernel_theta
    from pope.ops import flash_attention_forward, triton_pope_attention

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    results = {}
    for index, (name, batch, hq, hkv, nq, nk, d, dtype_name, magnitude, causal, q_offset) in enumerate(
        SMALL_CASES if small else CASES
    ):
        dtype = dtypes[dtype_name]
        g = torch.Generator().manual_seed(1000 + index)
        q = torch.randn(batch, hq, nq, d, generator=g)
        k = torch.randn(batch, hkv, nk, d, generator=g)
        v = torch.randn(batch, hkv, nk, d, generator=g)
        if magnitude == "identity":  # a cache of magnitudes is positive
            q, k = q.abs(), k.abs()
        delta = -6.283185307179586 * torch.rand(hq, d, generator=g)
        grad_out = torch.randn(batch, hq, nq, d, generator=g)
        q, k, v, grad_out = (t.to(device=device, dtype=dtype) for t in (q, k, v, grad_out))
        delta = delta.to(device)
        q_offset = nk - nq if q_offset is None else q_offset
        scale = d**-0.5
        theta = kernel_theta(d, 10000.0, device)
        tensors = {}
        for call in ("", "@2"):
            out, lse = flash_attention_forward(q, k, v, delta, theta, causal, scale, q_offset, magnitude)[:2]
            tensors["forward out" + call], tensors["lse" + call] = out.cpu(), lse.cpu()
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, delta)]
            out = triton_pope_attention(
                *leaves,
                base=10000.0,
                causal=causal,
                softmax_scale=scale,
                q_offset=q_offset,
                magnitude=magnitude,
                rotary_dim=None,
            )
            tensors["out" + call] = out.detach().cpu()
            if nq > 16:  # the decode kernels have no backward of their own (training calls take the block kernels)
                for grad_name, grad in zip(("dq", "dk", "dv", "d_delta"), torch.autograd.grad(out, leaves, grad_out)):
                    tensors[grad_name + call] = grad.cpu()
            del out, leaves
        results[name] = tensors
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"  {name}: {len(tensors)} tensors", file=sys.stderr, flush=True)
    torch.save(results, save)


def run_tree(tree: str, save: str, small: bool, device: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, os.path.abspath(__file__), "--worker", save, "--device", device] + (
        ["--small"] if small else []
    )
    run = subprocess.run(command, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"the run of {tree} failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")


def compare(old: dict, new: dict) -> list[dict]:
    import torch

    rows = []
    for case in list(old) + [c for c in new if c not in old]:
        names = sorted(set(old.get(case, {})) | set(new.get(case, {})))
        for name in names:
            a, b = old.get(case, {}).get(name), new.get(case, {}).get(name)
            if a is None or b is None:
                rows.append({"case": case, "tensor": name, "equal": False, "note": "missing in one tree"})
                continue
            equal = (
                a.dtype == b.dtype
                and a.shape == b.shape
                and torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
            )
            diff = (a.double() - b.double()).abs().max().item() if a.shape == b.shape else float("nan")
            rows.append(
                {
                    "case": case,
                    "tensor": name,
                    "equal": bool(equal),
                    "max_abs_diff": diff,
                    "shape": list(a.shape),
                    "dtype": str(a.dtype),
                }
            )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="source tree of the old version (the directory holding pope/)")
    parser.add_argument("--new", help="source tree of the new version")
    parser.add_argument("--small", action="store_true", help="small shapes (the CPU interpreter)")
    parser.add_argument(
        "--device", default=None, choices=["cuda", "cpu"], help="default: cuda, or cpu when TRITON_INTERPRET=1"
    )
    parser.add_argument("--out", help="directory for kernel_bitwise_ab.json (required with --old/--new)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device or ("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")
    if args.worker:
        worker(args.worker, args.small, device)
        return 0
    if not (args.old and args.new and args.out):
        parser.error("--old, --new and --out are required")
    for tree in (args.old, args.new):
        if not os.path.isdir(os.path.join(tree, "pope")):
            parser.error(f"{tree} holds no pope package (give the src directory of a checkout)")
    import torch

    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        saved = {}
        for label, tree in (("old", args.old), ("new", args.new)):
            print(f"running {label}: {tree}", flush=True)
            saved[label] = os.path.join(scratch, f"{label}.pt")
            run_tree(tree, saved[label], args.small, device)
        old, new = (torch.load(saved[label]) for label in ("old", "new"))
    rows = compare(old, new)
    width = max(len(r["case"]) for r in rows)
    for r in rows:
        note = r.get("note") or f"max |old - new| = {r['max_abs_diff']:.3g}"
        print(f"{r['case']:<{width}}  {r['tensor']:<16} {'equal' if r['equal'] else 'DIFFERS'}  {note}")
    mismatches = [r for r in rows if not r["equal"]]
    summary = {
        "old": os.path.abspath(args.old),
        "new": os.path.abspath(args.new),
        "device": device,
        "small": args.small,
        "tensors": len(rows),
        "mismatches": len(mismatches),
        "seconds": round(time.time() - started, 1),
        "rows": rows,
    }
    if device == "cuda":
        summary["gpu"] = torch.cuda.get_device_name()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_bitwise_ab.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{len(rows) - len(mismatches)}/{len(rows)} tensors bitwise equal ({summary['seconds']} s)")
    return 1 if mismatches or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
