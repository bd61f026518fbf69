"""pope.hf's transformers version guard: an unsupported version fails `import pope.hf` with one line naming the
supported versions; supported ones (4.50+, 5.x, release candidates, dev builds) pass. Fast: no model is built."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is part of the [hf] extra")

from pope.hf import compat  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "version, parsed",
    [
        ("4.50.0", (4, 50)),
        ("4.57.6", (4, 57)),
        ("5.0.0rc1", (5, 0)),
        ("4.58.0.dev0", (4, 58)),
        ("5.24.0", (5, 24)),
        ("6", (6, 0)),
    ],
)
def test_supported_versions_pass(version, parsed):
    assert compat.check_version(version) == parsed


@pytest.mark.parametrize("version", ["4.49.2", "4.36.0", "3.5.1", "not-a-version"])
def test_unsupported_versions_are_refused_in_one_line(version):
    with pytest.raises(ImportError) as caught:
        compat.check_version(version)
    message = str(caught.value)
    assert "\n" not in message and "transformers >= 4.50" in message and version in message


def test_import_pope_hf_with_an_old_transformers_fails_with_one_line():
    """The real import in a fresh interpreter whose transformers says it is 4.45.2."""
    code = "import transformers; transformers.__version__ = '4.45.2'; import pope.hf"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pope.hf needs transformers >= 4.50") and "4.45.2" in last, run.stderr[-2000:]
