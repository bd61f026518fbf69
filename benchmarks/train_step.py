"""Step time of the trainer on one GPU (default: the `indirect-indexing` preset, the paper's model).

For each variant (execution mode x positional encoding) it builds a fresh Trainer (same seed, same
data), runs warm-up steps (compilation, CUDA-graph capture), checks the losses of the first steps
against the eager fp32-free reference variant, then times `--steps` steps exactly as the training
loop runs them (train_step + loss accumulation, no host sync inside the timed region) with a
synchronize at both ends. Prints a table last; writes JSON with provenance to --out.

    PYTHONPATH=src python benchmarks/train_step.py --variants eager,compile,graph,compile+graph \
        --pe pope,pope:backend=reference,rope --out runs/bench/train_step.json
    PYTHONPATH=src python benchmarks/train_step.py --cases 'pope@compile+graph;pope@compile' --profile

`--profile` adds where the step's GPU time goes: the summed kernel time per step against the step time.

Target (issue 3): <= 4.8 ms/step for indirect-indexing (100k steps in <= 8 minutes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pope.provenance import git_commit, library_versions  # noqa: E402
from pope.train.run_config import resolve_run_config  # noqa: E402
from pope.train.trainer import Trainer  # noqa: E402

MODES = {
    "eager": ("false", "false"),
    "compile": ("true", "false"),
    "graph": ("false", "true"),
    "compile+graph": ("true", "true"),
}


def profile_steps(trainer, first: int, steps: int) -> dict:
    """GPU kernel time of `steps` more training steps under torch.profiler: the kernels' summed time per step
    (the GPU's busy time where kernels run one at a time, as in one stream; the rest of the step is the GPU
    waiting) and the 25 costliest kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for step in range(first, first + steps):
            trainer.train_step(step)
        torch.cuda.synchronize()
    kernels = [event for event in prof.key_averages() if event.self_device_time_total > 0]
    kernels.sort(key=lambda event: event.self_device_time_total, reverse=True)
    busy_ms = sum(event.self_device_time_total for event in kernels) / 1000 / steps
    top = [
        {
            "name": event.key[:120],
            "calls_per_step": event.count / steps,
            "ms_per_step": event.self_device_time_total / 1000 / steps,
        }
        for event in kernels[:25]
    ]
    return {"kernel_ms_per_step": busy_ms, "kernels_per_step": sum(e.count for e in kernels) / steps, "top": top}


def measure(
    preset: str,
    pe: str,
    mode: str,
    *,
    steps: int,
    warmup: int,
    check_steps: int,
    extra: list[str],
    profile: bool = False,
) -> dict:
    compile_flag, graph_flag = MODES[mode]
    overrides = [
        f"train.compile={compile_flag}",
        f"train.cuda_graph={graph_flag}",
        "train.tensorboard=false",
        "train.progress=false",
        *extra,
    ]
    config = resolve_run_config(preset, pe, seed=0, overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, run_dir)
        started = time.perf_counter()
        losses = []
        for step in range(max(warmup, check_steps)):
            loss = trainer.train_step(step)
            if step < check_steps:
                losses.append(loss.item())
        torch.cuda.synchronize()
        warmup_s = time.perf_counter() - started
        accumulated = torch.zeros((), device=trainer.device)
        times = []
        first = max(warmup, check_steps)
        for repeat in range(3):  # three timed blocks: median and spread
            torch.cuda.synchronize()
            begin = time.perf_counter()
            for step in range(first + repeat * steps, first + (repeat + 1) * steps):
                accumulated += trainer.train_step(step)
            torch.cuda.synchronize()
            times.append(1000 * (time.perf_counter() - begin) / steps)
        memory = torch.cuda.max_memory_allocated() / 2**20
        profiled = profile_steps(trainer, first + 3 * steps, steps) if profile else None
        del trainer
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return {
        "preset": preset,
        "pe": pe,
        "mode": mode,
        "ms_per_step": statistics.median(times),
        "ms_blocks": times,
        "warmup_and_compile_s": warmup_s,
        "first_losses": losses,
        "peak_memory_mib": memory,
        "loss_finite": bool(torch.isfinite(accumulated)),
        "profile": profiled,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="indirect-indexing")
    parser.add_argument("--pe", default="pope,rope", help="comma-separated encodings")
    parser.add_argument("--variants", default="eager,compile,graph,compile+graph")
    parser.add_argument("--steps", type=int, default=200, help="steps per timed block (3 blocks)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--check-steps", type=int, default=10, help="losses compared between variants")
    parser.add_argument("--cases", default=None, help="explicit 'PE@MODE;PE@MODE' list (overrides --pe/--variants)")
    parser.add_argument("--set", dest="extra", action="append", default=[])
    parser.add_argument("--out", default=None, help="write results JSON here")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one more block per case: GPU kernel time per step and the costliest kernels",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.cases:
        cases = [tuple(case.rsplit("@", 1)) for case in args.cases.split(";") if case.strip()]
    else:
        cases = [(pe, mode) for pe in args.pe.split(",") for mode in args.variants.split(",")]
    for _pe, mode in cases:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    results = []
    for pe, mode in cases:
        result = measure(
            args.preset,
            pe,
            mode,
            steps=args.steps,
            warmup=args.warmup,
            check_steps=args.check_steps,
            extra=args.extra,
            profile=args.profile,
        )
        results.append(result)
        print(json.dumps(result), flush=True)
    # correctness: every variant of one encoding follows the losses of that encoding's eager run
    # (or its first run): same seed, same batches; bf16 autocast allows small differences
    problems = []
    for result in results:
        same = [r for r in results if r["pe"].split(":")[0] == result["pe"].split(":")[0]]
        reference = next((r for r in same if r["mode"] == "eager"), same[0])
        worst = max(abs(a - b) / abs(b) for a, b in zip(result["first_losses"], reference["first_losses"]))
        result["max_rel_loss_diff_vs_first_variant"] = worst
        if worst > 0.02 or not result["loss_finite"]:
            problems.append(f"{result['pe']} {result['mode']}: losses differ by {worst:.3g} or non-finite")
    provenance = {
        "gpu": torch.cuda.get_device_name(),
        "versions": library_versions(),
        "git": git_commit(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": sys.argv,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"provenance": provenance, "results": results}, indent=2) + "\n")
    print(
        f"\n{provenance['gpu']}  torch {provenance['versions']['torch']}  triton {provenance['versions']['triton']}"
        f"  commit {provenance['git']['commit']}"
    )
    print(f"{'pe':<26}{'mode':<16}{'ms/step':>9}{'100k steps':>12}{'compile s':>11}{'loss diff':>11}{'MiB':>8}")
    for r in results:
        print(
            f"{r['pe']:<26}{r['mode']:<16}{r['ms_per_step']:>9.3f}{r['ms_per_step'] * 100:>11.0f}s"
            f"{r['warmup_and_compile_s']:>11.1f}{r['max_rel_loss_diff_vs_first_variant']:>11.2e}"
            f"{r['peak_memory_mib']:>8.0f}"
        )
    for r in results:
        if r["profile"]:
            p = r["profile"]
            print(
                f"\n{r['pe']} {r['mode']}: kernels {p['kernel_ms_per_step']:.3f} of {r['ms_per_step']:.3f} ms/step"
                f" ({p['kernels_per_step']:.0f} kernels a step)"
            )
            for kernel in p["top"]:
                print(f"  {kernel['ms_per_step']:8.4f} ms  x{kernel['calls_per_step']:<5.0f} {kernel['name'][:90]}")
    for problem in problems:
        print("CHECK FAILED:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
