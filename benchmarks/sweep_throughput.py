"""Seed-runs per hour on one GPU for 1, 2, 4 and 8 concurrent training processes (``pope train --seeds``).

For each K it runs the real sweep command, ``pope train PRESET --pe PE --seeds 0-(K-1) --jobs-per-gpu K``,
with evaluation and checkpoints pushed past the measurement, and watches every seed's metrics.jsonl
(a record each ``--log-interval`` steps, stamped with its arrival time by polling). The measurement window
opens when the last of the K processes has passed ``--warmup-steps`` (compilation and CUDA-graph capture
done) and lasts ``--window`` seconds with all K running; then the sweep is stopped with SIGINT. Aggregate
throughput = the steps all K processes made inside the window (interpolated from the stamped records) /
the window's length; seed-runs/hour = throughput x 3600 / the preset's max_steps. The step counts are the
benchmark's own: each process runs only as long as the window needs. About 3.5 minutes on an H200 for
K = 1, 2, 4, 8 (estimated: start-up ~20-60 s per K plus the 15 s window; the first K also fills
the compile cache the others reuse).

    PYTHONPATH=src python benchmarks/sweep_throughput.py [--pe pope] [--jobs 1,2,4,8] [--out benchmarks/results]

Without CUDA MPS the K processes time-slice the GPU; run it once with MPS on (``bash scripts/cuda_mps.sh start``
first) to see how much running their kernels side by side buys. Each row records whether MPS was on.

Prints a table; appends one row per K to OUT/sweep_throughput.csv with GPU, torch/triton versions, commit
(POPE_GIT_COMMIT or git), date and command. The best K under MPS is the --jobs-per-gpu to give that preset's
sweeps (pope.train.sweep.DEFAULT_JOBS_PER_GPU says why the default is one).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


class StepClock:
    """(arrival time, step) samples of one seed's metrics.jsonl, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.samples = path, 0, []

    def poll(self, now: float) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            record = json.loads(line)
            if record.get("kind") == "train":
                self.samples.append((now, int(record["step"])))

    def warm_since(self, warmup_steps: int) -> float | None:
        return next((t for t, step in self.samples if step >= warmup_steps), None)

    def step_at(self, when: float) -> float:
        """Steps done at time `when`, linear between the samples around it."""
        before = [(t, s) for t, s in self.samples if t <= when]
        after = [(t, s) for t, s in self.samples if t > when]
        if not before:
            return float(self.samples[0][1]) if self.samples else 0.0
        if not after:
            return float(before[-1][1])
        (t0, s0), (t1, s1) = before[-1], after[0]
        return s0 + (s1 - s0) * (when - t0) / (t1 - t0)


def measure(k: int, args, workdir: Path, max_steps: int) -> dict:
    out = workdir / f"k{k}"
    command = [
        sys.executable,
        "-m",
        "pope.cli",
        "train",
        args.preset,
        "--pe",
        args.pe,
        "--seeds",
        f"0-{k - 1}",
        "--jobs-per-gpu",
        str(k),
        "--jobs",
        str(k),
        "--out",
        str(out),
    ]
    given = {item.partition("=")[0].strip() for item in args.set}
    own = [
        f"train.log_interval={args.log_interval}",
        "recipe.eval_interval=100000000",
        "train.checkpoint_interval=100000000",
        "train.tensorboard=false",
    ]
    for item in [*(o for o in own if o.partition("=")[0] not in given), *args.set]:  # a key may be given once
        command += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if args.gpu is not None:  # all K processes on one GPU
        env["CUDA_VISIBLE_DEVICES"] = args.gpu
    sweep = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    clocks = [StepClock(out / f"seed-{seed}" / "metrics.jsonl") for seed in range(k)]
    started = time.monotonic()
    window_start = None
    try:
        while True:
            now = time.monotonic()
            for clock in clocks:
                clock.poll(now)
            if sweep.poll() is not None:
                logs = "; ".join(f"{p}: {p.read_text()[-500:]}" for p in sorted(out.glob("seed-*.log")))
                raise RuntimeError(f"the K={k} sweep exited ({sweep.returncode}) before the window closed. {logs}")
            warm = [clock.warm_since(args.warmup_steps) for clock in clocks]
            if window_start is None and all(w is not None for w in warm):
                window_start = max(warm)
            if window_start is not None and now - window_start >= args.window:
                window_end = now
                break
            if now - started > args.timeout:
                raise RuntimeError(f"K={k}: not warm after {args.timeout} s; see {out}/seed-*.log")
            time.sleep(0.1)
    finally:
        if sweep.poll() is None:
            sweep.send_signal(signal.SIGINT)  # the sweep forwards it to every seed and waits for them
            sweep.wait(timeout=120)
    steps = [clock.step_at(window_end) - clock.step_at(window_start) for clock in clocks]
    seconds = window_end - window_start
    throughput = sum(steps) / seconds
    return {
        "processes": k,
        "window_s": round(seconds, 2),
        "startup_s": round(window_start - started, 1),
        "ms_per_step_per_process": round(1000 * seconds * k / sum(steps), 3),
        "steps_per_s": round(throughput, 1),
        "seed_runs_per_hour": round(throughput * 3600 / max_steps, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="indirect-indexing")
    parser.add_argument("--pe", default="pope")
    parser.add_argument("--jobs", default="1,2,4,8", help="concurrent processes to measure, e.g. 1,2,4,8")
    parser.add_argument("--window", type=float, default=15.0, help="seconds measured with all processes warm")
    parser.add_argument("--warmup-steps", type=int, default=300, help="steps before a process counts as warm")
    parser.add_argument("--log-interval", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a K may take to get warm")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra --set for the runs")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    from pope.provenance import cuda_mps_active, provenance
    from pope.train.sweep import resolved_config, visible_gpus

    gpus = visible_gpus(args.set)
    args.gpu = gpus[0] if gpus else None
    device = "cuda" if gpus else "cpu"
    max_steps = resolved_config(args.preset, args.pe, overrides=args.set)["recipe"]["max_steps"]
    stamp = provenance(device)
    mps = cuda_mps_active()  # with MPS (scripts/cuda_mps.sh start) the K processes' kernels run side by side
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-throughput-") as workdir:
        for k in (int(x) for x in args.jobs.split(",")):
            row = measure(k, args, Path(workdir), max_steps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = rows[0]["steps_per_s"]
    print(
        f"\n{args.preset} --pe {args.pe} on {stamp['device']} (commit {stamp['git_commit']}), "
        f"seed-runs of {max_steps:,} steps, CUDA MPS {'on' if mps else 'off'}"
    )
    print(
        f"{'processes':>9} {'ms/step each':>12} {'steps/s':>9} {'seed-runs/h':>11} {'vs first':>8} {'start-up s':>10}"
    )
    for row in rows:
        print(
            f"{row['processes']:>9} {row['ms_per_step_per_process']:>12.2f} {row['steps_per_s']:>9.1f} "
            f"{row['seed_runs_per_hour']:>11.2f} {row['steps_per_s'] / base:>7.2f}x {row['startup_s']:>10.1f}"
        )
    best = max(rows, key=lambda r: r["steps_per_s"])
    print(f"best: {best['processes']} processes per GPU")
    path = Path(args.out) / "sweep_throughput.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "gpu": stamp["device"],
        "torch": stamp["torch"],
        "triton": stamp["triton"],
        "commit": stamp["git_commit"] or "unknown",
        "date": stamp["date_utc"],
        "command": stamp["command"],
        "preset": args.preset,
        "pe": args.pe,
        "max_steps": max_steps,
        "cuda_mps": mps,
    }
    new_file = not path.exists()
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*meta, *rows[0]])
        if new_file:
            writer.writeheader()
        writer.writerows({**meta, **row} for row in rows)
    print(f"appended {len(rows)} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
