"""The plots of ``pope report`` (matplotlib PNGs beside report.md): the headline metric per preset × PE ×
setting, perplexity against evaluation length, every seed's test accuracy against the step, the share of seeds
lifted off by each step, test accuracy against the indirect-indexing shift, and NLL against the step."""

from __future__ import annotations

from pathlib import Path

from pope.eval.report_records import (
    LIFT_OFF_ACCURACY,
    RunRecord,
    by_shift_groups,
    finished_groups,
    finite,
    first_step_past_lift_off,
    mean_std,
    paper_value,
    setting_groups,
)
from pope.eval.runs import short_pe_spec
from pope.files import finish_figure, height_with_legend_below, legend_below, plain_log_ticks
from pope.optional import pyplot


def _sweep_directory(label: str) -> str:
    """The sweep directory that opens a setting label ('pope-len32/ recipe.dataset=...'): a short name for a plot;
    the label's overrides are in report.md's table."""
    return label.split()[0]


def _where(preset: str, label: str) -> str:
    """A legend's name for a setting: its sweep directory, or the preset for a run outside a sweep (label '—')."""
    return preset if label == "—" else _sweep_directory(label)


# Twenty distinct colours, one per setting: matplotlib's ten default ones, then ten darker hues of its tab20b map,
# so a report of 11-20 settings (the indirect-indexing sweep has 12) never gives two settings one colour.
_COLOURS = [f"C{i}" for i in range(10)] + [
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#6b6ecf",
    "#b5cf6b",
    "#e7ba52",
    "#d6616b",
    "#ce6dbd",
]


def setting_colour(index: int) -> str:
    """The colour of the index-th setting of a plot (distinct for 20 settings, then repeating)."""
    return _COLOURS[index % len(_COLOURS)]


PAPER_SCALE_SHARE = 0.25
"""The least share of a panel's value axis that our runs must keep for the paper's marks to be drawn on it."""


def paper_marks_fit(ours: list[float], papers: list[float]) -> bool:
    """Whether the paper's values can share an axis with ours: drawing them must leave our runs' span (means,
    error bars and seeds) at least PAPER_SCALE_SHARE of the axis. A paper number from another scale of the same
    task (e.g. a full dataset where we trained on a small stand-in) would otherwise squash every seed into one
    line; plot_report names such numbers under the panel's title instead."""
    if not papers or not ours:
        return True
    low, high = min(ours), max(ours)
    span = high - low
    full = max(high, *papers) - min(low, *papers)
    return full == 0 or span / full >= PAPER_SCALE_SHARE


def plot_report(records: list[RunRecord], path: Path) -> Path | None:
    """One column per preset × PE × setting over finished runs: mean with an error bar of one std over seeds,
    dots = seeds, cross = paper. Points, not bars from zero, so gaps of a few hundredths in an NLL stay
    visible; the axis spans the values shown. Paper values that would shrink our runs to under a quarter of the
    axis (paper_marks_fit) are written under the panel's title, not drawn."""

    finished = {key: [m for m in members if m.finished] for key, members in setting_groups(records).items()}
    groups = [(key, done) for key, done in sorted(finished.items()) if finite(m.value for m in done)]
    if not groups:
        return None
    plt = pyplot()
    presets = sorted({preset for (preset, _, _), _ in groups})
    widths = [max(4.5, 1.2 * sum(p == preset for (p, _, _), _ in groups) + 1.5) for preset in presets]  # inches
    fig, axes = plt.subplots(1, len(presets), figsize=(sum(widths), 4.5), squeeze=False, width_ratios=widths)
    for ax, preset in zip(axes[0], presets):
        mine = [
            (pe if label == "—" else f"{pe}\n{_sweep_directory(label)}", members)
            for (p, pe, label), members in groups
            if p == preset
        ]
        papers = [(x, members[0].pe, paper_value(preset, members[0].pe)) for x, (_, members) in enumerate(mine)]
        papers = [(x, pe, value) for x, pe, value in papers if value is not None]
        shown: list[float] = []  # every value drawn for our runs: seeds, and means ± std
        for x, (_pe, members) in enumerate(mine):
            values = finite(m.value for m in members)
            mean, std, _ = mean_std(values)
            ax.errorbar(
                [x], [mean], yerr=[std or 0], fmt="s", color=setting_colour(x), markersize=8, capsize=6, zorder=2
            )
            ax.scatter([x + 0.12] * len(values), values, color="black", s=10, zorder=3)
            shown += values + [mean - (std or 0), mean + (std or 0)]
        title = preset
        if paper_marks_fit(shown, [value for _, _, value in papers]):
            for index, (x, _, value) in enumerate(papers):
                ax.scatter([x], [value], marker="x", color="red", s=60, zorder=4, label="paper" if index == 0 else None)
            if papers:
                ax.legend(fontsize=8)
        else:  # under the title, where no seed's dot can hide it
            title += "\npaper (off this scale): " + ", ".join(
                f"{short_pe_spec(pe)} {value:.4g}" for _, pe, value in papers
            )
        ax.set_xticks(range(len(mine)), [pe for pe, _ in mine], rotation=20, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(mine) - 0.4)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(next((m.metric for _, ms in mine for m in ms if m.metric), "metric"))
    return finish_figure(fig, path)


def plot_report_lengths(records: list[RunRecord], path: Path) -> Path | None:
    """Perplexity vs evaluation length per (preset, PE, setting): mean over seeds, error bars = std; one panel
    per set of documents, one colour per setting in every panel, one legend under the panels."""

    keys = sorted({key for record in records for key in record.length_ppl})
    if not keys:
        return None
    plt = pyplot()
    groups = sorted(finished_groups(records).items())
    colours = {key: setting_colour(i) for i, (key, _) in enumerate(groups)}
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5), squeeze=False)
    legend: dict[str, object] = {}
    for ax, key in zip(axes[0], keys):
        evaluated: set[int] = set()
        for (preset, pe, label), members in groups:
            lengths = sorted({L for m in members for L in m.length_ppl.get(key, {})})
            if not lengths:
                continue
            evaluated.update(lengths)
            stats = [mean_std(finite(m.length_ppl.get(key, {}).get(L) for m in members)) for L in lengths]
            line = ax.errorbar(
                lengths,
                [s[0] for s in stats],
                yerr=[s[1] or 0 for s in stats],
                marker="o",
                capsize=3,
                color=colours[(preset, pe, label)],
            )
            legend.setdefault(
                f"{preset} {short_pe_spec(pe)} {_sweep_directory(label)} (n={max(s[2] for s in stats)})", line
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
        ax.set_xticks(sorted(evaluated), [f"{L:,}" for L in sorted(evaluated)], fontsize=8)  # the lengths run
        ax.minorticks_off()
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title(key, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    # one legend column per panel (at most 2): a 6-inch-wide single panel cannot hold two columns of long labels
    legend_below(fig, list(legend.values()), list(legend), columns=min(2, len(keys)))
    return finish_figure(fig, path, tight_layout=False)


def plot_accuracy_curves(records: list[RunRecord], path: Path) -> Path | None:
    """Every run's test accuracy against the step, one colour per setting (named by its sweep directory in the
    legend under the axes); unfinished runs dashed."""

    groups = [
        (key, members) for key, members in sorted(setting_groups(records).items()) if any(m.curve for m in members)
    ]
    if not groups:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, height_with_legend_below(len(groups))))
    for index, ((preset, pe, label), members) in enumerate(groups):
        colour = setting_colour(index)
        finished = sum(m.finished for m in members)
        name = (
            f"{short_pe_spec(pe)} {_where(preset, label)} ({finished} finished, {len(members) - finished} unfinished)"
        )
        for number, member in enumerate(m for m in members if m.curve):
            steps, accuracy = zip(*member.curve)
            ax.plot(
                steps,
                [100 * a for a in accuracy],
                color=colour,
                alpha=0.7,
                lw=1.2,
                linestyle="-" if member.finished else "--",
                marker="o",
                markersize=2,
                label=name if number == 0 else None,
            )
    ax.axhline(100 * LIFT_OFF_ACCURACY, color="gray", lw=0.8, linestyle=":", label="lift-off threshold")
    ax.set_xlabel("step")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    # Under the axes, so that no curve is hidden; report.md's tables name each setting's overrides in full.
    fig.suptitle("Test accuracy vs step, every seed (dashed: unfinished)")
    legend_below(fig, *ax.get_legend_handles_labels(), columns=2)
    return finish_figure(fig, path, tight_layout=False)


def plot_lift_off_share(records: list[RunRecord], path: Path) -> Path | None:
    """The share of each setting's finished seeds whose test accuracy has passed the lift-off threshold by each
    step (their first evaluation past it; the seeds that never pass keep the line below 1), one step line per
    setting, drawn to the last step its seeds ran. Where the accuracy curves of dozens of seeds tangle, this shows
    what separates settings on this task: how soon and how often their seeds leave the plateau. None when no
    finished run has a test-accuracy curve."""

    groups = [(key, [m for m in members if m.curve]) for key, members in sorted(finished_groups(records).items())]
    groups = [(key, members) for key, members in groups if members]
    if not groups:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, height_with_legend_below(len(groups))))
    for index, ((preset, pe, label), members) in enumerate(groups):
        last = max(m.curve[-1][0] for m in members)
        firsts = sorted(s for s in map(first_step_past_lift_off, (m.curve for m in members)) if s is not None)
        steps = [0, *firsts, last]
        shares = [0.0, *[(i + 1) / len(members) for i in range(len(firsts))], len(firsts) / len(members)]
        ax.step(
            steps,
            [100 * s for s in shares],
            where="post",
            color=setting_colour(index),
            lw=1.6,
            label=f"{short_pe_spec(pe)} {_where(preset, label)} ({len(firsts)}/{len(members)})",
        )
    ax.set_xlabel("step")
    ax.set_ylabel(f"seeds past {100 * LIFT_OFF_ACCURACY:g} % test accuracy (%)")
    ax.set_ylim(-3, 103)
    ax.grid(True, alpha=0.3)
    fig.suptitle(f"Lift-off: share of finished seeds past {100 * LIFT_OFF_ACCURACY:g} % by each step")
    legend_below(fig, *ax.get_legend_handles_labels(), columns=2)
    return finish_figure(fig, path, tight_layout=False)


def plot_accuracy_by_shift(records: list[RunRecord], path: Path) -> Path | None:
    """Test accuracy against the signed shift (eval/task_accuracy.json's by_shift), one line per setting: the mean
    over its finished seeds that have it, a band of one std; chance (1/52) dotted. Which offsets each encoding has
    learned to index. None when no finished run has a per-shift record."""

    groups = sorted(by_shift_groups(records).items())
    if not groups:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, height_with_legend_below(len(groups))))
    for index, ((preset, pe, label), tables) in enumerate(groups):
        shifts = sorted(set().union(*tables))
        stats = [mean_std([100 * t[s][0] / t[s][1] for t in tables if s in t]) for s in shifts]  # (mean, std, n)
        means = [mean for mean, _, _ in stats]
        stds = [std or 0.0 for _, std, _ in stats]
        colour = setting_colour(index)
        ax.plot(
            shifts,
            means,
            color=colour,
            marker="o",
            markersize=3,
            lw=1.2,
            label=f"{short_pe_spec(pe)} {_where(preset, label)} (n={len(tables)})",
        )
        # the band stops at the scale's ends: an accuracy outside 0-100 % is an artefact of mean ± std
        ax.fill_between(
            shifts,
            [max(0.0, m - s) for m, s in zip(means, stds)],
            [min(100.0, m + s) for m, s in zip(means, stds)],
            color=colour,
            alpha=0.15,
            lw=0,
        )
    ax.axhline(100 / 52, color="gray", lw=0.8, linestyle=":", label="chance (1/52)")
    ax.set_xlabel("shift (target position − source position)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    fig.suptitle("Test accuracy by shift, mean ± std over finished seeds (band clipped to 0-100 %)")
    legend_below(fig, *ax.get_legend_handles_labels(), columns=2)
    return finish_figure(fig, path, tight_layout=False)


def plot_loss_curves(records: list[RunRecord], path: Path) -> Path | None:
    """Every run's validation NLL (solid) and test NLL (dotted) against the step, one colour per setting, the
    best-validation step of each finished run marked with a dot: where the minimum lies in the budget and how
    far the runs overfit after it."""

    groups = [
        (key, members) for key, members in sorted(setting_groups(records).items()) if any(m.loss_curve for m in members)
    ]
    if not groups:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    lowest, highest = float("inf"), float("-inf")
    for index, ((preset, pe, label), members) in enumerate(groups):
        colour = setting_colour(index)
        name = f"{pe} {_where(preset, label)} (n={len(members)})"
        for number, member in enumerate(m for m in members if m.loss_curve):
            steps, valid, test = zip(*member.loss_curve)
            ax.plot(steps, valid, color=colour, alpha=0.8, lw=1.2, label=f"{name}: valid" if number == 0 else None)
            ax.plot(
                steps,
                test,
                color=colour,
                alpha=0.6,
                lw=1.0,
                linestyle=":",
                label=f"{name}: test" if number == 0 else None,
            )
            best = [(s, v) for s, v, _ in member.loss_curve if s == member.best_step]
            if member.finished and best:
                ax.scatter(*zip(*best), color=colour, s=18, zorder=3)
            lowest, highest = min(lowest, *valid, *test), max(highest, min(valid), min(test))
    # the first evaluations and an overfitting tail can lie far above the minima: show the region around the
    # lowest validation and test NLLs
    top = lowest + 4 * max(highest - lowest, 1e-3)
    ax.set_ylim(lowest - 0.05 * (top - lowest), top)
    ax.set_xlabel("step")
    ax.set_ylabel("NLL (nats per token)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return finish_figure(
        fig, path, title="Validation (solid) and test (dotted) NLL vs step, every seed; dots: best-valid checkpoints"
    )
