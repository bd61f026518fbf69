"""The comparison sections of ``pope report``: "PoPE vs RoPE" (every encoding against RoPE of the same preset and
setting) and ``--against DIR`` (every other setting of DIR's preset against DIR's runs).

Over finished seeds, for the headline value and the best-valid one: the difference of means, its Welch t 95 %
interval and a two-sided permutation p-value (pope.eval.stats); for runs scored by test accuracy also the lift-off
rates on each side and Fisher's exact p, and, where a seed lifted off and both sides ran the same number of steps,
each seed's lift-off step compared by the exact rank-sum test; and each p adjusted by Holm's method over the settings
of one preset tested in the same table (the "Holm p" column); where two settings have >= 2 seeds finished on both
sides, a row paired by seed (the mean per-seed difference, its paired t interval and the sign-flip p,
pope.eval.stats.paired_permutation_test; its own Holm family).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from pope.eval.report_records import (
    COMPARED_PE,
    LIFT_OFF_ACCURACY,
    RunRecord,
    finite,
    first_step_past_lift_off,
    kilo_steps,
    lift_offs,
    setting_groups,
)
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
)


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
        return kilo_steps(None if math.isinf(middle) else middle)

    value = f"lift-off step (first past {100 * LIFT_OFF_ACCURACY:g} %)"
    return [
        ComparisonRow(
            preset,
            value,
            f"{label} | {value} | {', '.join(map(kilo_steps, steps[0]))} vs "
            f"{', '.join(map(kilo_steps, steps[1]))} | median {median(ordered[0])} vs "
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


def in_against(record: RunRecord, against: str | Path) -> bool:
    """Whether a run belongs to ``--against X``: a run directory inside the directory X, or a run read from a table
    whose run id is X or starts with "X/"."""
    if record.from_table:
        prefix = str(against).strip().rstrip("/")
        return record.run_id == prefix or record.run_id.startswith(prefix + "/")
    return Path(record.run).resolve().is_relative_to(Path(against).resolve())


def against_markdown(records: list[RunRecord], against: str | Path) -> list[str]:
    """``--against DIR``: every other setting of DIR's preset (any PE) against DIR's runs (in_against), as in "PoPE vs
    RoPE"; for recipe knobs, e.g. each sensitivity sweep against the paper's recipe. DIR must be one setting."""
    groups = setting_groups(records)
    inside = {key: [in_against(m, against) for m in members] for key, members in groups.items()}
    chosen = [key for key, flags in inside.items() if any(flags)]
    if not chosen:
        raise ValueError(
            f"--against {against}: no run given is inside it; give it as one of the inputs (a run table's runs: "
            "a prefix of their run ids, e.g. pope for pope/seed-0)"
        )
    if len(chosen) > 1 or not all(inside[chosen[0]]):
        raise ValueError(
            f"--against {against}: its runs are not one setting (or share it with runs outside it); "
            "give a sweep directory (or run-id prefix) of one preset, encoding and setting"
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
