"""Nothing lost, nothing silently restarted: locks, resume checks, output paths, signals, records."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import splits_fixture, tiny_run_sets  # noqa: F401  (the fixture `splits`)

from pope.cli import main as pope_main
from pope.train.run_config import resolve_run_config
from pope.train.stopping import exit_status, resume_command
from pope.train.trainer import Trainer, run_training

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _config(splits, *extra, drop=()):
    return resolve_run_config("indirect-indexing-tiny", "pope", overrides=tiny_run_sets(splits, *extra, drop=drop))


def _snapshot(directory: Path) -> dict:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _steps(run_dir: Path, kind="train") -> list[int]:
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["step"] for r in records if r["kind"] == kind]


def test_second_trainer_on_a_locked_directory_fails_at_once(splits, tmp_path):
    first = Trainer(_config(splits), tmp_path / "run")
    try:
        with pytest.raises(RuntimeError, match=rf"in use by another trainer \(pid {os.getpid()} on host .*\); wait"):
            Trainer(_config(splits), tmp_path / "run")
    finally:
        first.close()
    Trainer(_config(splits), tmp_path / "other").close()  # a different directory is free


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_notice(splits, tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}) + "\n")
    Trainer(_config(splits), run_dir).close()
    assert f"taking over the lock of {run_dir} from pid {dead.pid}" in capsys.readouterr().err


def test_new_run_into_a_run_directory_is_refused_and_nothing_changes(splits, tmp_path):
    run_training(_config(splits), tmp_path / "run")
    before = _snapshot(tmp_path / "run")
    with pytest.raises(
        ValueError,
        match=r"already holds a run \(config\.json, metrics\.jsonl \(up to step 6\), "
        r"checkpoints/last \(step 6\), checkpoints/best \(step \d\)\); pass --resume",
    ):
        Trainer(_config(splits), tmp_path / "run")
    assert _snapshot(tmp_path / "run") == before


def test_resume_without_last_says_what_exists_and_loses_nothing(splits, tmp_path):
    run_dir = tmp_path / "run"
    run_training(_config(splits), run_dir)
    best_step = torch.load(run_dir / "checkpoints" / "best" / "trainer_state.pt", weights_only=True)["step"]
    shutil.rmtree(run_dir / "checkpoints" / "last")
    before = _snapshot(run_dir)
    with pytest.raises(
        ValueError,
        match=rf"no valid checkpoints/last.*checkpoints/best \(step {best_step}\).*"
        rf"copy it to checkpoints/last \(cp -r",
    ):
        Trainer(_config(splits), run_dir, resume=True)
    assert _snapshot(run_dir) == before  # metrics.jsonl not truncated, nothing restarted
    shutil.rmtree(run_dir / "checkpoints")  # killed before its first checkpoint
    with pytest.raises(ValueError, match="nothing can be resumed; start over with a new --out"):
        Trainer(_config(splits), run_dir, resume=True)


@pytest.mark.parametrize("kind", ["file", "under_file", "not_writable"])
def test_bad_out_paths_fail_before_any_work(splits, tmp_path, capsys, kind):
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    out = {"file": blocker, "under_file": blocker / "run", "not_writable": Path("/sys/pope-test-run")}[kind]
    message = {
        "file": "is an existing file, not a directory",
        "under_file": f"lies under {blocker}, which is a file",
        "not_writable": "cannot be written",
    }[kind]
    args = ["train", "indirect-indexing-tiny", "--pe", "pope", "--out", str(out)]
    for item in tiny_run_sets(splits):
        args += ["--set", item]
    assert pope_main(args) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert blocker.read_text() == "keep me"


def _signal_at_step(trainer, at_step, signum):
    eager = trainer.step_function

    def step(index):
        loss = eager(index)
        if index + 1 == at_step:
            os.kill(os.getpid(), signum)  # arrives in the middle of the run; the step still finishes
        return loss

    trainer.step_function = step


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_finishes_the_step_checkpoints_and_says_how_to_continue(splits, tmp_path, capsys, signum, status):
    config = _config(splits, "recipe.max_steps=12", "recipe.eval_interval=6")
    trainer = Trainer(config, tmp_path / "run")
    _signal_at_step(trainer, 4, signum)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["step"] == 4 and summary["stop_reason"] == signal.Signals(signum).name
    assert exit_status(summary) == status
    # not started by the pope CLI here: the hint is the command that continues the run from its own config
    assert f"stopped at step 4; continue with: pope train --resume {tmp_path / 'run'}\n" in capsys.readouterr().err
    state = torch.load(tmp_path / "run" / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 4
    assert signal.getsignal(signum) is not None and signal.getsignal(signum) != trainer  # handlers restored
    resumed = run_training(config, tmp_path / "run", resume=True)
    assert resumed["finished"] and resumed["stop_reason"] == "finished"
    assert _steps(tmp_path / "run") == list(range(1, 13))


def test_stop_at_step_ends_with_the_same_line(splits, tmp_path, capsys):
    summary = run_training(_config(splits, "train.stop_at_step=2"), tmp_path / "run")
    assert summary["stop_reason"] == "stop_at_step" and exit_status(summary) == 0
    assert "stopped at step 2; continue with: pope train" in capsys.readouterr().err


def test_resume_command_drops_stop_at_step_and_adds_resume():
    argv = [
        "/x/bin/pope",
        "train",
        "jsb-tiny",
        "--pe",
        "pope:use_delta=no",
        "--out",
        "r",
        "--set",
        "train.stop_at_step=7",
        "--set",
        "recipe.lr=1e-3",
    ]
    assert resume_command(argv, fallback="?") == (
        "pope train jsb-tiny --pe pope:use_delta=no --out r --set recipe.lr=1e-3 --resume"
    )
    assert resume_command(["pytest", "-q"], fallback="fallback") == "fallback"


def test_sigterm_through_the_cli_exits_143_and_resumes(splits, tmp_path):
    """A real process: SIGTERM while training; exit 143 after writing checkpoints/last; the printed command
    continues it to the end."""
    run_dir = tmp_path / "run"
    args = ["indirect-indexing-tiny", "--pe", "pope", "--out", str(run_dir)]
    for item in tiny_run_sets(splits, "recipe.max_steps=100000", "recipe.eval_interval=100000"):
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "pope.cli", "train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = run_dir / "metrics.jsonl"
    for _ in range(1200):
        if process.poll() is not None or (metrics.exists() and metrics.read_text().count("\n") >= 3):
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-2000:]
    line = [x for x in err.splitlines() if x.startswith("stopped at step ")][-1]
    step = int(line.split()[3].rstrip(";"))
    assert line.endswith("--resume") and "Traceback" not in err
    state = torch.load(run_dir / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    assert state["step"] == step == _steps(run_dir)[-1]


def test_tensorboard_keeps_the_checkpoint_steps_scalars_on_resume(splits, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = _config(splits, drop=["train.tensorboard"])
    stopped = _config(splits, "train.stop_at_step=3", drop=["train.tensorboard"])
    run_training(stopped, tmp_path / "run")
    run_training(config, tmp_path / "run", resume=True)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in events.Scalars("eval/valid_loss")] == [3, 6]


def test_final_evaluation_announces_each_split_in_a_plain_log(splits, tmp_path, capfd):
    """Not a terminal (a redirected log): one plain line per split, labelled, with its batch count (a terminal gets a
    bar with the same label instead)."""
    config = _config(splits, "train.eval_batch_size=4", drop=["train.progress"])
    run_training(config, tmp_path / "run")
    captured = capfd.readouterr()
    for split in ("valid", "test"):  # 32 examples in batches of 4
        assert f"final evaluation ({split}): 8 batches" in captured.out, captured.out
    assert "\r" not in captured.out + captured.err  # no progress-bar frames


def test_out_of_range_token_ids_in_training_data_name_the_file(tmp_path):
    source = Path(os.environ.get("POPE_CACHE", Path.home() / ".cache" / "pope")) / "data" / "jsb"
    if not (source / "manifest.json").exists():
        pytest.skip("the prepared JSB data is not in the offline cache")
    data = tmp_path / "jsb"
    shutil.copytree(source, data)
    tokens = np.fromfile(data / "train.bin", dtype=json.loads((data / "manifest.json").read_text())["dtype"])
    tokens[5] = 200  # beyond the 90-symbol vocabulary; the file size (the manifest's cheap check) is unchanged
    tokens.tofile(data / "train.bin")
    config = resolve_run_config(
        "jsb-tiny",
        "pope",
        overrides=[
            "train.tensorboard=false",
            "train.progress=false",
            f"train.data_dir={data}",
            "recipe.max_steps=2",
            "recipe.warmup_steps=1",
        ],
    )
    with pytest.raises(
        ValueError,
        match=rf"{data}/train.bin contains token id 200 but the model only has 90 ids.*"
        r"re-prepare it",
    ):
        Trainer(config, tmp_path / "run")


def _children_with_rank(parent: int, rank: int) -> list[int]:
    """Worker processes of a torchrun agent with RANK=rank (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and f"RANK={rank}".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_signal_to_one_rank_stops_every_rank_at_the_same_step(splits, tmp_path):
    """2-process gloo DDP: SIGTERM to rank 1 only; rank 0 stops at the same step, the checkpoint holds it and
    the run resumes to the end. The signal comes at step ~3 and the ranks agree on stopping every step, so they
    stop within a few steps of it: 150 steps leave a wide margin (each is time the resume spends)."""
    run_dir, steps = tmp_path / "run", 150
    args = ["indirect-indexing-tiny", "--pe", "pope", "--out", str(run_dir)]
    for item in tiny_run_sets(splits, f"recipe.max_steps={steps}", f"recipe.eval_interval={steps}", "train.device=cpu"):
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "pope.cli",
        "train",
    ]
    agent = subprocess.Popen(launcher + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    for _ in range(1200):
        if agent.poll() is not None or (metrics.exists() and metrics.read_text().count("\n") >= 3):
            break
        time.sleep(0.1)
    workers = _children_with_rank(agent.pid, 1)
    assert len(workers) == 1, workers
    os.kill(workers[0], signal.SIGTERM)
    _, err = agent.communicate(timeout=240)
    line = [x for x in err.splitlines() if x.startswith("stopped at step ")][-1]
    step = int(line.split()[3].rstrip(";"))
    assert step < steps
    state = torch.load(run_dir / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    assert state["step"] == step == _steps(run_dir)[-1]
    resumed = subprocess.run(launcher + args + ["--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps(run_dir) == list(range(1, steps + 1))
