"""Evaluation against the wrong data: every command that scores a run on data the user names refuses data of another
kind than the run trained on, naming both (the run's data and what was given), before any model is loaded; data of
the run's kind is scored as before."""

import json
from pathlib import Path

import numpy as np
import pytest

from pope.cli import main as pope_main
from pope.data import indirect_indexing as task
from pope.data.writer import PreparedWriter
from pope.train.run_config import resolve_run_config
from pope.train.trainer import run_training

TINY = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "recipe.max_steps=2",
    "recipe.warmup_steps=1",
    "recipe.eval_interval=2",
    "recipe.batch_size=4",
    "train.tensorboard=false",
    "train.progress=false",
]


def _prepared(directory: Path, name: str, tokens: list[str] | int, pad_id: int | None = 0, tokenizer=None) -> Path:
    """A small prepared dataset of documents of 40 tokens (ids 1..size-1); ``tokens`` lists the token strings or
    gives the size of a vocabulary a tokenizer names (``tokenizer``, as text datasets record GPT-2's)."""
    size = tokens if isinstance(tokens, int) else len(tokens)
    vocab = {"tokens": None, "tokenizer": tokenizer} if isinstance(tokens, int) else {"tokens": tokens}
    rng = np.random.default_rng(size)
    with PreparedWriter(directory, size) as writer:
        for split, count in (("train", 8), ("valid", 2), ("test", 2)):
            for _ in range(count):
                writer.add_document(split, rng.integers(1, size, 40))
        writer.finish(
            {
                "name": name,
                "vocab": {**vocab, "pad_id": pad_id},
                "seq_len": 32,
                "request": {"dataset": name},
                "source": {"description": "test"},
                "train_transform": None,
            }
        )
    return directory


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Runs of each kind and data of each kind: a run on chorale-like documents, a run on the indirect-indexing task,
    a dataset with the chorales' vocabulary under another name, one with another vocabulary, and task files."""
    root = tmp_path_factory.mktemp("eval-data")
    notes = [f"n{i}" for i in range(30)]
    data = {
        "docs": _prepared(root / "docs", "notes", notes),
        "same-vocab": _prepared(root / "same-vocab", "notes-b", notes),
        "other-vocab": _prepared(root / "other-vocab", "events", [f"e{i}" for i in range(45)]),
        "splits": task.write_splits(root / "ii", seed=0, sizes={"train": 64, "valid": 16, "test": 16}),
        "query-first": task.write_splits(
            root / "ii-qf",
            seed=0,
            sizes={"train": 64, "valid": 16, "test": 16},
            options=task.TaskOptions(query_first=True),
        ),
    }
    docs_run = resolve_run_config(
        "jsb-tiny",
        "pope",
        overrides=[
            *TINY,
            f"train.data_dir={data['docs']}",
            "model.vocab_size=30",
            "model.max_seq_len=32",
            "recipe.seq_len=32",
        ],
    )
    run_training(docs_run, root / "docs-run")
    task_run = resolve_run_config(
        "indirect-indexing-tiny", "pope", overrides=[*TINY, f"train.data_dir={data['splits']}"]
    )
    run_training(task_run, root / "task-run")
    return {"root": root, "docs-run": root / "docs-run", "task-run": root / "task-run", **data}


def _error(capsys) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------------------------ eval accuracy
def test_accuracy_of_a_document_run_on_task_examples_is_refused_naming_both(world, capsys):
    run = world["docs-run"]
    assert pope_main(["eval", "accuracy", str(run), "--data", str(world["splits"] / "test.txt")]) == 1
    line = _error(capsys)
    assert f"{run} was trained on dataset '{world['docs']}', not on the indirect-indexing task" in line
    assert "a file of indirect-indexing examples" in line and f"pope eval length {run} --data {world['docs']}" in line


@pytest.mark.parametrize(
    "given, fragments",
    [
        ("query-first/test.txt", ["whose examples are in the paper's order", "has examples query first"]),
        ("splits", ["a directory of indirect-indexing example files: a directory, not a file of examples"]),
        ("docs", ["prepared dataset 'notes': a directory, not a file of examples"]),
        ("docs/test.bin", ["a file of prepared dataset 'notes': its first line is not an indirect-indexing example"]),
        ("missing.txt", ["does not exist"]),
    ],
)
def test_accuracy_of_a_task_run_on_other_data_is_refused_naming_both(world, capsys, given, fragments):
    first, _, rest = given.partition("/")
    path = (world[first] / rest) if first in world and rest else world.get(first, world["root"] / given)
    assert pope_main(["eval", "accuracy", str(world["task-run"]), "--data", str(path)]) == 1
    line = _error(capsys)
    assert f"{world['task-run']} was trained on the indirect-indexing task" in line, line
    assert f"e.g. --data {world['splits'] / 'test.txt'}" in line and all(f in line for f in fragments), line


def test_accuracy_of_a_task_run_on_its_own_examples_is_scored(world, capsys):
    assert pope_main(["eval", "accuracy", str(world["task-run"]), "--data", str(world["splits"] / "test.txt")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("accuracy ") and "/16)" in out and "notice" not in err


def test_accuracy_on_examples_outside_the_training_task_is_scored_with_a_notice(world, tmp_path, capsys):
    lines = (world["splits"] / "test.txt").read_text().splitlines()
    narrow = tmp_path / "narrow.txt"
    narrow.write_text("\n".join(lines) + "\n")
    run = world["task-run"]
    config = json.loads((run / "config.json").read_text())
    config["recipe"]["dataset"] = "indirect-indexing:min_len=20,max_len=25"  # as if it trained on shorter strings
    (run / "config.json").write_text(json.dumps(config))
    try:
        assert pope_main(["eval", "accuracy", str(run), "--data", str(narrow)]) == 0
    finally:
        config["recipe"]["dataset"] = "indirect-indexing"
        (run / "config.json").write_text(json.dumps(config))
    assert "holds examples outside what" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------------- eval length
def _length(run, data, tmp_path):
    return pope_main(["eval", "length", str(run), "--data", str(data), "--lengths", "8", "--out", str(tmp_path / "o")])


@pytest.mark.parametrize(
    "given, fragments",
    [
        ("other-vocab", ["dataset 'notes', 30 token ids", "dataset 'events'", "45 token ids) with another vocabulary"]),
        ("splits", ["a directory of indirect-indexing example files: not a prepared dataset"]),
        ("splits/test.txt", ["a file of indirect-indexing examples: not a prepared dataset"]),
        ("docs/test.bin", ["a file of prepared dataset 'notes': not a prepared dataset"]),
    ],
)
def test_length_of_a_document_run_on_other_data_is_refused_naming_both(world, tmp_path, capsys, given, fragments):
    first, _, rest = given.partition("/")
    path = world[first] / rest if rest else world[first]
    assert _length(world["docs-run"], path, tmp_path) == 1
    line = _error(capsys)
    assert f"{world['docs-run']} was trained on dataset '{world['docs']}'" in line, line
    assert f"give --data {world['docs']}" in line and all(f in line for f in fragments), line
    assert not (tmp_path / "o" / "length.csv").exists()


def test_length_of_a_document_run_on_an_unprepared_other_dataset_is_refused(world, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POPE_DATA_DIR", str(tmp_path / "empty"))
    run = world["root"] / "named-run"
    if not run.exists():  # a run recorded as trained on the registry's jsb (its data need not be here)
        run.mkdir()
        config = json.loads((world["docs-run"] / "config.json").read_text())
        config["train"]["data_dir"] = None
        (run / "config.json").write_text(json.dumps(config))
        (run / "checkpoints").symlink_to(world["docs-run"] / "checkpoints")
    assert _length(run, "maestro", tmp_path) == 1
    line = _error(capsys)
    assert f"{run} was trained on dataset 'jsb', but --data 'maestro' is another dataset" in line, line


def test_length_of_a_task_run_is_refused_pointing_at_eval_accuracy(world, tmp_path, capsys):
    assert _length(world["task-run"], world["docs"], tmp_path) == 1
    line = _error(capsys)
    assert (
        f"{world['task-run']} was trained on the indirect-indexing task" in line and "not on a prepared dataset" in line
    )
    assert f"pope eval accuracy {world['task-run']} --data {world['splits'] / 'test.txt'}" in line


def test_length_on_its_own_data_and_on_data_with_its_vocabulary(world, tmp_path, capsys):
    assert _length(world["docs-run"], world["docs"], tmp_path) == 0
    assert "notice" not in capsys.readouterr().err
    assert _length(world["docs-run"], world["same-vocab"], tmp_path) == 0  # another name, the same token ids
    err = capsys.readouterr().err
    assert "was trained on dataset 'notes'; scoring it on 'notes-b'" in err and "same vocabulary and tokenizer" in err


# --------------------------------------------------------------------------------------- analyze frequencies
def test_frequencies_refuse_data_and_text_of_another_kind(world, tmp_path, capsys):
    text = tmp_path / "sonnet.txt"
    text.write_text("Shall I compare thee to a summer's day?\n")
    out = ["--out", str(tmp_path / "f")]
    assert pope_main(["analyze", "frequencies", str(world["docs-run"]), "--data", str(world["other-vocab"]), *out]) == 1
    assert "with another vocabulary" in _error(capsys)
    for tokenizer in ("gpt2", "bytes"):
        args = ["analyze", "frequencies", str(world["docs-run"]), "--text", str(text), "--tokenizer", tokenizer, *out]
        assert pope_main(args) == 1
        line = _error(capsys)
        assert f"trained on dataset '{world['docs']}' (its own vocabulary, not a text tokenizer)" in line
        assert f"read with the {tokenizer} tokenizer; analyse it with --data" in line
    assert pope_main(["analyze", "frequencies", str(world["task-run"]), "--data", str(world["docs"]), *out]) == 1
    assert "was trained on the indirect-indexing task" in _error(capsys)
    assert not (tmp_path / "f").exists() or not any((tmp_path / "f").iterdir())


def test_a_fine_tune_on_a_dataset_of_another_vocabulary_is_refused(world, tmp_path, capsys):
    run = world["docs-run"]
    args = ["finetune", str(run), "--context", "64", "--steps", "1", "--warmup", "1", "--out", str(tmp_path / "ft")]
    assert pope_main([*args, "--set", f"train.data_dir={world['other-vocab']}"]) == 1
    line = _error(capsys)
    assert f"{run} was trained on dataset '{world['docs']}'" in line and "dataset 'events'" in line
    assert not (tmp_path / "ft" / "checkpoints").exists()


def test_a_text_run_read_with_another_tokenizer_is_refused(world, tmp_path, capsys):
    """A run on GPT-2 tokens (a vocabulary a tokenizer names, as the text datasets record it) given text read with
    the bytes tokenizer: 256 ids fit its vocabulary, so only the recorded tokenizer tells them apart."""
    data = _prepared(
        tmp_path / "text", "prose", 300, pad_id=None, tokenizer={"library": "tiktoken", "encoding": "gpt2"}
    )
    config = resolve_run_config(
        "jsb-tiny",
        "pope",
        overrides=[
            *TINY,
            f"train.data_dir={data}",
            "model.vocab_size=300",
            "model.max_seq_len=32",
            "recipe.seq_len=32",
        ],
    )
    run_training(config, tmp_path / "run")
    text = tmp_path / "sonnet.txt"
    text.write_text("Shall I compare thee to a summer's day?\n")
    args = ["analyze", "frequencies", str(tmp_path / "run"), "--text", str(text), "--tokenizer", "bytes"]
    assert pope_main([*args, "--out", str(tmp_path / "f")]) == 1
    line = _error(capsys)
    assert "(the gpt2 tokenizer), but --text is read with the bytes tokenizer; pass --tokenizer gpt2" in line
    lm_eval_model = pytest.importorskip("pope.eval.lm_eval_model")
    with pytest.raises(ValueError, match="read with the bytes tokenizer; pass --tokenizer gpt2"):
        lm_eval_model.PoPELM(path=str(tmp_path / "run"), tokenizer="bytes")
