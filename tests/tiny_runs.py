"""What the tests that train tiny indirect-indexing runs share (tests/test_train_reliability.py,
test_reliability_resume.py, test_reliability_write_faults.py): the run's settings, its data as a module fixture, and
the --set list with some settings replaced."""

import pytest

from pope.data import indirect_indexing as task

# 6 steps of a one-layer model, evaluated every 3 and logged every step: seconds on a CPU.
TINY_RUN_SETS = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "recipe.max_steps=6",
    "recipe.warmup_steps=1",
    "recipe.eval_interval=3",
    "recipe.batch_size=8",
    "train.log_interval=1",
    "train.tensorboard=false",
    "train.progress=false",
]


@pytest.fixture(scope="module", name="splits")
def splits_fixture(tmp_path_factory):
    """A small indirect-indexing dataset (train 256, valid 32, test 32 examples), written once per test module."""
    return task.write_splits(tmp_path_factory.mktemp("ii"), seed=0, sizes={"train": 256, "valid": 32, "test": 32})


def tiny_run_sets(splits, *extra, drop=(), base=TINY_RUN_SETS) -> list[str]:
    """base with the keys of ``extra`` replaced by them and ``drop`` left out, reading its data from ``splits``."""
    replaced = {item.partition("=")[0] for item in extra} | set(drop)
    return [s for s in base if s.partition("=")[0] not in replaced] + [f"train.data_dir={splits}", *extra]
