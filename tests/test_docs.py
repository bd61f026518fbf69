"""The docs stand alone and match the code.

(a) every `pope.x.y` name in backticks in docs/ARCHITECTURE.md imports (a module) or resolves (an attribute of an
    importable module, following attributes, e.g. a class's method);
(b) no tracked text file under docs/, results/, benchmarks/, src/ or README.md points outside the repository
    (no "shared/..." paths, nothing under /work/);
(c) every relative link in README.md and docs/*.md points to a file or directory that exists.
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
    files = tracked_files("docs", "results", "benchmarks", "src", "README.md")
    assert any(f.name == "README.md" for f in files)
    hits = []
    for path in files:
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
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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
