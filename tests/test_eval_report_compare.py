"""`pope report`'s comparisons: the lift-off table, PoPE vs RoPE and --against rows, the statistics under them
(Wilson, Fisher, Holm) and scripts/seed_power.py."""

import json
import warnings
from pathlib import Path

import pytest
from eval_fixtures import _fake_run, _sweep, _task_run


def test_report_lift_off_table_from_sweep_directories(tmp_path):
    from pope.eval.report import wilson_interval, write_report

    pope = _sweep(
        tmp_path / "pope", "pope", [0.95, 0.05, 0.40, 0.06], unfinished=[4], train_accuracy=[0.96, 0.11, 0.45, 0.10]
    )
    rope = _sweep(tmp_path / "rope", "rope", [0.11, 0.12])
    fp32 = _sweep(tmp_path / "pope-fp32", "pope", [0.9, 0.8], overrides=["train.autocast=none"])
    markdown, written = write_report([pope, rope, fp32], tmp_path / "report")
    # the report's folder holds its tables (runs.csv, curves.csv); a report of them is the same report
    assert {p.name for p in written} >= {"runs.csv", "curves.csv"}
    again, rewritten = write_report([str(tmp_path / "report")], tmp_path / "r2")
    assert again == markdown and "runs.csv" not in {p.name for p in rewritten}  # tables in, report and plots out
    # PoPE: finals 95, 5, 40, 6 % -> mean 36.50, sample std 42.26, median 23.00; 2/4 lift off; seed 4 left out;
    # gaps 1, 6, 5, 4 points -> 4.00 ± 2.16
    lo, hi = wilson_interval(2, 4)
    # first evaluation past 20 %, in seed order: seeds 0 and 2 at their second evaluation (10k), 1 and 3 never
    assert (
        f"| indirect-indexing | pope | 4 | 36.50 ± 42.26 | 23.00 | 2/4 | {100 * lo:.0f}–{100 * hi:.0f} % | "
        "10k, —, 10k, — | 4.00 ± 2.16 (n=4) | 94.82 | 4 (step 5000) | pope/ train.autocast=auto |"
    ) in markdown
    assert "| rope | 2 | 11.50 ± 0.71 | 11.50 | 0/2 | 0–66 % | —, — | not measured | 11.16 | — | rope/ |" in markdown
    # another recipe (fp32) is its own row, never averaged with the bf16 seeds
    assert (
        "| pope | 2 | 85.00 ± 7.07 | 85.00 | 2/2 | 34–100 % | 10k, 10k | not measured | 94.82 | — | "
        "pope-fp32/ train.autocast=none |" in markdown
    )
    assert (
        "| pope | test_accuracy (last evaluation) | 0.3650 ± 0.4226 (n=4) | — | 0.9482 | 0,1,2,3 | 4 (step 5000) |"
    ) in markdown  # no at_best_valid in these summaries: "—"
    # PoPE vs RoPE, same setting: +0.3650 - 0.1150 = +0.25; of the C(6, 4) = 15 splits, 11 are as extreme (the
    # 6 whose left-out pair sums to <= 0.23, the 5 that leave out 0.95 with another); the fp32 sweep has no
    # RoPE of its setting, so it is not compared
    comparison = markdown.split("## PoPE vs RoPE")[1].split("##")[0]
    assert (
        "| indirect-indexing | pope | pope/ vs rope/ | test_accuracy, headline | 4 / 2 | +0.2500 |"
    ) in comparison and "| 0.7333 (exact, all 15 splits) |" in comparison
    assert "pope-fp32" not in comparison and "at best valid" not in comparison
    # paired by seed: seeds 0 and 1 finished on both sides, differences +0.84 and -0.07, mean +0.385; all four sign
    # patterns reach |0.77|, so p = 1 (two pairs can never give less than 2/4); its own Holm family (m = 1)
    assert (
        "| indirect-indexing | pope | pope/ vs rope/ | test_accuracy, headline, paired by seed | 2 pairs (seeds 0,1; "
        "1 above) | +0.3850 |"
    ) in comparison
    assert "| 1.0000 (exact, all 4 sign flips) | 1.0000 (m = 1) |" in comparison
    assert "Paired rows: the seeds finished on both sides" in comparison
    # lift-off: 2/4 vs 0/2; Fisher: of the tables with 2 lift-offs in 6 runs, P(2 in PoPE's 4) = 6/15 and the
    # only less likely one, 0 in PoPE's 4, 1/15: p = 7/15
    assert (
        "| indirect-indexing | pope | pope/ vs rope/ | lift-off rate (> 20 %) | 2/4 vs 0/2 | +0.5000 | — | "
        "0.4667 (Fisher exact) |"
    ) in comparison
    assert "Train-example accuracy not measured for 4 finished run(s)" in markdown
    assert "## PoPE's delta outside" not in markdown  # no run has eval/delta_state.json
    for seed, share in ((0, 0.25), (1, 0.05)):  # `pope analyze delta` of two finished seeds, one unfinished
        for run in (f"pope/seed-{seed}", "pope/seed-4"):
            (tmp_path / run / "eval").mkdir(exist_ok=True)
            (tmp_path / run / "eval" / "delta_state.json").write_text(json.dumps({"outside_share": share}))
    markdown, _ = write_report([pope, rope], tmp_path / "report-delta")
    delta = markdown.split("## PoPE's delta outside [−2π, 0] at the end of training")[1]
    assert "| indirect-indexing | pope | 2 | 15.00 ± 14.14 % | 25.0, 5.0 | pope/ |" in delta  # seed 4 unfinished
    assert "| rope |" not in delta
    assert (tmp_path / "report" / "accuracy_vs_step.png").stat().st_size > 10_000
    assert {p.name for p in written} >= {"report.md", "report.png", "accuracy_vs_step.png"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a `pope train` run directory, a sweep"):
        write_report([str(tmp_path / "empty")], tmp_path / "r3")


def test_report_compares_lift_off_steps_of_one_schedule_by_rank_sum(tmp_path):
    """The lift-off step row: each finished seed's first evaluation past 20 % on both sides (— never), medians and
    the exact rank-sum p; no row where no seed lifted off, or where the sides ran different numbers of steps."""
    from pope.eval.report import write_report

    def sweep(name, pe, curves, overrides=()):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sweep.json").write_text(
            json.dumps({"preset": "indirect-indexing", "pe": pe, "overrides": list(overrides)})
        )
        for seed, curve in enumerate(curves):
            _task_run(tmp_path / name / f"seed-{seed}", pe, seed, curve, overrides=overrides)
        return str(tmp_path / name)

    early = [[0.05, 0.3, 0.9], [0.05, 0.05, 0.5], [0.25, 0.8, 0.9]]  # past 20 % at 10k, 15k, 5k
    late = [[0.05, 0.05, 0.3], [0.05, 0.05, 0.1]]  # 15k, never
    wrap = sweep("wrap", "pope:delta_range=wrap", early)
    rope = sweep("rope", "rope", late)
    with warnings.catch_warnings():  # report.png: the first setting (wrap) has no paper value, RoPE's mark is
        warnings.simplefilter("error")  # still named in the legend (no "no artists with labels" warning)
        section = write_report([wrap, rope], tmp_path / "r")[0].split("## PoPE vs RoPE")[1].split("\n## ")[0]
    # mid-ranks of 10k, 15k, 5k vs 15k, never: 2, 3.5, 1 vs 3.5, 5, observed |difference of mean ranks| 2.08; of
    # the C(5, 2) = 10 ways to pick RoPE's two, three reach it: the observed pair, its twin with the other 15k
    # (a tie), and {5k, 10k} (2.5): p = 3/10
    assert (
        "| wrap/ vs rope/ | lift-off step (first past 20 %) | 10k, 15k, 5k vs 15k, — | median 10k vs — | — | "
        "0.3000 (rank-sum, exact, all 10 splits) |"
    ) in section, section
    # no seed of either side lifted off: no row (the lift-off rate row is still there)
    never = sweep("pope", "pope", [[0.05, 0.05, 0.05]] * 2)
    never_lr = sweep("pope-lr", "pope", [[0.05, 0.05, 0.1]] * 2, overrides=["recipe.lr=0.001"])
    against = write_report([never, never_lr], tmp_path / "r1", against=never)[0].split("## Against")[1]
    assert "lift-off rate (> 20 %) | 0/2 vs 0/2" in against and "| lift-off step (" not in against
    # the same seeds on a longer schedule: a "never" of the shorter one is no "never" of the longer: no row
    longer = sweep("wrap-long", "pope:delta_range=wrap", early, overrides=["recipe.max_steps=200000"])
    against = write_report([wrap, longer], tmp_path / "r2", against=wrap)[0].split("## Against")[1]
    assert "lift-off rate (> 20 %)" in against and "| lift-off step (" not in against


def test_first_step_past_lift_off_reads_the_first_evaluation_above_the_threshold():
    from pope.eval.report import first_step_past_lift_off

    assert first_step_past_lift_off([(5000, 0.05), (10000, 0.2), (15000, 0.21), (20000, 0.9)]) == 15000  # > 20 %
    assert first_step_past_lift_off([(5000, 0.25), (10000, 0.1)]) == 5000  # the first, even if it falls back
    assert first_step_past_lift_off([(5000, 0.05)]) is None and first_step_past_lift_off([]) is None


def test_report_against_compares_every_other_setting_with_one_sweep(tmp_path):
    """--against DIR: recipe knobs (and other encodings) of the preset against DIR's seeds; DIR must be among
    the runs and one setting."""
    from pope.eval.report import write_report

    pope = _sweep(tmp_path / "pope", "pope", [0.95, 0.05, 0.40, 0.06])
    rope = _sweep(tmp_path / "rope", "rope", [0.11, 0.12])
    fp32 = _sweep(tmp_path / "pope-fp32", "pope", [0.9, 0.8], overrides=["train.autocast=none"])
    lone = _sweep(tmp_path / "pope-lr", "pope", [0.3], overrides=["recipe.lr=0.001"])  # 1 seed: left out
    markdown, _ = write_report([pope, rope, fp32, lone], tmp_path / "report", against=pope)
    section = markdown.split("## Against pope (pope/ ")[1].split("\n## ")[0]
    rows = {
        line.split(" | ")[2]: line
        for line in section.splitlines()
        if line.startswith("| indirect-indexing") and "lift-off" not in line and "paired by seed" not in line
    }
    # fp32: 0.85 - 0.365 = +0.485; rope: 0.115 - 0.365 = -0.25 (the PoPE vs RoPE table's +0.25, turned round)
    fp32_row = next(row for label, row in rows.items() if label.startswith("pope-fp32/ train.autocast=none"))
    assert "| test_accuracy, headline | 2 / 4 | +0.4850 |" in fp32_row
    assert "| test_accuracy, headline | 2 / 4 | -0.2500 |" in rows["rope/"]
    assert "| 0.7333 (exact, all 15 splits) |" in rows["rope/"] and "pope-lr" not in section
    assert "| lift-off rate (> 20 %) | 2/2 vs 2/4 | +0.5000 | — | 0.4667 (Fisher exact) |" in section  # fp32
    # Holm over the two settings compared (fp32, rope) per value: the smaller p doubled, the larger not below it
    raw = {label: float(row.split(" | ")[-2].split()[0]) for label, row in rows.items() if "headline" in row}
    holm = {label: row.split(" | ")[-1] for label, row in rows.items() if "headline" in row}
    assert all(cell.endswith(" (m = 2) |") for cell in holm.values())
    holm = {label: float(cell.split()[0]) for label, cell in holm.items()}
    small, large = sorted(raw, key=raw.get)  # p printed to 4 decimals: compare within their rounding
    assert holm[small] == pytest.approx(min(1.0, 2 * raw[small]), abs=2e-4)
    assert holm[large] == pytest.approx(max(holm[small], raw[large]), abs=2e-4)
    # lift-off: rope 0/2 vs 2/4 (Fisher 7/15), fp32 2/2 vs 2/4 (7/15): both adjusted to min(1, 2 * 7/15) = 14/15
    assert section.count("(Fisher exact) | 0.9333 (m = 2) |") == 2
    # paired by seed against pope's seeds 0-1: fp32 0.9, 0.8 vs 0.95, 0.05 (differences -0.05, +0.75); rope 0.11,
    # 0.12 (-0.84, +0.07); the lone 1-seed setting has one pair only and no row
    paired = [line for line in section.splitlines() if "paired by seed" in line]
    assert len(paired) == 2 and all("2 pairs (seeds 0,1; 1 above)" in line for line in paired)
    assert any("| +0.3500 |" in line for line in paired) and any("| -0.3850 |" in line for line in paired)
    assert "## Against" not in write_report([pope, rope], tmp_path / "r1")[0]
    with pytest.raises(ValueError, match="no run given is inside it"):
        write_report([rope, fp32], tmp_path / "r2", against=pope)
    with pytest.raises(ValueError, match="not one setting"):
        write_report([pope, fp32], tmp_path / "r3", against=tmp_path)


def test_wilson_interval_matches_known_values():
    from pope.eval.report import wilson_interval

    # reference values (Wilson 1927; e.g. statsmodels proportion_confint(method="wilson"))
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 4)[0] == 0.0 and wilson_interval(0, 4)[1] == pytest.approx(0.4899, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_fisher_exact_matches_known_values():
    from pope.eval.stats import fisher_exact

    # Fisher's tea-tasting table [[3, 1], [1, 3]]: two-sided p = 34/70 (e.g. scipy.stats.fisher_exact)
    assert fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70, rel=1e-12)
    assert fisher_exact(3, 7, 0, 8) == pytest.approx(1 / 13, rel=1e-12)  # 3/7 vs 0/8 lift-offs
    assert fisher_exact(0, 3, 0, 5) == 1.0 and fisher_exact(2, 2, 0, 2) == pytest.approx(1 / 3, rel=1e-12)
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        fisher_exact(3, 2, 0, 2)


def test_holm_adjust_matches_the_step_down_rule():
    from pope.eval.stats import holm_adjust

    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> non-decreasing: 0.04 becomes 0.06
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert (
        holm_adjust([0.5, 0.6]) == pytest.approx([1.0, 1.0]) and holm_adjust([0.2]) == [0.2] and holm_adjust([]) == []
    )
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        holm_adjust([0.1, 1.5])


def test_seed_power_script_plans_from_finished_runs_and_refuses_too_few(tmp_path, capsys):
    import runpy

    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "seed_power.py"))
    # two settings whose finished runs never overlap: topped up to 6 seeds each, every imagined sweep separates
    for seed, loss in enumerate([0.40, 0.41, 0.42]):
        _fake_run(tmp_path / "a" / f"seed-{seed}", "jsb-tiny", "pope", seed, [loss])
        _fake_run(tmp_path / "b" / f"seed-{seed}", "jsb-tiny", "rope", seed, [loss + 0.1])
    _fake_run(tmp_path / "b" / "seed-3", "jsb-tiny", "rope", 3, [0.0], finished=False)  # not counted
    assert script["main"]([str(tmp_path / "a"), str(tmp_path / "b"), "--sizes", "3,6", "--simulations", "20"]) == 0
    out = capsys.readouterr().out
    assert "3 finished seeds; B:" in out and "| 3 | 3 | 0 | 0.00 |" in out and "| 6 | 6 | 6 | 1.00 |" in out
    # at the best-valid checkpoint: the values recorded there, here identical on both sides, so never separated
    for side in "ab":
        for seed in range(3):
            summary = tmp_path / side / f"seed-{seed}" / "summary.json"
            summary.write_text(json.dumps({**json.loads(summary.read_text()), "at_best_valid": {"test_loss": 0.5}}))
    assert (
        script["main"](
            [str(tmp_path / "a"), str(tmp_path / "b"), "--sizes", "6", "--simulations", "20", "--at-best-valid"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("last test_loss at best-valid.") and "| 6 | 6 | 6 | 0.00 |" in out
    # errors: one line, exit status 2
    _fake_run(tmp_path / "c" / "seed-0", "jsb-tiny", "pope", 0, [0.4])
    assert script["main"]([str(tmp_path / "a"), str(tmp_path / "c")]) == 2
    assert "has 1 finished runs with a value; a resampling plan needs at least 2" in capsys.readouterr().err
    assert script["main"]([str(tmp_path / "a"), str(tmp_path / "b"), "--sizes", "4,x"]) == 2
    assert "--sizes takes comma-separated whole numbers" in capsys.readouterr().err
    accuracy = tmp_path / "acc"
    for seed in (0, 1):
        _fake_run(accuracy / f"seed-{seed}", "indirect-indexing", "pope", seed, [0.4])
        records = [{"step": 100, "kind": "eval", "test_accuracy": 0.1 * (seed + 1)}]
        (accuracy / f"seed-{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert script["main"]([str(tmp_path / "a"), str(accuracy)]) == 2
    assert "compare like with like" in capsys.readouterr().err
