"""pope.hf with the HF Trainer: the runnable example (examples/hf_pope_llama.py) trains, generates and reloads."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is part of the [hf] extra")
pytest.importorskip("accelerate", reason="the HF Trainer needs accelerate (part of the [hf] extra)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_pope_llama.py"


def test_example_trains_generates_and_reloads(tmp_path):
    spec = importlib.util.spec_from_file_location("hf_pope_llama_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--out", str(tmp_path), "--steps", "12"])
    losses = result["losses"]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5  # the Trainer's steps lower the loss
    assert result["same_after_reload"] and len(result["continuation"]) > 0
    assert '"model_type": "pope_llama"' in (tmp_path / "config.json").read_text()
