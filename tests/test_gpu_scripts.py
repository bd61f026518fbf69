"""The GPU scripts run on CPU through Triton's interpreter, so a change that breaks them shows here and not only
when a GPU lease is spent on them (their numbers mean nothing on CPU; only that they run and check).
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


def test_gpu_kernel_check_smoke(tmp_path):
    """scripts/gpu_kernel_check.py --smoke: every correctness row passes, the backward is deterministic."""
    _run_script(["scripts/gpu_kernel_check.py", "--smoke", "--out", str(tmp_path)], tmp_path)
    result = json.loads((tmp_path / "gpu_kernel_check.json").read_text())
    assert len(result["correctness"]) == 40 and all(r["passed"] for r in result["correctness"])  # 37 batched, 3 varlen
    assert result["determinism"]["bitwise_identical_over_3_runs"]
    assert result["decode_growing_cache"]["passed"]


def test_gpu_kernel_check_smoke_tf32(tmp_path):
    """--dtypes tf32 on CPU: the kernels' TF32 dots (the interpreter truncates their operands as the GPU does)
    within 2x of attention in TF32 arithmetic (pope.testing.tf32_reference), at every smoke row: offsets up
    to 10^7, decode, packed batches."""
    _run_script(["scripts/gpu_kernel_check.py", "--smoke", "--dtypes", "tf32", "--out", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "gpu_kernel_check.json").read_text())["correctness"]
    assert len(rows) == 10 and all(r["passed"] and r["dtype"] == "tf32" for r in rows)
    # TF32-sized errors: the check compared TF32 with TF32, not with full fp32; only the lanes decode kernel (one
    # query per key head, shape (B, H, H, 1, Nk, ...)) computes in fp32 FMAs, without tensor cores
    assert all(r["out"]["reference"] > 1e-5 for r in rows)
    lanes = [r for r in rows if not r.get("varlen") and r["shape"][1] == r["shape"][2] and r["shape"][3] == 1]
    assert len(lanes) == 2 and all(r["out"]["kernel"] < 1e-6 for r in lanes)
    assert all(r["out"]["kernel"] > 1e-5 for r in rows if r not in lanes)


def test_gpu_kernel_check_reports_each_failure_and_runs_the_rest(tmp_path):
    """scripts/gpu_kernel_check.py --isolate: a check that raises and a check whose process dies are failed rows, each
    one line saying what failed; the checks after them still run (in a fresh process) and pass; the final table
    prints and the exit status is 1."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.path.join(ROOT, "src"), "CUDA_VISIBLE_DEVICES": ""}
    # items: 0 varlen fp32, 1 determinism, 2 the decode growing-cache check
    run = subprocess.run(
        [
            sys.executable,
            "scripts/gpu_kernel_check.py",
            "--smoke",
            "--checks",
            "varlen",
            "--dtypes",
            "fp32",
            "--isolate",
            "--raise-in-items",
            "0",
            "--die-in-items",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_kernel_check.json").read_text())
    assert [r["passed"] for r in result["correctness"]] == [False]
    assert result["correctness"][0]["error"] == "raised RuntimeError: simulated failure of item 0 (--raise-in-items)"
    assert (
        not result["determinism"]["passed"]
        and "the check process died (exit status 134)" in result["determinism"]["error"]
    )
    assert result["decode_growing_cache"]["passed"]
    table = run.stdout[run.stdout.index("check                  passed / total") :].splitlines()
    assert [line.split() for line in table[1:4]] == [
        ["varlen", "0", "/", "1"],
        ["determinism", "0", "/", "1"],
        ["decode_growing_cache", "1", "/", "1"],
    ], run.stdout
    assert table[4].startswith(
        "FAIL fp32 varlen ([0, 1, 5, 12, 0], [3, 1, 40, 12, 0]) Hq=2 Hkv=1 d=32 causal=True: "
        "raised RuntimeError: simulated failure"
    ), table
    assert table[5].startswith("FAIL determinism (1, 4, 2, 97, 97, 48, True): the check process died"), table
    assert "2 failed" in table[6], table


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
    spec = importlib.util.spec_from_file_location("attention_benchmark", script)
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
