"""``pope report``: runs and seeds into one summary (report.md), its plots and the tidy tables.

Inputs: run directories made by ``pope train`` / ``pope finetune`` (or sweep directories of them), and folders of
tables (runs.csv with curves.csv beside it, pope.eval.report_tables) that an earlier report wrote. From run
directories the report writes the tables; from tables it writes only the summary and the plots, so the committed
tables of an experiment regenerate its numbers and figures.

report.md: metric per preset × positional encoding × setting, mean ± std over finished seeds, with the paper's
number beside ours where the preset and encoding match; the comparisons of pope.eval.report_compare; for runs scored
by test accuracy (indirect indexing) a lift-off table — n seeds, final test accuracy mean ± std and median, the
lift-off rate (final test accuracy > ``LIFT_OFF_ACCURACY``) with a Wilson 95 % interval, each seed's first
evaluation step above that threshold (how long it sat on the plateau), and the train − test accuracy gap where it was
measured — and accuracy per signed shift; the share of PoPE's δ outside [−2π, 0]; perplexity per evaluation length;
zero-shot downstream accuracy. Runs are grouped by preset, encoding and *setting* (everything in config.json but the
seed and how the run was executed), so runs of different recipes are never averaged together; the setting column
names the group's sweep directory and its ``--set`` overrides. Plots (pope.eval.report_plots): the headline metric per
setting, perplexity against length, every seed's test accuracy and the share of seeds lifted off against the step,
accuracy against the shift, NLL against the step.
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from pathlib import Path

from pope.eval.downstream import PAPER_COLUMNS, paper_downstream
from pope.eval.report_collect import collect_run, expand_runs
from pope.eval.report_compare import against_markdown, comparison_markdown
from pope.eval.report_plots import (
    plot_accuracy_by_shift,
    plot_accuracy_curves,
    plot_lift_off_share,
    plot_loss_curves,
    plot_report,
    plot_report_lengths,
)
from pope.eval.report_records import (
    LIFT_OFF_ACCURACY,
    METRIC_RULES,
    SHIFT_BUCKETS,
    RunRecord,
    by_shift_groups,
    finished_groups,
    finite,
    first_step_past_lift_off,
    format_mean_std,
    headline_metric,
    kilo_steps,
    lift_offs,
    mean_std,
    paper_encoding,
    paper_value,
    setting_groups,
    shift_bucket_accuracy,
)
from pope.eval.report_tables import RUNS_FILE, read_tables, tables_path, write_tables
from pope.eval.stats import wilson_interval
from pope.files import write_text_atomic

__all__ = [  # the report's API, and the names other modules and scripts import from here
    "collect_run",
    "default_out",
    "expand_runs",
    "headline_metric",
    "load_records",
    "paper_encoding",
    "paper_value",
    "report_markdown",
    "write_report",
]


def _best_steps(members: list[RunRecord]) -> str:
    """'; best step 400–900 of 2000': where the best-valid checkpoints lie in the schedule ('' when unknown)."""
    steps = sorted(m.best_step for m in members if isinstance(m.best_step, int) and m.at_best_valid is not None)
    if not steps:
        return ""
    budgets = sorted({m.max_steps for m in members if isinstance(m.max_steps, int)})
    span = f"{steps[0]}" if steps[0] == steps[-1] else f"{steps[0]}–{steps[-1]}"
    return f"; best step {span}" + (f" of {budgets[0]}" if len(budgets) == 1 else "")


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
        first_past = ", ".join(kilo_steps(first_step_past_lift_off(m.curve)) for m in done) or "—"
        lifted = lift_offs(finals)
        low, high = wilson_interval(lifted, len(finals))
        gaps = [
            m.task_accuracy["train"] - m.task_accuracy["test"]
            for m in done
            if m.task_accuracy and {"train", "test"} <= set(m.task_accuracy)
        ]
        no_gap += [m.run_id for m in done if not (m.task_accuracy and {"train", "test"} <= set(m.task_accuracy))]
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
    missing = [m.run_id for m in records if m.finished and m.value is None]
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


REPORT_DIR = "report"
"""Where a report goes without --out: INPUT/report for its one input (a run, a sweep or a folder of tables)."""


def default_out(inputs: list[str]) -> Path:
    """INPUT/report when there is one input (the folder of a runs.csv given as a file); ValueError otherwise: a
    report is never written into the current directory unasked."""
    if len(inputs) != 1:
        raise ValueError(
            f"{len(inputs)} inputs and no --out: give --out DIR (without it the report goes into INPUT/report, "
            "which needs a single input)"
        )
    path = Path(inputs[0])
    return (path.parent if path.is_file() else path) / REPORT_DIR


def _unique_ids(records: list[RunRecord]) -> None:
    """Give run directories that share a run id (the same sweep and seed names under different parents) ids with
    as many parent directories as it takes to tell them apart."""
    for _ in range(32):
        ids = [record.run_id for record in records]
        clashing = [r for r in records if not r.from_table and ids.count(r.run_id) > 1]
        if not clashing:
            return
        for record in clashing:
            parts = Path(record.run).resolve().parts
            record.run_id = "/".join(parts[-(record.run_id.count("/") + 2) :])


def load_records(inputs: list[str], only: list[str] | None = None) -> list[RunRecord]:
    """The RunRecords of the inputs (run directories, sweep directories, folders of tables or runs.csv files), those
    whose run id matches one of the ``only`` globs when given. ValueError when two runs share an id or ``only``
    keeps none."""
    if not inputs:
        raise ValueError("give at least one run directory, sweep directory or folder of run tables")
    records = []
    for text in inputs:
        table = None if (Path(text) / "config.json").is_file() else tables_path(text)  # a run dir is a run dir
        records += read_tables(table) if table else [collect_run(run) for run in expand_runs([text])]
    _unique_ids(records)
    if only:
        records = [r for r in records if any(fnmatch.fnmatchcase(r.run_id, pattern) for pattern in only)]
        if not records:
            raise ValueError(f"--only {' '.join(only)}: no run id matches; the ids are the run column of runs.csv")
    ids = [record.run_id for record in records]
    repeated = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
    if repeated:
        raise ValueError(
            f"run id(s) {', '.join(repeated)} come from more than one input; give each table once, or pick runs "
            "with --only"
        )
    return records


def _check_tables_out(records: list[RunRecord], out_dir: Path) -> None:
    """Refuse to replace a runs.csv in --out that holds runs this report does not (someone's other tables)."""
    existing = out_dir / RUNS_FILE
    if not existing.is_file():
        return
    ours = {record.run_id for record in records}
    theirs = [record.run_id for record in read_tables(existing)]
    lost = [run_id for run_id in theirs if run_id not in ours]
    if lost:
        raise ValueError(
            f"--out {out_dir} holds a {RUNS_FILE} with {len(lost)} run(s) this report does not have (e.g. "
            f"{lost[0]}); writing would drop them: choose another --out, or add its folder to the inputs"
        )


def write_report(
    inputs: list[str],
    out_dir: str | Path | None = None,
    against: str | Path | None = None,
    only: list[str] | None = None,
) -> tuple[str, list[Path]]:
    """Write report.md and its plots to ``out_dir`` (default: default_out), and, when any input is a run directory,
    the tables (runs.csv, curves.csv, ...); returns the markdown and the paths written."""
    records = load_records(inputs, only)
    out_dir = Path(out_dir) if out_dir is not None else default_out(inputs)
    markdown = report_markdown(records, against)
    written = []
    if any(not record.from_table for record in records):
        _check_tables_out(records, out_dir)
        written += write_tables(records, out_dir, experiment=out_dir.resolve().name)
    written.append(write_text_atomic(out_dir / "report.md", markdown))
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
