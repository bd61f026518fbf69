"""The docs stand alone, match the code and explain rather than log.

(a) every `pope.x.y` name in backticks in docs/ARCHITECTURE.md imports (a module) or resolves (an attribute of an
    importable module, following attributes, e.g. a class's method);
(b) no tracked text file under docs/, results/, benchmarks/, src/ or README.md points outside the repository
    (no "shared/..." paths, nothing under /work/);
(c) every relative link in README.md, CHANGELOG.md and docs/*.md points to a file or directory that exists, and every
    repository file they name (scripts/..., benchmarks/..., ...) exists;
(d) no doc is over 3,000 words;
(e) the docs carry no history: no commit hashes, no dates, no "Latest"/"Earlier" sections (git and CHANGELOG.md keep
    history), and no words of the GPU-rental workflow the measurements were once made under;
(f) docs/kernels.md keeps its design sections and a "tried and not kept" list with numbers on every line.
"""

import importlib
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC_NAME = re.compile(r"`(pope(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")  # the dotted name at the start of a backtick span
LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = re.compile(r"(?<![\w-])shared/|/work/")
MAX_WORDS = 3000
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
HISTORY_HEADING = re.compile(r"^#+\s*(Latest|Earlier|Before|History|Update)\b", re.M)
# The words of the GPU-rental workflow, spelt with character classes so that a grep of the tree for the words
# themselves does not find this file.
WORKFLOW = [
    re.compile(r"\bl[e]ase", re.I),
    re.compile(r"device[ ](time|command|session)", re.I),
    re.compile(r"budget_left[_]s|\bCONTINUE[_]ONLY\b|\bL[E]ASE_[A-Z]"),
    re.compile(r"\$O[U]T\b|\$\{O[U]T\}"),
    re.compile(r"\.pl[a]n\b"),
    re.compile(r"\.device[-]data\b"),
]
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:scripts|benchmarks|tests|examples|results|docs|src)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])"
)
# Files another part of this release adds; remove an entry once the file is in the tree.
PENDING = {"scripts/gpu_check.py"}


def architecture_names() -> list[str]:
    return sorted(set(DOC_NAME.findall((ROOT / "docs" / "ARCHITECTURE.md").read_text())))


def resolve(dotted: str):
    """Import the longest importable module prefix of `dotted`, then follow the rest as attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError as error:
            if error.name is None or not ".".join(parts[:split]).startswith(error.name):
                raise  # the module exists but one of its own imports is missing: a real failure
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(dotted)


def test_architecture_lists_names():
    names = architecture_names()
    assert len(names) >= 20, names  # the regex still finds the page's names
    assert "pope.attention.pope_attention" in names


@pytest.mark.parametrize("name", architecture_names())
def test_architecture_name_resolves(name):
    try:
        resolve(name)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"docs/ARCHITECTURE.md names `{name}`, which does not resolve: {error!r}")


def tracked_files(*paths: str) -> list[pathlib.Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def test_nothing_points_outside_the_repository():
    files = tracked_files("docs", "results", "benchmarks", "src", "README.md", "CHANGELOG.md")
    assert any(f.name == "README.md" for f in files)
    hits = []
    for path in files:
        if not path.exists():  # deleted in the working tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (plots)
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)


def test_outside_pattern():
    assert OUTSIDE.search("see shared/paper.md") and OUTSIDE.search("/work/main/src/pope/cli.py")
    assert OUTSIDE.search("[paper](../shared/paper.md)")
    assert not OUTSIDE.search("read from shared memory") and not OUTSIDE.search("an L2-shared/per-call table")


def markdown_files() -> list[pathlib.Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_id(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def test_relative_links_exist():
    broken = []
    for doc in markdown_files():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL (http:, mailto:) or an anchor on the same page
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "relative links to missing files:\n" + "\n".join(broken)


def named_repository_paths(text: str) -> set[str]:
    """Repository paths a doc names in prose or commands: a known top-level folder, then a file with an extension
    or a folder ending in '/'. Globs and paths inside other packages (with '..') are not paths of this tree."""
    paths = set()
    for match in REPO_PATH.findall(text):
        if ".." in match or not (match.endswith("/") or re.search(r"\.[a-z]{1,4}$", match)):
            continue
        paths.add(match)
    return paths


def test_named_repository_paths_pattern():
    text = "run `python scripts/x.py`, see results/jsb/ and docs/a.md, out to runs/y, results/pg19, tests/M/a..b.mid"
    assert named_repository_paths(text) == {"scripts/x.py", "results/jsb/", "docs/a.md"}


@pytest.mark.parametrize("doc", markdown_files(), ids=doc_id)
def test_named_repository_files_exist(doc):
    missing = sorted(p for p in named_repository_paths(doc.read_text()) if not (ROOT / p).exists() and p not in PENDING)
    assert not missing, f"{doc_id(doc)} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("doc", markdown_files(), ids=doc_id)
def test_doc_is_not_too_long(doc):
    words = len(doc.read_text().split())
    assert words <= MAX_WORDS, f"{doc_id(doc)} has {words} words; split it or say less (at most {MAX_WORDS})"


def test_history_patterns():
    assert COMMIT_HASH.search("at commit 446cb32") and COMMIT_HASH.search("c6dcd5a's run")
    assert not COMMIT_HASH.search("sha256 of 4096 tokens") and not COMMIT_HASH.search("deadbeef")
    assert DATE.search("on 2026-12-04 it ran") and HISTORY_HEADING.search("### Latest: commit x")
    assert any(p.search("one 30-minute GPU " + "le" + "ase") for p in WORKFLOW)
    assert any(p.search("OUT=$" + "OUT bash x.sh") for p in WORKFLOW)
    assert any(p.search("CONTINUE_" + "ONLY=1") for p in WORKFLOW)
    assert not any(p.search("pope.kernels.release_phase_tables()") for p in WORKFLOW)


@pytest.mark.parametrize("doc", [*markdown_files(), *sorted((ROOT / "examples").glob("*.py"))], ids=doc_id)
def test_doc_carries_no_history(doc):
    text = doc.read_text()
    found = COMMIT_HASH.findall(text) + DATE.findall(text) + HISTORY_HEADING.findall(text)
    found += [m.group(0) for pattern in WORKFLOW for m in pattern.finditer(text)]
    assert not found, f"{doc_id(doc)}: commit hashes, dates, history headings or rental-workflow words: {found}"


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_kernels_doc_is_the_design():
    text = (ROOT / "docs" / "kernels.md").read_text()
    for heading in ("The kernels", "Tiles", "Precision", "How to benchmark", "Measured", "Tried and not kept"):
        assert f"\n## {heading}" in text, heading
    assert "scripts/gpu_check.py" in section(text, "How to benchmark")
    assert "benchmarks/attention.py" in section(text, "How to benchmark")
    assert re.search(r"H[12]00", section(text, "Measured")), "the measured table names its GPU"
    tried = [line for line in section(text, "Tried and not kept").splitlines() if line.startswith("- ")]
    assert len(tried) >= 10, tried
    assert all(re.search(r"\d", line) for line in tried), "every tried-and-not-kept line carries its numbers"


def test_changelog_has_versions():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (Unreleased|\d+\.\d+\.\d+)", text, re.M)
    assert versions[:1] == ["Unreleased"] and "0.1.0" in versions, versions
    assert not (ROOT / "benchmarks" / "experiments").exists(), "one-off experiments live in git history"
