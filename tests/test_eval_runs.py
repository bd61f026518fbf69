"""End-to-end over real (tiny) runs made by pope.train: the eval CLI, YaRN / PoPE+ft fine-tuning, reports."""

import csv
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pope.cli import main
from pope.data.writer import PreparedWriter

TEST_DOC_LENGTHS = (40, 100, 70, 9)


def _document(rng, n):
    """A learnable toy 'piece': an 8-token motif transposed up by one every repetition."""
    motif = rng.integers(0, 80, size=8)
    return np.array([(motif[i % 8] + i // 8) % 88 for i in range(n)])


def _write_dataset(path, vocab=90, name="toy"):
    rng = np.random.default_rng(0)
    with PreparedWriter(path, vocab) as writer:
        for n in (300, 200, 250):
            writer.add_document("train", _document(rng, n))
        for n in (60, 50):
            writer.add_document("valid", _document(rng, n))
        for n in TEST_DOC_LENGTHS:
            writer.add_document("test", _document(rng, n))
        writer.finish({"name": name, "vocab": {"pad_id": None}})
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A prepared toy dataset and two 4-step runs (RoPE, PoPE) trained by pope.train at context 16."""
    from pope.train.run_config import resolve_run_config
    from pope.train.trainer import run_training

    root = tmp_path_factory.mktemp("eval_runs")
    data = _write_dataset(root / "data")
    runs = {}
    for pe in ("rope", "pope"):
        config = resolve_run_config(
            "jsb-tiny",
            pe,
            seed=0,
            overrides=[
                "model.n_layer=1",
                "model.d_model=32",
                "model.max_seq_len=16",
                "recipe.seq_len=16",
                "recipe.max_steps=4",
                "recipe.warmup_steps=1",
                "recipe.batch_size=4",
                "recipe.eval_interval=2",
                "recipe.eval_batches=2",
                f"train.data_dir={data}",
                "train.tensorboard=false",
                "train.progress=false",
                "train.device=cpu",
            ],
        )
        run_training(config, root / pe)
        runs[pe] = root / pe
    return {"root": root, "data": data, **runs}


def test_eval_length_cli_writes_tables_and_counts_tokens(workspace, capsys):
    out = workspace["root"] / "length_out"
    code = main(
        [
            "eval",
            "length",
            str(workspace["rope"]),
            str(workspace["pope"]),
            "--data",
            str(workspace["data"]),
            "--lengths",
            "16,32,64",
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {"length.csv", "length.md", "length.json", "length.png"}
    rows = list(csv.DictReader((out / "length.csv").open()))
    assert len(rows) == 6
    # Same documents at every length (those with >= 65 tokens: 100 and 70): every target once.
    assert {int(r["n_targets"]) for r in rows} == {99 + 69}
    assert {int(r["n_docs_excluded"]) for r in rows} == {2}
    for row in rows:
        assert math.isclose(float(row["perplexity"]), math.exp(float(row["mean_nll"])), rel_tol=1e-5)
    per_run = json.loads((workspace["rope"] / "eval" / "length-toy-test-16-64.json").read_text())
    assert [r["length"] for r in per_run["results"]] == [16, 32, 64] and per_run["git_commit"] is not None
    assert "| rope | rope | 16 |" in capsys.readouterr().out


def test_eval_length_records_the_data_path_relative_to_the_working_directory(workspace, monkeypatch):
    """An absolute --data below the working directory (as a checkout on a cluster node gives) is stored relative."""
    monkeypatch.chdir(workspace["root"])
    data = Path(workspace["data"]).resolve()
    out = workspace["root"] / "length_relative"
    assert (
        main(
            [
                "eval",
                "length",
                str(workspace["rope"]),
                "--data",
                str(data),
                "--lengths",
                "16",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    expected = data.relative_to(Path.cwd()).as_posix()
    assert json.loads((out / "length.json").read_text())["provenance"]["data"] == expected
    assert json.loads((workspace["rope"] / "eval" / "length-toy-test-16.json").read_text())["data"] == expected


def test_eval_length_bad_input(workspace, capsys, tmp_path):
    data = str(workspace["data"])
    assert (
        main(["eval", "length", str(workspace["rope"]), "--data", data, "--lengths", "128", "--out", str(tmp_path)])
        == 1
    )
    assert "the longest has 100 tokens" in capsys.readouterr().err
    (tmp_path / "no_checkpoint").mkdir()
    assert (
        main(
            [
                "eval",
                "length",
                str(tmp_path / "no_checkpoint"),
                "--data",
                data,
                "--lengths",
                "16",
                "--out",
                str(tmp_path),
            ]
        )
        == 1
    )
    assert "no checkpoint in" in capsys.readouterr().err
    big_vocab = _write_dataset(tmp_path / "big_vocab", vocab=300, name="big")
    assert (
        main(
            [
                "eval",
                "length",
                str(workspace["rope"]),
                "--data",
                str(big_vocab),
                "--lengths",
                "16",
                "--out",
                str(tmp_path),
            ]
        )
        == 1
    )
    assert "vocabulary mismatch" in capsys.readouterr().err


def _hand_yarn(head_dim, base, scale, original, alpha=1.0, beta=32.0):
    """YaRN written out from the paper (Peng et al. 2023), independent of pope.frequencies."""
    out = []
    for i in range(head_dim // 2):
        theta = base ** (-2 * i / head_dim)
        ratio = original / (2 * math.pi / theta)
        gamma = 0.0 if ratio < alpha else 1.0 if ratio > beta else (ratio - alpha) / (beta - alpha)
        out.append((1 - gamma) * theta / scale + gamma * theta)
    return torch.tensor(out, dtype=torch.float64)


def test_yarn_finetune_changes_frequencies_exactly_as_the_formula(workspace, tmp_path):
    from pope.checkpoint import load_model
    from pope.train.finetune import build_finetune_trainer

    original, _ = load_model(workspace["rope"])
    trainer = build_finetune_trainer(workspace["rope"], tmp_path / "yarn", context=64, steps=2, batch_size=4)
    config = trainer.config
    assert config.recipe.lr == config.recipe.min_lr == 6e-5 and config.recipe.seq_len == 64
    assert config.finetune["scale"] == 4.0 and config.model.pe.startswith("yarn:")
    # Starts from the trained weights.
    for name, tensor in original.state_dict().items():
        torch.testing.assert_close(trainer.model.state_dict()[name], tensor, rtol=0, atol=0)
    head_dim = trainer.model.config.head_dim
    for block in trainer.model.blocks:
        frequencies, factor = block.attn.pe.frequencies()
        torch.testing.assert_close(frequencies.double(), _hand_yarn(head_dim, 10000.0, 4.0, 16), rtol=1e-6, atol=0)
        assert block.attn.pe.softmax_scale == pytest.approx((0.1 * math.log(4.0) + 1) ** 2 / math.sqrt(head_dim))
    summary = trainer.train()
    trainer.close()
    assert summary["step"] == 2
    tuned, info = load_model(tmp_path / "yarn")
    assert tuned.config.pe == config.model.pe and tuned.config.max_seq_len == 64
    assert json.loads((tmp_path / "yarn" / "config.json").read_text())["finetune"]["from"]["run"] == str(
        workspace["rope"]
    )


def test_pope_finetune_does_not_interpolate(workspace, tmp_path):
    from pope.train.finetune import build_finetune_trainer, finetune_config

    trainer = build_finetune_trainer(workspace["pope"], tmp_path / "popeft", context=32, steps=1, batch_size=4)
    assert trainer.model.config.pe == json.loads((workspace["pope"] / "config.json").read_text())["model"]["pe"]
    assert trainer.model.config.max_seq_len == 32 and trainer.config.finetune["method"] == "no interpolation"
    trainer.close()
    # The paper's recipe for 500 steps: batch 64, lr 6e-5, 20 warmup, no decay.
    run_config = json.loads((workspace["pope"] / "config.json").read_text())
    recipe = finetune_config(run_config, context=64, steps=500)["recipe"]
    assert (recipe["batch_size"], recipe["lr"], recipe["min_lr"], recipe["warmup_steps"], recipe["max_steps"]) == (
        64,
        6e-5,
        6e-5,
        20,
        500,
    )
    with pytest.raises(ValueError, match="not longer than"):
        finetune_config(run_config, context=16, steps=10)
    with pytest.raises(ValueError, match="model's shape"):
        finetune_config(run_config, context=64, steps=10, overrides=["model.n_layer=3"])


def test_finetune_refuses_extended_and_absolute_encodings():
    from pope.train.finetune import extended_pe

    with pytest.raises(ValueError, match="already context-extended"):
        extended_pe("yarn:scale=2", head_dim=16, n_heads=2, scale=2, original_max_len=16)
    with pytest.raises(ValueError, match="cannot be context-extended"):
        extended_pe("learned-abs", head_dim=16, n_heads=2, scale=2, original_max_len=16)
    assert extended_pe("rope-half", head_dim=16, n_heads=2, scale=2, original_max_len=16).startswith(
        "yarn:base=10000,layout=half,rotary_dim=8,scale=2,"
    )
    assert extended_pe("alibi", head_dim=16, n_heads=2, scale=2, original_max_len=16) == "alibi"


def test_analyze_frequencies_cli(workspace, tmp_path, capsys):
    assert (
        main(
            [
                "analyze",
                "frequencies",
                str(workspace["rope"]),
                "--data",
                str(workspace["data"]),
                "--out",
                str(tmp_path),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    usage = json.loads((tmp_path / "frequency_usage.json").read_text())
    assert usage["kind"] == "rope" and np.array(usage["query"]).shape == (1, 4)
    assert usage["n_tokens"] == sum(TEST_DOC_LENGTHS)
    text = tmp_path / "sonnet.txt"
    text.write_text("Shall I compare thee to a summer's day?")
    assert (
        main(
            [
                "analyze",
                "frequencies",
                str(workspace["pope"]),
                "--text",
                str(text),
                "--tokenizer",
                "bytes",
                "--out",
                str(tmp_path),
            ]
        )
        == 1
    )
    assert "vocabulary mismatch" in capsys.readouterr().err  # 256 byte ids, 90-token model
    # PoPE: the position-only score to 20x the run's training length (its recipe.seq_len), plot and summary
    assert (
        main(
            [
                "analyze",
                "frequencies",
                str(workspace["pope"]),
                "--data",
                str(workspace["data"]),
                "--out",
                str(tmp_path / "pope"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "pope" / "frequency_usage.json").read_text())["position_bias"]
    seq_len = json.loads((workspace["pope"] / "config.json").read_text())["recipe"]["seq_len"]
    assert (summary["train_length"], summary["max_distance"]) == (seq_len, 20 * seq_len)
    assert (tmp_path / "pope" / "position_bias.png").is_file()
    out = capsys.readouterr().out
    assert "position-only score (PoPE, training length" in out
    movement = json.loads((tmp_path / "pope" / "frequency_usage.json").read_text())["delta_movement"]
    assert f"delta as a phase ({movement['entries']:,} entries)" in out and movement["entries"] > 0


def test_delta_state_counts_the_entries_outside_the_interval(workspace):
    from pope.encodings import TWO_PI
    from pope.eval.delta_state import delta_state, delta_state_table
    from pope.eval.runs import load_run_model

    model, _ = load_run_model(workspace["pope"])
    delta = model.blocks[0].attn.pe.delta  # (n_head, F)
    with torch.no_grad():
        delta.fill_(-1.0)
        delta[0, :3] = torch.tensor([-TWO_PI - 1e-3, 0.5, 0.0])  # below, above, on the bound 0 (inside)
        delta[1, 0] = -TWO_PI  # on the bound -2pi: inside
    state = delta_state(model)
    layer = state["layers"][0]
    assert (layer["below"], layer["above"], layer["entries"]) == (1, 1, delta.numel())
    assert state["outside"] == 2 and state["outside_share"] == pytest.approx(2 / delta.numel())
    assert layer["min"] == pytest.approx(-TWO_PI - 1e-3) and layer["max"] == 0.5
    assert state["delta_range"] == model.blocks[0].attn.pe.delta_range
    assert f"2 of {delta.numel()} entries outside [-2pi, 0]" in delta_state_table(state)
    rope, _ = load_run_model(workspace["rope"])
    with pytest.raises(ValueError, match="no PoPE layer with a learned delta"):
        delta_state(rope)


def test_analyze_delta_cli(workspace, tmp_path, capsys):
    out = tmp_path / "delta.json"
    assert main(["analyze", "delta", str(workspace["pope"]), "--out", str(out)]) == 0
    state = json.loads(out.read_text())
    assert state["step"] == 4 and state["layers"][0]["layer"] == 0 and "entries outside" in capsys.readouterr().out
    assert main(["analyze", "delta", str(workspace["rope"]), "--out", str(out)]) == 1
    assert "no PoPE layer with a learned delta" in capsys.readouterr().err
    assert main(["analyze", "delta", str(workspace["pope"]), "--out", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err
    assert main(["analyze", "delta", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err


def _fake_run(path, preset, pe, seed, test_losses, length_ppl=None, finished=True, at_best_valid=None):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"preset": preset, "pe": pe, "seed": seed}))
    records = [
        {"step": 100 * (i + 1), "kind": "eval", "test_loss": v, "valid_loss": v} for i, v in enumerate(test_losses)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"step": 100 * len(test_losses), "finished": finished}
    if at_best_valid is not None:  # the test loss of the evaluation checkpoints/best holds
        summary.update(
            best_metric="valid_loss",
            best_step=100 + 100 * seed,
            at_best_valid={"valid_loss": 0.4, "test_loss": at_best_valid},
        )
    (path / "summary.json").write_text(json.dumps(summary))
    if length_ppl:
        (path / "eval").mkdir()
        (path / "eval" / "length-jsb-test.json").write_text(
            json.dumps(
                {
                    "data_name": "jsb",
                    "split": "test",
                    "results": [{"length": length, "perplexity": ppl} for length, ppl in length_ppl.items()],
                }
            )
        )
    return str(path)


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


def test_length_labels_of_same_named_runs_are_their_shortest_distinct_path_tails():
    from pope.eval.length_runs import RunLengthResults, _disambiguate_labels

    def entry(run):
        return RunLengthResults(label=Path(run).name, run=run, pe="rope", train_length=16, results=[])

    entries = [
        entry("/tmp/runs/genome-pope/seed-0"),
        entry("/tmp/runs/genome-rope/seed-0"),
        entry("/tmp/runs/genome-rope/seed-1"),
        entry("/x/a/genome-rope/seed-1"),
        entry("/y/solo"),
    ]
    _disambiguate_labels(entries)
    assert [e.label for e in entries] == [
        "genome-pope/seed-0",
        "genome-rope/seed-0",
        "runs/genome-rope/seed-1",
        "a/genome-rope/seed-1",
        "solo",
    ]
    twice = [entry("/tmp/r/seed-0"), entry("/tmp/r/seed-0")]
    _disambiguate_labels(twice)
    assert [e.label for e in twice] == ["seed-0 [1]", "seed-0 [2]"]


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


def test_eval_accuracy_is_the_trainers_task_accuracy(tmp_path, capsys):
    from pope.checkpoint import save_checkpoint
    from pope.data import indirect_indexing as task
    from pope.model import GPT, GPTConfig
    from pope.train.evaluate import task_accuracy

    lines = task.generate_examples(20, np.random.default_rng(0))
    data = tmp_path / "examples.txt"
    data.write_text("\n".join(lines) + "\n")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=task.VOCAB_SIZE, n_layer=1, n_head=2, d_model=16, max_seq_len=48, pe="pope"))
    checkpoint = save_checkpoint(tmp_path / "ckpt", model_state=model.state_dict(), model_config=model.config.to_dict())
    assert main(["eval", "accuracy", str(checkpoint), "--data", str(data), "--json", "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == task_accuracy(str(checkpoint), str(data), device="cpu") and printed["examples"] == 20


def test_eval_accuracy_by_shift_counts_each_example_under_its_own_shift(tmp_path, capsys, monkeypatch):
    """by_shift holds, per signed shift, the examples with that shift and how many of them the model gets right;
    the totals are the overall numbers; the CLI prints it. The model is a stand-in that always answers one letter,
    so the examples it gets right are exactly those whose target is that letter."""
    import pope.train.evaluate
    from pope.data import indirect_indexing as task
    from pope.model import GPTConfig
    from pope.train.evaluate import task_accuracy

    lines = task.generate_examples(200, np.random.default_rng(1))
    data = tmp_path / "examples.txt"
    data.write_text("\n".join(lines) + "\n")
    parsed = [task.parse_example(line) for line in lines]
    letter = max(set(e.target for e in parsed), key=[e.target for e in parsed].count)
    letter_id = int(task.load_file(data).targets[[e.target for e in parsed].index(letter)].max())

    class AlwaysOneLetter(torch.nn.Module):
        config = GPTConfig(vocab_size=task.VOCAB_SIZE, n_layer=1, n_head=1, d_model=8, max_seq_len=48)

        def forward(self, x):  # (b, T) -> logits (b, T, vocab) with the letter on top everywhere
            return torch.nn.functional.one_hot(torch.full_like(x, letter_id), task.VOCAB_SIZE).float(), None

    monkeypatch.setattr(  # in the module that looks it up
        pope.train.evaluate, "load_model", lambda run, map_location: (AlwaysOneLetter(), {"path": run, "step": 7})
    )
    result = task_accuracy("stand-in", str(data), device="cpu", batch_size=7)
    expected = {}
    for example in parsed:
        row = expected.setdefault(f"{example.shift:+d}", {"examples": 0, "correct": 0})
        row["examples"] += 1
        row["correct"] += example.target == letter
    for row in expected.values():
        row["accuracy"] = row["correct"] / row["examples"]
    assert result["by_shift"] == dict(sorted(expected.items(), key=lambda item: int(item[0])))
    assert result["correct"] == sum(e.target == letter for e in parsed) > 0
    assert main(["eval", "accuracy", "stand-in", "--data", str(data), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    first_shift, first_row = next(iter(result["by_shift"].items()))
    assert printed.startswith(f"by shift (%): {first_shift} {100 * first_row['accuracy']:.1f} "), printed


def test_finetune_cli_trains_resumes_and_refuses_bad_context(workspace, tmp_path, capsys):
    out = tmp_path / "rope-ft32"
    arguments = [
        "finetune",
        str(workspace["rope"]),
        "--context",
        "32",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--set",
        "train.progress=false",
        "--set",
        "train.device=cpu",
    ]
    assert main(arguments) == 0
    assert json.loads((out / "config.json").read_text())["model"]["pe"].startswith("yarn:")
    assert main(arguments) == 1  # the run directory exists: refused without --resume
    assert "already holds a run" in capsys.readouterr().err
    assert main(arguments + ["--resume"]) == 0  # finished run: nothing left to train
    assert main(["finetune", str(workspace["rope"]), "--context", "8", "--out", str(tmp_path / "x")]) == 1
    assert "not longer than the run's training context 16" in capsys.readouterr().err


def _task_run(path, pe, seed, accuracies, *, finished=True, overrides=(), train_accuracy=None, every=5000):
    """A synthetic indirect-indexing run (as `pope train --seeds` writes it): config, eval records with
    test accuracy, summary, and optionally eval/task_accuracy.json."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "preset": "indirect-indexing",
        "pe": pe,
        "seed": seed,
        "recipe": {"lr": 2e-4},
        "train": {"autocast": "auto", "progress": False, "max_seconds": 480},
    }
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        config.setdefault(section, {})[name] = value
    (path / "config.json").write_text(json.dumps(config))
    records = [
        {"step": every * (i + 1), "kind": "eval", "test_accuracy": a, "valid_accuracy": a, "test_loss": 1.0}
        for i, a in enumerate(accuracies)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "summary.json").write_text(json.dumps({"finished": finished}))
    if train_accuracy is not None:
        (path / "eval").mkdir()
        (path / "eval" / "task_accuracy.json").write_text(
            json.dumps(
                {
                    "checkpoint": "last",
                    "step": 1,
                    "splits": {"train": {"accuracy": train_accuracy}, "test": {"accuracy": accuracies[-1]}},
                }
            )
        )


def _sweep(directory, pe, finals, *, overrides=(), unfinished=(), train_accuracy=None):
    directory.mkdir(parents=True)
    (directory / "sweep.json").write_text(
        json.dumps({"preset": "indirect-indexing", "pe": pe, "overrides": ["train.max_seconds=480", *overrides]})
    )
    for seed, final in enumerate(finals):
        _task_run(
            directory / f"seed-{seed}",
            pe,
            seed,
            [0.02, final],
            overrides=overrides,
            train_accuracy=None if train_accuracy is None else train_accuracy[seed],
        )
    for seed in unfinished:
        _task_run(directory / f"seed-{seed}", pe, seed, [0.5], finished=False, overrides=overrides)
    return str(directory)


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


def test_report_lists_a_settings_seeds_in_seed_order_whatever_the_argument_order(tmp_path):
    from pope.eval.report import write_report

    later, earlier = tmp_path / "s1" / "seed-1", tmp_path / "s0" / "seed-0"
    _task_run(later, "pope", 1, [0.02, 0.05])  # never past 20 %
    _task_run(earlier, "pope", 0, [0.3, 0.9])  # past it at the first evaluation
    markdown, _ = write_report([str(later), str(earlier)], tmp_path / "report")
    assert "| 5k, — |" in markdown  # the lift-off column, seed 0 first
    assert "| 0,1 |" in markdown  # the runs table's seeds column


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


def test_report_plot_colours_are_distinct_for_twenty_settings():
    # The indirect-indexing report has 12 settings: with matplotlib's 10-colour cycle two of them shared a colour.
    from matplotlib.colors import to_rgb

    from pope.eval.report_plots import setting_colour

    colours = [to_rgb(setting_colour(i)) for i in range(20)]
    assert len(set(colours)) == 20
    assert setting_colour(20) == setting_colour(0)


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


@pytest.mark.parametrize(
    ("damaged", "fix"),
    [
        ("summary.json", "pope train --resume RUN` rebuilds it"),
        ("config.json", "pope train --resume RUN` rebuilds it"),
        ("sweep.json", "restore or delete it"),
        ("env.json", "restore or delete it"),
        ("eval/length-jsb-test.json", "restore or delete it"),
    ],
)
def test_report_names_a_torn_record_and_the_fix(tmp_path, capsys, damaged, fix):
    """A run record cut by a crash or an edit elsewhere: `pope report` stops with one line naming the file and what
    to do, writes no report, and leaves every file as it was."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"overrides": []}))
    run = Path(_fake_run(sweep / "seed-0", "jsb-tiny", "pope", 0, [1.0, 0.9], length_ppl={256: 3.0}))
    (run / "env.json").write_text(json.dumps({"command": ["pope", "train"]}))
    target = sweep / damaged if damaged == "sweep.json" else run / damaged
    torn = target.read_text()[:7]
    target.write_text(torn)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(target) in err[0] and "is damaged" in err[0] and fix in err[0], err
    assert not (tmp_path / "report" / "report.md").exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "report" not in p.parts} == before


def test_report_leaves_out_a_torn_last_metrics_line_with_a_notice(tmp_path, capsys):
    """The last metrics line cut by a crash mid-write (a run still writing, or killed): left out with a notice, as the
    trainer reads it; the report is written from the complete records."""
    run = Path(_fake_run(tmp_path / "run", "jsb-tiny", "pope", 0, [1.0, 0.9]))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 300, "kind": "ev')
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert "last line is incomplete" in capsys.readouterr().err
    assert (tmp_path / "report" / "report.md").is_file()
