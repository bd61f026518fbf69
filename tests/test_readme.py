"""The README is short, its quick start runs, its commands parse, and its tables keep their shape.

(a) the quick-start block runs as written;
(b) every `pope ...` line of its shell blocks parses with the CLI's own parser, naming presets and positional
    encodings that exist, and the listing commands run;
(c) it stays under 1,500 words, no table cell is longer than 200 characters, every results row links to a folder
    under results/ that exists, and the performance table sits between the GPU check's markers.
"""

import pathlib
import re
import shlex

import pytest

import pope
from pope.cli import build_parser, main

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_WORDS = 1500
MAX_CELL = 200


def readme() -> str:
    return README.read_text()


def test_readme_quickstart_runs(capsys):
    text = readme()
    marker = text.index("<!-- quickstart")
    block = re.search(r"```python\n(.*?)```", text[marker:], re.S).group(1)
    exec(compile(block, "README quickstart", "exec"), {})
    printed = capsys.readouterr().out
    assert "torch.Size([2, 8, 128, 64])" in printed and "'pope'" in printed


def shell_commands() -> list[list[str]]:
    """Every `pope ...` line of the README's bash blocks, comments dropped, as argv lists (without `pope`)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", readme(), re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "pope":
                commands.append(words[1:])
    return commands


def test_readme_shows_commands():
    commands = shell_commands()
    assert len(commands) >= 6, commands
    assert {argv[0] for argv in commands} >= {"train", "eval", "report", "presets", "pe", "data"}


@pytest.mark.parametrize("argv", shell_commands(), ids=lambda argv: " ".join(argv[:2]))
def test_readme_command_parses(argv):
    args = build_parser().parse_args(argv)
    if argv[0] == "train":
        assert args.preset in pope.list_presets(), args.preset
        assert args.pe is not None or args.print_config, argv  # only --print-config runs without --pe
        name = (args.pe or "pope").split(":", 1)[0]
        assert name in pope.list_positional_encodings(), args.pe


@pytest.mark.parametrize("argv", [["presets"], ["pe", "--list"], ["--help"], ["train", "jsb-tiny", "--print-config"]])
def test_readme_listing_commands_run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as stop:  # --help exits through argparse
        code = stop.code
    assert code in (0, None)
    assert capsys.readouterr().out.strip()


def test_readme_is_short():
    words = len(readme().split())
    assert words < MAX_WORDS, f"README.md has {words} words; keep it under {MAX_WORDS}"


def table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| :]+\|", line.strip()):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_readme_cells_are_short():
    long_cells = [cell for row in table_rows(readme()) for cell in row if len(cell) > MAX_CELL]
    assert not long_cells, f"cells over {MAX_CELL} characters: {long_cells}"


def results_table() -> list[list[str]]:
    section = readme().split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = table_rows(section)
    assert rows and rows[0][:2] == ["experiment", "ours"], rows[:1]
    return rows[1:]


def test_results_rows_link_to_their_folders():
    rows = results_table()
    assert len(rows) >= 8
    for row in rows:
        links = re.findall(r"\]\((results/[^)]+)\)", row[0])
        if "not run" in row[-1]:
            continue
        assert links, f"results row without a link to its folder: {row[0]}"
        for link in links:
            assert (ROOT / link).is_dir(), f"{link} is not a folder of the repository"


def test_performance_table_between_gpu_check_markers():
    text = readme()
    begin, end = text.index("<!-- gpu-check:begin -->"), text.index("<!-- gpu-check:end -->")
    assert begin < end
    rows = table_rows(text[begin:end])
    assert rows[0] == ["measurement", "PoPE / baseline", "target"], rows[0]
    assert len(rows) >= 2
    headings = re.findall(r"^## (.+)$", text[:begin], re.M)
    assert headings[-1].startswith("Performance"), headings[-1]
