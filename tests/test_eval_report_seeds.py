"""`pope report`'s per-setting tables: mean ± std over seeds, paper numbers, seed order, perplexity per length,
and fine-tunes grouped apart from the runs they started from."""

import json

import pytest
from eval_fixtures import _fake_run, _task_run, workspace_fixture  # noqa: F401  (the fixture `workspace`)


def test_format_mean_std_never_rounds_a_spread_to_zero():
    from pope.eval.report import format_mean_std

    assert format_mean_std([2.33939, 2.33941]) == "2.3394 ± 1.4e-05 (n=2)"  # not "± 0.0000"
    assert format_mean_std([2.0, 2.0]) == "2.0000 ± 0.0000 (n=2)"  # an exact tie stays zero
    assert format_mean_std([0.50, 0.52]) == "0.5100 ± 0.0141 (n=2)"
    assert format_mean_std([0.5]) == "0.5000 (n=1)" and format_mean_std([]) == "—"


def test_report_mean_std_over_seeds_and_paper_numbers(tmp_path, workspace):
    from pope.eval.report import paper_value, write_report

    runs = [
        _fake_run(
            tmp_path / f"rope{s}", "jsb", "rope", s, [0.7, loss, 0.6], {64: 2.0 + s, 128: 3.0}, at_best_valid=best
        )
        for s, (loss, best) in enumerate([(0.52, 0.53), (0.50, 0.51)])
    ]
    runs += [
        _fake_run(tmp_path / f"pope{s}", "jsb", "pope", s, [0.49 + s / 100, 0.55], at_best_valid=best)
        for s, best in enumerate([0.50, 0.53, 0.49])
    ]
    runs.append(_fake_run(tmp_path / "pope9", "jsb", "pope", 9, [0.1], finished=False))  # never averaged in
    markdown, written = write_report(runs + [str(workspace["rope"])], tmp_path / "report")
    assert "| 0,1,2 | 9 (step 100) |" in markdown
    assert (
        "| metric (headline rule) | ours, headline: mean ± std (n seeds) | ours at best-valid checkpoint |" in markdown
    )
    # min test NLL per seed: rope 0.52, 0.50 -> 0.51 ± 0.014142; pope 0.49, 0.50, 0.51 -> 0.50 ± 0.01;
    # at the best-valid checkpoint: rope 0.53, 0.51 -> 0.52 ± 0.0141; pope 0.50, 0.53, 0.49 -> 0.5067 ± 0.0208
    assert (
        "| jsb | rope | test_nll (min over evaluations) | 0.5100 ± 0.0141 (n=2) | 0.5200 ± 0.0141 (n=2); "
        "best step 100–200 | 0.5081 |"
    ) in markdown
    assert (
        "| jsb | pope | test_nll (min over evaluations) | 0.5000 ± 0.0100 (n=3) | 0.5067 ± 0.0208 (n=3); "
        "best step 100–300 | 0.4889 |"
    ) in markdown
    # a real run's summary.json (pope.train) gives its at-best-valid test loss and step, of recipe.max_steps
    summary = json.loads((workspace["rope"] / "summary.json").read_text())
    assert "| jsb-tiny | rope | last test_loss |" in markdown
    assert f"| {summary['at_best_valid']['test_loss']:.4f} (n=1); best step {summary['best_step']} of 4 |" in markdown
    # PoPE vs RoPE: headline 0.50 - 0.51 = -0.01; of the C(5, 3) = 10 splits of {.49 .50 .51 | .52 .50} the ones
    # with |difference| >= 0.01 are the 5 whose PoPE sum is <= 1.50 or >= 1.53 -> p = 5/10; Welch interval
    # and df from scipy.stats.ttest_ind(equal_var=False). At best valid: -0.0133, 5 of 10 splits again.
    assert (
        "| jsb | pope | pope0/, pope1/, pope2/, pope9/ vs rope0/, rope1/ | test_nll, headline | 3 / 2 | -0.0100 | "
        "-0.0698 … +0.0498 (df 1.7) | "
        "0.5000 (exact, all 10 splits) |"
    ) in markdown
    assert (
        "| jsb | pope | pope0/, pope1/, pope2/, pope9/ vs rope0/, rope1/ | test_nll, at best valid | 3 / 2 | -0.0133 | "
        "-0.0638 … +0.0372 (df 2.9) | "
        "0.5000 (exact, all 10 splits) |"
    ) in markdown
    # paired by seed over seeds 0-1 (finished on both sides), each value: headline 0.49 - 0.52, 0.50 - 0.50; at best
    # valid 0.50 - 0.53, 0.53 - 0.51 (differences -0.03, +0.02: all four sign patterns as extreme, p = 1)
    assert "| test_nll, headline, paired by seed | 2 pairs (seeds 0,1; 0 above) | -0.0150 |" in markdown
    assert "| test_nll, at best valid, paired by seed | 2 pairs (seeds 0,1; 1 above) | -0.0050 |" in markdown
    assert "| 1.0000 (exact, all 4 sign flips) |" in markdown.split("at best valid, paired by seed")[1].splitlines()[0]
    assert "| jsb-tiny | rope |" in markdown and (tmp_path / "report" / "report.png").stat().st_size > 0
    assert (tmp_path / "report" / "loss_vs_step.png") in written  # test-NLL runs: NLL against the step
    assert "accuracy_vs_step.png" not in {p.name for p in written}
    assert "lift-off" not in markdown  # next-token test_accuracy of a language model is no task accuracy
    # perplexity per length, then each seed's growth from the shortest to the longest length: 3/2 and 3/3
    assert (
        "| jsb | rope | rope0/ ; rope1/ | 2.500 ± 0.707 (n=2) | 3.000 ± 0.000 (n=2) | 1.25 ± 0.35 (n=2) |" in markdown
    )
    assert "| L=64 | L=128 | L=128 / L=64 |" in markdown
    assert (tmp_path / "report" / "report_length.png").stat().st_size > 0
    assert paper_value("jsb", "pope:delta_init=uniform") == 0.4889
    assert paper_value("jsb", "pope:delta_init=zero") is None  # not the paper's setting for JSB
    assert paper_value("owt-124m", "pope") == 21.33 and paper_value("owt-124m", "alibi") is None
    with pytest.raises(FileNotFoundError, match="config.json"):
        write_report([str(tmp_path)], tmp_path / "r2")


def test_report_lists_a_settings_seeds_in_seed_order_whatever_the_argument_order(tmp_path):
    from pope.eval.report import write_report

    later, earlier = tmp_path / "s1" / "seed-1", tmp_path / "s0" / "seed-0"
    _task_run(later, "pope", 1, [0.02, 0.05])  # never past 20 %
    _task_run(earlier, "pope", 0, [0.3, 0.9])  # past it at the first evaluation
    markdown, _ = write_report([str(later), str(earlier)], tmp_path / "report")
    assert "| 5k, — |" in markdown  # the lift-off column, seed 0 first
    assert "| 0,1 |" in markdown  # the runs table's seeds column


def test_report_keeps_length_evaluations_on_different_documents_apart(tmp_path):
    """Two `pope eval length` calls on one run (1x..2x, then 4x on fewer, longer documents) are two tables."""
    from pope.eval.report import write_report

    run = _fake_run(tmp_path / "rope0", "jsb", "rope", 0, [0.5])
    for name, ppl in (("short", {64: 2.0, 128: 2.5}), ("long", {256: 4.0})):
        (tmp_path / "rope0" / "eval").mkdir(exist_ok=True)
        (tmp_path / "rope0" / "eval" / f"length-jsb-test-{name}.json").write_text(
            json.dumps(
                {
                    "data_name": "jsb",
                    "split": "test",
                    "same_documents": True,
                    "results": [{"length": length, "perplexity": value} for length, value in ppl.items()],
                }
            )
        )
    markdown, _ = write_report([run], tmp_path / "report")
    short = markdown.split("## Perplexity vs evaluation length (jsb/test, the same documents at every length to 128)")
    long = markdown.split("## Perplexity vs evaluation length (jsb/test, the same documents at every length to 256)")
    assert len(short) == 2 and "| jsb | rope | rope0/ | 2.000 (n=1) | 2.500 (n=1) |" in short[1].split("##")[0]
    assert len(long) == 2 and "| jsb | rope | rope0/ | 4.000 (n=1) |" in long[1].split("##")[0]


def test_report_keeps_a_fine_tune_apart_from_the_runs_it_started_from(tmp_path):
    """A fine-tune (same preset and PE, a different config) has its own row in the per-length table, named by
    its directory; the seeds' row averages the seeds alone."""
    from pope.eval.report import write_report

    runs = []
    for name, seed, ppl, extra in (
        ("seed0", 0, {64: 2.0, 128: 3.0}, None),
        ("seed1", 1, {64: 4.0, 128: 5.0}, None),
        ("rope-ft128", 0, {64: 1.0, 128: 1.0}, {"context": 128}),
    ):
        run = _fake_run(tmp_path / name, "jsb", "rope", seed, [0.5])
        config = json.loads((tmp_path / name / "config.json").read_text())
        config["finetune"] = extra
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        (tmp_path / name / "eval" / "length-jsb-test.json").parent.mkdir(exist_ok=True)
        (tmp_path / name / "eval" / "length-jsb-test.json").write_text(
            json.dumps(
                {
                    "data_name": "jsb",
                    "split": "test",
                    "same_documents": True,
                    "results": [{"length": length, "perplexity": value} for length, value in ppl.items()],
                }
            )
        )
        runs.append(run)
    markdown, _ = write_report(runs, tmp_path / "report")
    table = markdown.split("## Perplexity vs evaluation length")[1]
    assert "| jsb | rope | seed0/ ; seed1/ | 3.000 ± 1.414 (n=2) | 4.000 ± 1.414 (n=2) |" in table
    assert "| jsb | rope | rope-ft128/ finetune.context=128 | 1.000 (n=1) | 1.000 (n=1) |" in table
    assert (tmp_path / "report" / "report_length.png").is_file()


def test_report_groups_the_fine_tunes_of_a_settings_seeds_and_refuses_a_seed_twice(tmp_path, capsys):
    """Fine-tunes of seeds 0 and 1 (each naming its own source run) are one setting of two seeds, labelled without
    the source paths; two runs of one setting with one seed (a rerun) stop the report with one line."""
    from pope.cli import main
    from pope.eval.report import write_report

    runs = []
    for seed, checkpoint in ((0, "best"), (1, "best"), (1, "last")):
        name = f"ft-{seed}-{checkpoint}"
        runs.append(_fake_run(tmp_path / name, "jsb", "rope", seed, [0.5 + seed]))
        config = json.loads((tmp_path / name / "config.json").read_text())
        config["finetune"] = {
            "context": 128,
            "from": {
                "run": f"/somewhere/seed-{seed}",
                "step": 300 + seed,
                "checkpoint": f"/somewhere/seed-{seed}/checkpoints/{checkpoint}",
            },
        }
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    markdown, _ = write_report(runs, tmp_path / "report")
    rows = [line for line in markdown.splitlines() if line.startswith("| jsb | rope | test_nll")]
    assert len(rows) == 2 and "/somewhere" not in markdown
    assert any("1.0000 ± 0.7071 (n=2)" in row and "finetune.from=best" in row for row in rows)
    assert any("1.5000 (n=1)" in row and "finetune.from=last" in row for row in rows)

    rerun = _fake_run(tmp_path / "rerun", "jsb", "rope", 0, [0.7])
    config = json.loads((tmp_path / "ft-0-best" / "config.json").read_text())
    (tmp_path / "rerun" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="same seed 0"):
        write_report([runs[0], rerun], tmp_path / "report2")
    assert main(["report", runs[0], rerun, "--out", str(tmp_path / "report3")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "same seed 0" in err[0] and "Traceback" not in err[0]


def test_paper_value_of_the_indirect_indexing_baselines():
    """The paper's baseline numbers sit beside runs of the plain baseline PE only."""
    from pope.eval.report import paper_value

    assert paper_value("indirect-indexing", "rope-half") == 0.2850
    assert paper_value("indirect-indexing", "sinusoidal-abs") == 0.0190
    assert paper_value("indirect-indexing", "alibi-half:slopes=x") is None  # an option set: not the paper's setting
    assert paper_value("jsb", "rope-half") is None  # the paper reports no JSB baseline
