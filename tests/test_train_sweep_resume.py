"""Seed sweeps (pope.train.sweep) that fail, stop and resume: a seed of a sweep stopped and resumed is the single run
with that seed; a damaged checkpoint fails its seed alone; --resume skips finished seeds, refuses another setting,
starts over seeds that died at start, keeps what a seed that died later logged, and requeues a seed that ran out of
GPU memory. Children are real `pope train` processes on tiny CPU runs; shared set-up: tests/sweep_fixtures.py."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from sweep_fixtures import _env, _sets, splits_fixture  # noqa: F401  (the fixture `splits`)

from pope.checkpoint import load_checkpoint
from pope.cli import main
from pope.train.sweep import Sweep, report_lines, resolved_config


def _pope(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "pope.cli", *map(str, args)], env=_env(), capture_output=True, text=True, timeout=timeout
    )


def _losses(run_dir):
    return {
        r["step"]: r["loss"]
        for r in map(json.loads, (Path(run_dir) / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    }


def test_sweep_runs_resumes_reports_failures_and_matches_single_runs(splits, tmp_path, capsys):
    """The calls that start children are real `pope train` processes; the two that start none (a refused
    setting, every seed skipped) run pope.cli.main in this process."""
    out = tmp_path / "sweep"
    base = ["train", "indirect-indexing-tiny", "--pe", "pope", "--out", out, *_sets(splits)]
    # 1. Three seeds, two at a time, stopped at step 2 (as train.max_seconds would stop them).
    first = _pope(*base, "--seeds", "0-2", "--jobs", "2", "--set", "train.stop_at_step=2")
    assert first.returncode == 0, first.stdout + first.stderr
    record = json.loads((out / "sweep.json").read_text())
    assert {s: v["status"] for s, v in record["seeds"].items()} == {"0": "stopped", "1": "stopped", "2": "stopped"}
    assert "--resume" in first.stdout  # tells how to continue
    assert not any(p.name.endswith(".log") for p in (out / "seed-0").iterdir())  # logs stay beside the run
    # Another setting in the same directory is refused before anything starts.
    assert main([*map(str, base), "--seeds", "0-3", "--resume", "--set", "recipe.lr=0.5"]) == 1
    error = capsys.readouterr().err
    assert "holds runs of another setting" in error and "recipe.lr" in error
    assert not (out / "seed-3").exists()
    # 2. Resume 0-3: seeds 0 and 1 continue, seed 2 fails (its checkpoint is damaged), seed 3 starts and finishes.
    weights = out / "seed-2" / "checkpoints" / "last" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    second = _pope(*base, "--seeds", "0-3", "--resume", "--jobs", "2")
    assert second.returncode == 1
    assert f"seed 2 failed (exit 1); log {out / 'seed-2.log'}" in second.stdout
    assert "pope train: error:" in (out / "seed-2.log").read_text()
    record = json.loads((out / "sweep.json").read_text())
    assert {s: v["status"] for s, v in record["seeds"].items()} == {
        "0": "finished",
        "1": "finished",
        "2": "failed",
        "3": "finished",
    }
    assert len(record["invocations"]) == 2 and record["invocations"][1]["resume"] is True
    assert "restarted" not in second.stdout  # seeds with a checkpoint continue from it
    # 3. --resume skips finished seeds: no child starts, the logs do not grow.
    log_size = (out / "seed-0.log").stat().st_size
    assert main([*map(str, base), "--seeds", "0,1", "--resume"]) == 0
    assert capsys.readouterr().out.count("skipped") == 2
    assert (out / "seed-0.log").stat().st_size == log_size
    # 4. A seed of the sweep (stopped, then resumed) equals the single run with that seed.
    single = _pope(*base[:5], tmp_path / "single", *_sets(splits), "--seed", "1", "--set", "train.progress=false")
    assert single.returncode == 0, single.stderr
    assert _losses(out / "seed-1") == _losses(tmp_path / "single") and sorted(_losses(out / "seed-1")) == [1, 2, 3, 4]
    assert _losses(out / "seed-0") != _losses(out / "seed-1")  # the seed reached the child
    a = load_checkpoint(tmp_path / "single" / "checkpoints" / "last").model_state
    b = load_checkpoint(out / "seed-1" / "checkpoints" / "last").model_state
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((out / "seed-1" / "config.json").read_text()) == json.loads(
        (tmp_path / "single" / "config.json").read_text()
    )


# A trainer that runs out of GPU memory at its first step: it has written config.json, env.json, an empty
# metrics.jsonl and its (released) lock, and exits 1 with torch's message. Argv: the run directory, config.json's text.
OUT_OF_MEMORY_AT_START = (
    "import pathlib, sys; run = pathlib.Path(sys.argv[1]); run.mkdir(parents=True, exist_ok=True); "
    "(run / 'config.json').write_text(sys.argv[2]); (run / 'env.json').write_text('{}'); "
    "(run / 'metrics.jsonl').write_text(''); (run / '.lock').write_text(''); "
    "sys.exit('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 139.72 GiB of which 1.06 GiB is free.')"
)


class OutOfMemoryAtStart(Sweep):
    """A sweep whose first child for each seed in ``oom`` is the stand-in above (with the config that seed's real
    child would write); every other child is a real `pope train`."""

    def __init__(self, *args, oom=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.oom = set(oom)

    def child_command(self, run):
        if run.seed not in self.oom:
            return super().child_command(run)
        self.oom.remove(run.seed)
        config = resolved_config(self.preset, self.pe, seed=run.seed, overrides=self.child_sets())
        return [
            sys.executable,
            "-c",
            OUT_OF_MEMORY_AT_START,
            str(run.run_dir),
            json.dumps(config, indent=2, sort_keys=True) + "\n",
        ]


def test_seeds_that_died_at_start_start_over_and_out_of_memory_is_requeued(splits, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "sweep"
    sets = _sets(splits)[1::2]
    # 1. Seed 1 alone runs out of GPU memory at its first step: no other seed runs, so it fails (as before).
    lines, ok = report_lines(
        OutOfMemoryAtStart(
            "indirect-indexing-tiny", "pope", [1], out, oom={1}, overrides=[*sets, "train.stop_at_step=3"]
        ).run()
    )
    assert not ok and lines[-1].startswith("seed 1 failed (exit 1)") and "CUDA out of memory" in lines[-1]
    assert sorted(p.name for p in (out / "seed-1").iterdir()) == [".lock", "config.json", "env.json", "metrics.jsonl"]
    # Seed 3 died after logging steps but before its first checkpoint: its metrics are not deleted.
    (out / "seed-3").mkdir()
    (out / "seed-3" / "config.json").write_text(
        json.dumps(
            resolved_config("indirect-indexing-tiny", "pope", seed=3, overrides=["train.progress=false", *sets]),
            indent=2,
            sort_keys=True,
        )
    )
    (out / "seed-3" / "metrics.jsonl").write_text('{"step": 1, "kind": "train", "loss": 3.1}\n' * 2)
    seed_3 = {p.name: p.read_bytes() for p in (out / "seed-3").iterdir()}
    # 2. --resume, two at a time: seed 1 starts over (its config.json differed in a resume-mutable key: said so).
    # Seed 0's first child runs out of memory while seed 1 runs: it is requeued and starts (over) when seed 1 ends.
    # Seed 3 is not started.
    sweep = OutOfMemoryAtStart(
        "indirect-indexing-tiny", "pope", [0, 1, 3], out, oom={0}, overrides=sets, resume=True, jobs=2
    )
    lines, ok = report_lines(sweep.run())
    said = capsys.readouterr().err
    assert not ok and [r.status for r in sweep.runs] == ["finished", "finished", "failed"], lines
    assert lines[0].endswith("(requeued after CUDA out of memory; restarted from scratch)")
    assert lines[1].endswith(
        "(restarted from scratch; its config.json differed (train.stop_at_step: 3 -> null), the sweep's is used)"
    )
    assert lines[3] == (
        f"seed 3 not started: {out / 'seed-3'} has no checkpoint to resume from, and starting over "
        "would lose what it holds besides start-up records (metrics.jsonl with 2 record(s)); look at "
        f"it, then delete {out / 'seed-3'} to start seed 3 over, or leave seed 3 out of --seeds"
    )
    assert "seed 0 ran out of GPU memory" in said and "seed 1 starts over" in said
    assert {p.name: p.read_bytes() for p in (out / "seed-3").iterdir()} == seed_3
    log = (out / "seed-1.log").read_text()
    assert log.count(" gpu=None ") == 2 and "CUDA out of memory" in log and "starting over" in log
    record = json.loads((out / "sweep.json").read_text())["seeds"]
    assert record["0"]["notes"] == ["requeued after CUDA out of memory", "restarted from scratch"]
    # 3. The restarted seed equals the single run with that seed.
    single = _pope(
        "train",
        "indirect-indexing-tiny",
        "--pe",
        "pope",
        "--out",
        tmp_path / "single",
        *_sets(splits),
        "--seed",
        "1",
        "--set",
        "train.progress=false",
    )
    assert single.returncode == 0, single.stderr
    assert _losses(out / "seed-1") == _losses(tmp_path / "single") and sorted(_losses(out / "seed-1")) == [1, 2, 3, 4]
    a = load_checkpoint(tmp_path / "single" / "checkpoints" / "last").model_state
    b = load_checkpoint(out / "seed-1" / "checkpoints" / "last").model_state
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (out / "seed-1" / "config.json").read_text() == (tmp_path / "single" / "config.json").read_text()
