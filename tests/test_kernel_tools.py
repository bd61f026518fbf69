"""The kernel developer tools (scripts/kernel_variants.py) and the attention benchmark run on CPU, the kernels
through Triton's interpreter, so a change that breaks them shows here and not only on a GPU (their timings mean
nothing on CPU; only that they run and check).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# Not imported here: importing triton in this process (in compiled mode) would make the kernel test modules
# (tests/test_kernel_*.py), collected after this file, fall back to running their interpreter tests in a subprocess.
if importlib.util.find_spec("triton") is None:
    pytest.skip("the Triton kernels need pip install 'pope-attention[triton]'", allow_module_level=True)

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)


def _run_script(args, tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.path.join(ROOT, "src"), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_kernel_variants_compares_module_versions(tmp_path):
    """scripts/kernel_variants.py: two copies of the kernel module and one tile override all give the same
    outputs and gradients as the first module, and each row has its timings."""
    module = "src/pope/kernels"
    stdout = _run_script(
        [
            "scripts/kernel_variants.py",
            "--device",
            "cpu",
            "--module",
            f"a={module}",
            "--module",
            f"b={module}",
            "--shapes",
            "1x2x40x32",
            "--dkdv",
            "32,32,4,1",
            "--variant-tiles-only",
            "b",
            "--out",
            str(tmp_path),
        ],
        tmp_path,
    )
    rows = json.loads((tmp_path / "kernel_variants.json").read_text())["rows"]
    assert [(r["module"], r["plan"]) for r in rows] == [("a", {}), ("b", {}), ("b", {"dkdv": [32, 32, 4, 1]})]
    assert all(r["agrees_with_first"] and r["fwd_ms"] > 0 and r["bwd_ms"] > 0 for r in rows), stdout


def test_attention_benchmark_plots_decode_rows_without_a_gpu(tmp_path):
    """benchmarks/attention.py --plot-decode: the decode.csv rows of one commit (default: the last; not the others)
    become decode.png; a commit with no rows is an error."""
    header = "gpu,torch,triton,commit,date,shape,approach,ms,graph_ms,cache_mb,max_abs_diff_vs_materialized\n"
    rows = [
        f"H200,2.11,3.6,{commit},2026-11-30 20:00 UTC,8x32x8x16384x128,{approach},0.2,{ms},512,0.0\n"
        for commit in ("aaaaaaa", "bbbbbbb")
        for approach, ms in (
            ("pope triton decode (magnitude cache)", 0.18),
            ("pope materialized cache (2d channels) + sdpa", 0.20),
        )
    ]
    (tmp_path / "decode.csv").write_text(header + "".join(rows))
    script = os.path.join(ROOT, "benchmarks", "attention.py")
    # (plot_decode and plot_decode_csv live in attention_decode.py, which attention.py imports them from)
    spec = importlib.util.spec_from_file_location(
        "attention_decode_benchmark", os.path.join(ROOT, "benchmarks", "attention_decode.py")
    )
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    plotted = []
    benchmark.plot_decode = lambda chosen, path, title: plotted.append({r["commit"] for r in chosen})
    benchmark.plot_decode_csv(str(tmp_path / "decode.csv"), str(tmp_path / "unused.png"), "aaaaaaa")
    benchmark.plot_decode_csv(str(tmp_path / "decode.csv"), str(tmp_path / "unused.png"))  # default: the last commit
    assert plotted == [{"aaaaaaa"}, {"bbbbbbb"}]
    _run_script(["benchmarks/attention.py", "--plot-decode", "aaaaaaa", "--out", str(tmp_path)], tmp_path)
    assert (tmp_path / "decode.png").stat().st_size > 10_000
    run = subprocess.run(
        [sys.executable, script, "--plot-decode", "ccccccc", "--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0 and "no rows of commit 'ccccccc'" in run.stderr


def test_kernel_registers_writes_its_lines_to_out(tmp_path):
    """scripts/kernel_registers.py --out DIR: the lines it prints (one per kernel, head dim and tile, compiled for
    sm_90a without a GPU) are also DIR/kernel_registers.txt."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    run = subprocess.run(
        [
            sys.executable,
            "scripts/kernel_registers.py",
            "--kernels",
            "fwd",
            "--head-dims",
            "64",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    written = (tmp_path / "kernel_registers.txt").read_text().splitlines()
    assert len(written) == 1 and written[0].startswith("fwd    d=64  tile ") and "registers" in written[0]
    assert run.stdout.splitlines() == [*written, f"wrote {tmp_path / 'kernel_registers.txt'}"]


def test_kernel_bitwise_ab_needs_an_out_directory():
    run = subprocess.run(
        [sys.executable, "scripts/kernel_bitwise_ab.py", "--old", "src", "--new", "src"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stderr.strip().endswith("error: --old, --new and --out are required")
