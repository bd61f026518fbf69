"""End-to-end CPU runs of the trainer in this process: resume equivalence, gradient accumulation, a tiny preset
learning, run records. Runs of 2 gloo processes (DDP / FSDP2 vs 1 process, resume): tests/test_train_world_size.py."""

import json
from pathlib import Path

import pytest
import torch

from pope.checkpoint import load_checkpoint
from pope.data import indirect_indexing as task
from pope.train.run_config import resolve_run_config
from pope.train.trainer import run_training

SMALL_MODEL = ["model.n_layer=2", "model.d_model=32", "model.n_head=2"]


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    return task.write_splits(tmp_path_factory.mktemp("ii"), seed=0, sizes={"train": 2048, "valid": 128, "test": 128})


def _sets(splits, steps, *extra):
    return [
        *SMALL_MODEL,
        f"recipe.max_steps={steps}",
        "recipe.warmup_steps=4",
        "recipe.eval_interval=6",
        "recipe.batch_size=16",
        f"train.data_dir={splits}",
        "train.log_interval=1",
        "train.tensorboard=false",
        "train.progress=false",
        *extra,
    ]


def _train_losses(run_dir):
    return {
        r["step"]: r["loss"]
        for r in map(json.loads, (Path(run_dir) / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    }


def test_resume_is_bit_for_bit(splits, tmp_path):
    # dropout > 0 so the restored torch RNG state matters too
    sets = _sets(splits, 12, "model.dropout=0.1")
    config = resolve_run_config("indirect-indexing-tiny", "pope", seed=3, overrides=sets)
    run_training(config, tmp_path / "straight")
    stopped = resolve_run_config("indirect-indexing-tiny", "pope", seed=3, overrides=sets + ["train.stop_at_step=7"])
    summary = run_training(stopped, tmp_path / "resumed")
    assert summary["step"] == 7 and not summary["finished"]
    run_training(config, tmp_path / "resumed", resume=True)
    straight, resumed = _train_losses(tmp_path / "straight"), _train_losses(tmp_path / "resumed")
    assert sorted(resumed) == list(range(1, 13))
    assert resumed == straight  # exact float equality, every step
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last")
    for name, tensor in a.model_state.items():
        assert torch.equal(tensor, b.model_state[name]), name
    assert (tmp_path / "resumed" / "env.resume-7.json").exists()


def test_gradient_accumulation_matches_full_batch(splits, tmp_path):
    one = resolve_run_config("indirect-indexing-tiny", "rope", overrides=_sets(splits, 5))
    two = resolve_run_config("indirect-indexing-tiny", "rope", overrides=_sets(splits, 5, "recipe.grad_accum=4"))
    run_training(one, tmp_path / "a")
    run_training(two, tmp_path / "b")
    evaluation = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[-1])
    assert evaluation["kind"] == "eval" and not any(key.startswith("delta_") for key in evaluation)  # RoPE: no delta
    a, b = _train_losses(tmp_path / "a"), _train_losses(tmp_path / "b")
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6)


def test_delta_range_project_keeps_delta_inside_after_every_step(splits, tmp_path):
    """delta_range="project": the trainer clamps delta in place after each optimizer step, so the parameter never
    leaves [-2π, 0]; with the forward-pass clamp, the same run (zero init, a large learning rate) leaves entries
    outside, frozen."""
    from pope.encodings import TWO_PI
    from pope.eval.delta_state import delta_state
    from pope.eval.runs import load_run_model

    states = {}
    for bound in ("clamp", "project"):
        config = resolve_run_config(
            "indirect-indexing-tiny",
            f"pope:delta_range={bound},delta_init=zero",
            overrides=_sets(splits, 8, "recipe.lr=0.05"),
        )
        run_training(config, tmp_path / bound)
        model, _ = load_run_model(tmp_path / bound / "checkpoints" / "last")
        states[bound] = delta_state(model)
        deltas = torch.cat([block.attn.pe.delta.flatten() for block in model.blocks])
        if bound == "project":
            assert deltas.min() >= -TWO_PI and deltas.max() <= 0 and (deltas == 0).any() and (deltas < 0).any()
        # every evaluation logs the counts; the last one's are the final model's
        evals = [
            r
            for r in map(json.loads, (tmp_path / bound / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "eval"
        ]
        assert [r["step"] for r in evals] == [6, 8]
        last = evals[-1]
        assert last["delta_below"] + last["delta_above"] == states[bound]["outside"]
        assert (last["delta_below"], last["delta_above"]) == (
            sum(layer["below"] for layer in states[bound]["layers"]),
            sum(layer["above"] for layer in states[bound]["layers"]),
        )
    assert states["clamp"]["outside"] > 0 and states["project"]["outside"] == 0


def test_linear_decay_and_decay_of_all_parameters_reach_the_trainer(splits, tmp_path):
    """recipe.lr_decay=linear sets the learning rate of every logged step; recipe.weight_decay_params=all
    puts every parameter, PoPE's delta included, in the decayed group; both are recorded in config.json
    (and left out when at their defaults, so runs recorded before them still resume and group with new ones)."""
    from pope.train.schedule import WarmupDecaySchedule
    from pope.train.trainer import Trainer

    sets = _sets(splits, 10, "recipe.lr_decay=linear", "recipe.weight_decay_params=all")
    config = resolve_run_config("indirect-indexing-tiny", "pope", overrides=sets)
    trainer = Trainer(config, tmp_path / "run")
    try:
        assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [config.recipe.weight_decay]
        assert any(p is trainer.model.blocks[0].attn.pe.delta for p in trainer.optimizer.param_groups[0]["params"])
        trainer.train()
    finally:
        trainer.close()
    expected = WarmupDecaySchedule(config.recipe.lr, config.recipe.min_lr, 4, 10, "linear")
    logged = {
        r["step"]: r["lr"]
        for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    }
    assert logged == {step: pytest.approx(expected(step - 1)) for step in range(1, 11)}
    assert logged[6] != pytest.approx(WarmupDecaySchedule(config.recipe.lr, config.recipe.min_lr, 4, 10)(5))
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["recipe"]
    assert (recorded["lr_decay"], recorded["weight_decay_params"]) == ("linear", "all")
    default = resolve_run_config("indirect-indexing-tiny", "pope", overrides=_sets(splits, 10)).to_dict()
    assert "lr_decay" not in default["recipe"] and "weight_decay_params" not in default["recipe"]
    assert "init" not in default["model"]  # model.init: likewise written only when set
    fan_in = resolve_run_config("indirect-indexing-tiny", "pope", overrides=_sets(splits, 10, "model.init=fan-in"))
    assert fan_in.to_dict()["model"]["init"] == "fan-in" and fan_in.model.init == "fan-in"
    with pytest.raises(ValueError, match="lr_decay"):
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=_sets(splits, 10, "recipe.lr_decay=step"))


@pytest.mark.data
@pytest.mark.slow
def test_tiny_preset_learns(tmp_path):
    """jsb-tiny on the prepared chorales (documents cut into 257-token pieces): within 40 steps the
    training loss falls far below its start and the validation loss follows."""
    config = resolve_run_config(
        "jsb-tiny",
        "pope",
        overrides=[
            "train.tensorboard=false",
            "train.progress=false",
            "train.log_interval=10",
            "recipe.max_steps=40",
            "recipe.eval_interval=40",
            "train.eval_splits=valid",
        ],
    )
    summary = run_training(config, tmp_path / "tiny")
    losses = _train_losses(tmp_path / "tiny")
    first, last = losses[10], losses[40]
    assert last < first - 1.0, (first, last)
    assert summary["final"]["valid_loss"] < first - 1.0


def test_run_records(splits, tmp_path):
    """env.json, config.json, metrics.jsonl fields and TensorBoard events of a run."""
    sets = [s for s in _sets(splits, 5) if not s.startswith("train.tensorboard")]
    config = resolve_run_config("indirect-indexing-tiny", "pope", overrides=sets)
    run_training(config, tmp_path / "run")
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert {"versions", "git", "device_name", "world_size", "command", "cuda_mps"} <= set(env)
    assert env["versions"]["torch"] == torch.__version__ and env["world_size"] == 1
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == config.to_dict()
    train = [
        r
        for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    assert {"step", "loss", "lr", "tokens_per_s", "step_ms"} <= set(train[0]) and train[0]["tokens_per_s"] > 0
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


def test_fp32_matmul_option_sets_torch_precision_and_is_recorded(splits, tmp_path):
    """train.fp32_matmul=tf32 sets PyTorch's float32 matmul precision to 'high' for the run (pope's kernels follow
    it: kernels.host.precision) and env.json records it; the default 'ieee' is 'highest' and is left out of
    config.json, so that runs recorded before the option existed still resume."""
    before = torch.get_float32_matmul_precision()
    try:
        tf32 = resolve_run_config(
            "indirect-indexing-tiny", "pope", overrides=_sets(splits, 4, "train.fp32_matmul=tf32")
        )
        run_training(tf32, tmp_path / "tf32")
        assert torch.get_float32_matmul_precision() == "high"
        assert json.loads((tmp_path / "tf32" / "env.json").read_text())["fp32_matmul_precision"] == "high"
        assert json.loads((tmp_path / "tf32" / "config.json").read_text())["train"]["fp32_matmul"] == "tf32"
        exact = resolve_run_config("indirect-indexing-tiny", "pope", overrides=_sets(splits, 4))
        run_training(exact, tmp_path / "ieee")
        assert torch.get_float32_matmul_precision() == "highest"
        assert json.loads((tmp_path / "ieee" / "env.json").read_text())["fp32_matmul_precision"] == "highest"
        assert "fp32_matmul" not in json.loads((tmp_path / "ieee" / "config.json").read_text())["train"]
    finally:
        torch.set_float32_matmul_precision(before)
    with pytest.raises(ValueError, match="fp32_matmul"):
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=_sets(splits, 4, "train.fp32_matmul=fp16"))
