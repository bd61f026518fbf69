"""What the seed-sweep test modules share (tests/test_train_sweep.py, test_train_sweep_resume.py,
test_train_sweep_merge.py): a small indirect-indexing dataset as a module fixture, the --set list of a tiny CPU run,
and the environment in which a child `pope` process imports this checkout's pope."""

import os
from pathlib import Path

import pytest

from pope.data import indirect_indexing as task

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module", name="splits")
def splits_fixture(tmp_path_factory):
    return task.write_splits(tmp_path_factory.mktemp("ii"), seed=0, sizes={"train": 512, "valid": 64, "test": 64})


def _sets(splits, steps=4, *extra):
    items = [
        "model.n_layer=1",
        "model.d_model=16",
        "model.n_head=2",
        f"recipe.max_steps={steps}",
        "recipe.warmup_steps=1",
        "recipe.eval_interval=2",
        "recipe.batch_size=8",
        f"train.data_dir={splits}",
        "train.log_interval=1",
        "train.tensorboard=false",
        "train.device=cpu",
        *extra,
    ]
    return [x for item in items for x in ("--set", item)]


def _env():
    return {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
