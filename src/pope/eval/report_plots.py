"""The plots of ``pope report`` (matplotlib PNGs beside report.md): the headline metric per preset × PE ×
setting, perplexity against evaluation length, and every seed's test accuracy against the step."""
from __future__ import annotations

from pathlib import Path

from pope.eval.report import (LIFT_OFF_ACCURACY, RunRecord, finite, finished_groups, setting_groups, mean_std,
                              paper_value)
from pope.files import finish_figure


def plot_report(records: list[RunRecord], path: Path) -> Path | None:
    """Bar per preset × PE × setting over finished runs (mean, error bar = std over seeds, dots = seeds,
    cross = paper)."""
    from pope.optional import pyplot

    finished = {key: [m for m in members if m.finished] for key, members in setting_groups(records).items()}
    groups = [(key, done) for key, done in sorted(finished.items()) if finite(m.value for m in done)]
    if not groups:
        return None
    plt = pyplot()
    presets = sorted({preset for (preset, _, _), _ in groups})
    fig, axes = plt.subplots(1, len(presets), figsize=(4.5 * len(presets), 4), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        mine = [(pe if label == "—" else f"{pe}\n{label[:40]}", members)
                for (p, pe, label), members in groups if p == preset]
        for x, (pe, members) in enumerate(mine):
            values = finite(m.value for m in members)
            mean, std, _ = mean_std(values)
            ax.bar(x, mean, yerr=std or 0, capsize=4, alpha=0.6)
            ax.scatter([x] * len(values), values, color="black", s=10, zorder=3)
            paper = paper_value(preset, members[0].pe)
            if paper is not None:
                ax.scatter([x], [paper], marker="x", color="red", s=60, zorder=4, label="paper" if x == 0 else None)
        ax.set_xticks(range(len(mine)), [pe for pe, _ in mine], rotation=20, ha="right", fontsize=8)
        ax.set_title(preset)
        ax.set_ylabel(next((m.metric for _, ms in mine for m in ms if m.metric), "metric"))
        if any(paper_value(preset, members[0].pe) is not None for _, members in mine):
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
        for (preset, pe), members in sorted(finished_groups(records).items()):
            lengths = sorted({L for m in members for L in m.length_ppl.get(key, {})})
            if not lengths:
                continue
            stats = [mean_std(finite(m.length_ppl.get(key, {}).get(L) for m in members)) for L in lengths]
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


def plot_accuracy_curves(records: list[RunRecord], path: Path) -> Path | None:
    """Every run's test accuracy against the step, one colour per setting; unfinished runs dashed."""
    from pope.optional import pyplot

    groups = [(key, members) for key, members in sorted(setting_groups(records).items())
              if any(m.curve for m in members)]
    if not groups:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for index, ((preset, pe, label), members) in enumerate(groups):
        colour = f"C{index % 10}"
        finished = sum(m.finished for m in members)
        name = f"{pe} {label if label != '—' else preset} ({finished} finished, {len(members) - finished} unfinished)"
        for number, member in enumerate(m for m in members if m.curve):
            steps, accuracy = zip(*member.curve)
            ax.plot(steps, [100 * a for a in accuracy], color=colour, alpha=0.7, lw=1.2,
                    linestyle="-" if member.finished else "--", marker="o", markersize=2,
                    label=name if number == 0 else None)
    ax.axhline(100 * LIFT_OFF_ACCURACY, color="gray", lw=0.8, linestyle=":", label="lift-off threshold")
    ax.set_xlabel("step")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return finish_figure(fig, path, title="Test accuracy vs step, every seed (dashed: unfinished)")
