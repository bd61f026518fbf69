"""Collect runs into one table: metric per preset × positional encoding, mean ± std over seeds, with the
paper's number beside ours where the preset and encoding match (``pope report``).

What is read from each run directory (made by ``pope train`` / ``pope finetune`` and the eval commands):
* ``config.json``: preset, pe, seed.
* ``metrics.jsonl`` eval records: the preset's paper metric —
  ``test_nll``: the lowest ``test_loss`` over the run (the paper reports the best test NLL), over the
  evaluations that scored the whole test split when there are any (token streams: the final one);
  ``test_accuracy``: ``test_accuracy`` of the last evaluation; ``valid_ppl``: exp(``valid_loss``) of the
  last evaluation (the cosine schedule ends at its minimum learning rate). Presets without a paper metric
  report the last ``test_loss`` (or ``valid_loss``).
* ``eval/length-*.json`` (``pope eval length``): perplexity per evaluation length.
* ``eval/downstream.json`` (``pope eval downstream``): the paper's accuracy columns.
* ``summary.json``: whether the run finished its schedule. Unfinished runs (no summary, or
  ``finished: false``) are never averaged in: the tables list them apart, marked with their step. Also the
  same metric at the best-validation checkpoint (``at_best_valid``: the evaluation that ``checkpoints/best``
  holds, chosen by ``train.best_metric`` on the validation split only): ``test_nll`` and ``last test_loss``
  from its ``test_loss``, ``test_accuracy`` from its ``test_accuracy``, ``valid_ppl`` from its ``valid_loss``.
* ``eval/task_accuracy.json`` (``pope.eval.runs.score_task_accuracy``): accuracy of one checkpoint on
  training and test examples, for the memorisation gap.
* ``eval/delta_state.json`` (``pope analyze delta``): the share of PoPE's phase-bias entries outside [−2π, 0],
  tabled per setting.

A RUN argument may also be a sweep directory (``pope train --seeds``): every ``seed-N`` run in it.
Runs are grouped by preset, encoding and *setting*: everything in config.json but the seed and how the
run was executed (``EXECUTION_KEYS``), so runs of different recipes are never averaged together; the
setting column names the group's sweep directory and its ``--set`` overrides.

Runs with test accuracy (indirect indexing) also get a lift-off table: n seeds, final test accuracy
mean ± std and median, the lift-off rate — final test accuracy > ``LIFT_OFF_ACCURACY`` — with a Wilson 95 %
interval, each seed's first evaluation step above that threshold (how long it sat on the plateau), and the
train − test accuracy gap where ``eval/task_accuracy.json`` exists; plus one plot of
every seed's test accuracy against the step (``accuracy_vs_step.png``). Runs scored by test NLL get one
plot of every seed's validation and test NLL against the step, best-validation step marked
(``loss_vs_step.png``).

"PoPE vs RoPE": every encoding against RoPE of the same preset and setting (the config apart from the PE
and the seed), over finished seeds, for the headline value and the best-valid one: the difference of
means, its Welch t 95 % interval and a two-sided permutation p-value (pope.eval.stats); for runs scored by
test accuracy also the lift-off rates on each side and Fisher's exact p, and, where a seed lifted off and both
sides ran the same number of steps, each seed's lift-off step compared by the exact rank-sum test; and each p
adjusted by Holm's method over the settings of one preset tested in the same table (the "Holm p" column);
where two settings have >= 2 seeds finished on both sides, a row paired by seed (the mean per-seed
difference, its paired t interval and the sign-flip p, pope.eval.stats.paired_permutation_test; its own Holm
family). With
``against=DIR`` (``pope report ... --against DIR``) the same statistics compare every other setting of
DIR's preset with DIR's runs: recipe knobs against the recipe they change.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from pope.eval.delta_state import DELTA_STATE_FILE
from pope.eval.stats import (
    MAX_EXACT_SPLITS,
    MONTE_CARLO_SPLITS,
    fisher_exact,
    holm_adjust,
    paired_interval,
    paired_permutation_test,
    permutation_test,
    rank_sum_test,
    welch_interval,
    wilson_interval,
)
from pope.files import write_text_atomic
from pope.train.sweep import EXECUTION_KEYS, setting_of

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


def _kilo_steps(step: int | None) -> str:
    return "—" if step is None else f"{step / 1000:g}k"


@dataclass
class RunRecord:
    run: str
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


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line_number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{line_number} is not valid JSON ({err}); the run's log is damaged") from None
        records.append(record)
    return records


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
    from pope.encodings import parse_pe_spec
    from pope.presets import PRESETS

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
    from pope.presets import PRESETS

    encoding = paper_encoding(preset_name, pe)
    preset = PRESETS.get(preset_name)
    return None if encoding is None or not preset.paper else preset.paper.get(encoding)


FINETUNE_SOURCE_KEYS = ("finetune.from.run", "finetune.from.checkpoint", "finetune.from.step")
"""Where a fine-tune started: a path and step of one source run, so the fine-tunes of a setting's seeds differ
in them. A setting's fingerprint keeps only which checkpoint (``finetune.from``: "best" or "last")."""


def _setting(run_dir: Path, config: dict) -> tuple[str, str]:
    """(label, fingerprint): the fingerprint is the config without seed, execution keys and a fine-tune's source
    paths; the label names the sweep directory (``pope train --seeds``) and its overrides, or, for a run
    outside a sweep (a single run, a fine-tune), the run's own directory."""
    setting = setting_of(config)
    if setting.get("finetune.from.checkpoint"):
        setting["finetune.from"] = Path(str(setting["finetune.from.checkpoint"])).name
    fingerprint = json.dumps({k: v for k, v in setting.items() if k not in FINETUNE_SOURCE_KEYS}, sort_keys=True)
    sweep_file = run_dir.parent / "sweep.json"
    if sweep_file.is_file():
        overrides = json.loads(sweep_file.read_text()).get("overrides", [])
        kept = [o for o in overrides if o.partition("=")[0].strip() not in EXECUTION_KEYS]
        return " ".join([run_dir.parent.name + "/", *kept]), fingerprint
    return run_dir.name + "/", fingerprint


def collect_run(path: str | Path) -> RunRecord:
    from pope.presets import PRESETS

    run_dir = Path(path)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: is {run_dir} a `pope train` run directory?")
    config = json.loads(config_path.read_text())
    preset = str(config.get("preset", "?"))
    pe = str(config.get("pe") or (config.get("model") or {}).get("pe", "?"))
    paper_metric = (PRESETS[preset].paper or {}).get("metric") if preset in PRESETS else None
    records = _records(run_dir)
    evals = [r for r in records if r.get("kind") == "eval"]
    metric, value = headline_metric(evals, paper_metric)
    setting, fingerprint = _setting(run_dir, config)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    record = RunRecord(
        run=str(run_dir),
        preset=preset,
        pe=pe,
        seed=config.get("seed"),
        metric=metric,
        value=value,
        finished=bool(summary.get("finished")),
        step=records[-1].get("step") if records else None,
        setting=setting,
        fingerprint=fingerprint,
        at_best_valid=best_valid_value(summary, metric),
        best_step=summary.get("best_step"),
        max_steps=(config.get("recipe") or {}).get("max_steps"),
        curve=[
            (int(r["step"]), float(r["test_accuracy"]))
            for r in evals  # task accuracy only
            if metric == "test_accuracy" and isinstance(r.get("test_accuracy"), (int, float))
        ],
        loss_curve=[
            (int(r["step"]), float(r["valid_loss"]), float(r["test_loss"]))
            for r in evals
            if metric == "test_nll" and all(isinstance(r.get(key), (int, float)) for key in ("valid_loss", "test_loss"))
        ],
    )
    task_file = run_dir / "eval" / "task_accuracy.json"
    if task_file.is_file():
        splits = json.loads(task_file.read_text()).get("splits", {})
        record.task_accuracy = {name: float(info["accuracy"]) for name, info in splits.items()}
        if "by_shift" in splits.get("test", {}):
            record.test_by_shift = {
                int(shift): (int(row["correct"]), int(row["examples"]))
                for shift, row in splits["test"]["by_shift"].items()
            }
    for length_file in sorted((run_dir / "eval").glob("length-*.json")):
        data = json.loads(length_file.read_text())
        by_length = {int(r["length"]): float(r["perplexity"]) for r in data.get("results", [])}
        key = f"{data.get('data_name', '?')}/{data.get('split', '?')}"
        if data.get("same_documents") and by_length:  # evaluations on other document sets get their own table
            key += f", the same documents at every length to {max(by_length):,}"
        record.length_ppl[key] = by_length
    delta_file = run_dir / DELTA_STATE_FILE
    if delta_file.is_file():
        record.delta_outside = float(json.loads(delta_file.read_text())["outside_share"])
    downstream_file = run_dir / "eval" / "downstream.json"
    if downstream_file.is_file():
        record.downstream = json.loads(downstream_file.read_text()).get("paper_row")
    return record


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


def _best_steps(members: list[RunRecord]) -> str:
    """'; best step 400–900 of 2000': where the best-valid checkpoints lie in the schedule ('' when unknown)."""
    steps = sorted(m.best_step for m in members if isinstance(m.best_step, int) and m.at_best_valid is not None)
    if not steps:
        return ""
    budgets = sorted({m.max_steps for m in members if isinstance(m.max_steps, int)})
    span = f"{steps[0]}" if steps[0] == steps[-1] else f"{steps[0]}–{steps[-1]}"
    return f"; best step {span}" + (f" of {budgets[0]}" if len(budgets) == 1 else "")


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


def _unfinished(members: list[RunRecord]) -> str:
    rest = [m for m in members if not m.finished]
    return ", ".join(f"{m.seed} (step {m.step if m.step is not None else 0})" for m in rest) or "—"


def _percent(values: list[float]) -> str:
    if not values:
        return "—"
    mean, std, _ = mean_std(values)
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "")


def lift_off_markdown(records: list[RunRecord]) -> list[str]:
    """The lift-off table over runs with test accuracy (empty when there are none); module docstring."""
    groups = {key: members for key, members in setting_groups(records).items() if any(m.curve for m in members)}
    if not groups:
        return []
    lines = [
        "",
        f"## Test accuracy and lift-off (final test accuracy > {100 * LIFT_OFF_ACCURACY:g} %)",
        "",
        "Final test accuracy (%) over finished seeds; lift-off rate with a Wilson 95 % interval; first past "
        f"{100 * LIFT_OFF_ACCURACY:g} %: the step of each finished seed's first evaluation above it, in seed "
        "order (— never); gap = accuracy on training examples − on test examples of the same checkpoint "
        "(eval/task_accuracy.json).",
        "",
        "| preset | PE | n | test acc. mean ± std | median | lift-off | 95 % interval | first past "
        f"{100 * LIFT_OFF_ACCURACY:g} % | train − test gap | paper | unfinished (left out) | setting |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    no_gap = []
    for (preset, pe, label), members in sorted(groups.items()):
        done = [m for m in members if m.finished and m.curve]
        finals = [m.curve[-1][1] for m in done]
        first_past = ", ".join(_kilo_steps(first_step_past_lift_off(m.curve)) for m in done) or "—"
        lifted = lift_offs(finals)
        low, high = wilson_interval(lifted, len(finals))
        gaps = [
            m.task_accuracy["train"] - m.task_accuracy["test"]
            for m in done
            if m.task_accuracy and {"train", "test"} <= set(m.task_accuracy)
        ]
        no_gap += [m.run for m in done if not (m.task_accuracy and {"train", "test"} <= set(m.task_accuracy))]
        gap = f"{_percent(gaps)} (n={len(gaps)})" if gaps else "not measured"
        paper = paper_value(preset, pe)
        lines.append(
            f"| {preset} | {pe} | {len(finals)} | {_percent(finals)} | "
            f"{f'{100 * statistics.median(finals):.2f}' if finals else '—'} | {lifted}/{len(finals)} | "
            f"{100 * low:.0f}–{100 * high:.0f} % | {first_past} | {gap} | "
            f"{'—' if paper is None else f'{100 * paper:.2f}'} | "
            f"{_unfinished(members)} | {label} |"
        )
    if no_gap:
        lines += [
            "",
            f"Train-example accuracy not measured for {len(no_gap)} finished run(s) (no "
            "eval/task_accuracy.json; pope.eval.runs.score_task_accuracy writes it): " + ", ".join(no_gap),
        ]
    return lines


def delta_markdown(records: list[RunRecord]) -> list[str]:
    """The table of PoPE's delta at the end of training, over finished runs with eval/delta_state.json (empty
    when there are none): how much of delta lies outside [-2π, 0] (pope.eval.delta_state)."""
    groups = {
        key: done for key, done in finished_groups(records).items() if any(m.delta_outside is not None for m in done)
    }
    if not groups:
        return []
    lines = [
        "",
        "## PoPE's delta outside [−2π, 0] at the end of training",
        "",
        "Share of the phase-bias entries (layers × heads × frequencies) whose parameter lies outside "
        "[−2π, 0] (eval/delta_state.json, `pope analyze delta`): with δ clamped they get no gradient, so "
        "they stopped learning; with δ wrapped they kept learning, and are the entries the clamp would have "
        "stopped.",
        "",
        "| preset | PE | n | outside: mean ± std | per seed | setting |",
        "|---|---|---|---|---|---|",
    ]
    for (preset, pe, label), done in sorted(groups.items()):
        shares = [m.delta_outside for m in done if m.delta_outside is not None]
        per_seed = ", ".join(f"{100 * share:.1f}" for share in shares)
        lines.append(f"| {preset} | {pe} | {len(shares)} | {_percent(shares)} % | {per_seed} | {label} |")
    return lines


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


def by_shift_markdown(records: list[RunRecord]) -> list[str]:
    """Test accuracy (%) per range of signed shifts, mean ± std over the finished seeds re-scored with per-shift
    counts (eval/task_accuracy.json); empty when there are none. Beside accuracy_by_shift.png."""
    groups = by_shift_groups(records)
    if not groups:
        return []
    buckets = [
        b
        for b in SHIFT_BUCKETS
        if any(shift_bucket_accuracy(t, *b) is not None for tables in groups.values() for t in tables)
    ]
    names = [f"{low:+d}" if low == high else f"{low:+d} … {high:+d}" for low, high in buckets]
    lines = [
        "",
        "## Test accuracy by shift",
        "",
        "Test accuracy (%) of the re-scored checkpoint over the examples whose signed shift (target position − "
        "source position) lies in each range, mean ± std over finished seeds: which offsets each setting has "
        "learned to index (accuracy_by_shift.png has every shift).",
        "",
        "| preset | PE | n | " + " | ".join(names) + " | setting |",
        "|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for (preset, pe, label), tables in sorted(groups.items()):
        cells = [
            _percent([a for a in (shift_bucket_accuracy(t, *b) for t in tables) if a is not None]) for b in buckets
        ]
        lines.append(f"| {preset} | {pe} | {len(tables)} | " + " | ".join(cells) + f" | {label} |")
    return lines


def _comparison_key(record: RunRecord) -> tuple[str, str]:
    """(preset, config without the seed, execution keys and the PE): runs that may be compared."""
    setting = {k: v for k, v in json.loads(record.fingerprint).items() if k not in ("pe", "model.pe")}
    return record.preset, json.dumps(setting, sort_keys=True)


@dataclass(frozen=True)
class ComparisonRow:
    """One row of a comparison table before the Holm column. The rows of one preset and ``value`` (e.g.
    "test_accuracy, headline") in one table are one family for the Holm adjustment."""

    preset: str
    value: str
    cells: str
    p: float


def _difference_row(preset: str, label: str, value: str, values: list[float], baseline: list[float]) -> ComparisonRow:
    interval, test = welch_interval(values, baseline), permutation_test(values, baseline)
    ci = (
        "— (needs ≥ 2 seeds each)"
        if interval is None
        else f"{interval[0]:+.4f} … {interval[1]:+.4f} (df {interval[2]:.1f})"
    )
    return ComparisonRow(
        preset,
        value,
        f"{label} | {value} | {len(values)} / {len(baseline)} | "
        f"{statistics.fmean(values) - statistics.fmean(baseline):+.4f} | {ci} | "
        f"{test.p_value:.4f} ({test.describe()}) |",
        test.p_value,
    )


def _paired_row(preset: str, label: str, value: str, pairs: list[tuple[int, float, float]]) -> ComparisonRow:
    """One value of the seeds finished on both sides, paired by seed: mean of the differences, the paired t
    interval, the sign-flip p and how many seeds came out above the baseline."""
    differences = [mine - theirs for _, mine, theirs in pairs]
    interval, test = paired_interval(differences), paired_permutation_test(differences)
    ci = (
        "— (needs ≥ 2 pairs with spread)"
        if interval is None
        else f"{interval[0]:+.4f} … {interval[1]:+.4f} (df {interval[2]:.0f})"
    )
    above = sum(d > 0 for d in differences)
    seeds = ",".join(str(seed) for seed, _, _ in pairs)
    return ComparisonRow(
        preset,
        value,
        f"{label} | {value} | {len(pairs)} pairs (seeds {seeds}; {above} above) | "
        f"{statistics.fmean(differences):+.4f} | {ci} | {test.p_value:.4f} ({test.describe()}) |",
        test.p_value,
    )


def _seed_pairs(members: list[RunRecord], base: list[RunRecord], get) -> list[tuple[int, float, float]]:
    """(seed, value, baseline value) of one value (``get``: RunRecord -> value or None, see _COMPARED_VALUES) for
    each seed finished on both sides with a finite value."""

    def by_seed(group):
        values = {m.seed: get(m) for m in group if m.finished and m.seed is not None}
        return {seed: value for seed, value in values.items() if value is not None and math.isfinite(value)}

    mine, theirs = by_seed(members), by_seed(base)
    return [(seed, mine[seed], theirs[seed]) for seed in sorted(set(mine) & set(theirs))]


_COMPARED_VALUES = (("headline", lambda m: m.value), ("at best valid", lambda m: m.at_best_valid))
"""The two values of a run that the comparison rows test: (name in the row, RunRecord -> value or None)."""


def _difference_rows(
    preset: str, pe: str, settings: str, members: list[RunRecord], base: list[RunRecord]
) -> list[ComparisonRow]:
    """Rows of members vs base (headline and best-valid value), each where both have >= 2 finished seeds; and each
    of the two paired by seed where >= 2 seeds finished on both sides (one seed gives both runs the same batch order
    and starts both models' initialisation from the same random state, so a per-seed difference removes what the
    batch order decides)."""
    metric = next((m.metric for m in members if m.metric), "—")
    label = f"| {preset} | {pe} | {settings}"
    rows = []
    for name, get in _COMPARED_VALUES:
        values, baseline = (finite(get(m) for m in group if m.finished) for group in (members, base))
        if len(values) >= 2 and len(baseline) >= 2:
            rows.append(_difference_row(preset, label, f"{metric}, {name}", values, baseline))
            if metric == "test_accuracy" and name == "headline":
                rows.append(_lift_off_row(preset, label, values, baseline))
                rows += _lift_off_step_rows(preset, label, members, base)
    for name, get in _COMPARED_VALUES:
        pairs = _seed_pairs(members, base, get)
        if len(pairs) >= 2:
            rows.append(_paired_row(preset, label, f"{metric}, {name}, paired by seed", pairs))
    return rows


_LIFT_OFF_NOTE = (
    f" Runs scored by test accuracy add a lift-off row: the seeds past {100 * LIFT_OFF_ACCURACY:g} % on "
    "each side, the difference of the rates, and Fisher's exact two-sided p; and, where a seed lifted "
    "off and both sides ran the same number of steps, a lift-off step row: each finished seed's first "
    "evaluation past it (— never, ranked after every step), the medians, and the exact two-sided "
    "rank-sum (Mann-Whitney) p, which with no overlap is 2 / C(n1 + n2, n1)."
)
_PAIRED_NOTE = (
    " Paired rows: the seeds finished on both sides, each seed's two runs compared (one seed gives both "
    "runs the same batch order and starts both initialisations from the same random state; weights match "
    "only where the settings create the same parameters); the mean of the per-seed "
    "differences, its paired t 95 % interval, and the two-sided sign-flip permutation p (exact over all "
    "2^n sign patterns; with n pairs it cannot go below 2/2^n)."
)
_HOLM_NOTE = (
    " Holm p: the p-value adjusted (Holm's step-down method) over the table's rows of the same preset "
    "and value, i.e. over the m settings tested here at once; read it when asking whether any of them "
    "differs, the raw p when one comparison was planned before the runs. It depends on which runs the "
    "report was given."
)


def _lift_off_row(preset: str, label: str, values: list[float], baseline: list[float]) -> ComparisonRow:
    """Lift-off rates (final test accuracy > LIFT_OFF_ACCURACY) of two groups: counts, difference, Fisher's p."""
    lifted, lifted_base = lift_offs(values), lift_offs(baseline)
    rate = lifted / len(values) - lifted_base / len(baseline)
    p = fisher_exact(lifted, len(values), lifted_base, len(baseline))
    value = f"lift-off rate (> {100 * LIFT_OFF_ACCURACY:g} %)"
    return ComparisonRow(
        preset,
        value,
        f"{label} | {value} | {lifted}/{len(values)} vs "
        f"{lifted_base}/{len(baseline)} | {rate:+.4f} | — | {p:.4f} (Fisher exact) |",
        p,
    )


def _lift_off_step_rows(
    preset: str, label: str, members: list[RunRecord], base: list[RunRecord]
) -> list[ComparisonRow]:
    """[row] comparing when the two sides' finished seeds lifted off (first evaluation past LIFT_OFF_ACCURACY;
    never: after every step) by the exact rank-sum test; [] when no seed of either lifted off, or when the sides ran
    schedules of different lengths (a "never" of a shorter schedule says nothing about the steps past its end)."""
    groups = [
        [m for m in group if m.finished and m.value is not None and math.isfinite(m.value)] for group in (members, base)
    ]
    steps = [[first_step_past_lift_off(m.curve) for m in group] for group in groups]
    if len({m.max_steps for group in groups for m in group}) != 1 or all(s is None for g in steps for s in g):
        return []
    ordered = [[math.inf if s is None else s for s in g] for g in steps]
    test = rank_sum_test(*ordered)

    def median(values: list[float]) -> str:
        middle = statistics.median(values)
        return _kilo_steps(None if math.isinf(middle) else middle)

    value = f"lift-off step (first past {100 * LIFT_OFF_ACCURACY:g} %)"
    return [
        ComparisonRow(
            preset,
            value,
            f"{label} | {value} | {', '.join(map(_kilo_steps, steps[0]))} vs "
            f"{', '.join(map(_kilo_steps, steps[1]))} | median {median(ordered[0])} vs "
            f"{median(ordered[1])} | — | {test.p_value:.4f} (rank-sum, {test.describe()}) |",
            test.p_value,
        )
    ]


def _row_notes(rows: list[ComparisonRow]) -> str:
    """The sentences a comparison table's intro adds for its rows: the lift-off and paired rows (when there are
    any), Holm."""
    return (
        _LIFT_OFF_NOTE * any(row.value.startswith("lift-off") for row in rows)
        + _PAIRED_NOTE * any(row.value.endswith("paired by seed") for row in rows)
        + _HOLM_NOTE
    )


def _with_holm(rows: list[ComparisonRow]) -> list[str]:
    """The rows' text with a last column: each p Holm-adjusted within its family (preset and value), and the
    family's size m."""
    families: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows):
        families.setdefault((row.preset, row.value), []).append(i)
    adjusted = {}
    for members in families.values():
        adjusted.update(zip(members, holm_adjust([rows[i].p for i in members])))
    return [
        f"{row.cells} {adjusted[i]:.4f} (m = {len(families[row.preset, row.value])}) |" for i, row in enumerate(rows)
    ]


def _sweeps(members: list[RunRecord]) -> str:
    """The sweep directories of a setting's runs ('—' for runs outside sweeps)."""
    return ", ".join(sorted({m.setting.split()[0] for m in members if m.setting})) or "—"


def comparison_markdown(records: list[RunRecord]) -> list[str]:
    """The "PoPE vs RoPE" section (module docstring): settings with >= 2 finished seeds on both sides."""
    groups = setting_groups(records)
    baselines = {_comparison_key(members[0]): members for (_, pe, _), members in groups.items() if pe == COMPARED_PE}
    rows = []
    for (preset, pe, _label), members in sorted(groups.items()):
        key = _comparison_key(members[0])
        if pe == COMPARED_PE or key not in baselines:
            continue
        base = baselines[key]
        rows += _difference_rows(preset, pe, f"{_sweeps(members)} vs {_sweeps(base)}", members, base)
    if not rows:
        return []
    return [
        "",
        f"## PoPE vs RoPE: each encoding against {COMPARED_PE} of the same preset and setting",
        "",
        "Finished seeds only. Difference = mean(PE) − mean(RoPE) (for NLL and perplexity, negative means the PE "
        "is better; for accuracy, positive); 95 % interval: Welch t (unequal variances); p: two-sided "
        f"permutation test of equal means over the splits of the pooled seeds (exact when there are at most "
        f"{MAX_EXACT_SPLITS:,} splits, else {MONTE_CARLO_SPLITS:,} seeded random ones). With a handful of seeds only "
        "large gaps can reach p < 0.05: with 2 seeds each the smallest possible p is 1/3. Encodings with fewer "
        "than 2 finished seeds (or a RoPE with fewer) are not compared." + _row_notes(rows),
        "",
        "| preset | PE | settings | value | n (PE / RoPE) | difference | 95 % interval | p | Holm p |",
        "|---|---|---|---|---|---|---|---|---|",
        *_with_holm(rows),
    ]


def against_markdown(records: list[RunRecord], against: str | Path) -> list[str]:
    """``--against DIR``: every other setting of DIR's preset (any PE) against DIR's runs, as in "PoPE vs RoPE";
    for recipe knobs, e.g. each sensitivity sweep against the paper's recipe. DIR must be one setting."""
    base_dir = Path(against).resolve()
    groups = setting_groups(records)
    inside = {key: [Path(m.run).resolve().is_relative_to(base_dir) for m in members] for key, members in groups.items()}
    chosen = [key for key, flags in inside.items() if any(flags)]
    if not chosen:
        raise ValueError(f"--against {against}: none of the RUN arguments is inside it; give it as one of them")
    if len(chosen) > 1 or not all(inside[chosen[0]]):
        raise ValueError(
            f"--against {against}: its runs are not one setting (or share it with runs outside it); "
            "give a sweep directory of one preset, encoding and setting"
        )
    preset = chosen[0][0]
    base = groups[chosen[0]]
    rows = []
    for key, members in sorted(groups.items()):
        if key != chosen[0] and key[0] == preset:
            rows += _difference_rows(preset, key[1], key[2], members, base)
    title = f"{chosen[0][1]} ({chosen[0][2]})"
    if not rows:
        return ["", f"## Against {title}", "", f"No other setting of {preset} has >= 2 finished seeds to compare."]
    return [
        "",
        f"## Against {title}: every other setting of {preset}",
        "",
        "Finished seeds only; difference = mean(setting) − mean(the baseline named in the title), with the Welch 95 % "
        "interval and the permutation p of the PoPE vs RoPE table. Settings with fewer than 2 finished seeds are "
        "left out." + _row_notes(rows),
        "",
        "| preset | PE | setting | value | n (setting / baseline) | difference | 95 % interval | p | Holm p |",
        "|---|---|---|---|---|---|---|---|---|",
        *_with_holm(rows),
    ]


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
                f"{path / 'config.json'} not found: {path} is neither a `pope train` run "
                "directory nor a sweep directory holding runs"
            )
        runs += inside
    return runs


def report_markdown(records: list[RunRecord], against: str | Path | None = None) -> str:
    groups = setting_groups(records)
    lines = [
        "# Runs",
        "",
        "Finished runs only; unfinished ones are listed with their step and left out of every "
        "number. Two values per run: the headline one, taken from the evaluations by the rule in the metric "
        "column, and the same metric at the best-validation checkpoint (`checkpoints/best`, chosen on the "
        "validation split only: summary.json `at_best_valid`).",
        "",
        "| preset | PE | metric (headline rule) | ours, headline: mean ± std (n seeds) | ours at best-valid "
        "checkpoint | paper | seeds | unfinished (left out) | setting |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (preset, pe, label), members in sorted(groups.items()):
        done = [m for m in members if m.finished]
        metric = next((m.metric for m in members if m.metric), "—")
        rule = f"{metric} ({METRIC_RULES[metric]})" if metric in METRIC_RULES else metric
        paper = paper_value(preset, pe)
        seeds = ",".join(str(m.seed) for m in done) or "—"
        lines.append(
            f"| {preset} | {pe} | {rule} | {format_mean_std(finite(m.value for m in done))} | "
            f"{format_mean_std(finite(m.at_best_valid for m in done))}{_best_steps(done)} | "
            f"{'—' if paper is None else f'{paper:g}'} | {seeds} | {_unfinished(members)} | {label} |"
        )
    missing = [m.run for m in records if m.finished and m.value is None]
    if missing:
        lines += ["", "Finished runs without an evaluation record: " + ", ".join(missing)]
    lines += comparison_markdown(records)
    if against is not None:
        lines += against_markdown(records, against)
    lines += lift_off_markdown(records)
    lines += by_shift_markdown(records)
    lines += delta_markdown(records)
    by_setting = finished_groups(records)  # finished runs per preset x PE x setting

    length_keys = sorted({key for m in records for key in m.length_ppl})
    for key in length_keys:
        lengths = sorted({L for m in records for L in m.length_ppl.get(key, {})})
        # the growth column: each seed's perplexity at the longest length over its own at the shortest, then mean ±
        # std over seeds (1.00: flat; a ratio of the means would mix seeds of different levels)
        growth = [f"L={lengths[-1]:,} / L={lengths[0]:,}"] if len(lengths) > 1 else []
        lines += [
            "",
            f"## Perplexity vs evaluation length ({key})",
            "",
            "| preset | PE | setting | " + " | ".join([*(f"L={L:,}" for L in lengths), *growth]) + " |",
            "|---|---|---|" + "---|" * (len(lengths) + len(growth)),
        ]
        for (preset, pe, label), members in sorted(by_setting.items()):
            if not any(key in m.length_ppl for m in members):
                continue
            cells = [format_mean_std(finite(m.length_ppl.get(key, {}).get(L) for m in members), 3) for L in lengths]
            if growth:
                ratios = [
                    ppl[lengths[-1]] / ppl[lengths[0]]
                    for ppl in (m.length_ppl.get(key, {}) for m in members)
                    if math.isfinite(ppl.get(lengths[-1], math.nan)) and math.isfinite(ppl.get(lengths[0], math.nan))
                ]
                cells.append(format_mean_std(ratios, 2))
            lines.append(f"| {preset} | {pe} | {label} | " + " | ".join(cells) + " |")

    if any(m.downstream for m in records):
        from pope.eval.downstream import PAPER_COLUMNS, paper_downstream

        columns = [c for c, _, _ in PAPER_COLUMNS] + ["Average"]
        lines += [
            "",
            "## Zero-shot downstream accuracy (%)",
            "",
            "| preset | PE | setting | " + " | ".join(columns) + " |",
            "|---|---|---|" + "---|" * len(columns),
        ]
        for (preset, pe, label), members in sorted(by_setting.items()):
            rows = [m.downstream for m in members if m.downstream]
            if rows:
                cells = [format_mean_std(finite(r.get(c) for r in rows), 2) for c in columns]
                lines.append(f"| {preset} | {pe} | {label} | " + " | ".join(cells) + " |")
                paper = paper_downstream(preset, paper_encoding(preset, pe) or "")
                if paper:
                    lines.append(
                        f"| {preset} | paper {paper_encoding(preset, pe)} | the paper | "
                        + " | ".join(f"{paper[c]:.2f}" for c in columns)
                        + " |"
                    )
    return "\n".join(lines) + "\n"


def write_report(runs: list[str], out_dir: str | Path, against: str | Path | None = None) -> tuple[str, list[Path]]:
    if not runs:
        raise ValueError("give at least one run directory")
    records = [collect_run(run) for run in expand_runs(runs)]
    markdown = report_markdown(records, against)
    out_dir = Path(out_dir)
    written = [write_text_atomic(out_dir / "report.md", markdown)]
    from pope.eval.report_plots import (
        plot_accuracy_by_shift,
        plot_accuracy_curves,
        plot_lift_off_share,
        plot_loss_curves,
        plot_report,
        plot_report_lengths,
    )

    for plot in (
        plot_report(records, out_dir / "report.png"),
        plot_report_lengths(records, out_dir / "report_length.png"),
        plot_accuracy_curves(records, out_dir / "accuracy_vs_step.png"),
        plot_lift_off_share(records, out_dir / "lift_off_vs_step.png"),
        plot_accuracy_by_shift(records, out_dir / "accuracy_by_shift.png"),
        plot_loss_curves(records, out_dir / "loss_vs_step.png"),
    ):
        if plot is not None:
            written.append(plot)
    return markdown, written
