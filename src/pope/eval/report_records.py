"""What ``pope report`` knows about one run, read from its run directory (or from the tables of
pope.eval.report_tables), and how runs are grouped into settings.

What is read from each run directory (made by ``pope train`` / ``pope finetune`` and the eval commands):
* ``config.json``: preset, pe, seed; the setting (grouping key) is the config without the seed and the execution
  keys.
* ``metrics.jsonl``: the learning curves (training loss and learning rate; every evaluation's values) and the
  headline value of the run's metric —
  ``test_nll``: the lowest ``test_loss`` over the run (the paper reports the best test NLL), over the
  evaluations that scored the whole test split when there are any (token streams: the final one);
  ``test_accuracy``: ``test_accuracy`` of the last evaluation; ``valid_ppl``: exp(``valid_loss``) of the
  last evaluation (the cosine schedule ends at its minimum learning rate). The metric is the preset's paper metric;
  a preset without one is scored by test accuracy when it trains on the indirect-indexing task (an accuracy task),
  else by the last ``test_loss`` (or ``valid_loss``).
* ``summary.json``: whether the run finished its schedule (unfinished runs are never averaged in), its final
  evaluation, and the same metric at the best-validation checkpoint (``at_best_valid``: the evaluation that
  ``checkpoints/best`` holds, chosen by ``train.best_metric`` on the validation split only).
* ``env.json``: provenance (commit, GPU, library versions, start date, command, parameter count).
* ``eval/length-*.json`` (``pope eval length``): perplexity per evaluation length.
* ``eval/downstream.json`` (``pope eval downstream``): the paper's accuracy columns.
* ``eval/task_accuracy.json`` (``pope.eval.runs.score_task_accuracy``): accuracy of one checkpoint on training and
  test examples (the memorisation gap), per signed shift.
* ``eval/delta_state.json`` (``pope analyze delta``): the share of PoPE's phase-bias entries outside [−2π, 0].

A RUN argument may also be a sweep directory (``pope train --seeds``): every ``seed-N`` run in it.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from pope.data.indirect_indexing import is_task_spec
from pope.encodings import parse_pe_spec
from pope.presets import PRESETS
from pope.train.sweep_settings import setting_of

METRIC_RULES = {"test_nll": "min over evaluations", "test_accuracy": "last evaluation", "valid_ppl": "last evaluation"}
"""How each paper metric's headline value is taken from a run's evaluations (module docstring)."""
BEST_VALID_KEYS = {
    "test_nll": "test_loss",
    "last test_loss": "test_loss",
    "test_accuracy": "test_accuracy",
    "valid_ppl": "valid_loss",
    "last valid_loss": "valid_loss",
}
"""The at_best_valid (summary.json) entry that gives each metric at the best-validation checkpoint."""
COMPARED_PE = "rope"
"""The encoding every other one is compared against in the "PoPE vs RoPE" section."""
LIFT_OFF_ACCURACY = 0.20
"""A run has lifted off when its final test accuracy exceeds this (chance is 1/52; the paper's RoPE ~0.11)."""


def lift_offs(finals: list[float]) -> int:
    """How many of these final test accuracies lifted off (exceed LIFT_OFF_ACCURACY)."""
    return sum(value > LIFT_OFF_ACCURACY for value in finals)


def first_step_past_lift_off(curve: list[tuple[int, float]]) -> int | None:
    """The step of the first evaluation whose test accuracy exceeds LIFT_OFF_ACCURACY (None: none did). When
    seeds all lift off, this is what tells them apart: how long each sat on the plateau."""
    return next((step for step, accuracy in curve if accuracy > LIFT_OFF_ACCURACY), None)


def kilo_steps(step: int | None) -> str:
    return "—" if step is None else f"{step / 1000:g}k"


@dataclass
class RunRecord:
    run: str  # where it was read: the run directory, or "TABLE:run id" for a row of a runs.csv
    preset: str
    pe: str
    seed: int | None
    metric: str | None
    value: float | None
    length_ppl: dict[str, dict[int, float]] = field(default_factory=dict)  # "data/split" -> {L: ppl}
    downstream: dict[str, float | None] | None = None
    finished: bool = False  # summary.json says the schedule is complete
    step: int | None = None  # last step with a record
    setting: str = ""  # what distinguishes the run's group: sweep directory and overrides
    fingerprint: str = ""  # the config without seed and execution keys (grouping key)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, test_accuracy) of every evaluation
    loss_curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, valid_loss, test_loss)
    task_accuracy: dict[str, float] | None = None  # split -> accuracy of one checkpoint (eval/task_accuracy.json)
    test_by_shift: dict[int, tuple[int, int]] | None = None  # signed shift -> (correct, examples) on test (same file)
    delta_outside: float | None = None  # share of PoPE's delta entries outside [-2π, 0] (eval/delta_state.json)
    at_best_valid: float | None = None  # the metric at the best-validation checkpoint (summary.json)
    best_step: int | None = None  # the step of that checkpoint, of max_steps (is the minimum inside the budget?)
    max_steps: int | None = None
    # What the tables (pope.eval.report_tables) keep besides the fields above:
    run_id: str = ""  # the run's name in the tables: "SWEEP/seed-N", or the run directory's name
    experiment: str = ""  # the folder of tables the run belongs to
    config: dict = field(default_factory=dict)  # config.json
    provenance: dict = field(default_factory=dict)  # commit, GPU, versions, date, command, ... (PROVENANCE_KEYS)
    finals: dict = field(default_factory=dict)  # final and best values of the evaluations (FINAL_KEYS)
    curves: list[tuple[int, str, str, float]] = field(default_factory=list)  # (step, split, metric, value)
    lengths: list[dict] = field(default_factory=list)  # one dict per evaluated length (LENGTH_KEYS)
    shifts: list[tuple[int, str, int, int, int]] = field(default_factory=list)  # (step, split, shift, correct, n)
    rescored_step: int | None = None  # the step of the checkpoint eval/task_accuracy.json scored
    note: str = ""  # a remark kept with the run in runs.csv (e.g. "a second training of this seed")
    from_table: bool = False  # read from a runs.csv (``run`` is then "TABLE:run id"), not from a run directory


TRAIN_CURVE_METRICS = ("loss", "lr")


PROVENANCE_KEYS = (
    "seconds",
    "median_step_ms",
    "params",
    "gpu",
    "world_size",
    "commit",
    "dirty",
    "torch",
    "triton",
    "python",
    "pope",
    "date",
    "command",
)
"""Where and how a run was made: wall time, median step time, parameter count, device, code commit, library
versions, start date (UTC) and command (env.json, summary.json, metrics.jsonl)."""


LENGTH_KEYS = (
    "evaluation",
    "data",
    "split",
    "same_documents",
    "step",
    "length",
    "position_from",
    "position_to",
    "nll",
    "perplexity",
    "targets",
)
"""One evaluated length of a ``pope eval length`` record (eval/length-*.json; ``evaluation`` names the file): a row
for the whole window (no positions), then one per range of positions inside it [position_from, position_to) with
that range's NLL and targets (the record's ``bucket_nll``); the whole-window rows carry the evaluation's provenance
(commit, device, date, command)."""


def finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def headline_metric(records: list[dict], paper_metric: str | None) -> tuple[str | None, float | None]:
    """(metric name, value) from a run's eval records following the rules in the module docstring."""
    if not records:
        return paper_metric, None
    last = records[-1]
    if paper_metric == "test_nll":  # evaluations that scored the whole test split, when there are any
        whole = [
            r for r in records if r.get("test_split_tokens") and r.get("test_scored_tokens") == r["test_split_tokens"]
        ]
        values = finite(r.get("test_loss") for r in whole or records)
        return "test_nll", min(values) if values else None
    if paper_metric == "test_accuracy":
        value = last.get("test_accuracy")
        return "test_accuracy", float(value) if isinstance(value, (int, float)) else None
    if paper_metric == "valid_ppl":
        value = last.get("valid_loss")
        return "valid_ppl", math.exp(value) if isinstance(value, (int, float)) else None
    for key in ("test_loss", "valid_loss"):
        if isinstance(last.get(key), (int, float)):
            return f"last {key}", float(last[key])
    return None, None


def best_valid_value(summary: dict, metric: str | None) -> float | None:
    """``metric`` at the run's best-validation checkpoint from summary.json's ``at_best_valid``, or None."""
    value = (summary.get("at_best_valid") or {}).get(BEST_VALID_KEYS.get(metric or "", ""))
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return math.exp(value) if metric == "valid_ppl" else float(value)


def paper_encoding(preset_name: str, pe: str) -> str | None:
    """ "rope" or "pope" when ``pe`` is the paper's own setting of that encoding for this preset; a baseline's
    name (e.g. "rope-half") when the preset lists the paper's number for it and ``pe`` sets no option; else
    None."""

    preset = PRESETS.get(preset_name)
    if preset is None:
        return None
    try:
        name, options = parse_pe_spec(pe)
    except ValueError:
        return None
    execution_only = {"backend"}
    if name == "pope":
        options = {k: v for k, v in options.items() if k not in execution_only}
        if options in ({}, {"delta_init": preset.pope_delta_init}):
            return "pope"
    if name == "rope" and not set(options) - execution_only - {"layout"}:
        return "rope"
    if name not in ("pope", "rope") and name in preset.paper and not set(options) - execution_only:
        return name
    return None


def paper_value(preset_name: str, pe: str) -> float | None:
    """The paper's number for this preset and encoding when the encoding is the paper's own setting."""

    encoding = paper_encoding(preset_name, pe)
    preset = PRESETS.get(preset_name)
    return None if encoding is None or not preset.paper else preset.paper.get(encoding)


FINETUNE_SOURCE_KEYS = ("finetune.from.run", "finetune.from.checkpoint", "finetune.from.step")
"""Where a fine-tune started: a path and step of one source run, so the fine-tunes of a setting's seeds differ
in them. A setting's fingerprint keeps only which checkpoint (``finetune.from``: "best" or "last")."""


def fingerprint_of(config: dict) -> str:
    """The grouping key of a run: its config without the seed, the execution keys and a fine-tune's source paths
    (a fine-tune keeps only which checkpoint it started from, ``finetune.from``: "best" or "last")."""
    setting = setting_of(config)
    if setting.get("finetune.from.checkpoint"):
        setting["finetune.from"] = Path(str(setting["finetune.from.checkpoint"])).name
    return json.dumps({k: v for k, v in setting.items() if k not in FINETUNE_SOURCE_KEYS}, sort_keys=True)


def run_metric(preset: str, config: dict) -> str | None:
    """The metric a run is scored by: its preset's paper metric; for a preset without one, test accuracy when the
    run trained on the indirect-indexing task (an accuracy task: the report shows accuracy and lift-off)."""

    paper_metric = (PRESETS[preset].paper or {}).get("metric") if preset in PRESETS else None
    if paper_metric is None and is_task_spec(str((config.get("recipe") or {}).get("dataset", ""))):
        return "test_accuracy"
    return paper_metric


CURVE_SPLITS = ("valid", "test")
"""The evaluated splits whose "<split>_<metric>" values an evaluation record holds; its other values (e.g. the share
of δ entries past either end of [−2π, 0]) go to the split "model", and a training record's loss and learning rate to
the split "train"."""


def eval_records(curves: list[tuple[int, str, str, float]]) -> list[dict]:
    """The evaluation records (as in metrics.jsonl) that ``curves`` holds, one per step in step order; a later value
    of one step and key replaces an earlier one (a resumed run's repeated evaluation)."""
    by_step: dict[int, dict] = {}
    for step, split, metric, value in curves:
        if split in CURVE_SPLITS or split == "model":
            key = metric if split == "model" else f"{split}_{metric}"
            by_step.setdefault(step, {"step": step, "kind": "eval"})[key] = value
    return [by_step[step] for step in sorted(by_step)]


def evaluation_curves(record: RunRecord) -> None:
    """Fill ``record.curve`` (test accuracy, for accuracy runs) and ``record.loss_curve`` (valid and test NLL, for
    runs scored by test NLL) from ``record.curves``."""
    evals = eval_records(record.curves)
    if record.metric == "test_accuracy":
        record.curve = [(r["step"], float(r["test_accuracy"])) for r in evals if is_number(r.get("test_accuracy"))]
    if record.metric == "test_nll":
        record.loss_curve = [
            (r["step"], float(r["valid_loss"]), float(r["test_loss"]))
            for r in evals
            if is_number(r.get("valid_loss")) and is_number(r.get("test_loss"))
        ]


def is_number(value) -> bool:
    """Whether ``value`` is an int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


FINAL_KEYS = (
    "final_valid_loss",
    "final_test_loss",
    "final_valid_accuracy",
    "final_test_accuracy",
    "min_test_loss",
    "max_test_accuracy",
)
"""A run's final values (summary.json "final": the evaluation at the end of the schedule) and the best test values
over its evaluations."""


def length_tables(rows: list[dict]) -> dict[str, dict[int, float]]:
    """{"data/split": {L: perplexity}} of a run's length rows, one entry per evaluation; an evaluation on the same
    documents at every length is keyed apart (its own table in the report)."""
    by_evaluation: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("position_from") is None:  # the whole window, not a range of positions inside it
            by_evaluation.setdefault(row["evaluation"], []).append(row)
    tables = {}
    for members in by_evaluation.values():
        by_length = {int(r["length"]): float(r["perplexity"]) for r in members}
        key = f"{members[0]['data']}/{members[0]['split']}"
        if members[0]["same_documents"] and by_length:
            key += f", the same documents at every length to {max(by_length):,}"
        tables[key] = by_length
    return tables


def shift_tables(shifts: list[tuple[int, str, int, int, int]], split: str = "test") -> dict | None:
    """{signed shift: (correct, examples)} of one split of a run's re-scored checkpoint, or None."""
    table = {shift: (correct, n) for _, name, shift, correct, n in shifts if name == split}
    return table or None


def mean_std(values: list[float]) -> tuple[float, float | None, int]:
    """Mean, sample standard deviation (None for one value) and count."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None), len(values)


def format_mean_std(values: list[float], digits: int = 4) -> str:
    """'mean ± std (n=N)' with `digits` decimals; a std too small for them is written in e-notation, so a
    nonzero spread never reads as ± 0.0000."""
    if not values:
        return "—"
    mean, std, n = mean_std(values)
    if std is None:
        spread = ""
    elif 0 < std < 0.5 * 10**-digits:
        spread = f" ± {std:.1e}"
    else:
        spread = f" ± {std:.{digits}f}"
    return f"{mean:.{digits}f}{spread} (n={n})"


def finished_groups(records: list[RunRecord]) -> dict[tuple[str, str, str], list[RunRecord]]:
    """(preset, PE, setting label) -> finished runs of one setting; for the per-length and downstream tables,
    so that a fine-tune or a recipe knob is never averaged with the runs it started from."""
    groups = {key: [m for m in members if m.finished] for key, members in setting_groups(records).items()}
    return {key: members for key, members in groups.items() if members}


def setting_groups(records: list[RunRecord]) -> dict[tuple[str, str, str], list[RunRecord]]:
    """(preset, PE, setting label) -> runs of one setting (one config fingerprint), finished or not, in seed
    order (a setting's seeds may come from several RUN arguments). The label: the sweep directory and its
    overrides (or a lone run's directory), plus the config values in which this setting differs from the other
    settings of the same preset and PE (those it leaves unset, null, are not listed: a fine-tune's section is
    named on the fine-tune's row only). Two runs of one setting with the same seed raise ValueError."""
    by_fingerprint: dict[tuple[str, str, str], list[RunRecord]] = {}
    for record in records:
        by_fingerprint.setdefault((record.preset, record.pe, record.fingerprint), []).append(record)
    for members in by_fingerprint.values():
        members.sort(key=lambda m: (m.seed is None, m.seed or 0))
        for first, second in zip(members, members[1:]):
            if first.seed is not None and first.seed == second.seed:
                raise ValueError(
                    f"{first.run} and {second.run} are runs of one setting with the same seed "
                    f"{first.seed}: the report would count it twice as if independent; pass one of them "
                    "(compare a rerun with its original by reading both run directories)"
                )
    labels: dict[tuple[str, str, str], list[RunRecord]] = {}
    for (preset, pe, fingerprint), members in sorted(by_fingerprint.items()):
        siblings = [json.loads(f) for (p, e, f) in by_fingerprint if (p, e) == (preset, pe)]
        mine = json.loads(fingerprint)
        differing = sorted(k for k in set().union(*siblings) if len({json.dumps(s.get(k)) for s in siblings}) > 1)
        named = " ; ".join(sorted({m.setting for m in members if m.setting}))
        extra = [
            f"{k}={v if isinstance(v := mine.get(k), str) else json.dumps(v)}"
            for k in differing
            if f"{k}=" not in named and mine.get(k) is not None
        ]
        label = " ".join(filter(None, [named, *extra])) or "—"
        while (preset, pe, label) in labels:  # never merge two settings under one name
            label += " (another setting)"
        labels[(preset, pe, label)] = members
    return labels


SHIFT_BUCKETS = ((-15, -8), (-7, -4), (-3, -2), (-1, -1), (0, 0), (1, 1), (2, 3), (4, 7), (8, 15))
"""Signed-shift ranges of the by-shift table (0 only in the zero_shift task variant)."""


def shift_bucket_accuracy(by_shift: dict[int, tuple[int, int]], low: int, high: int) -> float | None:
    """Accuracy over the examples whose shift lies in [low, high] (None when there are none)."""
    correct = sum(c for shift, (c, _) in by_shift.items() if low <= shift <= high)
    examples = sum(n for shift, (_, n) in by_shift.items() if low <= shift <= high)
    return correct / examples if examples else None


def by_shift_groups(records: list[RunRecord]) -> dict[tuple[str, str, str], list[dict[int, tuple[int, int]]]]:
    """(preset, PE, setting label) -> the per-shift test counts of its finished seeds that have them (settings
    with none left out): what the by-shift table and accuracy_by_shift.png average."""
    groups = {
        key: [m.test_by_shift for m in members if m.finished and m.test_by_shift]
        for key, members in setting_groups(records).items()
    }
    return {key: tables for key, tables in groups.items() if tables}
