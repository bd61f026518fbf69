"""scripts/gpu_check.py: its verdicts, the README table it generates, and an end-to-end run on the CPU (--smoke).

The GPU numbers themselves come from running the check on a GPU; here we check that the check can fail (a value past
its tolerance is REGRESSED, a correctness row past the rule is FAIL), that README's performance table is exactly what
the committed CSV's latest run gives, and that the script runs every section and writes its rows.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402


def threshold(better: str, baseline: float | None, tolerance: float = 0.1, target: float | None = None) -> dict:
    return {"better": better, "target": target, "baseline": baseline, "tolerance": tolerance, "readme": ""}


def test_a_value_worse_than_baseline_beyond_its_tolerance_is_regressed():
    lower = threshold("lower", 2.0)  # a time ratio: 2.2 is the edge of 10 %
    assert gpu_check.verdict(2.19, lower) == "PASS"
    assert gpu_check.verdict(1.5, lower) == "PASS"
    assert gpu_check.verdict(2.21, lower) == "REGRESSED"
    higher = threshold("higher", 0.9)  # a speed ratio: 0.81 is the edge
    assert gpu_check.verdict(0.82, higher) == "PASS"
    assert gpu_check.verdict(0.80, higher) == "REGRESSED"
    assert gpu_check.verdict(0.5, None) == "NEW" and gpu_check.verdict(0.5, threshold("higher", None)) == "NEW"
    assert gpu_check.verdict(None, higher) == "ERROR" and gpu_check.verdict(float("nan"), higher) == "ERROR"


def test_targets_are_reported_apart_from_regressions():
    assert gpu_check.target_met(0.93, threshold("higher", 0.9, target=0.95)) == "missed"
    assert gpu_check.target_met(0.96, threshold("higher", 0.9, target=0.95)) == "met"
    assert gpu_check.target_met(1.9, threshold("lower", 2.0, target=2.0)) == "met"
    assert gpu_check.target_met(1.9, threshold("lower", 2.0)) == ""


def test_thresholds_file_names_real_checks_and_valid_directions():
    table = gpu_check.read_thresholds()
    assert table, "benchmarks/gpu_check_thresholds.csv is empty"
    for check, row in table.items():
        assert row["better"] in ("higher", "lower"), check
        assert row["tolerance"] is not None and 0 < row["tolerance"] < 1, check


def test_bad_threshold_direction_is_one_clear_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("check,better,target,baseline,tolerance,readme\nx,faster,1,1,0.1,\n")
    with pytest.raises(ValueError, match="better='faster'; use higher or lower"):
        gpu_check.read_thresholds(path)


def test_readme_performance_table_comes_from_the_latest_gpu_check_run():
    csv_path = ROOT / "benchmarks" / "results" / "gpu_check.csv"
    readme = (ROOT / "README.md").read_text()
    assert gpu_check.README_BEGIN in readme and gpu_check.README_END in readme
    section = readme.split(gpu_check.README_BEGIN, 1)[1].split(gpu_check.README_END, 1)[0].strip()
    expected = gpu_check.readme_table(gpu_check.latest_rows(csv_path), gpu_check.read_thresholds())
    assert section == expected.strip(), "README's table is stale: run python scripts/gpu_check.py --update-readme"
    latest = gpu_check.latest_rows(csv_path)
    assert all(row["gpu"].startswith("NVIDIA") for row in latest), "the committed rows must come from a GPU"


def test_update_readme_rewrites_only_the_marked_section(tmp_path):
    rows = [
        dict(run="r1", date_utc="2026-01-01T00:00:00Z", gpu="NVIDIA X", torch="2", triton="3", cuda="13", commit="c1",
             command="", section="gpt2", check="GPT-2 124M train step 8x1024 [default]: PoPE / RoPE tokens/s",
             value="0.5", unit="", target="", baseline="", status="NEW"),
        dict(run="r2", date_utc="2026-01-02T00:00:00Z", gpu="NVIDIA X", torch="2", triton="3", cuda="13", commit="c2",
             command="", section="gpt2", check="GPT-2 124M train step 8x1024 [default]: PoPE / RoPE tokens/s",
             value="0.912", unit="", target="", baseline="", status="NEW"),
    ]  # fmt: skip
    csv_path = tmp_path / "gpu_check.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=gpu_check.CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{gpu_check.README_BEGIN}\nold table\n{gpu_check.README_END}\noutro\n")
    gpu_check.update_readme(csv_path, readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old table" not in text
    assert "| 0.912× | ≥ 0.95×, missed |" in text and "0.5×" not in text  # the check's latest row, with its target
    assert "NVIDIA X (torch 2, triton 3)" in text and "benchmarks/results/gpu_check.csv" in text


@pytest.mark.slow
def test_smoke_run_measures_every_section_and_appends_rows(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--sections", "all", "--out", tmp_path],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    rows = list(csv.DictReader(open(tmp_path / "gpu_check.csv")))
    sections = {row["section"] for row in rows}
    assert sections == set(gpu_check.SECTIONS), result.stdout + result.stderr
    correctness = [row for row in rows if row["section"] == "correctness"]
    assert correctness and all(row["status"] == "PASS" for row in correctness), result.stdout
    assert all(row["value"] and row["gpu"].startswith("cpu") and row["commit"] for row in rows)
    assert not [row for row in rows if row["status"] == "ERROR"], result.stdout + result.stderr


def test_a_plain_run_checks_all_but_the_presets_and_all_names_every_section():
    assert gpu_check.parse_sections(",".join(gpu_check.DEFAULT_SECTIONS)) == ["correctness", "attention", "gpt2", "hf"]
    assert gpu_check.parse_sections("all") == list(gpu_check.SECTIONS)
    assert gpu_check.parse_sections("hf, gpt2") == ["gpt2", "hf"]  # the check's order, whatever the order given
    for bad in ("gpt3", "", "all,hf"):
        with pytest.raises(ValueError, match="choose from"):
            gpu_check.parse_sections(bad)


def test_without_a_gpu_the_check_says_so_in_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("scripts/gpu_check.py needs an NVIDIA GPU")
