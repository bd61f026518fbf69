"""Seed sweeps (pope.train.sweep): a seed of a sweep is the single run with that seed; failures, --resume,
bad seed lists, and Ctrl-C. Children are real `pope train` processes on tiny CPU runs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pope.checkpoint import load_checkpoint
from pope.cli import main
from pope.data import indirect_indexing as task
from pope.train.sweep import Sweep, report_lines, resolved_config, run_finished
from pope.train.sweep_settings import parse_seeds

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
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


def test_parse_seeds():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("0,3,5") == [0, 3, 5]
    assert parse_seeds(" 7 ") == [7] and parse_seeds("0-1,9") == [0, 1, 9]
    for bad, message in [
        ("3-1", "backwards"),
        ("a", "not a seed"),
        ("", "give seeds"),
        ("1,,2", "give seeds"),
        ("-1", "not a seed"),
        ("1-", "not a seed"),
        ("0-2,2", "given twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_seeds(bad)


def test_run_finished_loads_without_torch(tmp_path):
    """Shell scripts ask run_finished about a run in a python process of their own: importing it must not import
    torch (~1.6 s a call)."""
    (tmp_path / "summary.json").write_text(json.dumps({"finished": True}))
    code = (
        "import sys; from pathlib import Path; from pope.train.sweep import run_finished; run = Path(sys.argv[1]); "
        "print(run_finished(run), run_finished(run / 'absent'), 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() == ["True", "False", "False"], result.stderr


def test_bad_sweep_arguments_fail_before_anything_starts(splits, tmp_path, capsys):
    out = tmp_path / "sweep"
    for seeds in ("3-1", "a", ""):
        assert (
            main(
                ["train", "indirect-indexing-tiny", "--pe", "pope", "--seeds", seeds, "--out", str(out), *_sets(splits)]
            )
            == 1
        )
        assert "--seeds" in capsys.readouterr().err
    assert (
        main(["train", "indirect-indexing-tiny", "--pe", "pope", "--seeds", "0", "--seed", "1", "--out", str(out)]) == 1
    )
    assert "cannot be combined with --seed" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "indirect-indexing-tiny",
                "--pe",
                "pope",
                "--seeds",
                "0",
                "--out",
                str(out),
                "--set",
                "recipe.nonsense=1",
            ]
        )
        == 1
    )
    assert "recipe.nonsense" in capsys.readouterr().err
    (out / "seed-1").mkdir(parents=True)
    assert (
        main(["train", "indirect-indexing-tiny", "--pe", "pope", "--seeds", "0-2", "--out", str(out), *_sets(splits)])
        == 1
    )
    error = capsys.readouterr().err
    assert "seed-1 already exist" in error and "pass --resume" in error
    assert sorted(p.name for p in out.iterdir()) == ["seed-1"]  # nothing started, no record written


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


@pytest.mark.slow
def test_ctrl_c_stops_every_child_and_leaves_them_resumable(splits, tmp_path):
    out = tmp_path / "sweep"
    command = [
        sys.executable,
        "-m",
        "pope.cli",
        "train",
        "indirect-indexing-tiny",
        "--pe",
        "rope",
        "--seeds",
        "0-2",
        "--jobs",
        "2",
        "--out",
        str(out),
        *_sets(splits, 100_000, "train.checkpoint_interval=5"),
    ]
    sweep = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not all((out / f"seed-{s}" / "checkpoints" / "last").exists() for s in (0, 1)):
        time.sleep(0.5)
    sweep.send_signal(signal.SIGINT)
    output, _ = sweep.communicate(timeout=120)
    assert sweep.returncode == 1, output
    record = json.loads((out / "sweep.json").read_text())
    assert {s: v["status"] for s, v in record["seeds"].items()} == {
        "0": "interrupted",
        "1": "interrupted",
        "2": "pending",
    }
    assert "unfinished seed(s) [0, 1, 2]" in output
    left = [p for p in Path("/proc").glob("[0-9]*") if _reads(p / "cmdline").find(f"{out}/seed-".encode()) >= 0]
    assert left == []  # no child left running


def _reads(path):
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_sweep_throughput_benchmark_runs_on_cpu(splits, tmp_path):
    """benchmarks/sweep_throughput.py end to end on a tiny CPU model (numbers meaningless here): one CSV row
    per K with provenance, the table printed."""
    root = Path(__file__).resolve().parents[1]
    sets = [
        "train.device=cpu",
        "model.n_layer=1",
        "model.d_model=16",
        "recipe.max_steps=100000",
        f"train.data_dir={splits}",
    ]
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/sweep_throughput.py",
            "--preset",
            "indirect-indexing-tiny",
            "--jobs",
            "1,2",
            "--window",
            "1",
            "--warmup-steps",
            "10",
            "--log-interval",
            "5",
            "--timeout",
            "120",
            "--out",
            str(tmp_path),
            *[x for s in sets for x in ("--set", s)],
        ],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    import csv

    rows = list(csv.DictReader(open(tmp_path / "sweep_throughput.csv")))
    assert [r["processes"] for r in rows] == ["1", "2"] and all(float(r["steps_per_s"]) > 0 for r in rows)
    assert {"gpu", "torch", "triton", "commit", "date", "command"} <= set(rows[0]) and "best:" in result.stdout


def test_seeds_are_spread_over_the_visible_gpus(splits, tmp_path, monkeypatch):
    """Placement without starting anything: each child sees one GPU, at most --jobs-per-gpu per GPU, --jobs caps
    the total; CPU runs go one at a time unless --jobs asks for more."""
    from pope.train.sweep import DEFAULT_JOBS_PER_GPU, Sweep

    sets = _sets(splits)[1::2]
    gpu_sets = [s for s in sets if s != "train.device=cpu"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    sweep = Sweep("indirect-indexing-tiny", "pope", list(range(8)), tmp_path / "a", overrides=gpu_sets, jobs_per_gpu=3)
    assert sweep.gpus == ["3", "5"] and sweep.jobs == 6
    running = []
    for run in sweep.runs:
        slot = sweep._free_slot(running)
        if slot is False:
            break
        run.gpu, run.status = slot, "running"
        running.append(run)
    assert [r.gpu for r in running] == ["3", "5", "3", "5", "3", "5"]  # least-loaded GPU first, 3 each
    assert sweep._child_env("5")["CUDA_VISIBLE_DEVICES"] == "5"
    assert (
        Sweep("indirect-indexing-tiny", "pope", [0, 1], tmp_path / "b", overrides=gpu_sets).jobs
        == 2 * DEFAULT_JOBS_PER_GPU
    )
    capped = Sweep("indirect-indexing-tiny", "pope", [0, 1], tmp_path / "c", overrides=gpu_sets, jobs=1)
    assert capped._free_slot([]) == "3" and capped._free_slot(running[:1]) is False
    cpu = Sweep("indirect-indexing-tiny", "pope", [0, 1], tmp_path / "d", overrides=sets, jobs_per_gpu=4)
    assert cpu.gpus == [] and cpu.jobs == 1 and cpu._free_slot([]) is None
    assert "--seed" in cpu.child_command(cpu.runs[1]) and "1" in cpu.child_command(cpu.runs[1])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert Sweep("indirect-indexing-tiny", "pope", [0], tmp_path / "e", overrides=gpu_sets).gpus == []


def test_a_seed_stopped_by_its_own_signal_is_resumable_not_failed(splits, tmp_path):
    # SIGTERM to one child (e.g. to give its GPU share to the others): it writes its checkpoint and a summary
    # naming the signal and exits 143. The sweep reports it as stopped and resumable; a crash stays a failure.
    sweep = Sweep("indirect-indexing-tiny", "pope", [0, 1, 2], tmp_path / "sweep", overrides=_sets(splits)[1::2])
    summary = {"step": 3, "finished": False, "stop_reason": "SIGTERM"}
    for run, returncode, reason in zip(sweep.runs, (143, 1, -9), ("SIGTERM", "SIGTERM", None)):
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "summary.json").write_text(json.dumps({**summary, "stop_reason": reason}))
        run._log_handle = open(run.log, "a")
        sweep._finish(run, returncode)
    assert [r.status for r in sweep.runs] == ["stopped", "failed", "failed"]
    assert sweep.runs[0].notes == ["stopped by a SIGTERM sent to this seed alone; --resume continues it"]
    lines, ok = report_lines(sweep.runs)
    assert not ok and "unfinished seed(s) [0]: continue them with the same command plus --resume" in lines
    lines, ok = report_lines(sweep.runs[:1])
    assert ok


def _fake_sweep(directory, seeds, *, finished=True, overrides=("recipe.lr=0.0002",), started="2026-12-02T08:00:00Z"):
    """A sweep directory as `pope train --seeds` leaves it (config.json, summary.json, log, sweep.json), no run."""
    directory.mkdir(parents=True)
    record = {
        "preset": "indirect-indexing-tiny",
        "pe": "pope",
        "overrides": list(overrides),
        "invocations": [
            {
                "command": ["pope", "train", "--seeds", ",".join(map(str, seeds))],
                "started_utc": started,
                "seeds": list(seeds),
            }
        ],
        "seeds": {},
    }
    for seed in seeds:
        run = directory / f"seed-{seed}"
        run.mkdir()
        config = resolved_config(
            "indirect-indexing-tiny", "pope", seed=seed, overrides=[*overrides, f"train.max_seconds={100 + seed}"]
        )  # execution keys may differ
        (run / "config.json").write_text(json.dumps(config))
        (run / "summary.json").write_text(json.dumps({"step": 4 if finished else 2, "finished": finished}))
        (directory / f"seed-{seed}.log").write_text(f"seed {seed}\n")
        record["seeds"][str(seed)] = {
            "status": "finished" if finished else "stopped",
            "run_dir": run.name,
            "log": f"seed-{seed}.log",
            "step": 4 if finished else 2,
        }
    (directory / "sweep.json").write_text(json.dumps(record))
    return directory


def _tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_merge_sweep_joins_seeds_of_one_setting_and_refuses_anything_else(tmp_path):
    from pope.train.sweep_merge import merge_sweep

    destination = _fake_sweep(tmp_path / "pope-tf32", [0, 1])
    later = _fake_sweep(tmp_path / "later" / "pope-tf32-s2", [2], started="2026-12-03T08:00:00Z")
    before = _tree(later)
    lines = merge_sweep(later, destination)
    assert lines == [f"seed 2: finished at step 4 -> {destination / 'seed-2'}"]
    assert _tree(later) == before  # the source is left as it was
    record = json.loads((destination / "sweep.json").read_text())
    assert list(record["seeds"]) == ["0", "1", "2"] and record["seeds"]["2"]["status"] == "finished"
    assert [i.get("merged_from") for i in record["invocations"]] == [None, "pope-tf32-s2"]
    assert (destination / "seed-2" / "config.json").read_bytes() == before["seed-2/config.json"]
    assert (destination / "seed-2.log").read_text() == "seed 2\n"
    merged = _tree(destination)

    # Refused, with the destination unchanged: a finished seed in both, another setting, another encoding.
    with pytest.raises(ValueError, match="seed 2 is in both sweeps and .* is finished"):
        merge_sweep(later, destination)
    other_lr = _fake_sweep(tmp_path / "lr" / "x", [3], overrides=("recipe.lr=0.0005",))
    with pytest.raises(
        ValueError,
        match=r"source seed 3 was not run with the destination's setting: recipe.lr: "
        r"0.0005 vs 0.0002",
    ):
        merge_sweep(other_lr, destination)
    other_pe = _fake_sweep(tmp_path / "pe" / "x", [4])
    record_pe = json.loads((other_pe / "sweep.json").read_text())
    (other_pe / "sweep.json").write_text(json.dumps({**record_pe, "pe": "rope"}))
    with pytest.raises(ValueError, match="the sweeps differ in pe: 'rope' .source. vs 'pope'"):
        merge_sweep(other_pe, destination)
    with pytest.raises(ValueError, match="has no sweep.json"):
        merge_sweep(tmp_path / "later", destination)
    (destination / "seed-6.log").write_text("a log of the user's\n")
    with pytest.raises(ValueError, match="seed-6.log exists without a seed-6 directory beside it"):
        merge_sweep(_fake_sweep(tmp_path / "six" / "x", [6]), destination)
    (destination / "seed-6.log").unlink()
    assert _tree(destination) == merged

    # An unfinished seed (stopped in one job) is replaced by a whole rerun only when asked.
    stopped = _fake_sweep(tmp_path / "stopped" / "pope-tf32", [5], finished=False)
    merge_sweep(stopped, destination)
    rerun = _fake_sweep(tmp_path / "rerun" / "pope-tf32-s5", [5], started="2026-12-04T08:00:00Z")
    with pytest.raises(ValueError, match="pass --replace-unfinished"):
        merge_sweep(rerun, destination)
    lines = merge_sweep(rerun, destination, replace_unfinished=True)
    assert lines[0].endswith(f"(replaced the destination's unfinished copy) -> {destination / 'seed-5'}")
    assert run_finished(destination / "seed-5")
    assert json.loads((destination / "sweep.json").read_text())["seeds"]["5"]["status"] == "finished"

    # A copy archived while it ran (no summary.json; sweep.json still says running at step 0) joins as unfinished at
    # its last logged step; a copy that got less far does not replace it.
    def archived_mid_run(name, last_step):
        lost = _fake_sweep(tmp_path / name / "pope-tf32-s7", [7], finished=False)
        (lost / "seed-7" / "summary.json").unlink()
        steps = range(500, last_step + 1, 500)
        (lost / "seed-7" / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in steps))
        record = json.loads((lost / "sweep.json").read_text())
        record["seeds"]["7"].update(status="running", step=0)
        (lost / "sweep.json").write_text(json.dumps(record))
        return lost

    assert merge_sweep(archived_mid_run("far", 1500), destination) == [
        f"seed 7: unfinished at step 1500 -> {destination / 'seed-7'}"
    ]
    entry = json.loads((destination / "sweep.json").read_text())["seeds"]["7"]
    assert entry["status"] == "unfinished" and "archived while running" in entry["notes"][-1]
    merged = _tree(destination)
    with pytest.raises(
        ValueError, match="unfinished at step 1000, short of the destination's unfinished copy at step 1500"
    ):
        merge_sweep(archived_mid_run("near", 1000), destination, replace_unfinished=True)
    assert _tree(destination) == merged


def test_merge_sweep_script_errors_in_one_line(tmp_path):
    destination = _fake_sweep(tmp_path / "a", [0])
    run = subprocess.run(
        [sys.executable, str(Path(SRC).parent / "scripts" / "merge_sweep.py"), str(destination), str(destination)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"merge_sweep.py: source and destination are the same directory ({destination})"
    ]
