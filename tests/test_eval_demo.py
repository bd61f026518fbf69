"""The demo end to end on the real chorales, with a 3-step schedule (the real one is 1200 steps)."""

import csv

import pytest

from pope.eval import demo


@pytest.mark.data
def test_demo_runs_end_to_end_and_reports_every_model(tmp_path, capsys):
    out = tmp_path / "out"
    arguments = ["--steps", "3", "--max-docs", "3", "--out", str(out), "--work", str(tmp_path / "work")]
    assert demo.main(arguments) == 0
    printed = capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"demo.md", "length.csv", "length.md", "length.json", "length.png"}
    rows = list(csv.DictReader((out / "length.csv").open()))
    assert [r["label"] for r in rows] == [label for label in demo.ENCODINGS for _ in demo.EVAL_MULTIPLES]
    assert {int(r["length"]) for r in rows} == {demo.TRAIN_CONTEXT * m for m in demo.EVAL_MULTIPLES}
    # The same test tokens at every length and for every model.
    assert len({int(r["n_targets"]) for r in rows}) == 1 and int(rows[0]["n_targets"]) >= 3 * 512
    assert "Wall time:" in printed and "L=512 (8x)" in printed
    # A second invocation reuses the trained runs instead of training again.
    assert demo.main(arguments) == 0
    assert "reusing" in capsys.readouterr().out
