"""What the end-to-end tests of `pope eval`, `pope analyze`, `pope finetune` and `pope report` share
(tests/test_eval_runs.py, test_eval_length.py, test_eval_finetune.py, test_eval_analyze.py, test_eval_report_*.py):
a toy prepared dataset and two tiny runs trained by pope.train as a module fixture, and synthetic run and sweep
directories."""

import json

import numpy as np
import pytest

from pope.data.writer import PreparedWriter

TEST_DOC_LENGTHS = (40, 100, 70, 9)


def _document(rng, n):
    """A learnable toy 'piece': an 8-token motif transposed up by one every repetition."""
    motif = rng.integers(0, 80, size=8)
    return np.array([(motif[i % 8] + i // 8) % 88 for i in range(n)])


def _write_dataset(path, vocab=90, name="toy"):
    rng = np.random.default_rng(0)
    with PreparedWriter(path, vocab) as writer:
        for n in (300, 200, 250):
            writer.add_document("train", _document(rng, n))
        for n in (60, 50):
            writer.add_document("valid", _document(rng, n))
        for n in TEST_DOC_LENGTHS:
            writer.add_document("test", _document(rng, n))
        writer.finish({"name": name, "vocab": {"pad_id": None}})
    return path


@pytest.fixture(scope="module", name="workspace")
def workspace_fixture(tmp_path_factory):
    """A prepared toy dataset and two 4-step runs (RoPE, PoPE) trained by pope.train at context 16."""
    from pope.train.run_config import resolve_run_config
    from pope.train.trainer import run_training

    root = tmp_path_factory.mktemp("eval_runs")
    data = _write_dataset(root / "data")
    runs = {}
    for pe in ("rope", "pope"):
        config = resolve_run_config(
            "jsb-tiny",
            pe,
            seed=0,
            overrides=[
                "model.n_layer=1",
                "model.d_model=32",
                "model.max_seq_len=16",
                "recipe.seq_len=16",
                "recipe.max_steps=4",
                "recipe.warmup_steps=1",
                "recipe.batch_size=4",
                "recipe.eval_interval=2",
                "recipe.eval_batches=2",
                f"train.data_dir={data}",
                "train.tensorboard=false",
                "train.progress=false",
                "train.device=cpu",
            ],
        )
        run_training(config, root / pe)
        runs[pe] = root / pe
    return {"root": root, "data": data, **runs}


def _fake_run(path, preset, pe, seed, test_losses, length_ppl=None, finished=True, at_best_valid=None):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"preset": preset, "pe": pe, "seed": seed}))
    records = [
        {"step": 100 * (i + 1), "kind": "eval", "test_loss": v, "valid_loss": v} for i, v in enumerate(test_losses)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"step": 100 * len(test_losses), "finished": finished}
    if at_best_valid is not None:  # the test loss of the evaluation checkpoints/best holds
        summary.update(
            best_metric="valid_loss",
            best_step=100 + 100 * seed,
            at_best_valid={"valid_loss": 0.4, "test_loss": at_best_valid},
        )
    (path / "summary.json").write_text(json.dumps(summary))
    if length_ppl:
        (path / "eval").mkdir()
        (path / "eval" / "length-jsb-test.json").write_text(
            json.dumps(
                {
                    "data_name": "jsb",
                    "split": "test",
                    "results": [{"length": length, "perplexity": ppl} for length, ppl in length_ppl.items()],
                }
            )
        )
    return str(path)


def _task_run(path, pe, seed, accuracies, *, finished=True, overrides=(), train_accuracy=None, every=5000):
    """A synthetic indirect-indexing run (as `pope train --seeds` writes it): config, eval records with
    test accuracy, summary, and optionally eval/task_accuracy.json."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "preset": "indirect-indexing",
        "pe": pe,
        "seed": seed,
        "recipe": {"lr": 2e-4},
        "train": {"autocast": "auto", "progress": False, "max_seconds": 480},
    }
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        config.setdefault(section, {})[name] = value
    (path / "config.json").write_text(json.dumps(config))
    records = [
        {"step": every * (i + 1), "kind": "eval", "test_accuracy": a, "valid_accuracy": a, "test_loss": 1.0}
        for i, a in enumerate(accuracies)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "summary.json").write_text(json.dumps({"finished": finished}))
    if train_accuracy is not None:
        (path / "eval").mkdir()
        (path / "eval" / "task_accuracy.json").write_text(
            json.dumps(
                {
                    "checkpoint": "last",
                    "step": 1,
                    "splits": {"train": {"accuracy": train_accuracy}, "test": {"accuracy": accuracies[-1]}},
                }
            )
        )


def _sweep(directory, pe, finals, *, overrides=(), unfinished=(), train_accuracy=None):
    directory.mkdir(parents=True)
    (directory / "sweep.json").write_text(
        json.dumps({"preset": "indirect-indexing", "pe": pe, "overrides": ["train.max_seconds=480", *overrides]})
    )
    for seed, final in enumerate(finals):
        _task_run(
            directory / f"seed-{seed}",
            pe,
            seed,
            [0.02, final],
            overrides=overrides,
            train_accuracy=None if train_accuracy is None else train_accuracy[seed],
        )
    for seed in unfinished:
        _task_run(directory / f"seed-{seed}", pe, seed, [0.5], finished=False, overrides=overrides)
    return str(directory)
