"""scripts/plot_accuracy.py: accuracy (and learning rate) against step from run directories or metrics files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot_accuracy.py"


def load_script():
    spec = importlib.util.spec_from_file_location("plot_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(directory: Path, accuracies: list[float], lr: float) -> Path:
    directory.mkdir(parents=True)
    lines = []
    for index, accuracy in enumerate(accuracies, start=1):
        lines.append({"step": 500 * index, "kind": "train", "loss": 1.0, "lr": lr / index})
        lines.append({"step": 500 * index, "kind": "eval", "test_accuracy": accuracy, "valid_accuracy": accuracy})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return directory


def test_plots_labelled_runs_with_their_learning_rate(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    short = write_run(tmp_path / "short", [0.05, 0.06], 2e-4)
    long = write_run(tmp_path / "long", [0.05, 0.5], 2e-4)
    out = tmp_path / "plot.png"
    assert (
        load_script().main(
            [
                f"100k steps={short}",
                str(long / "metrics.jsonl"),
                "--lr",
                "--no-valid",
                "--paper",
                "pope",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out.splitlines()
    assert "100k steps" in table[0] and "metrics" in table[0]  # LABEL=PATH, else the file's stem
    assert table[2].split() == ["1000", "6.00%", "50.00%"]


def test_delta_panel_plots_the_counts_and_refuses_runs_without_them(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    script = load_script()
    plain = write_run(tmp_path / "plain", [0.05, 0.06], 2e-4)
    with pytest.raises(SystemExit, match="--delta: no run has delta counts"):
        script.main([str(plain), "--delta", "--out", str(tmp_path / "x.png")])
    counted = write_run(tmp_path / "counted", [0.05, 0.5], 2e-4)
    records = [json.loads(line) for line in (counted / "metrics.jsonl").read_text().splitlines()]
    for index, record in enumerate(r for r in records if r["kind"] == "eval"):
        record.update(delta_below=3 + index, delta_above=1)
    (counted / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "delta.png"
    capsys.readouterr()
    assert script.main([str(counted), str(plain), "--delta", "--lr", "--out", str(out)]) == 0  # plain: no delta line
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "plot_accuracy.py: --delta: plain has no delta counts (not a PoPE run, or trained before the "
        "trainer logged them): it has no line in the delta panel"
    ]  # said, not silently left out


def test_a_missing_or_broken_run_is_one_line(tmp_path):
    script = load_script()
    with pytest.raises(SystemExit, match="no metrics file"):
        script.main([str(tmp_path / "absent"), "--out", str(tmp_path / "x.png")])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit, match="is not JSON lines"):
        script.main([str(broken), "--out", str(tmp_path / "x.png")])


def test_a_paper_line_the_paper_does_not_report_is_refused(tmp_path):
    run = write_run(tmp_path / "run", [0.05], 2e-4)
    with pytest.raises(SystemExit, match="no indirect-indexing number for --paper 'wrap'; give one of rope, pope"):
        load_script().main([str(run), "--paper", "wrap", "--out", str(tmp_path / "x.png")])


def test_group_gives_a_family_one_colour_and_each_member_its_own_line_style(tmp_path):
    script = load_script()
    styles = script.line_styles(
        ["PoPE, clamp, seed 0", "RoPE, seed 0", "PoPE, clamp, seed 1", "RoPE, seed 1", "ALiBi"], group=True
    )
    assert styles[0] == {"color": "C0", "linestyle": "-"} and styles[2] == {"color": "C0", "linestyle": "--"}
    assert styles[1] == {"color": "C1", "linestyle": "-"} and styles[3] == {"color": "C1", "linestyle": "--"}
    assert styles[4] == {"color": "C2", "linestyle": "-"}  # no comma: a family of its own
    assert script.line_styles(["a, seed 0", "a, seed 1"], group=False) == [{}, {}]
    five = script.line_styles([f"a, seed {seed}" for seed in range(6)], group=True)
    assert len({str(style["linestyle"]) for style in five[:5]}) == 5  # five seeds, five distinguishable lines
    assert five[5]["linestyle"] == "-"  # then the styles repeat
    run = write_run(tmp_path / "run", [0.05], 2e-4)
    with pytest.raises(SystemExit, match="add --no-valid"):
        script.main([str(run), "--group", "--out", str(tmp_path / "x.png")])
