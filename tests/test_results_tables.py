"""The committed results are data: each folder's tables (runs.csv, curves.csv, lengths.csv) regenerate its
report.md exactly, and the numbers its README and results/REPRODUCTION.md quote are recomputed here from the tables
with the report's own statistics (pope.eval.stats). A number edited in a document, or a table edited without its
documents, fails here."""

import csv
import re
import statistics
import subprocess
from pathlib import Path

import pytest

from pope.eval.report import load_records, report_markdown
from pope.eval.report_records import eval_records, headline_metric, run_metric
from pope.eval.report_tables import read_tables
from pope.eval.stats import fisher_exact, paired_interval, permutation_test, welch_interval

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
REPRODUCTION = (RESULTS / "REPRODUCTION.md").read_text()

# (folder, --only globs, --against, the report it regenerates): the commands in each folder's README
REPORTS = [
    ("demo", None, None, "demo/report.md"),
    ("jsb", None, None, "jsb/report.md"),
    ("maestro", None, None, "maestro/report.md"),
    ("genome", ["genome-*"], None, "genome/report.md"),
    ("genome", ["genome-pope*", "genome-rope/*", "finetune/*-ft4000"], None, "genome/finetune/report.md"),
    ("text", ["text-*"], None, "text/report.md"),
    ("text", ["ablations/ablation-*"], "ablations/ablation-full", "text/ablations/report.md"),
    ("indirect_indexing", ["*/seed-*"], "pope", "indirect_indexing/report.md"),
    ("indirect_indexing", ["*-200k/*"], None, "indirect_indexing/200k/report.md"),
]


def _finals(folder: str, setting: str, value: str = "value") -> list[float]:
    """The finished seeds' values of one setting (its run ids start with SETTING/), in seed order."""
    records = [r for r in read_tables(RESULTS / folder) if r.run_id.startswith(setting + "/") and r.finished]
    return [getattr(r, value) for r in sorted(records, key=lambda r: r.seed)]


def _mean_std(values: list[float], digits: int, scale: float = 1.0) -> str:
    return f"{scale * statistics.fmean(values):.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def _ppl(folder: str, setting: str, length: int) -> list[float]:
    """Each seed's test perplexity at ``length`` (the whole window) from lengths.csv."""
    return [
        row["perplexity"]
        for record in read_tables(RESULTS / folder)
        if record.run_id.startswith(setting + "/")
        for row in record.lengths
        if row["length"] == length and row["position_from"] is None
    ]


def _readme(folder: str) -> str:
    return (RESULTS / folder / "README.md").read_text()


@pytest.mark.parametrize("folder, only, against, report", REPORTS, ids=[r[3] for r in REPORTS])
def test_each_committed_report_is_what_pope_report_makes_of_the_tables(folder, only, against, report):
    assert report_markdown(load_records([str(RESULTS / folder)], only), against) == (RESULTS / report).read_text()


@pytest.mark.parametrize("folder", ["demo", "jsb", "maestro", "genome", "text", "indirect_indexing"])
def test_each_runs_headline_is_the_one_its_curves_give(folder):
    records = read_tables(RESULTS / folder)
    assert records and all(r.provenance.get("commit") and r.provenance.get("gpu") for r in records)
    for record in records:
        metric, value = headline_metric(eval_records(record.curves), run_metric(record.preset, record.config))
        assert (metric, value) == (record.metric, record.value), record.run_id


@pytest.mark.parametrize("folder", ["demo", "jsb", "maestro", "genome", "text", "indirect_indexing"])
def test_each_run_names_its_own_folder_as_experiment(folder):
    # runs merged in from another folder's report keep that folder's name unless the merge sets it
    with open(RESULTS / folder / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {row["experiment"] for row in rows} == {folder}


def test_demo_tables_give_make_demos_table():
    """The tables come from a second `make demo` run; its NLL per length is demo.md's at every printed digit."""
    demo = (RESULTS / "demo" / "demo.md").read_text()
    for record in read_tables(RESULTS / "demo"):
        cells = [f"{row['nll']:.4f}" for row in record.lengths if row["position_from"] is None]
        assert len(cells) == 4
        row = next(line for line in demo.splitlines() if line.startswith("| ") and f"| {record.pe} |" in line)
        assert [cell.split(" (")[0] for cell in row.strip(" |").split(" | ")[3:]] == cells, record.run_id


def test_jsb_numbers():
    pope, rope = _finals("jsb", "jsb-pope", "at_best_valid"), _finals("jsb", "jsb-rope", "at_best_valid")
    test, (low, high, _) = permutation_test(pope, rope), welch_interval(pope, rope)
    assert test.exact and test.p_value == pytest.approx(2 / 252)
    row = (
        f"{_mean_std(pope, 4)} vs {_mean_std(rope, 4)} (5 seeds each, best-valid checkpoint): "
        f"−{abs(statistics.fmean(pope) - statistics.fmean(rope)):.4f}, p = {test.p_value:.4f}"
    )
    assert row in REPRODUCTION
    assert f"−{abs(low):.4f} … −{abs(high):.4f}" in _readme("jsb") and "p = 0.0079 = 2/252" in _readme("jsb")
    assert max(pope) < min(rope)  # "every PoPE seed below every RoPE seed"


def test_maestro_numbers():
    pope, rope = (
        _finals("maestro", "maestro-pope", "at_best_valid"),
        _finals("maestro", "maestro-rope", "at_best_valid"),
    )
    test = permutation_test(pope, rope)
    assert test.exact and test.p_value == pytest.approx(10 / 252)
    assert f"{_mean_std(pope, 4)} vs {_mean_std(rope, 4)}" in REPRODUCTION
    assert f"**p = 10/252 = {test.p_value:.3f}**" in _readme("maestro")


def test_genome_numbers():
    nll = {pe: _finals("genome", f"genome-{pe}") for pe in ("pope", "pope-d0", "rope")}
    test = permutation_test(nll["pope"], nll["rope"])
    assert test.exact and test.splits == 20 and test.p_value == pytest.approx(0.1)
    assert f"{_mean_std(nll['pope'], 4)} vs {_mean_std(nll['rope'], 4)} (3 seeds each)" in REPRODUCTION
    readme = _readme("genome")
    for pe in ("pope", "pope-d0", "rope"):
        assert f"| {_mean_std(nll[pe], 4)} |" in readme
    d0, rope = (_ppl("genome", f"genome-{pe}", length) for pe, length in (("pope-d0", 1000), ("rope", 10000)))
    assert f"{_mean_std(d0, 1)} → {_mean_std(_ppl('genome', 'genome-pope-d0', 10000), 1)}" in readme
    assert "1,676.3 ± 25.9" in readme and _mean_std(rope, 1) == "1676.3 ± 25.9"
    # seed 2's first trainings in place of the table's
    first = [*_finals("genome", "genome-pope")[:2], *_finals("genome", "first-copies/genome-pope")]
    assert f"{_mean_std(first, 4)} (δ=U)" in readme


def test_text_numbers():
    readme = _readme("text")
    for setting in ("text-pope-d0", "text-rope"):
        cells = " | ".join(_mean_std(_ppl("text", setting, length), 2) for length in (256, 512, 1024, 2048, 2560))
        assert f"| 3 | {cells} |" in readme, setting
    assert "RoPE 76.22 → 114.40 (3 seeds)" in REPRODUCTION
    assert _mean_std(_ppl("text", "text-rope", 2560), 2) == "114.40 ± 5.72"
    # the ablations: each seed paired with the full PoPE of the same seed
    full = _finals("text", "ablations/ablation-full")
    for name, row in (("identity", 14), ("relu", 15), ("no-delta", 16)):
        differences = [a - b for a, b in zip(_finals("text", f"ablations/ablation-{name}"), full, strict=True)]
        low, high, _ = paired_interval(differences)
        cell = f"{statistics.fmean(differences):+.4f} nats vs full PoPE, paired 95 % {low:+.4f} … {high:+.4f}"
        assert cell.replace("-", "−") in REPRODUCTION, (row, cell)


def test_indirect_indexing_numbers():
    pope, rope = _finals("indirect_indexing", "pope"), _finals("indirect_indexing", "rope")
    wrap, wrap200, rope200 = (_finals("indirect_indexing", s) for s in ("pope-wrap", "pope-wrap-200k", "rope-200k"))
    readme = _readme("indirect_indexing")
    assert f"{_mean_std(pope, 2, 100)} % (8 seeds, 100k steps, none past 20 %)" in REPRODUCTION
    assert f"| 8 | {_mean_std(pope, 2, 100)} | {', '.join(f'{100 * v:.2f}' for v in pope)} | 0/8 |" in readme
    assert max(pope) < 0.20 and sum(v > 0.20 for v in wrap) == 8 and len(wrap) == 13
    gap = permutation_test(pope, rope)
    difference = 100 * (statistics.fmean(pope) - statistics.fmean(rope))
    assert gap.exact and f"+{difference:.1f} points at 100k steps (8 vs 4 seeds, p = {gap.p_value:.2f})" in REPRODUCTION
    assert f"δ wrapped (our change) {_mean_std(wrap, 2, 100)} % (13)" in REPRODUCTION
    assert f"Fisher p = {fisher_exact(8, 13, 0, 8):.4f}" in readme
    assert f"permutation p = {permutation_test(wrap, pope).p_value:.3f}" in readme
    late, difference = permutation_test(wrap200, rope200), 100 * (statistics.fmean(wrap200) - statistics.fmean(rope200))
    assert f"δ wrapped − RoPE +{difference:.1f} (5 vs 5, p = {late.p_value:.2f})" in REPRODUCTION
    assert f"RoPE {_mean_std(rope200, 2, 100)} %" in REPRODUCTION
    # the paper's recipe at 200k steps against RoPE and against δ wrapped, five seeds a side
    recipe200 = _finals("indirect_indexing", "pope-200k")
    assert len(recipe200) == 5
    late = permutation_test(recipe200, rope200)
    difference = f"{100 * (statistics.fmean(recipe200) - statistics.fmean(rope200)):+.1f}".replace("-", "−")
    lifted = sum(v > 0.20 for v in recipe200)
    assert f"at 200k PoPE − RoPE {difference} (5 vs 5, p = {late.p_value:.2f})" in REPRODUCTION
    assert f"given 200k steps {_mean_std(recipe200, 2, 100)} % (5 seeds)" in REPRODUCTION
    per_seed = ", ".join(f"{100 * v:.2f}" for v in recipe200)
    assert f"| 5 | {_mean_std(recipe200, 2, 100)} | {per_seed} | {lifted}/5 |" in readme
    assert f"{_mean_std(recipe200, 2, 100)} | {lifted}/5 |" in readme  # the table beside the replication
    assert f"RoPE {difference} points, exact permutation p = {late.p_value:.2f}" in readme
    against_wrap = permutation_test(recipe200, wrap200)
    difference = f"{100 * (statistics.fmean(recipe200) - statistics.fmean(wrap200)):+.1f}".replace("-", "−")
    assert f"the paper's recipe − wrapped {difference}, p = {against_wrap.p_value:.2f}" in readme
    assert "fifth seed is not run yet" not in readme
    half = _finals("indirect_indexing", "rope-half")
    assert f"{_mean_std(half, 2, 100)} % (2 seeds: {100 * half[0]:.2f}, {100 * half[1]:.2f} %)" in REPRODUCTION


def test_reproduction_rows_are_short_and_link_to_their_results():
    rows = [line for line in REPRODUCTION.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(line.split("|")[1]) for line in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 22
    for line in rows:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 6 and all(len(cell) <= 200 for cell in cells), cells[0]
        links = re.findall(r"\]\(([^)]+)\)", cells[5])
        assert links or cells[5].startswith("command "), cells[0]
        assert all((RESULTS / link).is_file() for link in links), links


def test_results_stay_small_and_readable():
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert 0 < len(tracked) <= 150
    assert not [path for path in tracked if path.endswith((".log", ".jsonl"))]
    for readme in RESULTS.glob("*/README.md"):
        words = len(readme.read_text().split())
        assert words <= 3000, (readme, words)
        for target in re.findall(r"\]\(([^)#]+\.(?:png|md))\)", readme.read_text()):
            assert (readme.parent / target).is_file(), (readme, target)
