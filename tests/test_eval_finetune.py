"""YaRN and PoPE fine-tuning of real (tiny) runs to a longer context: the frequencies, the recipe, the refusals
and `pope finetune`."""

import json
import math

import pytest
import torch
from eval_fixtures import workspace_fixture  # noqa: F401  (the fixture `workspace`)

from pope.cli import main


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
