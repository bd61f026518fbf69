"""No tracked file describes one particular GPU-rental workflow: the library, its scripts and its docs speak of
runs, jobs and time limits (--out, --max-seconds, --resume), not of leases, device time or a command's output
folder. Data files (*.csv, *.jsonl) are left out: their rows record commands as they were run."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORDS = re.compile(r"\b(?:leases?|leased|device\s+time|budget_left_s|continue_only|lease_[a-z_]+)\b", re.IGNORECASE)
OUT_CONVENTION = re.compile(r"\$\{?OUT\b")  # an output folder handed over in $OUT (scripts take --out instead)
DATA = (".csv", ".jsonl")


def offenders(paths: list[str]) -> dict[str, str]:
    """{path: the first match} of the files whose text holds a workflow word."""
    found = {}
    for path in paths:
        if path.endswith(DATA) or path == "tests/test_repository_words.py":
            continue
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files; a path deleted in the working tree
        match = WORDS.search(text) or OUT_CONVENTION.search(text)
        if match:
            found[path] = " ".join(match.group(0).split())
    return found


def test_the_patterns_catch_each_form():
    texts = {
        "one 30-minute GPU lease": "lease",
        "two Leases": "Leases",
        "a machine leased for it": "leased",
        "costs device\ntime": "device\ntime",
        "budget_left_s": "budget_left_s",
        "CONTINUE_ONLY=1": "CONTINUE_ONLY",
        "LEASE_BUDGETS": "LEASE_BUDGETS",
        "--out $OUT/check": "$OUT",
        "into ${OUT}": "${OUT",
    }
    for text, word in texts.items():
        match = WORDS.search(text) or OUT_CONVENTION.search(text)
        assert match and match.group(0) == word, text
    for text in ("release the lock", "please", "leaseholder", 'out="$out"', "$OUTPUT", "device times out"):
        assert not (WORDS.search(text) or OUT_CONVENTION.search(text)), text


def test_no_tracked_file_speaks_of_a_gpu_rental_workflow():
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    found = offenders(listed.splitlines())
    assert not found, f"{len(found)} tracked files speak of a GPU-rental workflow:\n" + "\n".join(
        f"  {path}: {word!r}" for path, word in sorted(found.items())
    )
