"""Resume semantics: finished runs, extended runs, changed options, and run records a crash tore mid-write.

Every case runs the `pope` command as a user would (pope.cli.main) on a tiny indirect-indexing run and checks three
things: the exit status, the one line the user reads (it names the problem and what to do), and that no file the
run owns was lost or changed unless the command's purpose is to change it."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY_RUN_SETS, splits_fixture, tiny_run_sets  # noqa: F401  (the fixture `splits`)

from pope.cli import main as pope_main
from pope.data import indirect_indexing as task
from pope.train.metrics import read_metrics
from pope.train.run_config import resolve_run_config
from pope.train.sweep import Sweep
from pope.train.trainer import run_training

SETS = [*TINY_RUN_SETS, "train.checkpoint_interval=1"]


def _sets(splits, *extra):
    return tiny_run_sets(splits, *extra, base=SETS)


def _command(splits, run_dir, *extra, resume=True):
    args = ["train", "indirect-indexing-tiny", "--pe", "pope", "--out", str(run_dir)]
    for item in _sets(splits, *extra):
        args += ["--set", item]
    return args + (["--resume"] if resume else [])


@pytest.fixture(scope="module")
def finished(splits, tmp_path_factory):
    """A run trained to its end (6 steps), and one stopped at step 4 (train.stop_at_step), copied by each test."""
    root = tmp_path_factory.mktemp("runs")
    run_training(resolve_run_config("indirect-indexing-tiny", "pope", overrides=_sets(splits)), root / "finished")
    stopped = resolve_run_config("indirect-indexing-tiny", "pope", overrides=_sets(splits, "train.stop_at_step=4"))
    run_training(stopped, root / "stopped")
    return root


def _copy(finished, name, tmp_path) -> Path:
    target = tmp_path / name
    shutil.copytree(finished / name, target)
    return target


def _snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _losses(run_dir: Path) -> dict:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"}


# ---------------------------------------------------------------------------------------------- finished runs
@pytest.mark.parametrize("form", ["run-alone", "full-command"])
def test_a_finished_run_resumed_changes_nothing_and_says_how_to_extend(finished, splits, tmp_path, capsys, form):
    run = _copy(finished, "finished", tmp_path)
    before = _snapshot(run)
    args = ["train", "--resume", str(run)] if form == "run-alone" else _command(splits, run)
    assert pope_main(args) == 0
    out, err = capsys.readouterr()
    assert f"{run} is finished (step 6 of recipe.max_steps 6); nothing to train and nothing changed" in err
    assert f"pope train --resume {run} --set recipe.max_steps=N with N > 6" in err
    assert _snapshot(run) == before  # summary.json keeps its whole-split evaluation and wall time
    assert json.loads(out) == json.loads((run / "summary.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final"]["test_loss"] > 0 and summary["seconds"] > 0.001


def test_extending_a_finished_run_keeps_its_records_and_schedule(finished, tmp_path, capsys):
    run = _copy(finished, "finished", tmp_path)
    old_summary = json.loads((run / "summary.json").read_text())
    old_lines = (run / "metrics.jsonl").read_text().splitlines()
    assert pope_main(["train", "--resume", str(run), "--set", "recipe.max_steps=9"]) == 0
    err = capsys.readouterr().err
    assert "its summary at step 6 is kept as summary.step-6.json" in err
    assert json.loads((run / "summary.step-6.json").read_text()) == old_summary  # the finished run's result kept
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines[: len(old_lines)] == old_lines  # every earlier record kept, in place
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 9 and summary["finished"] and summary["seconds"] > old_summary["seconds"]
    config = json.loads((run / "config.json").read_text())
    assert config["recipe"]["max_steps"] == 9
    train = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["lr"] for r in train if r["step"] > 6] == [config["recipe"]["min_lr"]] * 3  # the schedule's end
    assert [r["lr"] for r in train if r["step"] <= 6] == [json.loads(x)["lr"] for x in old_lines if '"train"' in x]
    env = json.loads((run / "env.resume-6.json").read_text())
    assert env["extended"] == {"schedule_steps": 6, "max_steps": 9}
    state = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 9 and state["schedule"]["total_steps"] == 6


def test_extending_a_stopped_run_continues_it_bit_for_bit_to_the_old_end(finished, splits, tmp_path):
    run = _copy(finished, "stopped", tmp_path)
    assert pope_main(["train", "--resume", str(run), "--set", "recipe.max_steps=8"]) == 0
    losses = _losses(run)
    straight = _losses(finished / "finished")
    assert sorted(losses) == list(range(1, 9))
    assert {step: losses[step] for step in straight} == straight  # steps 1..6: the unextended run's, exactly


# ------------------------------------------------------------------------------------------------ resume alone
def test_resume_run_alone_continues_a_stopped_run_bit_for_bit(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    assert pope_main(["train", "--resume", str(run)]) == 0  # the stored stop_at_step=4 is not carried over
    assert _losses(run) == _losses(finished / "finished")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["finished"] and summary["step"] == 6


def test_resume_names_no_run_or_two(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    cases = {
        ("train",): "give PRESET --pe PE --out DIR for a new run, or --resume RUN to continue one",
        ("train", "--out", str(run)): f"a new run needs PRESET and --pe (PRESET is missing); to continue the run in "
        f"{run}, use --resume {run}",
        ("train", "--resume", str(run), "--out", str(tmp_path / "other")): "name two directories",
        ("train", "indirect-indexing-tiny", "--resume", str(run)): "give both PRESET and --pe",
        ("train", "--resume", str(tmp_path / "missing")): "does not exist, so it is not a run directory",
        ("train", "--resume", str(run / "config.json")): "is a file, so it is not a run directory",
    }
    before = _snapshot(run)
    for args, message in cases.items():
        assert pope_main(list(args)) == 1
        assert message in _one_error_line(capsys.readouterr().err)
    assert _snapshot(run) == before


# -------------------------------------------------------------------------------------------- changed options
@pytest.mark.parametrize(
    "sets, named",
    [
        (["recipe.lr=0.5", "model.n_layer=2"], ["model.n_layer: 1 -> 2", "recipe.lr: 0.001 -> 0.5"]),
        (["recipe.max_steps=4"], ["recipe.max_steps: 6 -> 4 (it may only grow, to extend the run)"]),
        (["train.best_metric=valid_loss"], ["train.best_metric"]),
        (["--seed=1"], ["seed: 0 -> 1"]),
    ],
)
def test_changed_options_are_refused_naming_each(finished, tmp_path, capsys, sets, named):
    run = _copy(finished, "stopped", tmp_path)
    before = _snapshot(run)
    args = ["train", "--resume", str(run)]
    for item in sets:
        args += [item] if item.startswith("--") else ["--set", item]
    assert pope_main(args) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "--resume refused" in line and f"`pope train --resume {run}` continues the run as recorded" in line
    assert all(name in line for name in named), line
    assert _snapshot(run) == before


def test_execution_settings_may_change(finished, tmp_path):
    run = _copy(finished, "stopped", tmp_path)
    args = ["train", "--resume", str(run), "--set", "train.log_interval=2", "--set", "train.device=cpu"]
    assert pope_main(args) == 0
    assert json.loads((run / "summary.json").read_text())["finished"]


def test_a_stop_at_step_already_reached_trains_nothing_and_changes_nothing(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    before = _snapshot(run)
    for stop in (3, 4):
        assert pope_main(["train", "--resume", str(run), "--set", f"train.stop_at_step={stop}"]) == 0
        err = capsys.readouterr().err
        assert f"is at step 4, and train.stop_at_step {stop} is not after it: nothing to train and nothing" in err
        assert f"leave train.stop_at_step out (pope train --resume {run}) or give a step after 4" in err
        assert _snapshot(run) == before


# ------------------------------------------------------------------------------------------------- torn files
def test_a_torn_last_metrics_line_is_dropped_with_a_notice(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 5, "kind": "tr')  # the process died inside this write
    assert pope_main(["train", "--resume", str(run)]) == 0
    assert "its last line was cut off by a crash mid-write" in capsys.readouterr().err
    assert _losses(run) == _losses(finished / "finished")
    assert all(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())


def test_a_damaged_metrics_line_before_the_end_is_refused_and_kept(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    before = _snapshot(run)
    assert pope_main(["train", "--resume", str(run)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"{run / 'metrics.jsonl'} line 2 is not a metrics record" in line and "repair or delete that line" in line
    assert _snapshot(run) == before


@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_the_summary_of_a_finished_run_is_rebuilt_from_its_checkpoint(finished, tmp_path, capsys, damage):
    run = _copy(finished, "finished", tmp_path)
    original = json.loads((run / "summary.json").read_text())
    torn = (run / "summary.json").read_bytes()[:40]
    if damage == "torn":
        (run / "summary.json").write_bytes(torn)
    else:
        (run / "summary.json").unlink()
    assert pope_main(["train", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert "rebuilt" in err and "is finished" in err
    rebuilt = json.loads((run / "summary.json").read_text())
    assert rebuilt["final"] == original["final"] and rebuilt["step"] == 6 and rebuilt["finished"]
    assert {k: rebuilt[k] for k in original if k.startswith("best")} == {
        k: original[k] for k in original if k.startswith("best")
    }
    assert rebuilt["seconds"] == pytest.approx(original["seconds"], rel=0.5)
    if damage == "torn":
        assert "kept as summary.json.damaged" in err
        assert (run / "summary.json.damaged").read_bytes() == torn


def test_a_torn_summary_of_a_stopped_run_is_kept_aside(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    torn = (run / "summary.json").read_bytes()[:30]
    (run / "summary.json").write_bytes(torn)
    assert pope_main(["train", "--resume", str(run)]) == 0
    assert "summary.json was torn" in capsys.readouterr().err
    assert (run / "summary.json.damaged").read_bytes() == torn
    assert json.loads((run / "summary.json").read_text())["finished"]


@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_config_json_is_read_from_the_checkpoint_when_torn_or_missing(finished, tmp_path, capsys, damage):
    run = _copy(finished, "stopped", tmp_path)
    original = (run / "config.json").read_bytes()
    if damage == "torn":
        (run / "config.json").write_bytes(original[:50])
    else:
        (run / "config.json").unlink()
    assert pope_main(["train", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert "using the run config stored in checkpoints/last" in err
    assert _losses(run) == _losses(finished / "finished")
    rewritten = json.loads((run / "config.json").read_text())
    stored = json.loads(original)
    assert rewritten == {**stored, "train": {**stored["train"], "stop_at_step": None}}
    if damage == "torn":
        assert (run / "config.json.damaged").read_bytes() == original[:50]


def test_a_torn_config_without_a_checkpoint_is_refused(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    shutil.rmtree(run / "checkpoints")
    (run / "config.json").write_text('{"preset": "indir')
    before = _snapshot(run)
    assert pope_main(["train", "--resume", str(run)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "config.json is not valid JSON" in line and "nothing can be resumed: start over with a new --out" in line
    assert _snapshot(run) == before


@pytest.mark.parametrize("file", ["model.safetensors", "trainer_state.pt", "manifest.json"])
def test_a_torn_checkpoint_is_refused_saying_what_to_do(finished, splits, tmp_path, capsys, file):
    run = _copy(finished, "stopped", tmp_path)
    path = run / "checkpoints" / "last" / file
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = _snapshot(run)
    assert pope_main(_command(splits, run)) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "no valid checkpoints/last" in line and "copy it to checkpoints/last" in line, line
    assert _snapshot(run) == before


def test_a_checkpoint_write_killed_between_its_renames_resumes_from_the_old_copy(finished, tmp_path):
    run = _copy(finished, "stopped", tmp_path)
    (run / "checkpoints" / "last").rename(run / "checkpoints" / ".last.old")  # the new copy never arrived
    (run / "checkpoints" / ".last.tmp-999999999").mkdir()  # a killed writer's temporary directory
    assert pope_main(["train", "--resume", str(run)]) == 0
    assert _losses(run) == _losses(finished / "finished")
    assert not (run / "checkpoints" / ".last.tmp-999999999").exists()  # removed by the next write


# ------------------------------------------------------------------------------------------------------ sweeps
def _sweep_dir(finished, splits, tmp_path, seeds=(0,)) -> Path:
    """A sweep directory whose seeds finished (the finished run is seed 0's; its config names seed 0)."""
    out = tmp_path / "sweep"
    out.mkdir()
    for seed in seeds:
        shutil.copytree(finished / "finished", out / f"seed-{seed}")
    record = {"preset": "indirect-indexing-tiny", "pe": "pope", "overrides": _sets(splits), "invocations": []}
    (out / "sweep.json").write_text(json.dumps({**record, "seeds": {str(s): {"status": "finished"} for s in seeds}}))
    return out


def test_a_sweep_resumes_from_its_record(finished, splits, tmp_path, capsys):
    out = _sweep_dir(finished, splits, tmp_path)
    seed = _snapshot(out / "seed-0")
    assert pope_main(["train", "--resume", str(out)]) == 0
    assert "seed    0  skipped" in capsys.readouterr().out
    assert _snapshot(out / "seed-0") == seed
    record = json.loads((out / "sweep.json").read_text())
    assert record["seeds"]["0"]["status"] == "skipped" and len(record["invocations"]) == 1


def test_a_damaged_sweep_record_is_kept_and_rewritten(finished, splits, tmp_path, capsys):
    out = _sweep_dir(finished, splits, tmp_path)
    (out / "sweep.json").write_text('{"preset": "indirect-indexing-tiny", "pe"')
    sweep = Sweep("indirect-indexing-tiny", "pope", [0], out, overrides=_sets(splits), resume=True, progress=False)
    sweep.run()
    assert "sweep.json was damaged" in capsys.readouterr().err
    assert (out / "sweep.json.damaged").read_text() == '{"preset": "indirect-indexing-tiny", "pe"'
    assert json.loads((out / "sweep.json").read_text())["seeds"]["0"]["status"] == "skipped"


def test_a_sweep_record_that_cannot_say_its_sweep_is_refused(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text("{}")
    assert pope_main(["train", "--resume", str(out)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "cannot say which sweep to resume" in line and f"--seeds LIST --out {out} --resume" in line


def test_seeds_with_a_single_run_to_resume_is_refused(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    assert pope_main(["train", "--resume", str(run), "--seeds", "0-1"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"{run} holds no sweep record (sweep.json)" in line and "--resume SWEEP_DIR" in line


def test_a_torn_best_checkpoint_is_named_and_the_run_continues_from_last(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    weights = run / "checkpoints" / "best" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert pope_main(["train", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"checkpoint {run / 'checkpoints' / 'best'}: model.safetensors is truncated" in err
    assert "evaluate RUN/checkpoints/last" in err
    assert _losses(run) == _losses(finished / "finished")


def test_a_sweep_stopped_at_a_step_resumes_from_its_record_to_the_end(finished, splits, tmp_path, capsys):
    out = _sweep_dir(finished, splits, tmp_path)
    shutil.rmtree(out / "seed-0")
    shutil.copytree(finished / "stopped", out / "seed-0")
    record = json.loads((out / "sweep.json").read_text())
    record["overrides"].append("train.stop_at_step=4")  # the first invocation stopped its seeds at step 4
    (out / "sweep.json").write_text(json.dumps(record))
    assert pope_main(["train", "--resume", str(out)]) == 0
    assert "seed    0  finished     step 6/6" in capsys.readouterr().out
    assert _losses(out / "seed-0") == _losses(finished / "finished")


def test_resuming_on_other_data_is_refused_saying_which(finished, tmp_path, capsys):
    run = _copy(finished, "stopped", tmp_path)
    other = task.write_splits(tmp_path / "other", seed=0, sizes={"train": 128, "valid": 32, "test": 32})
    before = _snapshot(run)
    assert pope_main(["train", "--resume", str(run), "--set", f"train.data_dir={other}"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "was written for other data" in line and "resume it on the data it trained on" in line
    assert {k: v for k, v in _snapshot(run).items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }
