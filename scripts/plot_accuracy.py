"""Accuracy-vs-step plot of indirect-indexing runs from their metrics, optionally with each run's learning rate.

    PYTHONPATH=src python scripts/plot_accuracy.py runs/reproduce/indirect-pope/seed-0 \
        runs/reproduce/indirect-rope/seed-0 --out runs/accuracy_vs_step.png
    PYTHONPATH=src python scripts/plot_accuracy.py "PoPE, seed 0=runs/reproduce/indirect-pope/seed-0" \
        "PoPE, seed 1=runs/reproduce/indirect-pope/seed-1" --group --lr --no-valid --out runs/seeds.png

Each argument is a metrics JSONL file or a run directory holding metrics.jsonl, optionally as LABEL=PATH (the
label defaults to the file's stem, or the run directory's name). Prints the table of test accuracy per evaluation
and writes the PNG: test accuracy solid, validation dashed (unless --no-valid), the paper's 3-seed means as dotted
lines for labels named pope-... or rope-... and for each --paper PE (pope.eval.report.paper_value); --lr adds a
panel below with each run's learning rate (the `lr` of its training records), so where runs part can be read
against their schedules; --delta a panel with the number of PoPE delta entries outside [-2pi, 0] at each
evaluation (`delta_below` + `delta_above` of the eval records, which the trainer writes for PoPE runs; the
entries the forward clamp has frozen), so lift-off can be read against it; a run without them is named on
stderr. --group draws runs whose labels agree up to their last comma ("RoPE, seed 0", "RoPE, seed 1") in one
colour, each with its own line style, so seeds of one setting read as one family.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pope.eval.report import paper_value

PRESET = "indirect-indexing"  # the paper's numbers drawn are this preset's (pope.presets)


def read_run(argument: str) -> tuple[str, list[dict]]:
    """(label, records) of one LABEL=PATH or PATH argument; a one-line SystemExit when it cannot be read."""
    label, _, path_text = argument.rpartition("=")  # no "=": label ""
    path = Path(path_text)
    if path.is_dir():
        label = label or path.name
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"plot_accuracy.py: no metrics file {path} (give a metrics.jsonl or a run directory)")
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise SystemExit(f"plot_accuracy.py: {path} is not JSON lines ({error})") from None
    if not any(r.get("kind") == "eval" for r in records):
        raise SystemExit(f"plot_accuracy.py: {path} has no eval records")
    return label or path.stem, records


SEED_LINE_STYLES = ("-", "--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)))
"""Line styles of a --group family's members, in the order given (then repeated): solid, dashed, dash-dotted, dotted,
dash-dot-dotted (a matplotlib dash tuple: offset, then on/off lengths in points)."""


def line_styles(labels: list[str], group: bool) -> list[dict]:
    """Plot keyword arguments per label: nothing (matplotlib's colour cycle) without grouping; with it one colour
    per family (the label up to its last comma) and the next line style per member."""
    if not group:
        return [{} for _ in labels]
    families: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        families.setdefault(label.rpartition(",")[0] or label, []).append(index)
    styles = [{} for _ in labels]
    for colour, members in enumerate(families.values()):
        for rank, index in enumerate(members):
            styles[index] = {"color": f"C{colour % 10}", "linestyle": SEED_LINE_STYLES[rank % len(SEED_LINE_STYLES)]}
    return styles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="metrics.jsonl files or run directories, optionally LABEL=PATH")
    parser.add_argument("--out", required=True, help="PNG path")
    parser.add_argument("--lr", action="store_true", help="add a panel with each run's learning rate")
    parser.add_argument(
        "--delta", action="store_true", help="add a panel with each PoPE run's count of delta entries outside [-2pi, 0]"
    )
    parser.add_argument("--no-valid", action="store_true", help="plot test accuracy only")
    parser.add_argument(
        "--paper",
        action="append",
        default=[],
        metavar="PE",
        help="draw the paper's 3-seed mean for this PE, e.g. pope or rope-half (also drawn for labels named PE-...)",
    )
    parser.add_argument("--title", default="Indirect indexing (8 layers, d_model 512)")
    parser.add_argument(
        "--group",
        action="store_true",
        help="one colour per family of labels (the text before the last comma), one line style per "
        "member; needs --no-valid (validation lines are dashed)",
    )
    args = parser.parse_args(argv)
    if args.group and not args.no_valid:
        raise SystemExit(
            "plot_accuracy.py: --group gives each seed of a family its own line style, which the "
            "dashed validation lines would clash with; add --no-valid"
        )
    for pe in args.paper:
        if paper_value(PRESET, pe) is None:
            from pope.presets import PRESETS

            known = ", ".join(k for k in PRESETS[PRESET].paper if k != "metric")
            raise SystemExit(
                f"plot_accuracy.py: the paper reports no {PRESET} number for --paper {pe!r}; give one of {known}"
            )
    runs = [read_run(argument) for argument in args.runs]
    if args.delta and not any("delta_below" in r for _, records in runs for r in records):
        raise SystemExit(
            "plot_accuracy.py: --delta: no run has delta counts in its eval records (delta_below, "
            "delta_above: PoPE runs trained since the trainer logs them); leave --delta out"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise SystemExit("plotting needs matplotlib: pip install 'pope-attention[train]'") from err
    extra = [name for name, wanted in (("lr", args.lr), ("delta", args.delta)) if wanted]  # panels below
    figure, axes = plt.subplots(
        1 + len(extra),
        1,
        figsize=(7, 4.2 + 1.8 * len(extra)),
        sharex=True,
        height_ratios=(3, *[1.3] * len(extra)),
        squeeze=False,
    )
    axis, panels = axes[0][0], {name: row[0] for name, row in zip(extra, axes[1:])}
    table = {}
    for (label, records), style in zip(runs, line_styles([label for label, _ in runs], args.group)):
        evals = [r for r in records if r.get("kind") == "eval"]
        steps = [r["step"] for r in evals]
        (line,) = axis.plot(
            steps,
            [100 * r["test_accuracy"] for r in evals],
            marker="o",
            markersize=3,
            label=f"{label} test" if not args.no_valid else label,
            **style,
        )
        if not args.no_valid:
            axis.plot(
                steps,
                [100 * r["valid_accuracy"] for r in evals],
                linestyle="--",
                color=line.get_color(),
                alpha=0.6,
                label=f"{label} valid",
            )
        pe = label.split("-")[0]
        paper = paper_value(PRESET, pe)
        if paper is not None:
            axis.axhline(
                100 * paper, color=line.get_color(), linestyle=":", linewidth=1, label=f"paper {pe} (3-seed mean)"
            )
        if args.lr:
            train = [r for r in records if r.get("kind") == "train" and "lr" in r]
            panels["lr"].plot(
                [r["step"] for r in train],
                [r["lr"] for r in train],
                color=line.get_color(),
                linestyle=line.get_linestyle(),
                label=label,
            )
        counted = [r for r in evals if "delta_below" in r] if args.delta else []
        if counted:
            panels["delta"].plot(
                [r["step"] for r in counted],
                [r["delta_below"] + r["delta_above"] for r in counted],
                color=line.get_color(),
                linestyle=line.get_linestyle(),
                label=label,
            )
        elif args.delta:
            print(
                f"plot_accuracy.py: --delta: {label} has no delta counts (not a PoPE run, or trained before the "
                "trainer logged them): it has no line in the delta panel",
                file=sys.stderr,
            )
        table[label] = {r["step"]: r["test_accuracy"] for r in evals}
    for pe in args.paper:
        value = 100 * paper_value(PRESET, pe)
        axis.axhline(value, color="black", linestyle=":", linewidth=1, label=f"paper {pe} (3-seed mean)")
        # several --paper lines share one style: name each on the line itself
        axis.annotate(
            f"paper {pe} {value:.1f} %",
            xy=(0.99, value),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            fontsize=7,
        )
    axis.axhline(100 / 52, color="grey", linewidth=0.8, label="chance (1/52)")
    axis.set_ylabel("accuracy on the target letter (%)")
    axis.set_title(args.title)
    axis.set_ylim(0, 100)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", handlelength=3.5)  # long enough to show the line styles
    titles = {"lr": "learning rate", "delta": "delta entries\noutside [-2π, 0]"}
    for name, panel in panels.items():
        panel.set_ylabel(titles[name])
        panel.set_ylim(bottom=0)
        panel.grid(alpha=0.3)
    axes[-1][0].set_xlabel("training step")
    figure.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=130)
    labels = list(table)
    steps = sorted(set().union(*(t.keys() for t in table.values())))
    width = max(16, *(len(label) + 2 for label in labels))
    print("step".rjust(8) + "".join(f"{label:>{width}}" for label in labels))
    for step in steps:
        print(
            f"{step:>8}"
            + "".join(
                f"{100 * table[label][step]:>{width - 1}.2f}%" if step in table[label] else " " * width
                for label in labels
            )
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
