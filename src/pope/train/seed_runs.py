"""One seed of a sweep (pope.train.sweep): its record (`SeedRun`), what its run directory and log say (the last
logged step, whether it finished, ran out of GPU memory, may start over, or stopped on a signal sent to it alone),
the child-side request to die with the sweep, and the lines that report the seeds. Standard library only: scripts
call `run_finished` once per run."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

OUT_OF_MEMORY = ("CUDA out of memory", "CUDA error: out of memory")
"""What a child's log says when the GPU had no memory left (torch.OutOfMemoryError; a failed CUDA allocation)."""
STARTUP_RECORDS = ("config.json", "env.json", ".lock")
"""Files a run writes before its first step (with an empty metrics.jsonl and TensorBoard event files): a run
directory holding nothing else has nothing to lose by starting over."""


@dataclass
class SeedRun:
    seed: int
    run_dir: Path
    log: Path
    total_steps: int
    status: str = "pending"  # pending, running, finished, stopped, interrupted, failed, skipped
    gpu: str | None = None
    returncode: int | None = None
    step: int = 0
    notes: list[str] = field(default_factory=list)  # for the summary: restarted from scratch, requeued
    reason: str | None = None  # why a failed seed was not started (it has no child and no exit status)
    oom_retries: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)
    _log_handle: object = field(default=None, repr=False)
    _log_offset: int = field(default=0, repr=False)  # where this attempt's output starts in the log

    def record(self) -> dict:
        return {
            "status": self.status,
            "run_dir": self.run_dir.name,
            "log": self.log.name,
            "step": self.step,
            "total_steps": self.total_steps,
            "gpu": self.gpu,
            "returncode": self.returncode,
            "notes": self.notes,
            "reason": self.reason,
        }

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def log_line(self, text: str) -> None:
        with open(self.log, "a") as handle:
            handle.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}\n")


def last_step(metrics_path: Path) -> int:
    """The step of the last record in a metrics.jsonl (0 when absent); reads only the file's tail."""
    try:
        with open(metrics_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 8192))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a partial first line of the tail, or a line being written
    return 0


def out_of_memory(run: SeedRun) -> bool:
    """Whether the seed's last attempt (its part of the log; the last 64 KiB of it) reports CUDA out of memory."""
    try:
        with open(run.log, "rb") as handle:
            handle.seek(max(run._log_offset, handle.seek(0, os.SEEK_END) - 65536))
            text = handle.read().decode(errors="replace")
    except OSError:
        return False
    return any(marker in text for marker in OUT_OF_MEMORY)


def why_not_start_over(run_dir: Path, seed: int, config: dict) -> str | None:
    """None when a run directory without checkpoints holds only what a run writes before its first logged step
    (STARTUP_RECORDS, an empty metrics.jsonl, a tensorboard/ of event files) and its config.json is ``config``
    up to resume-mutable keys; else one line saying what is there and what to do."""
    from pope.train.run_config import config_differences  # here: it imports torch, which this module does without

    kept = []
    for entry in sorted(run_dir.iterdir()):
        if entry.name == "metrics.jsonl" and entry.is_file():
            rows = sum(1 for line in entry.read_text(errors="replace").splitlines() if line.strip())
            if rows:
                kept.append(f"metrics.jsonl with {rows} record(s)")
        elif entry.name == "tensorboard" and entry.is_dir():
            if any(not (f.is_file() and f.name.startswith("events.out.tfevents.")) for f in entry.iterdir()):
                kept.append("tensorboard/ with other files than event files")
        elif not (entry.name in STARTUP_RECORDS and entry.is_file()):
            kept.append(entry.name + ("/" if entry.is_dir() else ""))
    what_to_do = f"look at it, then delete {run_dir} to start seed {seed} over, or leave seed {seed} out of --seeds"
    if kept:
        return (
            f"{run_dir} has no checkpoint to resume from, and starting over would lose what it holds besides "
            f"start-up records ({', '.join(kept)}); {what_to_do}"
        )
    try:
        foreign = config_differences(json.loads((run_dir / "config.json").read_text()), config)
    except ValueError:
        return f"{run_dir / 'config.json'} is not valid JSON; {what_to_do}"
    if foreign:  # what a single run's --resume would refuse too
        return f"{run_dir / 'config.json'} is not this sweep's seed {seed} ({'; '.join(foreign[:4])}); {what_to_do}"
    return None


def run_finished(run_dir: Path, max_steps: int | None = None) -> bool:
    """True when the run's summary.json says its schedule is complete (and, given ``max_steps``, that it reached
    that step: a run being extended to more steps is not finished). A missing or torn summary.json is False: the
    run's --resume then says whether it is finished, and rebuilds the summary from its checkpoint."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        if not isinstance(summary, dict) or not summary.get("finished"):
            return False
        return max_steps is None or int(summary.get("step") or 0) >= max_steps
    except (OSError, ValueError, TypeError):
        return False


def stopped_by_own_signal(run_dir: Path, returncode: int) -> str | None:
    """ "SIGINT" / "SIGTERM" when a child ended cleanly on a signal sent to it alone (`kill`, a scheduler), not
    to the sweep: its summary.json names the signal and its exit status is that signal's (pope.train.stopping),
    so its last checkpoint is written and --resume continues it. None otherwise (a crash, or SIGKILL)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    from pope.train.stopping import exit_status  # here: it imports torch, which this module does without

    reason = summary.get("stop_reason")
    return reason if reason in ("SIGINT", "SIGTERM") and exit_status(summary) == returncode else None


def die_with_parent() -> None:
    """Child-side (Linux): get SIGTERM if the sweep process dies, so no orphan keeps training."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def report_lines(runs: list[SeedRun]) -> tuple[list[str], bool]:
    """(lines for the terminal, whether every seed ended well: finished, skipped or stopped on purpose)."""
    lines = [
        f"seed {r.seed:>4}  {r.status:<11}  step {r.step}/{r.total_steps}  {r.run_dir}"
        + (f"  ({'; '.join(r.notes)})" if r.notes else "")
        for r in runs
    ]
    failed = [r for r in runs if r.status == "failed"]
    for run in failed:
        if run.reason is not None:
            lines.append(f"seed {run.seed} not started: {run.reason}")
            continue
        tail = run.log.read_text(errors="replace").strip().splitlines()[-1:] if run.log.exists() else []
        lines.append(
            f"seed {run.seed} failed (exit {run.returncode}); log {run.log}" + (f": {tail[0]}" if tail else "")
        )
    resumable = [r.seed for r in runs if r.status in ("interrupted", "stopped", "pending")]
    if resumable:
        lines.append(f"unfinished seed(s) {resumable}: continue them with the same command plus --resume")
    ok = not failed and not any(r.status in ("interrupted", "pending") for r in runs)
    return lines, ok
