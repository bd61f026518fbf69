"""Multi-GPU scaling of the trainer's step: tokens/s per GPU, scaling efficiency, peak memory, loss equality.

Run under torchrun; the world size is the number of processes. For a preset (default owt-124m; owt-774m with
--parallel fsdp) and each --pe, the trainer's own components (setup_distributed, make_strategy: DDP or FSDP2,
build_optimizer, WarmupDecaySchedule, EagerStep, WindowBatches) run --warmup + --steps optimizer steps at the
preset's GLOBAL batch (recipe.batch_size x seq_len, split over grad_accum x world size, as the trainer splits
it), so every world size computes the same steps. The --steps steps after the warm-up are timed (synchronised
and barriered at both ends; the slowest rank's time counts). torch.compile on CUDA as the trainer does; bf16
autocast on CUDA.

Data: a synthetic token stream (ids drawn from a Zipf-like law, a fixed 2^16-token sequence repeated), windows
drawn the trainer's way (a pure function of (seed, step)): no dataset needed, and the loss falls as the model
learns the sequence, so the per-step losses are a meaningful equality check across world sizes. Not a
language-modelling result.

One row per (preset, pe, parallel, world size) is appended to OUT/scaling.csv (rank 0) with provenance (GPU,
torch, triton, commit — POPE_GIT_COMMIT wins over git — date, command): tokens/s in total and per GPU, ms per
step, peak memory per GPU (max over ranks, and each rank's), and the global loss of the first --loss-steps steps.

    torchrun --standalone --nproc_per_node=N benchmarks/scaling.py [--preset owt-124m] [--parallel ddp]
        [--pe pope --pe rope] [--steps 20] [--warmup 5] [--out benchmarks/results]
    python benchmarks/scaling.py --plot [--out benchmarks/results]   # efficiency table + OUT/scaling.png, no GPU

Efficiency at world size W = (tokens/s per GPU at W) / (tokens/s at world size 1), for rows of the same
(preset, pe, parallel, gpu, commit); the plot and table use the last row of each world size. Two world-size-1
rows in a group (run it twice) give the table the GPU's own run-to-run loss difference to judge the others by.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_io import append_csv  # noqa: E402  (same directory: the shared CSV helper)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
GROUP_KEYS = ("preset", "pe", "parallel", "gpu", "commit")
SYNTHETIC_PERIOD = 1 << 16


def synthetic_tokens(vocab_size: int, n_tokens: int, seed: int = 0) -> np.ndarray:
    """(n_tokens,) int64: a fixed random SYNTHETIC_PERIOD-token sequence (Zipf-like ids below vocab_size), repeated."""
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(1.2, size=SYNTHETIC_PERIOD) - 1
    period = rng.permutation(vocab_size)[np.minimum(ranks, vocab_size - 1)]
    return np.resize(period, n_tokens).astype(np.int64)


def measure(args, pe: str, context) -> dict:
    """Run warm-up + timed steps of one PE on this rank; returns the row (meaningful on rank 0)."""
    import torch.distributed as dist

    from pope.model import GPT
    from pope.train.batches import Shard, WindowBatches
    from pope.train.distributed import all_gather_object, all_reduce_sum, barrier
    from pope.train.optimizer import build_optimizer
    from pope.train.parallel import make_strategy
    from pope.train.run_config import resolve_run_config
    from pope.train.schedule import WarmupDecaySchedule
    from pope.train.step import EagerStep
    from pope.train.trainer_state import seed_everything

    config = resolve_run_config(args.preset, pe, seed=args.seed, overrides=args.set)
    recipe, device = config.recipe, context.device
    cuda = device.type == "cuda"
    total_steps = args.warmup + args.steps
    seed_everything(config.seed)
    tokens = synthetic_tokens(config.model.vocab_size, max(4 * SYNTHETIC_PERIOD, 2 * recipe.seq_len + 2), args.seed)
    batches = WindowBatches(
        tokens,
        recipe.seq_len,
        global_batch=recipe.batch_size,
        micro_steps=recipe.grad_accum,
        seed=config.seed,
        shard=Shard(context.rank, context.world_size),
        device=device,
        source="synthetic tokens",
    )
    model = GPT(config.model).to(device)
    strategy = make_strategy(context, args.parallel)
    train_model = strategy.wrap(model)
    schedule = WarmupDecaySchedule(
        recipe.lr, recipe.min_lr, min(recipe.warmup_steps, total_steps), total_steps, recipe.lr_decay
    )
    optimizer = build_optimizer(
        model,
        lr=schedule(0),
        betas=(recipe.beta1, recipe.beta2),
        weight_decay=recipe.weight_decay,
        decay_params=recipe.weight_decay_params,
        fused=cuda,
    )
    compiled = cuda if args.compile is None else args.compile
    if compiled:
        train_model = torch.compile(train_model)
    autocast = torch.bfloat16 if cuda else None
    step = EagerStep(
        model=model,
        train_model=train_model,
        strategy=strategy,
        optimizer=optimizer,
        schedule=schedule,
        batches=batches,
        micro_steps=recipe.grad_accum,
        grad_clip=recipe.grad_clip,
        device=device,
        autocast_dtype=autocast,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    losses = [step(s) for s in range(args.warmup)]
    if cuda:
        torch.cuda.synchronize(device)
    barrier()
    started = time.perf_counter()
    losses += [step(s) for s in range(args.warmup, total_steps)]
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = torch.tensor(time.perf_counter() - started, dtype=torch.float64)
    if dist.is_initialized():  # the slowest rank's time counts
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    global_losses = all_reduce_sum(torch.stack(losses).float()).tolist()  # each rank returned its share
    peak_mb = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else float("nan")
    peaks = all_gather_object(peak_mb)  # every rank's
    tokens_per_s = recipe.batch_size * recipe.seq_len * args.steps / float(elapsed)
    row = {
        "preset": args.preset,
        "pe": pe,
        "parallel": args.parallel,
        "strategy": strategy.name,
        "world_size": context.world_size,
        "global_batch": recipe.batch_size,
        "seq_len": recipe.seq_len,
        "grad_accum": recipe.grad_accum,
        "micro_batch": batches.micro_batch,
        "params": model.num_params(),
        "compile": compiled,
        "autocast": str(autocast),
        "warmup": args.warmup,
        "steps": args.steps,
        "ms_per_step": 1000 * float(elapsed) / args.steps,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / context.world_size,
        "peak_mb_per_gpu": max(peaks),
        "peak_mb_ranks": ";".join(f"{p:.0f}" for p in peaks),
        "losses": " ".join(f"{x:.7g}" for x in global_losses[: args.loss_steps]),
    }
    del step, optimizer, train_model, model
    gc.collect()
    if cuda:
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    barrier()
    return row


def read_rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        raise SystemExit(f"{path} not found: run benchmarks/scaling.py under torchrun first")
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _loss_difference(row: dict, base: dict) -> float:
    """The largest relative difference of two rows' losses over the steps both recorded."""
    pairs = zip((float(x) for x in row["losses"].split()), (float(x) for x in base["losses"].split()))
    return max((abs(a - b) / abs(b) for a, b in pairs), default=float("nan"))


def efficiency_table(rows: list[dict]) -> list[dict]:
    """Per (preset, pe, parallel, gpu, commit) and world size (the last row of each): tokens/s per GPU,
    efficiency vs the world-size-1 row and the largest relative loss difference from it over the steps both
    recorded; ``loss_noise`` is that difference between the group's last two world-size-1 rows (the GPU's run
    to run noise; NaN with one). Groups without a world-size-1 row are left out."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in GROUP_KEYS), {}).setdefault(int(row["world_size"]), []).append(row)
    table = []
    for key, by_size in groups.items():
        if 1 not in by_size:
            print(f"no world-size-1 row for {dict(zip(GROUP_KEYS, key))}: no efficiency", file=sys.stderr)
            continue
        ones = by_size[1]
        base = ones[-1]
        noise = _loss_difference(ones[-2], base) if len(ones) > 1 else float("nan")
        for size in sorted(by_size):
            row = by_size[size][-1]
            table.append(
                {
                    **dict(zip(GROUP_KEYS, key)),
                    "world_size": size,
                    "tokens_per_s_per_gpu": float(row["tokens_per_s_per_gpu"]),
                    "efficiency": float(row["tokens_per_s_per_gpu"]) / float(base["tokens_per_s"]),
                    "peak_mb_per_gpu": float(row["peak_mb_per_gpu"]),
                    "loss_max_rel_diff": _loss_difference(row, base),
                    "loss_noise": noise,
                    "loss_steps_compared": min(len(row["losses"].split()), len(base["losses"].split())),
                }
            )
    return table


def plot(table: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    lines = {}
    for row in table:
        lines.setdefault((row["preset"], row["pe"], row["parallel"], row["gpu"], row["commit"]), []).append(row)
    for (preset, pe, parallel, _gpu, commit), points in lines.items():
        sizes = [p["world_size"] for p in points]
        label = f"{preset} {pe} {parallel} ({commit})"
        axes[0].plot(sizes, [p["efficiency"] for p in points], marker="o", label=label)
        axes[1].plot(sizes, [p["tokens_per_s_per_gpu"] for p in points], marker="o", label=label)
    for target, label in ((0.9, "target DDP 124M at 8 GPUs"), (0.8, "target FSDP2 774M at 8 GPUs")):
        axes[0].axhline(target, color="grey", linestyle="--", linewidth=0.8)
        axes[0].text(1, target - 0.04, label, fontsize=7, color="grey")
    gpus = sorted({row["gpu"] for row in table})
    axes[0].set(
        xlabel="world size (GPUs)",
        ylabel="scaling efficiency vs 1 GPU",
        xscale="log",
        ylim=(0, 1.1),
        title="tokens/s per GPU / tokens/s on 1 GPU",
    )
    axes[1].set(xlabel="world size (GPUs)", ylabel="tokens/s per GPU", xscale="log", title=", ".join(gpus))
    for ax in axes:
        sizes = sorted({row["world_size"] for row in table})
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(table: list[dict]) -> None:
    print(
        f"{'preset':<12}{'pe':<22}{'parallel':<9}{'GPUs':>5}{'tok/s/GPU':>12}{'eff':>7}{'peak MiB':>10}"
        f"{'loss rel diff':>15}{'1-GPU noise':>13}"
    )
    for r in table:
        print(
            f"{r['preset']:<12}{r['pe']:<22}{r['parallel']:<9}{r['world_size']:>5}{r['tokens_per_s_per_gpu']:>12.0f}"
            f"{r['efficiency']:>7.3f}{r['peak_mb_per_gpu']:>10.0f}{r['loss_max_rel_diff']:>15.2e}"
            f"{r['loss_noise']:>13.2e}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="owt-124m")
    parser.add_argument("--parallel", default="ddp", choices=("ddp", "fsdp"))
    parser.add_argument(
        "--pe", action="append", default=None, help="positional encoding spec, repeatable (default: pope and rope)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model./recipe. override, as pope train --set (e.g. recipe.grad_accum=4)",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    parser.add_argument("--loss-steps", type=int, default=25, help="how many first steps' losses the row keeps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the model (default: on CUDA, as the trainer does)",
    )
    parser.add_argument("--out", default=RESULTS, help="folder of scaling.csv (and scaling.png)")
    parser.add_argument("--plot", action="store_true", help="only print the efficiency table and draw OUT/scaling.png")
    args = parser.parse_args(argv)
    csv_path = os.path.join(args.out, "scaling.csv")
    if args.plot:
        table = efficiency_table(read_rows(csv_path))
        if not table:
            raise SystemExit(f"{csv_path}: no group has a world-size-1 row to compare with")
        print_table(table)
        plot(table, os.path.join(args.out, "scaling.png"))
        return 0
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    from pope.provenance import provenance
    from pope.train.distributed import setup_distributed, teardown_distributed

    context = setup_distributed(args.device)
    try:
        stamp = provenance(context.device)
        meta = {
            "gpu": stamp["device"],
            "torch": stamp["torch"],
            "triton": stamp["triton"],
            "commit": stamp["git_commit"] or "unknown",
            "date": stamp["date_utc"],
            "command": stamp["command"],
        }
        rows = []
        for pe in args.pe or ["pope", "rope"]:
            row = measure(args, pe, context)
            rows.append(row)
            if context.is_main:
                print(
                    f"{row['preset']} {pe} {row['strategy']} x{row['world_size']}: {row['ms_per_step']:.1f} ms/step, "
                    f"{row['tokens_per_s']:.0f} tokens/s ({row['tokens_per_s_per_gpu']:.0f} per GPU), peak "
                    f"{row['peak_mb_per_gpu']:.0f} MiB/GPU",
                    flush=True,
                )
        if context.is_main:
            os.makedirs(args.out, exist_ok=True)
            append_csv(csv_path, rows, meta)
            print(f"appended {len(rows)} rows to {csv_path}")
    finally:
        teardown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
