"""The README's quick-start block runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quickstart_runs(capsys):
    text = README.read_text()
    marker = text.index("<!-- quickstart")
    block = re.search(r"```python\n(.*?)```", text[marker:], re.S).group(1)
    exec(compile(block, "README quickstart", "exec"), {})
    printed = capsys.readouterr().out
    assert "torch.Size([2, 8, 128, 64])" in printed and "'pope'" in printed
