"""`pope report`'s and `pope eval length`'s figures: legends inside the figure, setting colours, paper values off
the scale, log-axis ticks, the lift-off and by-shift plots."""

import json
from pathlib import Path

from eval_fixtures import _fake_run, _sweep


def _figure_legends(monkeypatch, module) -> list:
    """Patch ``module.finish_figure`` to draw each figure first and record, per figure legend, (legend box, figure
    box, lowest axes bottom) in display units; returns the list it fills."""
    seen = []
    finish = module.finish_figure

    def record_then_finish(fig, path, **kwargs):
        fig.canvas.draw()
        axes_bottom = min(ax.get_window_extent().y0 for ax in fig.axes)
        seen.extend((legend.get_window_extent(), fig.bbox, axes_bottom) for legend in fig.legends)
        return finish(fig, path, **kwargs)

    monkeypatch.setattr(module, "finish_figure", record_then_finish)
    return seen


def test_report_length_plot_keeps_its_legend_inside_the_figure(tmp_path, monkeypatch):
    """One panel with three long setting names (the genome report's case): every legend entry must be drawn inside
    the PNG, not cut off at its left and right edges."""
    import pope.eval.report_plots as report_plots
    from pope.eval.report import write_report

    legends = _figure_legends(monkeypatch, report_plots)
    runs = [
        _fake_run(
            tmp_path / f"genome-{pe.replace(':', '-').replace('=', '-')}-two-seeds" / f"seed-{s}",
            "genome-small",
            pe,
            s,
            [6.7],
            {1000: 800.0 + s, 10000: 1600.0 + s},
        )
        for pe in ("pope", "rope", "pope:delta_init=zero")
        for s in (0, 1)
    ]
    for run in runs:  # a sweep's runs: the legend names the sweep directory
        (tmp_path / run).parent.joinpath("sweep.json").write_text(json.dumps({"overrides": []}))
    write_report(runs, tmp_path / "report")
    assert (tmp_path / "report" / "report_length.png").is_file()
    inside = [box.x0 >= figure.x0 and box.x1 <= figure.x1 and box.y0 >= figure.y0 for box, figure, _ in legends]
    assert inside and all(inside), legends


def test_report_plot_writes_off_scale_paper_values_under_the_title(tmp_path, monkeypatch):
    """A paper number far from ours (MAESTRO v3's 1.49 against a stand-in's 2.31) would squash every seed into one
    line: it is written in the panel, not drawn; a paper number near ours (JSB's) is drawn as a cross."""
    import pope.eval.report_plots as report_plots
    from pope.eval.report import write_report

    assert not report_plots.paper_marks_fit([2.298, 2.339], [1.486, 1.501])  # ours: 5 % of the axis
    assert report_plots.paper_marks_fit([0.449, 0.472], [0.4889, 0.5081])  # ours: 39 % of it
    assert report_plots.paper_marks_fit([2.3], []) and report_plots.paper_marks_fit([1.0, 1.0], [1.0])
    figures = []
    finish = report_plots.finish_figure
    monkeypatch.setattr(
        report_plots, "finish_figure", lambda fig, path, **kw: figures.append(fig) or finish(fig, path, **kw)
    )
    for preset, values in (("maestro", (2.30, 2.33)), ("jsb", (0.455, 0.467))):
        runs = [
            _fake_run(tmp_path / preset / f"{pe}{s}", preset, pe, s, [value + s / 200])
            for pe, value in zip(("pope", "rope"), values)
            for s in (0, 1)
        ]
        figures.clear()
        write_report(runs, tmp_path / preset / "report")
        (ax,) = figures[0].axes  # report.png: the first figure drawn
        crosses = [c for c in ax.collections if c.get_label() == "paper"]
        if preset == "maestro":
            assert ax.get_title() == "maestro\npaper (off this scale): pope 1.486, rope 1.501" and not crosses
            assert ax.get_ylim()[0] > 2.2  # the axis spans our runs only
        else:
            assert ax.get_title() == "jsb" and len(crosses) == 1 and ax.get_legend() is not None


def test_length_plot_puts_its_legend_under_the_panels_inside_the_figure(tmp_path, monkeypatch):
    """Seven runs with long names (the genome-more stage's case): the legend is drawn below both panels, not over the
    curves, and every entry lies inside the PNG."""
    import numpy as np

    import pope.eval.length_runs
    from pope.eval.length import LengthResult
    from pope.eval.length_runs import RunLengthResults, plot_length_curves

    legends = _figure_legends(monkeypatch, pope.eval.length_runs)

    def result(length, nll):
        return LengthResult(
            length=length,
            mean_nll=nll,
            n_targets=length,
            position_nll_sum=np.full(length, nll),
            position_count=np.ones(length, dtype=np.int64),
        )

    entries = [
        RunLengthResults(
            label=f"genome-{name}/seed-2",
            run=f"/runs/genome-{name}/seed-2",
            pe=pe,
            train_length=16,
            results=[result(16, 6.6), result(160, 7.4)],
        )
        for name, pe in [
            ("pope", "pope"),
            ("rope", "rope"),
            ("pope-d0", "pope:delta_init=zero"),
            ("alibi", "alibi"),
            ("nope", "nope"),
            ("rope-ft64", "yarn:base=10000,scale=4"),
            ("pope-d0-ft64", "pope:delta_init=zero"),
        ]
    ]
    plot_length_curves(entries, tmp_path / "length.png", title="genome / test")
    assert (tmp_path / "length.png").stat().st_size > 10_000
    seen = [
        box.x0 >= 0 and box.x1 <= figure.x1 and box.y0 >= 0 and box.y1 <= axes_bottom
        for box, figure, axes_bottom in legends
    ]
    assert seen == [True], legends


def test_legends_name_the_pe_spec_whole_when_it_is_short():
    from pope.eval.runs import short_pe_spec

    assert short_pe_spec("pope:delta_init=zero") == "pope:delta_init=zero"  # the δ init tells two PoPE runs apart
    assert short_pe_spec("yarn:base=10000,scale=4,original_max_len=256") == "yarn:…"
    assert short_pe_spec("rope") == "rope"


def test_report_plots_test_accuracy_by_shift_when_runs_have_it(tmp_path):
    """eval/task_accuracy.json's test by_shift is read per run; accuracy_by_shift.png is drawn from the finished
    runs that have it, and left out when none has."""
    from pope.eval.report import collect_run, write_report

    pope = _sweep(tmp_path / "pope", "pope", [0.3, 0.1], train_accuracy=[0.4, 0.2])
    rope = _sweep(tmp_path / "rope", "rope", [0.1, 0.1], train_accuracy=[0.2, 0.2])
    _, written = write_report([pope, rope], tmp_path / "before")
    assert "accuracy_by_shift.png" not in {p.name for p in written}
    for seed, table in enumerate(({"-2": 0.1, "+1": 0.9}, {"-2": 0.3, "+1": 0.5, "+3": 0.0})):
        path = tmp_path / "pope" / f"seed-{seed}" / "eval" / "task_accuracy.json"
        record = json.loads(path.read_text())
        record["splits"]["test"]["by_shift"] = {
            k: {"examples": 10, "correct": round(10 * v), "accuracy": v} for k, v in table.items()
        }
        path.write_text(json.dumps(record))
    assert collect_run(tmp_path / "pope" / "seed-1").test_by_shift == {-2: (3, 10), 1: (5, 10), 3: (0, 10)}
    assert collect_run(tmp_path / "rope" / "seed-0").test_by_shift is None
    markdown, written = write_report([pope, rope], tmp_path / "after")
    assert (tmp_path / "after" / "accuracy_by_shift.png").stat().st_size > 10_000
    assert "accuracy_by_shift.png" in {p.name for p in written}
    # the table: ranges with examples only; seed 0 has no +3 example, so +2 … +3 is seed 1's 0 % alone
    table = markdown[markdown.index("## Test accuracy by shift") :]
    assert "| preset | PE | n | -3 … -2 | +1 | +2 … +3 | setting |" in table, table
    assert "| indirect-indexing | pope | 2 | 20.00 ± 14.14 | 70.00 ± 28.28 | 0.00 | pope/ |" in table, table
    assert "| rope |" not in table


def test_report_plot_colours_are_distinct_for_twenty_settings():
    # The indirect-indexing report has 12 settings: with matplotlib's 10-colour cycle two of them shared a colour.
    from matplotlib.colors import to_rgb

    from pope.eval.report_plots import setting_colour

    colours = [to_rgb(setting_colour(i)) for i in range(20)]
    assert len(set(colours)) == 20
    assert setting_colour(20) == setting_colour(0)


def test_accuracy_plots_keep_their_legends_under_the_axes_inside_the_figure(tmp_path, monkeypatch):
    """Sixteen settings with long encoding specs (the indirect-indexing sweep's case): the accuracy-vs-step,
    lift-off and by-shift legends are drawn under the axes, where they hide no curve, and every entry lies inside
    the PNG."""
    import pope.eval.report_plots as report_plots
    from pope.eval.report import write_report

    legends = _figure_legends(monkeypatch, report_plots)
    sweeps = []
    for index in range(16):
        pe = "pope:softmax_scale=0.08838834764831845" if index % 2 else "pope:delta_range=wrap"
        sweeps.append(
            _sweep(
                tmp_path / f"setting-with-a-long-name-{index}",
                pe,
                [0.1 + index / 100, 0.2],
                overrides=[f"recipe.lr={index + 1}e-4"],
                train_accuracy=[0.3, 0.3],
            )
        )
        for seed in (0, 1):
            path = tmp_path / f"setting-with-a-long-name-{index}" / f"seed-{seed}" / "eval" / "task_accuracy.json"
            record = json.loads(path.read_text())
            record["splits"]["test"]["by_shift"] = {
                "-1": {"examples": 10, "correct": 9, "accuracy": 0.9},
                "+1": {"examples": 10, "correct": 1, "accuracy": 0.1},
            }
            path.write_text(json.dumps(record))
    _, written = write_report(sweeps, tmp_path / "report")
    assert {"accuracy_vs_step.png", "lift_off_vs_step.png", "accuracy_by_shift.png"} <= {p.name for p in written}
    assert len(legends) == 3  # one figure legend each: accuracy vs step, lift-off share, by shift
    for box, figure, axes_bottom in legends:
        assert box.x0 >= figure.x0 and box.x1 <= figure.x1 and box.y0 >= figure.y0, (box, figure)
        assert box.y1 <= axes_bottom, (box, axes_bottom)


def test_plain_log_ticks_label_a_short_log_axis_with_several_round_numbers():
    """Perplexities from 62 to 160 on a log axis: matplotlib alone labels only 10^2 (and '6 × 10^1'-style minors);
    plain_log_ticks gives several plain round labels inside the range. Over several decades it keeps the decades."""
    from pope.files import plain_log_ticks
    from pope.optional import pyplot

    plt = pyplot()
    fig, (short, wide) = plt.subplots(1, 2)
    short.plot([1, 2], [62, 160])
    wide.plot([1, 2], [1, 50_000])
    for ax in (short, wide):
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
    fig.canvas.draw()

    def labels(ax):
        low, high = ax.get_ylim()
        return [
            t.get_text() for t in ax.yaxis.get_majorticklabels() if t.get_text() and low <= t.get_position()[1] <= high
        ]

    assert len(labels(short)) >= 4 and all(text.replace(",", "").isdigit() for text in labels(short)), labels(short)
    assert {"10", "100", "1,000", "10,000"} <= set(labels(wide)), labels(wide)
    plt.close(fig)


def test_lift_off_plot_counts_each_finished_seed_at_its_first_evaluation_past_the_threshold(tmp_path, monkeypatch):
    import pope.eval.report_plots as report_plots
    from pope.eval.report import write_report

    figures = {}
    finish = report_plots.finish_figure
    monkeypatch.setattr(
        report_plots,
        "finish_figure",
        lambda fig, path, **kw: figures.setdefault(Path(path).name, fig) and finish(fig, path, **kw),
    )
    # PoPE: finals 95, 5, 40, 6 % (evaluations at 5k and 10k; the first is 2 %), seed 4 unfinished and left out
    pope = _sweep(tmp_path / "pope", "pope", [0.95, 0.05, 0.40, 0.06], unfinished=[4])
    rope = _sweep(tmp_path / "rope", "rope", [0.11, 0.12])
    _, written = write_report([pope, rope], tmp_path / "report")
    assert "lift_off_vs_step.png" in {p.name for p in written}
    (ax,) = figures["lift_off_vs_step.png"].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"pope pope/ (2/4)", "rope rope/ (0/2)"}
    # two of four seeds pass 20 % at their 10k evaluation: 0 % until then, 50 % from 10k to the last step run
    assert list(lines["pope pope/ (2/4)"].get_xdata()) == [0, 10000, 10000, 10000]
    assert list(lines["pope pope/ (2/4)"].get_ydata()) == [0, 25, 50, 50]
    assert list(lines["rope rope/ (0/2)"].get_ydata()) == [0, 0]
    # no test-accuracy curve (an NLL preset): no lift-off plot
    jsb = [_fake_run(tmp_path / "jsb" / f"seed-{s}", "jsb", "pope", s, [0.5]) for s in (0, 1)]
    _, written = write_report(jsb, tmp_path / "report-jsb")
    assert "lift_off_vs_step.png" not in {p.name for p in written}
