"""Bad input to the trainer and checkpoints gives clear errors, never a half-loaded model."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from pope import checkpoint as ckpt
from pope.cli import main as pope_main
from pope.data import indirect_indexing as task
from pope.train.run_config import resolve_run_config
from pope.train.trainer import Trainer, run_training

SETS = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "recipe.max_steps=4",
    "recipe.warmup_steps=1",
    "recipe.eval_interval=4",
    "recipe.batch_size=8",
    "train.tensorboard=false",
    "train.progress=false",
]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    splits = task.write_splits(root / "ii", seed=0, sizes={"train": 256, "valid": 32, "test": 32})
    config = resolve_run_config("indirect-indexing-tiny", "pope", overrides=SETS + [f"train.data_dir={splits}"])
    run_training(config, root / "run")
    return root / "run", config


def test_unknown_preset_pe_and_set_key_list_valid_names(capsys):
    with pytest.raises(ValueError, match="valid presets: .*indirect-indexing"):
        resolve_run_config("no-such-preset", "pope")
    with pytest.raises(ValueError, match="valid names: .*rope"):
        resolve_run_config("indirect-indexing-tiny", "bogus-pe")
    with pytest.raises(ValueError, match="recipe.lr.*model.n_layer|model.n_layer.*recipe.lr"):
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=["recipe.learning_rate=1"])
    with pytest.raises(ValueError, match="key=value"):
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=["recipe.lr"])
    with pytest.raises(ValueError, match="cannot read"):
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=["model.n_layer=two"])
    with pytest.raises(ValueError, match="--pe"):
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=["model.pe=rope"])
    # through the CLI: one clear line on stderr, exit status 1
    assert pope_main(["train", "no-such-preset", "--pe", "pope", "--out", "/tmp/unused-pope-run"]) == 1
    assert "valid presets" in capsys.readouterr().err
    config = resolve_run_config("indirect-indexing-tiny", "rope", overrides=["recipe.lr=3e-3", "train.compile=false"])
    assert config.recipe.lr == 3e-3 and config.train.compile is False
    assert config.model.vocab_size == task.VOCAB_SIZE and config.model.pe == "rope"


def test_checkpoint_round_trip_and_load_model(trained_run):
    run_dir, _ = trained_run
    model, info = ckpt.load_model(run_dir)
    assert info["step"] == 4 and info["path"].endswith("best")
    assert model.lm_head.weight is model.token_embedding.weight  # tied weights restored as tied
    stored = ckpt.load_checkpoint(run_dir / "checkpoints" / "best").model_state
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, stored[name]), name


@pytest.mark.parametrize("damage", ["flip", "truncate", "no_manifest", "no_state"])
def test_damaged_checkpoint_is_refused(trained_run, tmp_path, damage):
    run_dir, _ = trained_run
    target = tmp_path / "ckpt"
    shutil.copytree(run_dir / "checkpoints" / "last", target)
    weights = target / ckpt.MODEL_FILE
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
        message = "corrupt"
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
        message = "truncated"
    elif damage == "no_manifest":
        (target / ckpt.MANIFEST_FILE).unlink()
        message = "incomplete"
    else:
        (target / ckpt.STATE_FILE).unlink()
        message = "missing"
    with pytest.raises(ValueError, match=message):
        ckpt.load_model(target)


def test_mismatched_weights_leave_model_untouched(trained_run):
    from pope.model import GPT, GPTConfig

    run_dir, config = trained_run
    state = ckpt.load_checkpoint(run_dir / "checkpoints" / "last").model_state
    other = GPT(GPTConfig.from_dict({**config.model.to_dict(), "n_layer": 2}))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="missing"):
        ckpt.apply_model_state(other, state)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


def test_resume_with_different_config_is_refused(trained_run, tmp_path):
    run_dir, config = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    changed = config.to_dict()
    changed["recipe"]["lr"] = 0.5
    changed["model"]["dropout"] = 0.1
    with pytest.raises(ValueError, match=r"(?s)recipe\.lr: 0\.001 -> 0\.5.*|model\.dropout"):
        Trainer(changed, copy, resume=True)
    with pytest.raises(ValueError, match="--resume"):  # a new run may not reuse a run directory
        Trainer(config, copy)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        Trainer(config, tmp_path / "empty", resume=True)


def test_resume_from_corrupt_checkpoint_is_refused(trained_run, tmp_path):
    run_dir, config = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    weights = copy / "checkpoints" / "last" / ckpt.MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated"):
        Trainer(config, copy, resume=True)


def test_interrupted_save_keeps_the_previous_checkpoint(trained_run, tmp_path, monkeypatch):
    run_dir, _ = trained_run
    target = tmp_path / "checkpoints" / "last"
    shutil.copytree(run_dir / "checkpoints" / "last", target)
    good = ckpt.load_checkpoint(target)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", crash)  # dies while writing the new checkpoint
    with pytest.raises(OSError):
        ckpt.save_checkpoint(
            target,
            model_state={k: v * 0 for k, v in good.model_state.items()},
            model_config=good.model_config,
            trainer_state={},
        )
    again = ckpt.load_checkpoint(target)  # the previous checkpoint is intact
    assert all(torch.equal(again.model_state[k], v) for k, v in good.model_state.items())
    # a crash between the two renames: only .last.old exists; it is found
    target.rename(target.parent / ".last.old")
    assert ckpt.load_checkpoint(target).path.name == ".last.old"


def test_accuracy_command(trained_run, capsys):
    run_dir, config = trained_run
    data = Path(config.train.data_dir) / "test.txt"
    assert pope_main(["eval", "accuracy", str(run_dir), "--data", str(data), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["examples"] == 32 and 0 <= result["accuracy"] <= 1 and result["step"] == 4
    assert pope_main(["eval", "accuracy", str(run_dir), "--data", str(data.parent / "missing.txt")]) == 1
    assert "does not exist" in capsys.readouterr().err
