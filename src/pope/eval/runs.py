"""Loading trained runs for evaluation: one place for the checks and the labels."""

from __future__ import annotations

from pathlib import Path

import torch

from pope.checkpoint import load_model
from pope.data import indirect_indexing as task
from pope.files import read_json_record, write_json_atomic
from pope.train.evaluate import task_accuracy


def load_run_model(path: str | Path, device: str | torch.device = "cpu"):
    """(model in eval mode on ``device``, info) from a run or checkpoint directory via pope.checkpoint."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run or checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path} is not a directory; give a run directory (made by `pope train`) or one of "
            f"its checkpoints/<name> directories"
        )

    return load_model(path, map_location=str(device))  # already on the device and in eval mode


def run_config(path: str | Path) -> dict:
    """The run's resolved config.json (empty when ``path`` is a bare checkpoint directory)."""
    path = Path(path)
    for candidate in (path / "config.json", path.parent.parent / "config.json"):
        if candidate.is_file():
            return read_run_record(candidate)
    return {}


def run_label(path: str | Path) -> str:
    """A short label for tables and legends: the run directory's name (checkpoint name appended)."""
    path = Path(path).resolve()
    return path.name if path.name not in ("best", "last") else f"{path.parent.parent.name}/{path.name}"


def short_pe_spec(pe: str, limit: int = 28) -> str:
    """A PE spec short enough for a legend: whole up to ``limit`` characters ('pope:delta_init=zero'), else its
    name ('yarn:base=10000,...' -> 'yarn:…'); tables print it in full."""
    return pe if len(pe) <= limit else pe.split(":")[0] + ":…"


def run_dir_of(path: str | Path) -> Path:
    """The run directory for a run dir or one of its checkpoints/<name> directories."""
    path = Path(path)
    return path.parent.parent if path.parent.name == "checkpoints" else path


def task_splits_of(run: str | Path) -> Path:
    """The indirect-indexing split directory ``run`` trained on: its ``train.data_dir``, else the directory its
    dataset spec (the paper's task or a variant such as ``indirect-indexing:min_len=20,max_len=32``) and data
    seed name, generated if missing. Scoring a variant's run on the paper's splits would compare it on a task
    it was not trained for."""

    config = run_config(run)
    if not config:
        raise FileNotFoundError(f"{run} has no config.json; give a run directory made by `pope train`")
    if config["train"].get("data_dir"):
        return Path(config["train"]["data_dir"])
    spec = str(config["recipe"]["dataset"])
    if not task.is_task_spec(spec):
        raise ValueError(f"{run} trained on {spec!r}, not on the indirect-indexing task")
    return Path(task.ensure_splits(None, seed=config["train"]["data_seed"], options=task.parse_task_spec(spec)))


TASK_ACCURACY_FILE = "eval/task_accuracy.json"
"""Indirect-indexing accuracy of one checkpoint on several example files (``score_task_accuracy``):
{"checkpoint": name, "step": N, "splits": {name: {"accuracy", "correct", "examples", "loss", "by_shift", "data"}}}
(``by_shift``: the accuracy per signed shift, pope.train.evaluate.task_accuracy)."""


def score_task_accuracy(
    run: str | Path,
    data_files: dict[str, str | Path],
    *,
    checkpoint: str = "last",
    device: str = "auto",
    batch_size: int = 1000,
) -> dict:
    """Score ``RUN/checkpoints/<checkpoint>`` on each file (e.g. {"train": first 10k training examples,
    "test": test.txt}) with pope.train.evaluate.task_accuracy, all in fp32 with the same weights, and write
    RUN/eval/task_accuracy.json: the one place the train-vs-test (memorisation) gap of a run comes from."""

    run = run_dir_of(run)
    weights = run / "checkpoints" / checkpoint
    if not weights.exists():
        raise FileNotFoundError(f"{weights} does not exist; score a run that has checkpoints/{checkpoint}")
    splits = {}
    step = None
    for name, path in data_files.items():
        result = task_accuracy(str(weights), str(path), batch_size=batch_size, device=device)
        step = result.pop("step")
        result.pop("checkpoint")
        splits[name] = result
    record = {"checkpoint": checkpoint, "step": step, "splits": splits}
    write_json_atomic(run / TASK_ACCURACY_FILE, record)
    return record


def read_run_record(path: Path, *, required: bool = False) -> dict:
    """A JSON record a run keeps (config.json, summary.json, sweep.json, env.json, eval/*.json): {} when absent (unless
    required); a damaged one is one error naming the file and what to do (pope.files.read_json_record)."""
    if not path.is_file() and required:
        raise FileNotFoundError(f"{path} not found: is {path.parent} a `pope train` run directory?")
    rebuilt = path.name in ("summary.json", "config.json")
    fix = "`pope train --resume RUN` rebuilds it from the checkpoint" if rebuilt else "restore or delete it"
    return read_json_record(path, fix=f"{fix}, or leave this run out")
