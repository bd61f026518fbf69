"""`pope analyze frequencies` and `pope analyze delta` on real (tiny) runs, and the delta state they read."""

import json

import numpy as np
import pytest
import torch
from eval_fixtures import TEST_DOC_LENGTHS, workspace_fixture  # noqa: F401  (the fixture `workspace`)

from pope.cli import main


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
