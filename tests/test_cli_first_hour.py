"""The command line of a first hour: --print-config alone and complete, the start banner and plain logs when stdout is
not a terminal, a shortened schedule's warmup, "did you mean" on misspelled names, and evaluation defaults that come
from the run (its data, its directory)."""

import json
import re

import numpy as np
import pytest
import torch

from pope.checkpoint import save_checkpoint
from pope.cli import main
from pope.cli.listings import encodings_table
from pope.data import indirect_indexing as task
from pope.data.writer import PreparedWriter
from pope.model import GPT, GPTConfig
from pope.presets import PRESETS, get_preset
from pope.train import metrics
from pope.train.finetune import finetune_config
from pope.train.run_config import WRITTEN_WHEN_SET, resolve_run_config
from pope.train.schedule import fit_warmup
from pope.train.trainer import run_training

TINY = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "recipe.max_steps=4",
    "recipe.warmup_steps=1",
    "recipe.eval_interval=4",
    "recipe.batch_size=8",
    "train.tensorboard=false",
    "train.log_interval=2",
]


# ---------------------------------------------------------------------------------------- --print-config
def test_print_config_alone_prints_every_setting(capsys):
    assert main(["train", "jsb-tiny", "--print-config"]) == 0
    captured = capsys.readouterr()
    config = json.loads(captured.out)
    for key in WRITTEN_WHEN_SET:  # the settings config.json leaves out at their defaults are all printed
        section, name = key.split(".")
        assert name in config[section], key
    assert config["model"]["pe"] == "pope:delta_init=uniform" and config["recipe"]["lr_decay"] == "cosine"
    assert "--pe not given; showing the config with --pe pope" in captured.err
    assert main(["train", "jsb-tiny", "--pe", "rope", "--print-config", "--set", "train.pack=true"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["model"]["pe"] == "rope" and config["train"]["pack"] is True


def test_training_still_needs_pe_and_out(capsys):
    assert main(["train", "jsb-tiny", "--pe", "pope"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("pope train: error: --out is needed, e.g. `pope train jsb-tiny --pe pope --out")
    assert "\n" not in error


def test_pe_listing_says_what_each_preset_makes_of_plain_pope():
    note = next(line for line in encodings_table("pope").splitlines() if "under `pope train`" in line)
    others = re.search(r"zero for ([^;]+);", note)[1].split(", ")
    assert "uniform for the other presets" in note and "owt-124m" in others
    for name, preset in PRESETS.items():  # the note agrees with what pope train resolves
        expected = "zero" if name in others else "uniform"
        assert preset.resolve_pe("pope") == f"pope:delta_init={expected}", name


# ------------------------------------------------------------------------------------ banner, plain log
def test_banner_and_one_plain_line_per_log_interval(tmp_path, capfd):
    splits = task.write_splits(tmp_path / "ii", seed=0, sizes={"train": 256, "valid": 32, "test": 32})
    config = resolve_run_config("indirect-indexing-tiny", "pope", overrides=TINY + [f"train.data_dir={splits}"])
    run_training(config, tmp_path / "run")
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"pope train: preset indirect-indexing-tiny, seed 0, {tmp_path / 'run'} (new run)"
    assert lines[1].startswith(
        "  encoding  pope:delta_init=uniform (--pe pope with the preset's delta_init=uniform): base=10000.0, "
        "magnitude=softplus, delta_init=uniform, delta_range=clamp"
    )
    params = GPT(config.model).num_params()
    assert lines[2] == f"  model     1 layers, d_model 32, 2 heads, {params / 1e6:.2f}M parameters"
    assert lines[3].startswith("  schedule  4 steps (warmup 1, cosine lr 0.001 -> 0.0001), batch 8 x 47 tokens")
    assert lines[4].startswith("  device    cpu")
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["2/4", "4/4"] and "tokens/s" in steps[0]
    (evaluation,) = [line for line in lines if line.startswith("eval step ")]
    assert evaluation.startswith("eval step 4: valid_loss ")
    assert re.search(r"PoPE delta entries outside \[-2pi, 0\]: \d+ below, \d+ above", evaluation)
    assert "\r" not in out + err and "it/s" not in out + err  # no progress-bar frames in a redirected log


def test_a_terminal_gets_the_bar_instead_of_step_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(metrics, "interactive", lambda: True)
    logger = metrics.MetricsLogger(tmp_path, enabled=True, total_steps=4, tensorboard=False)
    logger.log({"step": 2, "kind": "train", "loss": 1.0, "lr": 1e-3, "tokens_per_s": 10.0, "step_ms": 1.0})
    logger.close()
    assert "step 2/4" not in capsys.readouterr().out
    monkeypatch.setattr(metrics, "interactive", lambda: False)
    quiet = metrics.MetricsLogger(tmp_path, enabled=True, total_steps=4, tensorboard=False, progress=False)
    quiet.log({"step": 2, "kind": "train", "loss": 1.0, "lr": 1e-3, "tokens_per_s": 10.0, "step_ms": 1.0})
    quiet.close()
    assert capsys.readouterr().out == ""  # train.progress=false: evaluation lines only


# ------------------------------------------------------------------------------------------- warmup
def test_a_shorter_max_steps_scales_the_warmup_with_a_notice(capsys):
    config = resolve_run_config("jsb-tiny", "pope", overrides=["recipe.max_steps=2"])  # 20 of 300 steps
    assert (config.recipe.max_steps, config.recipe.warmup_steps) == (2, 1)
    notice = capsys.readouterr().err
    assert "pope train: notice: recipe.max_steps=2 is shorter than the warmup (20 of 300 steps)" in notice
    assert (
        resolve_run_config("indirect-indexing", "pope", overrides=["recipe.max_steps=2000"]).recipe.warmup_steps == 80
    )
    assert resolve_run_config("jsb-tiny", "pope", overrides=["recipe.max_steps=150"]).recipe.warmup_steps == 20
    assert capsys.readouterr().err.count("notice") == 1  # 80 of 2000 was scaled; 20 of 150 fits
    explicit = ["recipe.max_steps=2", "recipe.warmup_steps=0"]
    assert resolve_run_config("jsb-tiny", "pope", overrides=explicit).recipe.warmup_steps == 0
    with pytest.raises(ValueError, match=r"recipe\.warmup_steps \(5\) must be in \[0, recipe\.max_steps = 2\]"):
        resolve_run_config("jsb-tiny", "pope", overrides=["recipe.max_steps=2", "recipe.warmup_steps=5"])


def test_finetune_uses_the_same_rule(capsys):
    run_config = resolve_run_config("jsb-tiny", "rope").to_dict()
    short = finetune_config(run_config, context=512, steps=5)
    assert short["recipe"]["warmup_steps"] == fit_warmup(20, 5, 500, what="")[0] == 1
    assert "pope finetune: notice: --steps 5 is shorter than the warmup (20 of 500 steps)" in capsys.readouterr().err
    assert finetune_config(run_config, context=512, steps=500)["recipe"]["warmup_steps"] == 20
    with pytest.raises(ValueError, match="--warmup 9 is longer than --steps 5"):
        finetune_config(run_config, context=512, steps=5, warmup_steps=9)


# ------------------------------------------------------------------------------------- did you mean
def test_misspelled_names_get_a_suggestion(capsys):
    with pytest.raises(ValueError, match=r"unknown preset 'jsb-tiy' \(did you mean 'jsb-tiny'\?\); valid presets"):
        get_preset("jsb-tiy")
    with pytest.raises(ValueError, match=r"unknown positional encoding 'pop' \(did you mean 'pope'\?\)"):
        resolve_run_config("jsb-tiny", "pop")
    with pytest.raises(ValueError, match=r"no option 'delta_int' \(did you mean 'delta_init'\?\)"):
        resolve_run_config("jsb-tiny", "pope:delta_int=zero")
    with pytest.raises(ValueError, match=r"no key 'recipe.max_step' \(did you mean 'recipe.max_steps'\?\)"):
        resolve_run_config("jsb-tiny", "pope", overrides=["recipe.max_step=3"])
    with pytest.raises(ValueError, match=r"unknown preset 'qwertyuiop'; valid presets"):  # nothing close: no guess
        get_preset("qwertyuiop")
    with pytest.raises(SystemExit) as exited:
        main(["train", "jsb-tiny", "--pee", "pope", "--out", "x"])
    assert exited.value.code == 2
    assert "pope train: error: unrecognized arguments: --pee (did you mean '--pe'?) pope" in capsys.readouterr().err


# ------------------------------------------------------------------------------- evaluation defaults
def test_eval_accuracy_defaults_to_the_runs_own_task_data(tmp_path, capsys):
    splits = task.write_splits(tmp_path / "ii", seed=0, sizes={"train": 256, "valid": 32, "test": 24})
    overrides = TINY + [f"train.data_dir={splits}", "train.progress=false"]
    run_training(resolve_run_config("indirect-indexing-tiny", "rope", overrides=overrides), tmp_path / "run")
    capsys.readouterr()
    assert main(["eval", "accuracy", str(tmp_path / "run"), "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["examples"] == 24 and result["data"].endswith("test.txt")
    assert main(["eval", "accuracy", str(tmp_path / "run"), "--split", "valid", "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 32


@pytest.fixture
def toy_runs(tmp_path):
    """Two untrained runs whose config.json names a toy prepared dataset (vocab 90), and one on other data."""
    rng = np.random.default_rng(0)
    for name in ("data", "other"):
        with PreparedWriter(tmp_path / name, 90) as writer:
            for split, lengths in (("train", (40,)), ("valid", (40,)), ("test", (70, 50))):
                for n in lengths:
                    writer.add_document(split, rng.integers(0, 88, size=n))
            writer.finish({"name": f"toy-{name}", "vocab": {"pad_id": None}})
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=90, n_layer=1, n_head=2, d_model=16, max_seq_len=16, pe="pope")
    for run, data in (("a", "data"), ("b", "data"), ("c", "other")):
        save_checkpoint(
            tmp_path / run / "checkpoints" / "last",
            model_state=GPT(config).state_dict(),
            model_config=config.to_dict(),
            trainer_state={"step": 0},
        )
        run_config = {"preset": "toy", "pe": "pope", "train": {"data_dir": str(tmp_path / data)}, "recipe": {}}
        (tmp_path / run / "config.json").write_text(json.dumps(run_config))
    return tmp_path


def test_eval_length_defaults_to_the_runs_data_and_directory(toy_runs, monkeypatch, capsys):
    work = toy_runs / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["--lengths", "8,16", "--device", "cpu"]
    assert main(["eval", "length", str(toy_runs / "a"), *args]) == 0
    out = toy_runs / "a" / "eval" / "length-toy-data-test-8-16"
    assert {"length.csv", "length.md", "length.json", "length.png"} <= {p.name for p in out.iterdir()}
    assert (toy_runs / "a" / "eval" / "length-toy-data-test-8-16.json").is_file()
    assert list(work.iterdir()) == []  # nothing in the current directory
    captured = capsys.readouterr()
    assert f"wrote {out / 'length.csv'}" in captured.out
    assert "\r" not in captured.out + captured.err and "win/s" not in captured.err  # no bar frames in a redirected log
    assert main(["eval", "length", str(toy_runs / "a"), str(toy_runs / "b"), *args]) == 1
    assert "give --out DIR for the table of several runs" in capsys.readouterr().err
    assert main(["eval", "length", str(toy_runs / "a"), str(toy_runs / "c"), *args, "--out", "both"]) == 1
    error = capsys.readouterr().err
    assert "the runs trained on different data" in error and "give --data NAME" in error
    assert not (work / "both").exists()
