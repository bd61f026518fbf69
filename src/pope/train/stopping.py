"""Stopping a run early without losing it: SIGINT / SIGTERM, ``train.stop_at_step``, ``train.max_seconds``.

A signal during training does not interrupt the step: ``StopSignals`` records it, the loop finishes
the current step, writes ``checkpoints/last`` and ends with ``stopped at step N; continue with:
pope train ... --resume`` (the same line as a stop at ``stop_at_step`` or ``max_seconds``). The
summary's ``stop_reason`` then gives the exit status: 0 for a finished run or a planned stop, 130
after SIGINT and 143 after SIGTERM (128 + the signal number, as a shell reports them).
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

EXIT_STATUS = {
    "finished": 0,
    "stop_at_step": 0,
    "max_seconds": 0,
    "SIGINT": 128 + signal.SIGINT,
    "SIGTERM": 128 + signal.SIGTERM,
}


class StopSignals:
    """Context manager: while active, SIGINT and SIGTERM set ``received`` (the signal's name) instead of
    raising; the previous handlers are restored on exit. Inactive off the main thread."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            print(
                f"\n{signal.Signals(signum).name} received: finishing this step, then writing a checkpoint",
                file=sys.stderr,
                flush=True,
            )
        self.received = self.received or signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


class StopVote:
    """Ranks agree on when to stop: ``poll(local)`` is true on every rank once any rank passed True.

    One process: ``local`` itself. Several on CPU (gloo): a small all-reduce per call. Several on CUDA:
    the all-reduce of call k is read back (through pinned memory and an event) at call k + 1, so the
    step loop never waits for the GPU; the ranks then stop together one step after the signal."""

    def __init__(self, device: torch.device) -> None:
        self.distributed = dist.is_initialized() and dist.get_world_size() > 1
        self.lagged = self.distributed and device.type == "cuda"
        if self.distributed:
            self.flag = torch.zeros((), device=device)
        if self.lagged:
            self.host = torch.zeros((), pin_memory=True)
            self.event, self.pending = torch.cuda.Event(), False

    def poll(self, local: bool) -> bool:
        if not self.distributed:
            return local
        decided = False
        if self.lagged and self.pending:
            self.event.synchronize()  # the previous call's all-reduce: finished a step ago
            decided = bool(self.host.item())
        self.flag.fill_(float(local))
        dist.all_reduce(self.flag, op=dist.ReduceOp.MAX)
        if not self.lagged:
            return bool(self.flag.item())
        self.host.copy_(self.flag, non_blocking=True)
        self.event.record()
        self.pending = True
        return decided


def exit_status(summary: dict) -> int:
    """The process exit status for a run that ended with ``summary`` (see the module docstring)."""
    return EXIT_STATUS.get(summary.get("stop_reason", "finished"), 0)


def resume_command(argv: list[str] | None = None, *, fallback: str) -> str:
    """The command that continues this run: the pope command line that started it, without
    ``--set train.stop_at_step=...`` and with ``--resume``; ``fallback`` when not started by the pope CLI
    (e.g. from Python)."""
    argv = list(sys.argv if argv is None else argv)
    program = Path(argv[0]).parts[-2:] if argv else ()
    if len(argv) < 2 or not (program[-1:] == ("pope",) or program in (("cli", "__main__.py"), ("pope", "__main__.py"))):
        return fallback
    words, skip = ["pope"], False
    for index, word in enumerate(argv[1:], start=1):
        if skip:
            skip = False
            continue
        if word == "--set" and index + 1 < len(argv) and argv[index + 1].startswith("train.stop_at_step="):
            skip = True
            continue
        if word.startswith("--set=train.stop_at_step="):
            continue
        words.append(word)
    if "--resume" not in words:
        words.append("--resume")
    return shlex.join(words)
