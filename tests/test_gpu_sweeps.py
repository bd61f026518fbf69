"""scripts/gpu_sweeps.sh, the one line pasted into every device command of a GPU lease: it starts the plan's
sweeps on a fresh machine, leaves running and finished ones alone, resumes a killed one, then watches them with
scripts/gpu_sweep_monitor.sh within its seconds; the monitor gives up at once on a fresh machine and stops
waiting when every sweep process is gone. Most tests use a stand-in sweep script (steps logged to metrics.jsonl
every 50 ms, resuming from its last step); one runs the real scripts/gpu_sweep_indirect.sh on a tiny CPU model."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_SWEEP = r"""#!/usr/bin/env bash
# stand-in for scripts/gpu_sweep_indirect.sh: seeds one after another, FAKE_STEPS steps each, resuming from the
# last step in metrics.jsonl; every invocation's settings appended to $RUNS/$NAME/invocations.txt
set -u
dir=$RUNS/$NAME; mkdir -p "$dir" "$OUT"
printf '%s\n' "PE=$PE SEEDS=$SEEDS JOBS_PER_GPU=$JOBS_PER_GPU LIMIT=$LIMIT EXTRA=$EXTRA" >> "$dir/invocations.txt"
for seed in $(seq "${SEEDS%-*}" "${SEEDS#*-}"); do
  run=$dir/seed-$seed; mkdir -p "$run"; touch "$run/config.json"
  step=$(tail -n 1 "$run/metrics.jsonl" 2>/dev/null | sed 's/^{"step": \([0-9]*\),.*/\1/'); step=${step:-0}
  echo "seed $seed from step $step"
  while [ "$step" -lt "$FAKE_STEPS" ]; do
    step=$((step + 1)); echo "{\"step\": $step, \"kind\": \"train\", \"step_ms\": 1.0}" >> "$run/metrics.jsonl"
    sleep 0.05
  done
  echo '{"finished": true}' > "$run/summary.json"
done
echo "fp32 re-score"
"""


@pytest.fixture
def machine(tmp_path):
    """A stand-in GPU machine: its own RUNS/OUT/LOG_DIR, the stand-in sweep script; every sweep started is killed
    (its process group, by the id the script printed) at the end."""
    script = tmp_path / "fake_sweep_indirect.sh"
    script.write_text(FAKE_SWEEP)
    env = {
        **os.environ,
        "RUNS": str(tmp_path / "runs"),
        "OUT": str(tmp_path / "out"),
        "LOG_DIR": str(tmp_path / "logs"),
        "SWEEP_OUT": str(tmp_path / "sweep-out"),
        "SWEEP_SCRIPT": str(script),
        "FAKE_STEPS": "20",
        "CUDA_VISIBLE_DEVICES": "",
    }
    started = []

    def sweeps(*args, timeout=60, **settings):
        result = subprocess.run(
            ["bash", "scripts/gpu_sweeps.sh", *map(str, args)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**env, **settings},
            timeout=timeout,
        )
        started.extend(int(pid) for pid in re.findall(r"(?:started|restarted) .*; pid (\d+), log", result.stdout))
        return result

    def monitor(*args, timeout=60):
        return subprocess.run(
            ["bash", "scripts/gpu_sweep_monitor.sh", *map(str, args)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )

    yield sweeps, monitor, tmp_path, started
    for pid in started:
        try:
            os.killpg(pid, signal.SIGKILL)  # setsid: the sweep leads its own process group
        except ProcessLookupError:
            pass


def _lines(result):
    """The script's one line per sweep."""
    state = re.compile(r"^[a-z0-9-]+: (started|running|restarted|finished)")
    return [line for line in result.stdout.splitlines() if state.match(line)]


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""  # a zombie has no command line
    except OSError:
        return False


def test_fresh_start_then_running_then_finished(machine):
    sweeps, monitor, tmp_path, started = machine
    plan = tmp_path / "next.plan"
    extra = "--set recipe.dataset=indirect-indexing:min_len=20,max_len=32 --set train.autocast=none"
    plan.write_text(
        f"# the next sweeps\nNAME=pope-wrap PE=pope:delta_range=wrap SEEDS=0-1 JOBS_PER_GPU=2\n\n"
        f'NAME=pope-len32 PE=pope SEEDS=0-1 EXTRA="{extra}"  # strings of 20-32 letters\n'
    )
    first = sweeps(0, plan)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = _lines(first)
    assert [line.split(";")[0] for line in lines] == [
        "pope-wrap: started (fresh machine: no runs)",
        "pope-len32: started (fresh machine: no runs)",
    ]
    assert len(started) == 2 and all(_alive(pid) for pid in started)
    assert first.stdout.count("MPS: ") == 1  # tried once, before the first start (no MPS on this machine)
    assert first.stdout.index("MPS: ") < first.stdout.index("pope-wrap: started")

    again = sweeps(0, plan)  # the next device command, same machine, sweeps still running
    assert _lines(again) == [f"pope-wrap: running (pid {started[0]})", f"pope-len32: running (pid {started[1]})"]
    assert "MPS: " not in again.stdout and len(started) == 2

    begin = time.monotonic()
    watched = sweeps(30, plan)  # watches them to their end, which comes before its 30 s
    assert watched.returncode == 0 and "sweeps ended" in watched.stdout, watched.stdout + watched.stderr
    assert time.monotonic() - begin < 15
    assert "pope-len32/seed-1: step 20 finished=True" in watched.stdout
    with tarfile.open(tmp_path / "out" / "sweep-pope-wrap.tar.gz") as archive:
        assert "pope-wrap/seed-1/metrics.jsonl" in archive.getnames()

    done = sweeps(30, plan)  # finished sweeps are not restarted; the monitor sees they ended
    assert _lines(done) == ["pope-wrap: finished", "pope-len32: finished"] and "sweeps ended" in done.stdout
    runs = tmp_path / "runs"
    assert (runs / "pope-wrap" / "invocations.txt").read_text().splitlines() == [
        "PE=pope:delta_range=wrap SEEDS=0-1 JOBS_PER_GPU=2 LIMIT=100000 EXTRA="
    ]
    assert (runs / "pope-len32" / "invocations.txt").read_text().splitlines() == [
        f"PE=pope SEEDS=0-1 JOBS_PER_GPU= LIMIT=100000 EXTRA={extra}"
    ]  # EXTRA verbatim, started once


def test_continue_only_starts_nothing_on_a_fresh_machine(machine):
    """CONTINUE_ONLY=1, for the second command of a run too long for one: a fresh machine (the runs went back with
    the previous one) starts nothing and exits 3 at once; a machine that holds the runs continues them as usual."""
    sweeps, monitor, tmp_path, started = machine
    line = "NAME=pope-200k PE=pope SEEDS=0-1"
    check = sweeps("--check", line, CONTINUE_ONLY="1")
    assert check.returncode == 0 and check.stdout.splitlines() == [
        "pope-200k: not started (fresh machine: no runs to continue, and CONTINUE_ONLY=1)"
    ], check.stdout
    begin = time.monotonic()
    fresh = sweeps(30, line, CONTINUE_ONLY="1")
    assert fresh.returncode == 3, fresh.stdout + fresh.stderr
    assert (
        fresh.stdout.splitlines()[0] == "pope-200k: not started (fresh machine: no runs to continue, and "
        "CONTINUE_ONLY=1)"
    )
    assert "nothing started" in fresh.stdout.splitlines()[1] and time.monotonic() - begin < 10
    assert started == [] and not (tmp_path / "runs").exists() and not (tmp_path / "logs").exists()

    first = sweeps(0, line)  # the first command of the pair starts the runs
    assert first.returncode == 0 and len(started) == 1, first.stdout + first.stderr
    second = sweeps(30, line, CONTINUE_ONLY="1")  # the same machine: continued and watched to the end
    assert second.returncode == 0, second.stdout + second.stderr
    assert _lines(second) == [f"pope-200k: running (pid {started[0]})"] and "sweeps ended" in second.stdout
    assert (tmp_path / "runs" / "pope-200k" / "seed-1" / "summary.json").is_file()

    bad = sweeps(0, line, CONTINUE_ONLY="yes")
    assert bad.returncode == 2 and bad.stdout == "" and "CONTINUE_ONLY must be 0 or 1, not 'yes'" in bad.stderr


def test_killed_sweep_is_resumed_and_seconds_are_honoured(machine):
    sweeps, monitor, tmp_path, started = machine
    line = "NAME=pope PE=pope SEEDS=0 LIMIT=600"
    first = sweeps(0, line, FAKE_STEPS="400")  # 20 s of steps
    assert _lines(first)[0].startswith("pope: started (fresh machine: no runs)"), first.stdout + first.stderr
    metrics = tmp_path / "runs" / "pope" / "seed-0" / "metrics.jsonl"
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 5:
        time.sleep(0.1)
    os.killpg(started[0], signal.SIGKILL)
    while _alive(started[0]):
        time.sleep(0.05)
    step = len(metrics.read_text().splitlines())

    begin = time.monotonic()
    crashed = monitor(60, "pope")  # no process left, the log lacks its end: stop waiting and say so
    assert crashed.returncode == 1 and time.monotonic() - begin < 10
    assert "no sweep process alive, but pope did not end" in crashed.stdout

    begin = time.monotonic()
    resumed = sweeps(3, line, FAKE_STEPS="400")  # SECONDS honoured: back after ~3 s, the sweep still going
    elapsed = time.monotonic() - begin
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert 2 <= elapsed < 8, elapsed  # it waited, and not past its 3 s (bash counts whole seconds)
    assert _lines(resumed)[0].startswith(f"pope: restarted (resume: seed 0 at step {step}; each seed continues")
    assert _alive(started[1]) and "sweeps ended" not in resumed.stdout
    assert (tmp_path / "logs" / "sweep-pope.log.previous").read_text().startswith("seed 0 from step 0")
    assert (tmp_path / "logs" / "sweep-pope.log").read_text().startswith(f"seed 0 from step {step}")
    os.killpg(started[1], signal.SIGKILL)
    while _alive(started[1]):
        time.sleep(0.05)

    finish = sweeps(60, line, FAKE_STEPS="150")  # restarted again, it runs to its end; steps 1..150 once each
    assert "sweeps ended" in finish.stdout, finish.stdout + finish.stderr
    steps = [int(re.match(r'{"step": (\d+)', row).group(1)) for row in metrics.read_text().splitlines()]
    assert steps == list(range(1, 151))
    assert len((tmp_path / "runs" / "pope" / "invocations.txt").read_text().splitlines()) == 3


def test_mps_is_started_only_when_the_plan_trains_more_than_one_process_at_once(machine):
    """One process alone ran ~9 % faster without MPS on the H200: a plan whose seeds train one at a time leaves MPS
    alone unless MPS=on; a plan with two at once tries to start it (this machine has no MPS: gpu_mps.sh says so)."""
    sweeps, monitor, tmp_path, started = machine
    alone = sweeps(0, "NAME=one PE=pope SEEDS=0-2 JOBS_PER_GPU=1")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "MPS: left alone (the plan runs one training process at a time; MPS=on starts it anyway)" in alone.stdout
    forced = sweeps(0, "NAME=forced PE=pope SEEDS=0", MPS="on")
    assert "MPS: " in forced.stdout and "left alone" not in forced.stdout, forced.stdout
    two = sweeps(0, "NAME=a PE=pope SEEDS=0", "NAME=b PE=rope SEEDS=0")  # two sweeps side by side
    assert "MPS: " in two.stdout and "left alone" not in two.stdout, two.stdout
    bad = sweeps(0, "NAME=c PE=pope SEEDS=0", MPS="yes")
    assert bad.returncode == 2 and bad.stderr.strip() == "gpu_sweeps.sh: MPS must be auto, on or off, not 'yes'"
    assert len(started) == 4  # one, forced, a and b: nothing starts with a bad setting


def test_monitor_on_a_fresh_machine_exits_at_once(machine):
    sweeps, monitor, tmp_path, started = machine
    begin = time.monotonic()
    result = monitor(580, "pope-wrap", "rope")
    assert result.returncode == 3 and time.monotonic() - begin < 5
    assert result.stdout.strip() == (
        f"gpu_sweep_monitor.sh: nothing to watch: no sweep pope-wrap rope under {tmp_path / 'runs'} and no sweep "
        "process (a fresh machine? the previous one was given back); start the sweeps again (scripts/gpu_sweeps.sh "
        "does it)"
    )


def test_monitor_says_how_long_the_rest_of_each_schedule_takes(machine):
    """Each seed's line gives left= (remaining steps x the last step time): whether the runs fit the lease is read
    off the first command's output. A run with no step time yet, or finished, says left=-."""
    sweeps, monitor, tmp_path, started = machine
    sweep = tmp_path / "runs" / "pope-tf32"
    for seed, records in ((0, [{"kind": "train", "step": 40000, "step_ms": 12.5}]), (1, [])):
        run = sweep / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "config.json").write_text('{"recipe": {"max_steps": 100000}}')
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = monitor(0, "pope-tf32")  # no sweep process: one status pass, then exit 1
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("pope-tf32/")]
    assert lines == [
        "pope-tf32/seed-0: step 40000 finished=False ms/step=12.50 left=750s valid_acc=- test_acc=-",
        "pope-tf32/seed-1: step 0 finished=False ms/step=- left=- valid_acc=- test_acc=-",
    ], result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["540", "NAME=a PE=pope"], "give SEEDS"),
        (["540", "NAME=a PE=pope SEEDS=3-1"], "SEEDS: "),
        (["540", "NAME=a PE=pope SEED=0"], "'SEED=0' is not KEY=VALUE with a known KEY"),
        (["540", "NAME=a/b PE=pope SEEDS=0"], "must be a directory name"),
        (["540", "NAME=a PE=pope SEEDS=0", "NAME=a PE=rope SEEDS=0"], "NAME a is already a sweep of the plan"),
        (["540", "NAME=a PE=pope SEEDS=0 JOBS_PER_GPU=0"], "JOBS_PER_GPU must be a positive whole number"),
        (["540", "NAME=a PE=pope SEEDS=0 EXTRA='--set x"], "cannot split it into words"),
        (["540", "missing.plan"], "no such plan file"),
        (["soon", "NAME=a PE=pope SEEDS=0"], "SECONDS must be a whole number"),
        (["540"], "usage: gpu_sweeps.sh"),
    ],
)
def test_bad_plans_fail_before_anything_starts(machine, args, message):
    sweeps, monitor, tmp_path, started = machine
    result = sweeps(*args)
    assert result.returncode == 2 and message in result.stderr, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert not (tmp_path / "runs").exists() and started == []


def test_check_prints_the_plan_and_starts_nothing(machine):
    sweeps, monitor, tmp_path, started = machine
    result = sweeps("--check", 'NAME=rope PE=rope SEEDS=0-3 EXTRA="--set train.autocast=none"')
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "rope: would be started (fresh machine: no runs): PE=rope SEEDS=0-3 "
        "JOBS_PER_GPU=default LIMIT=100000 EXTRA=--set train.autocast=none"
    ]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "logs").exists()
    example = sweeps("--check", "scripts/sweeps/example.plan")  # the plan in the repository parses
    assert example.returncode == 0 and [line.split(":")[0] for line in example.stdout.splitlines()] == [
        "pope-fresh",
        "pope-len32",
    ], example.stdout + example.stderr
    plans = sorted((Path(__file__).resolve().parents[1] / "scripts" / "sweeps").glob("*.plan"))
    assert len(plans) >= 2
    for plan in plans:  # every plan in the repository parses
        checked = sweeps("--check", str(plan))
        assert checked.returncode == 0 and "would be started" in checked.stdout, (plan, checked.stderr)


def test_real_sweep_script_through_gpu_sweeps(tmp_path):
    """scripts/gpu_sweeps.sh with the real scripts/gpu_sweep_indirect.sh, one seed of a tiny CPU model: started;
    its script killed while its `pope train` sweep goes on, that process still counts as running (no second
    trainer on the same run directory); once it is gone the sweep is restarted (the seed finished: only the
    script's scoring is left), watched to its end, then reported finished."""
    from pope.data import indirect_indexing as task

    splits = task.write_splits(tmp_path / "ii", seed=0, sizes={"train": 256, "valid": 32, "test": 32})
    sets = [
        "model.n_layer=1",
        "model.d_model=16",
        "model.n_head=2",
        "recipe.max_steps=4",
        "recipe.warmup_steps=1",
        "recipe.eval_interval=2",
        "recipe.batch_size=8",
        f"train.data_dir={splits}",
        "train.log_interval=2",
        "train.tensorboard=false",
        "train.device=cpu",
    ]
    extra = " ".join(f"--set {item}" for item in sets)
    env = {
        **os.environ,
        "RUNS": str(tmp_path / "runs"),
        "OUT": str(tmp_path / "out"),
        "LOG_DIR": str(tmp_path),
        "SWEEP_OUT": str(tmp_path / "sweep-out"),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "MPS": "off",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    line = f"NAME=tiny PE=pope SEEDS=0 EXTRA='{extra}'"

    def sweeps(*args):
        return subprocess.run(
            ["bash", "scripts/gpu_sweeps.sh", *args, line],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def running():
        found = re.search(r"^tiny: running \(pid ([\d ]+)\)", sweeps("--check").stdout, re.M)
        return [int(pid) for pid in found.group(1).split()] if found else []

    first = sweeps("0")
    assert _lines(first)[0].startswith("tiny: started (fresh machine: no runs)"), first.stdout + first.stderr
    assert "MPS: left alone (MPS=off)" in first.stdout
    script = int(re.search(r"; pid (\d+), log", first.stdout).group(1))
    try:
        deadline = time.monotonic() + 120
        while len(running()) < 2 and time.monotonic() < deadline:  # the script and its `pope train --seeds`
            time.sleep(0.2)
        assert script in running() and len(running()) >= 2
        os.kill(script, signal.SIGKILL)
        while _alive(script):
            time.sleep(0.05)
        left = running()
        assert left and script not in left  # its sweep (and seed) processes, found by --out RUNS/tiny
        while running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running()

        resumed = sweeps("240")
        assert resumed.returncode == 0 and "sweeps ended" in resumed.stdout, resumed.stdout + resumed.stderr
        assert _lines(resumed)[0].startswith("tiny: restarted (resume: seed 0 finished;")
        assert "tiny/seed-0: step 4 finished=True" in resumed.stdout
        log = (tmp_path / "sweep-tiny.log").read_text()
        assert "sweep exit status 0" in log and "fp32 re-score" in log
        for out in ("out", "sweep-out"):  # the monitor's archive in this command's OUT, the script's in its own
            with tarfile.open(tmp_path / out / "sweep-tiny.tar.gz") as archive:
                assert "tiny/seed-0/eval/task_accuracy.json" in archive.getnames()
        again = sweeps("240")
        assert _lines(again) == ["tiny: finished"] and "sweeps ended" in again.stdout, again.stdout + again.stderr
    finally:
        try:
            os.killpg(script, signal.SIGKILL)
        except ProcessLookupError:
            pass
