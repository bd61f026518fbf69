"""`pope report`'s tidy tables (runs.csv, curves.csv, lengths.csv, shifts.csv): written from run directories, read
back into the same records and the same report; where a report goes without --out; accuracy tasks; the report
modules' layering."""

import ast
import json
from pathlib import Path

import pytest

from pope import cli
from pope.eval.report import load_records, report_markdown, write_report
from pope.eval.report_collect import collect_run
from pope.eval.report_tables import read_tables, write_tables

SRC = Path(__file__).resolve().parents[1] / "src" / "pope"


def _run(path: Path, *, preset="indirect-indexing", pe="pope", seed=0, accuracies=(0.02, 0.5), finished=True):
    """A run directory as `pope train` writes it, with every file the report reads: config, training and evaluation
    records, summary, env, a length evaluation, the re-scored accuracy per shift and δ's state."""
    (path / "eval").mkdir(parents=True)
    dataset = "indirect-indexing" if preset.startswith("indirect") else "jsb"
    config = {"preset": preset, "pe": pe, "seed": seed, "recipe": {"dataset": dataset, "max_steps": 2000}, "train": {}}
    (path / "config.json").write_text(json.dumps(config))
    records = []
    for i, accuracy in enumerate(accuracies):
        step = 1000 * (i + 1)
        records.append({"step": step, "kind": "train", "loss": 3.0 / (i + 1), "lr": 1e-3 * 0.1, "step_ms": 2.5 + i})
        records.append(
            {
                "step": step,
                "kind": "eval",
                "valid_loss": 2.0 - i / 3,
                "valid_accuracy": accuracy,
                "test_loss": 2.1 - i / 3,
                "test_accuracy": accuracy,
                "test_scored_tokens": 100,
                "test_split_tokens": 100,
                "delta_below": i,
            }
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {
        "finished": finished,
        "seconds": 12.5,
        "final": {"test_loss": 2.1 - (len(accuracies) - 1) / 3, "test_accuracy": accuracies[-1]},
        "best_step": 1000,
        "at_best_valid": {"test_loss": 2.1, "test_accuracy": accuracies[0], "valid_loss": 2.0},
    }
    (path / "summary.json").write_text(json.dumps(summary))
    env = {
        "versions": {"torch": "2.11.0", "python": "3.12.3"},
        "git": {"commit": "abc1234", "dirty": False},
        "device_name": "NVIDIA H200",
        "command": ["pope", "train", preset, "--pe", pe, "--out", "a dir, with a comma"],
        "started_utc": "2026-01-01T00:00:00Z",
        "model_params": 1234,
    }
    (path / "env.json").write_text(json.dumps(env))
    length = {
        "data_name": "jsb",
        "split": "test",
        "same_documents": True,
        "step": 2000,
        "git_commit": "abc1234",
        "results": [
            {
                "length": n,
                "mean_nll": 0.1 * n,
                "perplexity": 1.0 + n / 3,
                "n_targets": 7,
                "bucket_edges": [0, n // 2, n],
                "bucket_nll": [0.5, 0.7],
                "bucket_count": [3, 4],
            }
            for n in (64, 128)
        ],
    }
    (path / "eval" / "length-jsb-test-64-128.json").write_text(json.dumps(length))
    by_shift = {f"{s:+d}": {"correct": 3 + s, "examples": 20} for s in (-2, 1, 3)}
    task = {"step": 2000, "splits": {"test": {"accuracy": 0.45, "by_shift": by_shift}, "train": {"accuracy": 0.5}}}
    (path / "eval" / "task_accuracy.json").write_text(json.dumps(task))
    (path / "eval" / "delta_state.json").write_text(json.dumps({"outside_share": 0.125}))
    return path


def _sweep(directory: Path, pe: str, finals: list[float], preset="indirect-indexing") -> str:
    directory.mkdir(parents=True)
    (directory / "sweep.json").write_text(json.dumps({"preset": preset, "pe": pe, "overrides": []}))
    for seed, final in enumerate(finals):
        _run(directory / f"seed-{seed}", preset=preset, pe=pe, seed=seed, accuracies=(0.02, 0.1 + seed / 10, final))
    return str(directory)


def test_tables_hold_every_value_of_the_runs_and_read_back_to_the_same_report(tmp_path):
    pope = _sweep(tmp_path / "pope", "pope", [0.95, 0.05, 0.1 + 0.2])
    rope = _sweep(tmp_path / "rope", "rope", [0.11, 0.12])
    records = load_records([pope, rope])
    written = write_tables(records, tmp_path / "tables", experiment="toy")
    assert [p.name for p in written] == ["runs.csv", "curves.csv", "lengths.csv", "shifts.csv"]
    back = read_tables(tmp_path / "tables")
    for before, after in zip(records, back, strict=True):
        for name in before.__dataclass_fields__:
            if name not in ("run", "from_table", "experiment"):
                assert getattr(before, name) == getattr(after, name), name
        assert after.experiment == "toy" and after.from_table and after.run.endswith(f"runs.csv:{after.run_id}")
    assert report_markdown(back, against="pope") == report_markdown(records, against=str(tmp_path / "pope"))
    first = back[0]
    assert first.run_id == "pope/seed-0" and first.provenance["command"].endswith("'a dir, with a comma'")
    assert first.provenance["median_step_ms"] == 3.5 and first.provenance["gpu"] == "NVIDIA H200"
    assert back[2].value == 0.1 + 0.2 != 0.3  # written as repr: every float reads back to itself
    assert (3000, "model", "delta_below", 2) in first.curves and (3000, "train", "lr", 1e-3 * 0.1) in first.curves
    assert isinstance(dict((m, v) for s, sp, m, v in back[0].curves if sp == "test")["scored_tokens"], int)
    assert first.length_ppl == {
        "jsb/test, the same documents at every length to 128": {64: 1.0 + 64 / 3, 128: 1.0 + 128 / 3}
    }
    assert [(r["length"], r["position_from"], r["position_to"], r["nll"], r["targets"]) for r in first.lengths][:3] == [
        (64, None, None, 6.4, 7),
        (64, 0, 32, 0.5, 3),
        (64, 32, 64, 0.7, 4),
    ]
    assert first.test_by_shift == {-2: (1, 20), 1: (4, 20), 3: (6, 20)} and first.task_accuracy == {
        "test": 0.45,
        "train": 0.5,
    }
    header = (tmp_path / "tables" / "runs.csv").read_text().splitlines()[0].split(",")
    assert header[:6] == ["run", "experiment", "preset", "pe", "setting", "seed"] and header[-2:] == ["note", "config"]
    curves = (tmp_path / "tables" / "curves.csv").read_text().splitlines()
    assert curves[0] == "run,step,split,metric,value" and "pope/seed-0,1000,train,loss,3.0" in curves


def test_a_table_names_only_runs_it_holds_and_each_once(tmp_path):
    write_tables(load_records([_sweep(tmp_path / "pope", "pope", [0.5])]), tmp_path / "t")
    curves = tmp_path / "t" / "curves.csv"
    curves.write_text(curves.read_text() + "ghost/seed-9,1,train,loss,1.0\n")
    with pytest.raises(ValueError, match="names run 'ghost/seed-9', which runs.csv beside it does not hold"):
        read_tables(tmp_path / "t")
    with pytest.raises(FileNotFoundError, match="holds no runs.csv"):
        read_tables(tmp_path)
    records = load_records([str(tmp_path / "pope")])
    with pytest.raises(ValueError, match="given twice"):
        write_tables(records * 2, tmp_path / "t2")


def test_report_from_tables_selects_runs_and_compares_against_a_run_id_prefix(tmp_path):
    pope = _sweep(tmp_path / "pope", "pope", [0.95, 0.05, 0.4])
    rope = _sweep(tmp_path / "rope", "rope", [0.11, 0.12])
    _, written = write_report([pope, rope], tmp_path / "tables")
    assert {"runs.csv", "curves.csv", "report.md", "lift_off_vs_step.png"} <= {p.name for p in written}
    again, rewritten = write_report([str(tmp_path / "tables" / "runs.csv")], tmp_path / "again", against="pope")
    assert "## Against pope (pope/): every other setting of indirect-indexing" in again
    assert again == write_report([pope, rope], tmp_path / "dirs", against=pope)[0]
    assert not {"runs.csv", "curves.csv"} & {p.name for p in rewritten}  # tables in: summary and plots out
    only, _ = write_report([str(tmp_path / "tables")], tmp_path / "only", only=["pope/seed-[01]"])
    assert "| indirect-indexing | pope | 2 |" in only and "| rope |" not in only
    with pytest.raises(ValueError, match="--only nothing/\\*: no run id matches"):
        write_report([str(tmp_path / "tables")], tmp_path / "none", only=["nothing/*"])
    with pytest.raises(ValueError, match="come from more than one input"):
        write_report([str(tmp_path / "tables"), str(tmp_path / "tables" / "runs.csv")], tmp_path / "twice")
    with pytest.raises(ValueError, match="are runs of one setting with the same seed 0"):
        write_report([str(tmp_path / "tables"), pope], tmp_path / "both")  # a run and its own row


def test_report_never_drops_the_runs_of_someone_elses_table(tmp_path):
    write_report([_sweep(tmp_path / "pope", "pope", [0.5, 0.6])], tmp_path / "theirs")
    before = (tmp_path / "theirs" / "runs.csv").read_bytes()
    with pytest.raises(ValueError, match="holds a runs.csv with 2 run\\(s\\) this report does not have"):
        write_report([_sweep(tmp_path / "rope", "rope", [0.1])], tmp_path / "theirs")
    assert (tmp_path / "theirs" / "runs.csv").read_bytes() == before
    write_report([str(tmp_path / "pope")], tmp_path / "theirs")  # the same runs again: rewritten, nothing lost
    assert (tmp_path / "theirs" / "runs.csv").read_bytes() == before


def test_report_without_out_writes_under_its_one_input_never_the_working_directory(tmp_path, monkeypatch, capsys):
    sweep = _sweep(tmp_path / "runs" / "pope", "pope", [0.5])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["report", sweep]) == 0
    assert (Path(sweep) / "report" / "runs.csv").is_file() and (Path(sweep) / "report" / "report.md").is_file()
    assert cli.main(["report", str(Path(sweep) / "report")]) == 0  # the tables: its report goes in report/report/
    assert (Path(sweep) / "report" / "report" / "report.md").is_file()
    capsys.readouterr()
    assert cli.main(["report", sweep, sweep.replace("pope", "rope")]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("pope report: error: 2 inputs and no --out: give --out DIR") and "\n" not in err
    assert list(work.iterdir()) == []
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    assert "default INPUT/report" in " ".join(capsys.readouterr().out.split())


def test_an_accuracy_task_without_a_paper_metric_reports_accuracy_and_lift_off(tmp_path):
    """indirect-indexing-tiny has no paper number; its runs are still scored by test accuracy, not test loss."""
    sweep = _sweep(tmp_path / "tiny", "pope", [0.9, 0.05], preset="indirect-indexing-tiny")
    record = collect_run(Path(sweep) / "seed-0")
    assert record.metric == "test_accuracy" and record.value == 0.9 and record.curve[-1] == (3000, 0.9)
    markdown, written = write_report([sweep], tmp_path / "report")
    assert "| indirect-indexing-tiny | pope | test_accuracy (last evaluation) | 0.4750 ± 0.6010 (n=2) |" in markdown
    assert "## Test accuracy and lift-off (final test accuracy > 20 %)" in markdown and "test_loss" not in markdown
    assert {"accuracy_vs_step.png", "lift_off_vs_step.png"} <= {p.name for p in written}
    jsb = collect_run(_run(tmp_path / "jsb-run", preset="jsb-tiny"))
    assert jsb.metric == "last test_loss"  # a language-modelling preset without a paper metric: unchanged


def _eval_imports(path: Path) -> set[str]:
    """The pope.eval modules ``path`` imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pope.eval."):
            names.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("pope.eval.")}
    return names


def test_report_modules_form_no_import_cycle_and_none_exceeds_500_lines():
    modules = {p.stem: p for p in (SRC / "eval").glob("*.py") if p.stem.startswith("report") or p.stem == "stats"}
    assert {"report", "report_records", "report_collect", "report_compare", "report_tables", "report_plots"} <= set(
        modules
    )
    graph = {name: _eval_imports(path) & set(modules) for name, path in modules.items()}
    assert "report" not in graph["report_plots"]  # the cycle this split removed

    def visit(name, trail):
        assert name not in trail, f"import cycle: {' -> '.join([*trail, name])}"
        for child in graph[name]:
            visit(child, [*trail, name])

    for name in graph:
        visit(name, [])
    for name, path in modules.items():
        assert len(path.read_text().splitlines()) <= 500, name


def test_a_run_directory_that_holds_tables_is_still_read_as_a_run(tmp_path):
    run = _run(tmp_path / "run")
    write_report([str(run)], run)  # the tables written into the run directory itself
    assert (run / "runs.csv").is_file()
    (record,) = load_records([str(run)])
    assert not record.from_table and record.run == str(run)
