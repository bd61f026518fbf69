"""pope.eval.runs.task_splits_of: a run is scored on the splits it trained on (variants included)."""

import json

import pytest

from pope.data import indirect_indexing as task
from pope.eval.runs import task_splits_of


def _run(tmp_path, dataset, data_dir=None, data_seed=3):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"recipe": {"dataset": dataset}, "train": {"data_dir": data_dir, "data_seed": data_seed}})
    )
    return run


@pytest.mark.parametrize(
    "dataset, expected",
    [
        ("indirect-indexing", task.PAPER_TASK),
        ("indirect-indexing:min_len=20,max_len=32", task.TaskOptions(min_len=20, max_len=32)),
        ("indirect-indexing:zero_shift=true,fresh=true", task.TaskOptions(zero_shift=True, fresh=True)),
        ("indirect-indexing:query_first=true", task.TaskOptions(query_first=True)),
    ],
)
def test_splits_follow_the_runs_task_variant_and_data_seed(tmp_path, monkeypatch, dataset, expected):
    calls = []
    monkeypatch.setattr(
        task,
        "ensure_splits",
        lambda directory, seed, options: calls.append((directory, seed, options)) or tmp_path / "splits",
    )
    assert task_splits_of(_run(tmp_path, dataset)) == tmp_path / "splits"
    assert calls == [(None, 3, expected)]


def test_an_explicit_data_dir_wins_and_other_datasets_are_refused(tmp_path):
    assert task_splits_of(_run(tmp_path, "indirect-indexing", data_dir="/data/ii")).as_posix() == "/data/ii"
    (tmp_path / "run" / "config.json").unlink()
    (tmp_path / "run").rmdir()
    with pytest.raises(ValueError, match="not on the indirect-indexing task"):
        task_splits_of(_run(tmp_path, "jsb"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        task_splits_of(tmp_path / "nowhere")
