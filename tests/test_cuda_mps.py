"""CUDA MPS for seed sweeps: scripts/cuda_mps.sh's start/stop paths (with a stand-in control program: this machine
has no GPU) and the process-table check that runs record in env.json."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pope.provenance import cuda_mps_active

ROOT = Path(__file__).resolve().parents[1]


def _mps(action, tmp_path, path):
    env = {
        **os.environ,
        "PATH": path,
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipes"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "logs"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    return subprocess.run(
        ["bash", "scripts/cuda_mps.sh", action], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_start_without_mps_says_so_and_fails(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = _mps("start", tmp_path, f"{empty}{os.pathsep}{os.environ['PATH']}")
    assert result.returncode == 1
    assert (
        result.stdout.strip() == "MPS: off (nvidia-cuda-mps-control is not on this machine); processes sharing "
        "a GPU time-slice it"
    )


def test_start_stops_the_daemon_again_when_no_cuda_context_opens(tmp_path):
    """The daemon starts, but no CUDA context opens (no GPU here): MPS is stopped again and start fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(f'#!/usr/bin/env bash\nif [ $# -gt 0 ]; then echo "$@" >> {calls}; else cat >> {calls}; fi\n')
    fake.chmod(0o755)
    result = _mps("start", tmp_path, f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("MPS: off (the daemon started but a CUDA context through it failed")
    assert calls.read_text().split() == ["-d", "quit"]
    assert (tmp_path / "pipes").is_dir() and (tmp_path / "logs").is_dir()


def test_usage_error(tmp_path):
    result = _mps("restart", tmp_path, os.environ["PATH"])
    assert result.returncode == 2 and "usage: cuda_mps.sh start|status|stop" in result.stderr


def test_cuda_mps_active_reads_the_process_table(tmp_path):
    for pid, comm in (("1", "systemd\n"), ("42", "python3\n"), ("self", "nvidia-cuda-mps\n")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "comm").write_text(comm)
    assert not cuda_mps_active(tmp_path)  # "self" is not a process id
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "comm").write_text("nvidia-cuda-mps\n")  # the server's or daemon's name, cut to 15
    assert cuda_mps_active(tmp_path)
    assert not cuda_mps_active(tmp_path / "missing")
