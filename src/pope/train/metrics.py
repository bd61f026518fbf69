"""Run records and best-checkpoint bookkeeping.

``MetricsLogger``: ``metrics.jsonl`` (one JSON object per line), TensorBoard events, and on the console a tqdm bar
where stdout and stderr are terminals, else one plain line per log interval (logs redirected to a file hold no bar
frames); every evaluation is printed as one line in both. Only rank 0 writes (``enabled=False`` elsewhere). Every
record has ``step`` and ``kind`` (``"train"`` or ``"eval"``); train records carry ``loss``, ``lr``, ``tokens_per_s``;
eval records carry ``{split}_loss`` / ``{split}_accuracy`` (accuracy = argmax over the vocabulary on the scored
tokens).

``BestTracker``: which evaluation ``checkpoints/best`` holds (``train.best_metric``), and the best test
loss / accuracy over all evaluations (what the paper reports for JSB, MAESTRO and the genome); its
state is stored in every checkpoint. ``summary()`` gives ``RUN/summary.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from tqdm.auto import tqdm

from pope.files import write_text_atomic
from pope.optional import require


class MetricsLogger:
    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        enabled: bool,
        total_steps: int,
        start_step: int = 0,
        tensorboard: bool = True,
        progress: bool = True,
    ) -> None:
        self.enabled, self.progress, self.total_steps = enabled, progress, total_steps
        self.path = Path(run_dir) / "metrics.jsonl"
        self._writer = None
        self._bar = None
        self._plain = False  # progress as one printed line per log interval
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        self._file = open(self.path, "a", buffering=1)
        if tensorboard:
            tensorboard_module = require(
                "torch.utils.tensorboard", purpose="TensorBoard logging; or pass --set train.tensorboard=false"
            )
            # events after the checkpoint's step are dropped (those steps run again); the step's own are kept
            self._writer = tensorboard_module.SummaryWriter(
                log_dir=str(Path(run_dir) / "tensorboard"), purge_step=start_step + 1 if start_step else None
            )
        if progress and interactive():
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
        elif progress:
            self._plain = True

    def _truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint: those steps are run again. A last line cut off by a
        crash mid-write is dropped with a notice; a damaged line before it is an error (the file is left as it
        is). The shortened file replaces the old one atomically."""
        if not self.path.exists():
            return
        records, torn = parse_metrics(self.path)
        if torn is not None:
            print(
                f"notice: {self.path}: its last line was cut off by a crash mid-write ({torn[:60]!r}...); dropped "
                "(its step runs again)",
                file=sys.stderr,
            )
        kept = [line for line, record in records if record.get("step", 0) <= step]
        if torn is None and len(kept) == len(records):
            return  # nothing to drop: the file stays as it is
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        if self._writer is not None:
            for key, value in record.items():
                if key not in ("step", "kind") and isinstance(value, (int, float)):
                    self._writer.add_scalar(f"{record.get('kind', 'train')}/{key}", value, record["step"])
        if self._bar is not None and record.get("kind") == "train":
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")
        elif self._plain and record.get("kind") == "train":
            print(train_line(record, self.total_steps), flush=True)
        if record.get("kind") == "eval":  # evaluations are always echoed (also without a progress bar)
            line = eval_line(record)
            if self._bar is not None:
                self._bar.write(line)
            else:
                print(line, flush=True)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def evaluation_progress(self, label: str, total: int):
        """A labelled bar over ``total`` evaluation batches (a no-op without a progress bar)."""
        if not (self.enabled and self._bar is not None):
            if self._plain:
                print(f"{label}: {total} batches", flush=True)
            return nullcontext(None)
        return tqdm(total=total, desc=label, unit="batch", leave=False, dynamic_ncols=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._writer is not None:
            self._writer.close()
        if self._bar is not None:
            self._bar.close()


def interactive() -> bool:
    """Whether the console is a terminal (stdout and stderr): a live bar there, plain lines otherwise."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def _number(value, spec: str) -> str:
    return "nan" if value is None else format(value, spec)


def train_line(record: dict, total_steps: int) -> str:
    """One log interval as a plain line: 'step 200/300  loss 1.2345  lr 1.2e-03  4,321 tokens/s  12.3 ms/step'."""
    return (
        f"step {record['step']}/{total_steps}  loss {_number(record.get('loss'), '.4f')}  "
        f"lr {_number(record.get('lr'), '.2e')}  {_number(record.get('tokens_per_s'), ',.0f')} tokens/s  "
        f"{_number(record.get('step_ms'), '.1f')} ms/step"
    )


def eval_line(record: dict) -> str:
    """One evaluation as a line: 'eval step 100: valid_loss 0.7012  ...', then, for PoPE with a learned delta, how
    many delta entries lie outside [-2pi, 0] (the record's delta_below / delta_above; pope.eval.delta_state: under
    delta_range=clamp they no longer learn)."""
    hidden = ("step", "kind", "delta_below", "delta_above")  # token counts stay in metrics.jsonl
    shown = {k: v for k, v in record.items() if k not in hidden and not k.endswith("_tokens")}
    parts = [f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items()]
    line = f"eval step {record.get('step')}: " + "  ".join(parts)
    if "delta_below" in record:
        line += (
            f"  | PoPE delta entries outside [-2pi, 0]: {record['delta_below']} below, {record['delta_above']} above "
            "(`pope analyze delta`)"
        )
    return line


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """Every record of RUN/metrics.jsonl. A last line cut off by a crash mid-write (the run is being written, or
    died) is left out with a notice on stderr; a damaged line before it is a ValueError naming it."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a `pope train` run directory?")
    records, torn = parse_metrics(path)
    if torn is not None:
        print(
            f"notice: {path}: its last line is incomplete (a crash mid-write, or a run still writing); left out",
            file=sys.stderr,
        )
    return [record for _, record in records]


def parse_metrics(path: Path) -> tuple[list[tuple[str, dict]], str | None]:
    """([(line, record), ...] of a metrics.jsonl's complete records, the torn last line or None). Records are
    appended one line at a time, so a crash can cut off only the last line; a line before it that is not a JSON
    object is damage from elsewhere: ValueError naming the file and the line, and what to do."""
    lines = path.read_text(errors="replace").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records, torn = [], None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            if number == len(lines):
                torn = line
                break
            raise ValueError(
                f"{path} line {number} is not a metrics record ({err}); the file was damaged or edited: repair or "
                "delete that line (keep a copy), then run the command again"
            ) from None
        records.append((line, record))
    return records, torn


class BestTracker:
    """Best evaluation so far by one metric (``name``; ``*_accuracy`` higher is better, ``*_loss`` lower)
    and the best test loss / accuracy over all evaluations. ``state`` is the dict checkpoints store."""

    def __init__(self, name: str, state: dict | None = None) -> None:
        self.name, self.higher_is_better = name, name.endswith("_accuracy")
        self.state = dict(state or {})

    def update(self, step: int, metrics: dict) -> bool:
        """Record one evaluation; True when it is the new best (checkpoints/best should be written)."""
        state = self.state
        if self.name in metrics:
            value, previous = metrics[self.name], state.get("value")
            if previous is None or (value > previous if self.higher_is_better else value < previous):
                state.update(metric=self.name, value=value, step=step, metrics=metrics)
        if "test_loss" in metrics and metrics["test_loss"] < state.get("best_test_loss", math.inf):
            state.update(best_test_loss=metrics["test_loss"], best_test_loss_step=step)
        if "test_accuracy" in metrics and metrics["test_accuracy"] > state.get("best_test_accuracy", -1.0):
            state.update(best_test_accuracy=metrics["test_accuracy"], best_test_accuracy_step=step)
        return state.get("step") == step

    def summary(self) -> dict:
        """The best-related keys of RUN/summary.json."""
        state = self.state
        return {
            "best_metric": state.get("metric"),
            "best_value": state.get("value"),
            "best_step": state.get("step"),
            "at_best_valid": state.get("metrics", {}),
            "best_test_loss": state.get("best_test_loss"),
            "best_test_loss_step": state.get("best_test_loss_step"),
            "best_test_accuracy": state.get("best_test_accuracy"),
            "best_test_accuracy_step": state.get("best_test_accuracy_step"),
        }
