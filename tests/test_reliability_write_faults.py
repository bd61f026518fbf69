"""Faults during writes: a process killed mid-write, a full disk (writes made to fail with ENOSPC), a read-only
directory (made to fail with EACCES/EROFS, so the tests run the same as root and unprivileged). Nothing half-written
is left looking whole, nothing earlier is lost, and the next command says what to do."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY_RUN_SETS, splits_fixture, tiny_run_sets  # noqa: F401  (the fixture `splits`)

from pope import checkpoint as ckpt
from pope import files
from pope.cli import main as pope_main
from pope.train import trainer as trainer_module
from pope.train.metrics import MetricsLogger, read_metrics

SRC = str(Path(__file__).resolve().parents[1] / "src")
SETS = [*TINY_RUN_SETS, "train.checkpoint_interval=1"]


def _train_args(splits, run_dir, *extra):
    args = ["train", "indirect-indexing-tiny", "--pe", "pope", "--out", str(run_dir)]
    for item in tiny_run_sets(splits, *extra, base=SETS):
        args += ["--set", item]
    return args


@pytest.fixture(scope="module")
def straight(splits, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    assert pope_main(_train_args(splits, run)) == 0
    return {r["step"]: r["loss"] for r in read_metrics(run) if r["kind"] == "train"}


def _losses(run):
    return {r["step"]: r["loss"] for r in read_metrics(run) if r["kind"] == "train"}


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _hidden_temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*tmp*"))


# ------------------------------------------------------------------------------------------ atomic text writes
def test_a_write_that_fails_on_a_full_disk_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text('{"kept": true}\n')
    monkeypatch.setattr(files.os, "fsync", _full_disk)
    with pytest.raises(OSError, match=rf"No space left on device.*{target}") as caught:
        files.write_json_atomic(target, {"new": True})
    assert caught.value.filename == str(target)  # the file meant, not the hidden temporary
    assert target.read_text() == '{"kept": true}\n'
    assert _hidden_temporaries(tmp_path) == []


def test_a_write_killed_before_its_rename_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "config.json"
    target.write_text('{"kept": true}\n')
    code = (
        "import os, sys; from pope import files\n"
        "files.os.replace = lambda *a: os._exit(9)  # killed between the write and the rename\n"
        "files.write_json_atomic(sys.argv[1], {'new': True})\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(target)], env={**os.environ, "PYTHONPATH": SRC})
    assert result.returncode == 9
    assert json.loads(target.read_text()) == {"kept": True}  # never half-written under its own name
    files.write_json_atomic(target, {"next": True})  # the next write is not in the way of the killed one's temporary
    assert json.loads(target.read_text()) == {"next": True}


# ------------------------------------------------------------------------------------------------ checkpoints
def test_a_checkpoint_write_on_a_full_disk_keeps_the_previous_checkpoint(splits, tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert pope_main(_train_args(splits, run, "train.stop_at_step=2")) == 0
    last = run / "checkpoints" / "last"
    before = {p.name: p.read_bytes() for p in last.iterdir()}
    monkeypatch.setattr(ckpt.torch, "save", _full_disk)
    with pytest.raises(OSError, match=r"No space left on device while writing checkpoint .*previous checkpoint there"):
        ckpt.save_checkpoint(last, model_state={"w": torch.zeros(2)}, model_config={}, trainer_state={"step": 3})
    assert {p.name: p.read_bytes() for p in last.iterdir()} == before
    assert _hidden_temporaries(run / "checkpoints") == []
    assert ckpt.checkpoint_step(last) == 2


# --------------------------------------------------------------------------------------------- during training
@pytest.mark.parametrize("where", ["checkpoint", "metrics", "summary"])
def test_a_full_disk_mid_run_is_one_error_and_the_run_resumes(splits, straight, tmp_path, monkeypatch, capsys, where):
    run = tmp_path / "run"
    if where == "checkpoint":  # the 4th checkpoint write fails
        real, calls = ckpt.torch.save, []

        def save(*args, **kwargs):
            calls.append(1)
            return _full_disk() if len(calls) == 4 else real(*args, **kwargs)

        monkeypatch.setattr(ckpt.torch, "save", save)
    elif where == "metrics":  # the record of step 5 cannot be appended
        real_log = MetricsLogger.log
        monkeypatch.setattr(
            MetricsLogger, "log", lambda self, record: _full_disk() if record["step"] == 5 else real_log(self, record)
        )
    else:  # everything trained, summary.json cannot be written
        real_write = trainer_module.write_text_atomic
        monkeypatch.setattr(
            trainer_module,
            "write_text_atomic",
            lambda path, text: _full_disk() if Path(path).name == "summary.json" else real_write(path, text),
        )
    assert pope_main(_train_args(splits, run)) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and f"training {run} stopped at step" in line
    assert f"continue with: pope train --resume {run}" in line
    step = ckpt.checkpoint_step(run / "checkpoints" / "last")
    assert f"checkpoints/last (step {step}) is intact" in line
    assert not (run / "summary.json").exists()  # no summary claims a result the run does not have
    assert _hidden_temporaries(run) == []
    monkeypatch.undo()
    assert pope_main(["train", "--resume", str(run)]) == 0
    assert _losses(run) == straight  # the continued run is the uninterrupted one
    assert json.loads((run / "summary.json").read_text())["finished"]


def test_a_run_directory_that_became_read_only_is_refused_on_resume(splits, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert pope_main(_train_args(splits, run, "train.stop_at_step=2")) == 0
    capsys.readouterr()
    before = sorted(p.name for p in run.rglob("*"))

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr("tempfile.mkstemp", read_only)  # the write probe of check_output_dir
    assert pope_main(["train", "--resume", str(run)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"--resume: {run} cannot be written" in line and "Read-only file system" in line
    assert f"make it writable (chmod -R u+w {run}), or copy the run to a writable place" in line
    assert sorted(p.name for p in run.rglob("*")) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_run_directory_really_refuses_on_resume(splits, tmp_path, capsys):
    run = tmp_path / "run"
    assert pope_main(_train_args(splits, run, "train.stop_at_step=2")) == 0
    capsys.readouterr()
    os.chmod(run, 0o555)
    try:
        assert pope_main(["train", "--resume", str(run)]) == 1
        assert "make it writable" in _one_error_line(capsys.readouterr().err)
    finally:
        os.chmod(run, 0o755)


def test_an_evaluation_into_a_read_only_directory_fails_before_any_work(splits, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert pope_main(_train_args(splits, run, "train.stop_at_step=2")) == 0
    capsys.readouterr()
    monkeypatch.setattr("tempfile.mkstemp", lambda *a, **k: (_ for _ in ()).throw(PermissionError(errno.EACCES, "x")))
    args = ["eval", "length", str(run), "--data", "jsb", "--lengths", "8", "--out", str(tmp_path / "out")]
    assert pope_main(args) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"--out {tmp_path / 'out'} cannot be written" in line and "choose a writable directory" in line
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------- a process killed (-9)
def test_a_run_killed_mid_write_resumes_from_its_last_checkpoint(splits, tmp_path):
    """SIGKILL at an arbitrary moment of a real training process (no handler runs): every record left is whole or
    a torn last metrics line, the checkpoint verifies, and `pope train --resume RUN` continues it."""
    run = tmp_path / "run"
    args = _train_args(splits, run, "recipe.max_steps=100000", "recipe.eval_interval=100000")
    process = subprocess.Popen(
        [sys.executable, "-m", "pope.cli", *args],
        env={**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    metrics = run / "metrics.jsonl"
    for _ in range(1200):
        if process.poll() is not None or (metrics.exists() and metrics.read_text().count("\n") >= 6):
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    step = ckpt.checkpoint_step(run / "checkpoints" / "last")
    assert step is not None and step >= 1
    json.loads((run / "config.json").read_text())  # whole: written atomically
    assert not (run / "summary.json").exists()
    stop = step + 2
    assert pope_main(["train", "--resume", str(run), "--set", f"train.stop_at_step={stop}"]) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, stop + 1))
    assert json.loads((run / "summary.json").read_text())["step"] == stop


def test_any_command_whose_write_the_disk_refuses_says_to_rerun(splits, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert pope_main(_train_args(splits, run, "train.stop_at_step=2")) == 0
    capsys.readouterr()
    monkeypatch.setattr(files.os, "fsync", _full_disk)
    assert pope_main(["analyze", "delta", str(run)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    out = run / "eval" / "delta_state.json"
    assert f"No space left on device: '{out}'" in line and "free space or make the directory writable" in line
    assert not out.exists() and _hidden_temporaries(run) == []


def test_evaluating_a_run_whose_best_checkpoint_is_torn_names_the_other_one(splits, tmp_path, capsys):
    run = tmp_path / "run"
    assert pope_main(_train_args(splits, run, "train.stop_at_step=3")) == 0
    capsys.readouterr()
    weights = run / "checkpoints" / "best" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert pope_main(["eval", "accuracy", str(run), "--data", str(splits / "test.txt")]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "model.safetensors is truncated" in line and f"give {run / 'checkpoints' / 'last'} instead" in line
    assert pope_main(["eval", "accuracy", str(run / "checkpoints" / "last"), "--data", str(splits / "test.txt")]) == 0


def test_a_full_disk_before_the_first_checkpoint_says_to_start_again(splits, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    monkeypatch.setattr(ckpt.torch, "save", _full_disk)
    assert pope_main(_train_args(splits, run)) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and "no checkpoint was written yet" in line
    assert "start the run again with another --out" in line
    assert not (run / "checkpoints" / "last").exists() and _hidden_temporaries(run) == []
