"""GPU check of stopping a run by signal (the CPU tests cover one process and gloo DDP).

1. one GPU, compile + whole-step CUDA graph: SIGINT mid-run -> exit 130 with checkpoints/last at the printed
   step; `--resume` finishes; losses match a straight run within the GPU's run-to-run noise;
2. torchrun, 2 GPUs, NCCL DDP: SIGTERM to torchrun -> both ranks stop at one step with a checkpoint; resume.

    PYTHONPATH=src python3 scripts/gpu_train_stop_check.py --out /tmp/out      (writes stop_check.json)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SETS = [
    "train.data_dir=/tmp/ii-small",
    "recipe.max_steps=3000",
    "recipe.eval_interval=1000",
    "train.log_interval=1",
    "train.progress=false",
    "train.tensorboard=false",
]


def command(out: Path, *, processes: int = 0, resume: bool = False) -> list[str]:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        if processes
        else [sys.executable]
    )
    args = ["indirect-indexing-tiny", "--pe", "pope", "--out", str(out)] + [x for s in SETS for x in ("--set", s)]
    return launcher + ["-m", "pope.cli", "train", *args] + (["--resume"] if resume else [])


def losses(run: Path) -> dict[int, float]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def interrupted(out: Path, signum: int, *, processes: int = 0, env: dict) -> dict:
    """Start a run, signal it after 200 logged steps, resume it to the end."""
    process = subprocess.Popen(command(out, processes=processes), env=env, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    while process.poll() is None and not (metrics.exists() and metrics.read_text().count("\n") >= 200):
        time.sleep(0.2)
    process.send_signal(signum)
    _, err = process.communicate(timeout=600)
    lines = [line for line in err.splitlines() if line.startswith("stopped at step ")]
    stopped = int(lines[-1].split()[3].rstrip(";")) if lines else None
    import torch

    state = torch.load(out / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    resumed = subprocess.run(command(out, processes=processes, resume=True), env=env, capture_output=True, text=True)
    return {
        "exit_status": process.returncode,
        "stopped_at": stopped,
        "checkpoint_step": state["step"],
        "stop_lines": len(lines),
        "resume_exit_status": resumed.returncode,
        "steps_complete_after_resume": sorted(losses(out)) == list(range(1, 3001)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/out")
    parser.add_argument("--work", default="/tmp/pope-stop-check")
    args = parser.parse_args()
    from pope.data.indirect_indexing import write_splits

    write_splits("/tmp/ii-small", 0, {"train": 20000, "valid": 1000, "test": 1000})
    work = Path(args.work)
    subprocess.run(["rm", "-rf", str(work)], check=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    one_gpu = {**env, "CUDA_VISIBLE_DEVICES": "0"}
    subprocess.run(command(work / "straight"), env=one_gpu, check=True, capture_output=True)
    single = interrupted(work / "single", signal.SIGINT, env=one_gpu)
    straight, again = losses(work / "straight"), losses(work / "single")
    single["max_rel_loss_diff_vs_straight"] = max(abs(again[s] - straight[s]) / abs(straight[s]) for s in straight)
    result = {
        "single_gpu_sigint": single,
        "ddp_2gpu_sigterm": interrupted(work / "ddp", signal.SIGTERM, processes=2, env=env),
    }
    result["ok"] = (
        single["exit_status"] == 130
        and single["stopped_at"] == single["checkpoint_step"]
        and all(
            r["steps_complete_after_resume"] and r["resume_exit_status"] == 0
            for r in result.values()
            if isinstance(r, dict)
        )
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "stop_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
