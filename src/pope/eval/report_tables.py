"""The tidy tables of ``pope report``, written from RunRecords and read back into equal RunRecords, so that a report
made from the tables is the report made from the run directories:

* ``runs.csv``: one row per run — run id, experiment, preset, encoding, setting, seed, whether it finished, steps,
  the headline and best-valid values of its metric, its final and best evaluation values, the re-scored accuracy
  (eval/task_accuracy.json), δ outside [−2π, 0], provenance (wall time, step time, parameters, GPU, commit, library
  versions, date, command), a note, and its whole config as JSON;
* ``curves.csv``: the learning curves in long format, one row per (run, step, split, metric, value): the training
  loss and learning rate (split ``train``), every evaluation's values (``valid``, ``test``; ``model`` for the share
  of δ entries past either end of [−2π, 0]);
* ``lengths.csv`` (runs with ``pope eval length`` records): one row per run, evaluation and length, with the
  evaluation's own provenance;
* ``shifts.csv`` (indirect-indexing runs re-scored per shift): one row per run, split and signed shift.

Numbers are written as Python writes them (``repr``: the shortest text that reads back to the same float), so a
table round-trips exactly. A folder holds one set of tables; ``read_tables`` takes the folder or its runs.csv.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from pope.eval.report_records import (
    FINAL_KEYS,
    LENGTH_KEYS,
    PROVENANCE_KEYS,
    RunRecord,
    evaluation_curves,
    fingerprint_of,
    length_tables,
    shift_tables,
)
from pope.files import write_text_atomic

RUNS_FILE, CURVES_FILE, LENGTHS_FILE, SHIFTS_FILE = "runs.csv", "curves.csv", "lengths.csv", "shifts.csv"
LEADING_COLUMNS = (
    "run",
    "experiment",
    "preset",
    "pe",
    "setting",
    "seed",
    "finished",
    "step",
    "max_steps",
    "metric",
    "headline",
    "at_best_valid",
    "best_step",
    *FINAL_KEYS,
    "delta_outside",
)
"""runs.csv's first columns; then rescored_step and rescored_<split>_accuracy (when a run has them),
downstream_<task> (when a run has them), the provenance (PROVENANCE_KEYS), note and config."""
CURVE_COLUMNS = ("run", "step", "split", "metric", "value")
LENGTH_COLUMNS = ("run", *LENGTH_KEYS, "commit", "device", "date", "command")
SHIFT_COLUMNS = ("run", "step", "split", "shift", "correct", "examples")
_INTEGERS = {
    "seed",
    "step",
    "max_steps",
    "best_step",
    "rescored_step",
    "params",
    "world_size",
    "length",
    "targets",
    "position_from",
    "position_to",
}
_BOOLEANS = {"finished", "dirty", "same_documents"}
_FLOATS = {"headline", "at_best_valid", "delta_outside", "seconds", "median_step_ms", "nll", "perplexity", *FINAL_KEYS}


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _number(text: str) -> int | float:
    """The int or float a number cell holds ("12" -> 12, "12.0" -> 12.0, "nan" -> nan)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _value(column: str, text: str):
    """A runs.csv / lengths.csv cell read back: None when empty, else by the column's type."""
    if text == "":
        return None
    if column in _BOOLEANS:
        if text not in ("true", "false"):
            raise ValueError(f"column {column}: {text!r} is not true or false")
        return text == "true"
    if column in _INTEGERS:
        return int(text)
    if column == "config":
        return json.loads(text)
    if column in _FLOATS or column.startswith(("rescored_", "downstream_")):
        return float(text)
    return text


def _csv(columns: tuple[str, ...] | list[str], rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({column: _cell(row.get(column)) for column in columns})
    return buffer.getvalue()


def _run_row(record: RunRecord, experiment: str) -> dict:
    row = {
        "run": record.run_id,
        "experiment": record.experiment or experiment,
        "preset": record.preset,
        "pe": record.pe,
        "setting": record.setting,
        "seed": record.seed,
        "finished": record.finished,
        "step": record.step,
        "max_steps": record.max_steps,
        "metric": record.metric,
        "headline": record.value,
        "at_best_valid": record.at_best_valid,
        "best_step": record.best_step,
        **record.finals,
        "delta_outside": record.delta_outside,
        "rescored_step": record.rescored_step,
        **{f"rescored_{split}_accuracy": value for split, value in (record.task_accuracy or {}).items()},
        **{f"downstream_{name}": value for name, value in (record.downstream or {}).items()},
        **record.provenance,
        "note": record.note,
        "config": record.config,
    }
    return row


def run_columns(rows: list[dict]) -> list[str]:
    """runs.csv's columns for these rows: LEADING_COLUMNS, the re-scored and downstream columns any row has, then
    the provenance, note and config."""
    present = {key for row in rows for key, value in row.items() if value is not None}
    rescored = sorted(key for key in present if key.startswith("rescored_") and key != "rescored_step")
    downstream = [key for row in rows for key in row if key.startswith("downstream_")]
    optional = (["rescored_step", *rescored] if rescored else []) + list(dict.fromkeys(downstream))
    return [*LEADING_COLUMNS, *optional, *PROVENANCE_KEYS, "note", "config"]


def write_tables(records: list[RunRecord], out_dir: str | Path, experiment: str = "") -> list[Path]:
    """runs.csv and curves.csv (and lengths.csv, shifts.csv where a run has such records) of ``records`` in
    ``out_dir``; run ids must be unique. Returns the paths written."""
    ids = [record.run_id for record in records]
    repeated = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
    if repeated:
        raise ValueError(f"run id(s) {', '.join(repeated)} given twice; each run of a table needs its own id")
    out_dir = Path(out_dir)
    rows = [_run_row(record, experiment) for record in records]
    written = [write_text_atomic(out_dir / RUNS_FILE, _csv(run_columns(rows), rows))]
    curves = [
        {"run": r.run_id, "step": step, "split": split, "metric": metric, "value": value}
        for r in records
        for step, split, metric, value in r.curves
    ]
    written.append(write_text_atomic(out_dir / CURVES_FILE, _csv(CURVE_COLUMNS, curves)))
    lengths = [{"run": r.run_id, **row} for r in records for row in r.lengths]
    if lengths:
        written.append(write_text_atomic(out_dir / LENGTHS_FILE, _csv(LENGTH_COLUMNS, lengths)))
    shifts = [dict(zip(SHIFT_COLUMNS, (r.run_id, *row))) for r in records for row in r.shifts]
    if shifts:
        written.append(write_text_atomic(out_dir / SHIFTS_FILE, _csv(SHIFT_COLUMNS, shifts)))
    return written


def tables_path(path: str | Path) -> Path | None:
    """The runs.csv that ``path`` names (the file itself, or a folder holding one), else None."""
    path = Path(path)
    if path.is_file() and path.name.endswith(".csv"):
        return path
    return path / RUNS_FILE if (path / RUNS_FILE).is_file() else None


def _read_csv(path: Path, required: tuple[str, ...]) -> list[dict]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in required if column not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} lacks the column(s) {', '.join(missing)}; give a table written by `pope report`")
        return list(reader)


def _by_run(path: Path, columns: tuple[str, ...], ids: set[str]) -> dict[str, list[dict]]:
    """The rows of a curves/lengths/shifts table per run id ({} when the file does not exist); a row naming a run
    that runs.csv lacks raises ValueError."""
    if not path.is_file():
        return {}
    grouped: dict[str, list[dict]] = {}
    for line, row in enumerate(_read_csv(path, columns), 2):
        if row["run"] not in ids:
            raise ValueError(f"{path}:{line} names run {row['run']!r}, which {RUNS_FILE} beside it does not hold")
        grouped.setdefault(row["run"], []).append(row)
    return grouped


def read_tables(path: str | Path) -> list[RunRecord]:
    """The RunRecords of a folder of tables (or of its runs.csv and the tables beside it), in runs.csv's order."""
    runs_path = tables_path(path)
    if runs_path is None:
        raise FileNotFoundError(f"{path} holds no {RUNS_FILE}; give a folder of tables written by `pope report`")
    rows = _read_csv(runs_path, ("run", "preset", "pe", "setting", "seed", "config"))
    ids = [row["run"] for row in rows]
    repeated = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
    if repeated:
        raise ValueError(f"{runs_path}: run id(s) {', '.join(repeated)} appear on more than one row")
    folder = runs_path.parent
    curves = _by_run(folder / CURVES_FILE, CURVE_COLUMNS, set(ids))
    lengths = _by_run(folder / LENGTHS_FILE, LENGTH_COLUMNS, set(ids))
    shifts = _by_run(folder / SHIFTS_FILE, SHIFT_COLUMNS, set(ids))
    return [_record(runs_path, {k: _value(k, v) for k, v in row.items()}, curves, lengths, shifts) for row in rows]


def _record(runs_path: Path, row: dict, curves: dict, lengths: dict, shifts: dict) -> RunRecord:
    run_id, config = row["run"], row["config"] or {}
    rescored = {
        key[len("rescored_") : -len("_accuracy")]: value
        for key, value in row.items()
        if key.startswith("rescored_") and key.endswith("_accuracy") and value is not None
    }
    downstream = {key[len("downstream_") :]: value for key, value in row.items() if key.startswith("downstream_")}
    record = RunRecord(
        run=f"{runs_path}:{run_id}",
        preset=row["preset"],
        pe=row["pe"],
        seed=row["seed"],
        metric=row.get("metric"),
        value=row.get("headline"),
        finished=bool(row.get("finished")),
        step=row.get("step"),
        setting=row["setting"] or "",
        fingerprint=fingerprint_of(config),
        at_best_valid=row.get("at_best_valid"),
        best_step=row.get("best_step"),
        max_steps=row.get("max_steps"),
        task_accuracy=rescored or None,
        delta_outside=row.get("delta_outside"),
        downstream=downstream if any(value is not None for value in downstream.values()) else None,
        run_id=run_id,
        experiment=row.get("experiment") or "",
        config=config,
        provenance={key: row[key] for key in PROVENANCE_KEYS if row.get(key) is not None},
        finals={key: row[key] for key in FINAL_KEYS if row.get(key) is not None},
        curves=[(int(r["step"]), r["split"], r["metric"], _number(r["value"])) for r in curves.get(run_id, [])],
        lengths=[{key: _value(key, r[key]) for key in LENGTH_COLUMNS if key != "run"} for r in lengths.get(run_id, [])],
        shifts=[
            (_value("step", r["step"]), r["split"], int(r["shift"]), int(r["correct"]), int(r["examples"]))
            for r in shifts.get(run_id, [])
        ],
        rescored_step=row.get("rescored_step"),
        note=row.get("note") or "",
        from_table=True,
    )
    evaluation_curves(record)
    record.length_ppl = length_tables(record.lengths)
    record.test_by_shift = shift_tables(record.shifts)
    return record
