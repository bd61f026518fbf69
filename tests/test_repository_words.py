"""No tracked file describes one particular GPU-rental workflow: the library, its scripts and its docs speak of
runs, jobs and time limits (--out, --max-seconds, --resume), not of rented machines, their budgets or a command's
output folder. Data files (*.csv, *.jsonl) are left out: their rows record commands as they were run. The words are
spelled in pieces here, so that this file does not hold them either."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RENT, DEVICE, BUDGET, ONLY = "lea" + "se", "dev" + "ice", "budget" + "_left_s", "continue" + "_only"
WORDS = re.compile(rf"\b(?:{RENT}s?|{RENT}d|{DEVICE}\s+time|{BUDGET}|{ONLY}|{RENT}_[a-z_]+)\b", re.IGNORECASE)
DOLLAR = "$"
OUT_CONVENTION = re.compile(r"\$\{?OUT\b")  # an output folder handed over in an OUT variable (scripts take --out)
DATA = (".csv", ".jsonl")


def offenders(paths: list[str]) -> dict[str, str]:
    """{path: the first match} of the files whose text holds a workflow word."""
    found = {}
    for path in paths:
        if path.endswith(DATA):
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
        f"one 30-minute GPU {RENT}": RENT,
        f"two {RENT.title()}s": f"{RENT.title()}s",
        f"a machine {RENT}d for it": f"{RENT}d",
        f"costs {DEVICE}\ntime": f"{DEVICE}\ntime",
        BUDGET: BUDGET,
        f"{ONLY.upper()}=1": ONLY.upper(),
        f"{RENT.upper()}_BUDGETS": f"{RENT.upper()}_BUDGETS",
        f"--out {DOLLAR}OUT/check": f"{DOLLAR}OUT",
        f"into {DOLLAR}{{OUT}}": f"{DOLLAR}{{OUT",
    }
    for text, word in texts.items():
        match = WORDS.search(text) or OUT_CONVENTION.search(text)
        assert match and match.group(0) == word, text
    for text in (
        "release the lock",
        "please",
        f"{RENT}holder",
        f'out="{DOLLAR}out"',
        f"{DOLLAR}OUTPUT",
        f"{DEVICE} times out",
    ):
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
