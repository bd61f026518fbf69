"""Seed sweeps (pope.train.sweep): seed lists and bad sweep arguments, placement of seeds over the visible GPUs, and
stopping (Ctrl-C to the sweep, a signal to one seed), plus the sweep-throughput benchmark. Resume and failures:
tests/test_train_sweep_resume.py; joining sweeps: tests/test_train_sweep_merge.py. Children are real `pope train`
processes on tiny CPU runs; shared set-up: tests/sweep_fixtures.py."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_fixtures import _env, _sets, splits_fixture  # noqa: F401  (the fixture `splits`)

from pope.cli import main
from pope.train.sweep import Sweep, report_lines
from pope.train.sweep_settings import parse_seeds


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
