"""`pope eval length` on real (tiny) runs made by pope.train: its tables, the documents and tokens it counts,
its refusals, and the labels of same-named runs."""

import csv
import json
import math
from pathlib import Path

from eval_fixtures import _write_dataset, workspace_fixture  # noqa: F401  (the fixture `workspace`)

from pope.cli import main


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
