"""Reading run directories made by ``pope train`` / ``pope finetune`` into RunRecords (pope.eval.report_records
says what is read from each file)."""

from __future__ import annotations

import os
import re
import shlex
import statistics
from pathlib import Path

from pope.eval.delta_state import DELTA_STATE_FILE
from pope.eval.report_records import (
    CURVE_SPLITS,
    LENGTH_KEYS,
    TRAIN_CURVE_METRICS,
    RunRecord,
    best_valid_value,
    eval_records,
    evaluation_curves,
    fingerprint_of,
    finite,
    headline_metric,
    is_number,
    length_tables,
    run_metric,
    shift_tables,
)
from pope.eval.runs import read_run_record
from pope.train.metrics import read_metrics
from pope.train.sweep_settings import EXECUTION_KEYS


def _records(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records as the trainer reads them: a last line torn by a crash is left out with a notice, a
    damaged line before it is one error naming it."""
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    return read_metrics(run_dir)


def _setting_label(run_dir: Path) -> str:
    """The sweep directory (``pope train --seeds``) and its overrides, or, for a run outside a sweep (a single run,
    a fine-tune), the run's own directory."""
    sweep_file = run_dir.parent / "sweep.json"
    if sweep_file.is_file():
        overrides = read_run_record(sweep_file).get("overrides", [])
        kept = [o for o in overrides if o.partition("=")[0].strip() not in EXECUTION_KEYS]
        return " ".join([run_dir.parent.name + "/", *kept])
    return run_dir.name + "/"


def curve_rows(records: list[dict]) -> list[tuple[int, str, str, float]]:
    """(step, split, metric, value) of a run's metrics.jsonl records: its learning curves in long format."""
    rows = []
    for record in records:
        step = int(record["step"])
        for key, value in record.items():
            if key in ("step", "kind") or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if record.get("kind") == "train":
                if key in TRAIN_CURVE_METRICS:
                    rows.append((step, "train", key, value))
            elif record.get("kind") == "eval":
                split, _, metric = key.partition("_")
                in_split = split in CURVE_SPLITS and metric
                rows.append((step, split, metric, value) if in_split else (step, "model", key, value))
    return rows


def final_values(summary: dict, evals: list[dict]) -> dict:
    final = summary.get("final") or {}
    values = {f"final_{key}": final.get(key) for key in ("valid_loss", "test_loss", "valid_accuracy", "test_accuracy")}
    losses, accuracies = finite(r.get("test_loss") for r in evals), finite(r.get("test_accuracy") for r in evals)
    values["min_test_loss"] = min(losses) if losses else None
    values["max_test_accuracy"] = max(accuracies) if accuracies else None
    return {key: value for key, value in values.items() if is_number(value)}


def run_provenance(run_dir: Path, summary: dict, records: list[dict]) -> dict:
    env_path = run_dir / "env.json"
    env = read_run_record(env_path)
    versions, git = env.get("versions") or {}, env.get("git") or {}
    step_ms = finite(r.get("step_ms") for r in records if r.get("kind") == "train")
    command = env.get("command")
    values = {
        "seconds": summary.get("seconds"),
        "median_step_ms": statistics.median(step_ms) if step_ms else None,
        "params": env.get("model_params"),
        "gpu": env.get("device_name") or env.get("device"),
        "world_size": env.get("world_size"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "torch": versions.get("torch"),
        "triton": versions.get("triton"),
        "python": versions.get("python"),
        "pope": versions.get("pope"),
        "date": env.get("started_utc"),
        "command": shlex.join(map(str, command)) if isinstance(command, list) else command,
    }
    return {key: value for key, value in values.items() if value is not None}


def length_rows(run_dir: Path) -> list[dict]:
    """The rows of ``pope eval length``'s records of this run (LENGTH_KEYS): per length, the whole window with the
    evaluation's provenance, then each range of positions inside it."""
    rows = []
    for path in sorted((run_dir / "eval").glob("length-*.json")):
        data = read_run_record(path)
        shared = {
            **dict.fromkeys((*LENGTH_KEYS, "commit", "device", "date", "command")),
            "evaluation": path.stem,
            "data": data.get("data_name", "?"),
            "split": data.get("split", "?"),
            "same_documents": bool(data.get("same_documents")),
            "step": data.get("step"),
        }
        provenance = {
            key: data.get(name)
            for key, name in (
                ("commit", "git_commit"),
                ("device", "device"),
                ("date", "date_utc"),
                ("command", "command"),
            )
        }
        for result in data.get("results", []):
            length = int(result["length"])
            whole = {"nll": result.get("mean_nll"), "perplexity": float(result["perplexity"])}
            rows.append({**shared, "length": length, **whole, "targets": result.get("n_targets"), **provenance})
            edges = result.get("bucket_edges") or []
            for start, end, nll, count in zip(
                edges, edges[1:], result.get("bucket_nll") or [], result.get("bucket_count") or []
            ):
                rows.append(
                    {
                        **shared,
                        "length": length,
                        "position_from": start,
                        "position_to": end,
                        "nll": nll,
                        "targets": count,
                    }
                )
    return rows


def run_id_of(run_dir: Path) -> str:
    """A run's name in the tables: "SWEEP/seed-N" for a seed of a sweep, else the run directory's name."""
    run_dir = Path(os.path.abspath(run_dir))
    in_sweep = (run_dir.parent / "sweep.json").is_file() or re.fullmatch(r"seed-\d+", run_dir.name)
    return f"{run_dir.parent.name}/{run_dir.name}" if in_sweep else run_dir.name


def collect_run(path: str | Path) -> RunRecord:
    """The RunRecord of one run directory made by ``pope train`` / ``pope finetune`` (module docstring)."""
    run_dir = Path(path)
    config_path = run_dir / "config.json"
    config = read_run_record(config_path, required=True)
    preset = str(config.get("preset", "?"))
    records = _records(run_dir)
    curves = curve_rows(records)
    evals = eval_records(curves)
    metric, value = headline_metric(evals, run_metric(preset, config))
    summary_path = run_dir / "summary.json"
    summary = read_run_record(summary_path)
    record = RunRecord(
        run=str(run_dir),
        preset=preset,
        pe=str(config.get("pe") or (config.get("model") or {}).get("pe", "?")),
        seed=config.get("seed"),
        metric=metric,
        value=value,
        finished=bool(summary.get("finished")),
        step=records[-1].get("step") if records else None,
        setting=_setting_label(run_dir),
        fingerprint=fingerprint_of(config),
        at_best_valid=best_valid_value(summary, metric),
        best_step=summary.get("best_step"),
        max_steps=(config.get("recipe") or {}).get("max_steps"),
        run_id=run_id_of(run_dir),
        config=config,
        provenance=run_provenance(run_dir, summary, records),
        finals=final_values(summary, evals),
        curves=curves,
        lengths=length_rows(run_dir),
    )
    evaluation_curves(record)
    record.length_ppl = length_tables(record.lengths)
    task_file = run_dir / "eval" / "task_accuracy.json"
    if task_file.is_file():
        task = read_run_record(task_file)
        splits = task.get("splits", {})
        record.task_accuracy = {name: float(info["accuracy"]) for name, info in splits.items()}
        record.rescored_step = task.get("step")
        record.shifts = [
            (task.get("step"), name, int(shift), int(row["correct"]), int(row["examples"]))
            for name, info in splits.items()
            for shift, row in (info.get("by_shift") or {}).items()
        ]
        record.test_by_shift = shift_tables(record.shifts)
    delta_file = run_dir / DELTA_STATE_FILE
    if delta_file.is_file():
        share = read_run_record(delta_file).get("outside_share")
        record.delta_outside = float(share) if share is not None else None
    downstream_file = run_dir / "eval" / "downstream.json"
    if downstream_file.is_file():
        record.downstream = read_run_record(downstream_file).get("paper_row")
    return record


def expand_runs(paths: list[str]) -> list[Path]:
    """Run directories from RUN arguments: a run directory itself, or every started run ``seed-N`` inside a
    sweep directory (``pope train --seeds``), in seed order."""
    runs = []
    for path in map(Path, paths):
        if (path / "config.json").is_file():
            runs.append(path)
            continue
        inside = sorted(
            (p for p in path.glob("seed-*/") if (p / "config.json").is_file() and p.name[5:].isdigit()),
            key=lambda p: int(p.name[5:]),
        )
        if not inside:
            raise FileNotFoundError(
                f"{path / 'config.json'} not found: {path} is neither a `pope train` run directory, a sweep "
                "directory holding runs, nor a folder of run tables (runs.csv)"
            )
        runs += inside
    return runs
