"""Collect runs into one table: metric per preset × positional encoding, mean ± std over seeds, with the
paper's number beside ours where the preset and encoding match (``pope report``).

What is read from each run directory (made by ``pope train`` / ``pope finetune`` and the eval commands):
* ``config.json``: preset, pe, seed.
* ``metrics.jsonl`` eval records: the preset's paper metric —
  ``test_nll``: the lowest ``test_loss`` over the run (the paper reports the best test NLL);
  ``test_accuracy``: ``test_accuracy`` of the last evaluation; ``valid_ppl``: exp(``valid_loss``) of the
  last evaluation (the cosine schedule ends at its minimum learning rate). Presets without a paper metric
  report the last ``test_loss`` (or ``valid_loss``).
* ``eval/length-*.json`` (``pope eval length``): perplexity per evaluation length.
* ``eval/downstream.json`` (``pope eval downstream``): the paper's accuracy columns.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from pope.files import finish_figure, write_text_atomic


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


def _eval_records(run_dir: Path) -> list[dict]:
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
        if record.get("kind") == "eval":
            records.append(record)
    return records


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def headline_metric(records: list[dict], paper_metric: str | None) -> tuple[str | None, float | None]:
    """(metric name, value) from a run's eval records following the rules in the module docstring."""
    if not records:
        return paper_metric, None
    last = records[-1]
    if paper_metric == "test_nll":
        values = _finite(r.get("test_loss") for r in records)
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


def paper_encoding(preset_name: str, pe: str) -> str | None:
    """"rope" or "pope" when ``pe`` is the paper's own setting of that encoding for this preset, else None."""
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
    return None


def paper_value(preset_name: str, pe: str) -> float | None:
    """The paper's number for this preset and encoding when the encoding is the paper's own setting."""
    from pope.presets import PRESETS

    encoding = paper_encoding(preset_name, pe)
    preset = PRESETS.get(preset_name)
    return None if encoding is None or not preset.paper else preset.paper.get(encoding)


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
    metric, value = headline_metric(_eval_records(run_dir), paper_metric)
    record = RunRecord(run=str(run_dir), preset=preset, pe=pe, seed=config.get("seed"), metric=metric, value=value)
    for length_file in sorted((run_dir / "eval").glob("length-*.json")):
        data = json.loads(length_file.read_text())
        key = f"{data.get('data_name', '?')}/{data.get('split', '?')}"
        record.length_ppl[key] = {int(r["length"]): float(r["perplexity"]) for r in data.get("results", [])}
    downstream_file = run_dir / "eval" / "downstream.json"
    if downstream_file.is_file():
        record.downstream = json.loads(downstream_file.read_text()).get("paper_row")
    return record


def mean_std(values: list[float]) -> tuple[float, float | None, int]:
    """Mean, sample standard deviation (None for one value) and count."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None), len(values)


def format_mean_std(values: list[float], digits: int = 4) -> str:
    if not values:
        return "—"
    mean, std, n = mean_std(values)
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "") + f" (n={n})"


def _groups(records: list[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        groups.setdefault((record.preset, record.pe), []).append(record)
    return groups


def report_markdown(records: list[RunRecord]) -> str:
    groups = _groups(records)
    lines = ["# Runs", "", "| preset | PE | metric | ours: mean ± std (n seeds) | paper | seeds |",
             "|---|---|---|---|---|---|"]
    for (preset, pe), members in sorted(groups.items()):
        values = _finite(m.value for m in members)
        metric = next((m.metric for m in members if m.metric), "—")
        paper = paper_value(preset, pe)
        seeds = ",".join(str(m.seed) for m in members)
        lines.append(f"| {preset} | {pe} | {metric} | {format_mean_std(values)} | "
                     f"{'—' if paper is None else f'{paper:g}'} | {seeds} |")
    missing = [m.run for m in records if m.value is None]
    if missing:
        lines += ["", "Runs without an evaluation record yet: " + ", ".join(missing)]

    length_keys = sorted({key for m in records for key in m.length_ppl})
    for key in length_keys:
        lengths = sorted({L for m in records for L in m.length_ppl.get(key, {})})
        lines += ["", f"## Perplexity vs evaluation length ({key})", "",
                  "| preset | PE | " + " | ".join(f"L={L:,}" for L in lengths) + " |",
                  "|---|---|" + "---|" * len(lengths)]
        for (preset, pe), members in sorted(groups.items()):
            if not any(key in m.length_ppl for m in members):
                continue
            cells = [format_mean_std(_finite(m.length_ppl.get(key, {}).get(L) for m in members), 3) for L in lengths]
            lines.append(f"| {preset} | {pe} | " + " | ".join(cells) + " |")

    if any(m.downstream for m in records):
        from pope.eval.downstream import PAPER_COLUMNS, paper_downstream

        columns = [c for c, _, _ in PAPER_COLUMNS] + ["Average"]
        lines += ["", "## Zero-shot downstream accuracy (%)", "",
                  "| preset | PE | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
        for (preset, pe), members in sorted(groups.items()):
            rows = [m.downstream for m in members if m.downstream]
            if rows:
                cells = [format_mean_std(_finite(r.get(c) for r in rows), 2) for c in columns]
                lines.append(f"| {preset} | {pe} | " + " | ".join(cells) + " |")
                paper = paper_downstream(preset, paper_encoding(preset, pe) or "")
                if paper:
                    lines.append(f"| {preset} | paper {paper_encoding(preset, pe)} | "
                                 + " | ".join(f"{paper[c]:.2f}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def plot_report(records: list[RunRecord], path: Path) -> Path | None:
    """Bar per preset × PE (mean, error bar = std over seeds, dots = seeds, cross = paper)."""
    from pope.optional import pyplot

    groups = [(key, members) for key, members in sorted(_groups(records).items())
              if _finite(m.value for m in members)]
    if not groups:
        return None
    plt = pyplot()
    presets = sorted({preset for (preset, _), _ in groups})
    fig, axes = plt.subplots(1, len(presets), figsize=(4.5 * len(presets), 4), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        mine = [(pe, members) for (p, pe), members in groups if p == preset]
        for x, (pe, members) in enumerate(mine):
            values = _finite(m.value for m in members)
            mean, std, _ = mean_std(values)
            ax.bar(x, mean, yerr=std or 0, capsize=4, alpha=0.6)
            ax.scatter([x] * len(values), values, color="black", s=10, zorder=3)
            paper = paper_value(preset, pe)
            if paper is not None:
                ax.scatter([x], [paper], marker="x", color="red", s=60, zorder=4, label="paper" if x == 0 else None)
        ax.set_xticks(range(len(mine)), [pe for pe, _ in mine], rotation=20, ha="right", fontsize=8)
        ax.set_title(preset)
        ax.set_ylabel(next((m.metric for _, ms in mine for m in ms if m.metric), "metric"))
        if any(paper_value(preset, pe) is not None for pe, _ in mine):
            ax.legend(fontsize=8)
    return finish_figure(fig, path)


def plot_report_lengths(records: list[RunRecord], path: Path) -> Path | None:
    """Perplexity vs evaluation length per (preset, PE): mean over seeds, error bars = std; one panel per data."""
    from pope.optional import pyplot

    keys = sorted({key for record in records for key in record.length_ppl})
    if not keys:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for (preset, pe), members in sorted(_groups(records).items()):
            lengths = sorted({L for m in members for L in m.length_ppl.get(key, {})})
            if not lengths:
                continue
            stats = [mean_std(_finite(m.length_ppl.get(key, {}).get(L) for m in members)) for L in lengths]
            ax.errorbar(lengths, [s[0] for s in stats], yerr=[s[1] or 0 for s in stats], marker="o", capsize=3,
                        label=f"{preset} {pe} (n={max(s[2] for s in stats)})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title(key)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return finish_figure(fig, path)


def write_report(runs: list[str], out_dir: str | Path) -> tuple[str, list[Path]]:
    if not runs:
        raise ValueError("give at least one run directory")
    records = [collect_run(run) for run in runs]
    markdown = report_markdown(records)
    out_dir = Path(out_dir)
    written = [write_text_atomic(out_dir / "report.md", markdown)]
    for plot in (plot_report(records, out_dir / "report.png"),
                 plot_report_lengths(records, out_dir / "report_length.png")):
        if plot is not None:
            written.append(plot)
    return markdown, written
