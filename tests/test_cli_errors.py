"""The top-level CLI: one error line per user-facing fault (traceback only with --debug), Ctrl-C -> 130,
and listings people can discover (presets, positional encodings)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pope.cli import main
from pope.cli.listings import preset_rows
from pope.data import registry


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad value; do X"),
        TypeError("wrong type; pass an int"),
        FileNotFoundError("no such file /x; create it"),
        PermissionError(13, "Permission denied", "/ro"),
        IsADirectoryError(21, "Is a directory", "/d"),
        NotADirectoryError(20, "Not a directory", "/f/x"),
        RuntimeError("the device failed; retry"),
    ],
)
def test_user_errors_are_one_line_without_traceback(monkeypatch, capsys, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(registry, "prepare", fail)
    assert main(["data", "prepare", "jsb"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pope data prepare: error: ") and err.count("\n") == 1 and "Traceback" not in err
    if isinstance(error, OSError) and error.filename:
        assert error.filename in err and error.strerror in err
    else:
        assert str(error) in err
    with pytest.raises(type(error)):  # --debug (anywhere on the line) shows the real exception
        main(["data", "prepare", "jsb", "--debug"])


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "prepare", interrupted)
    assert main(["data", "prepare", "jsb"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "pope data prepare: interrupted" and "Traceback" not in err


def test_unknown_command_and_missing_arguments_use_argparse(capsys):
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2 and "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["eval", "length"])
    assert info.value.code == 2 and "required" in capsys.readouterr().err


def test_presets_lists_every_preset_with_size_dataset_and_description(capsys):
    from pope.presets import PRESETS

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name, preset in PRESETS.items():
        line = next(row for row in out.splitlines() if row.split()[:1] == [name])
        assert f"{preset.model['n_layer']} x {preset.model['d_model']}" in line
        assert preset.recipe.dataset in line and preset.description in line
    rows = {row["name"]: row for row in preset_rows()}
    assert 120e6 < rows["owt-124m"]["params"] < 130e6  # GPT-2 small with tied embeddings: ~124M
    # the count is the real module's: a built tiny model agrees exactly
    from pope.data.indirect_indexing import VOCAB_SIZE
    from pope.model import GPT

    tiny = PRESETS["jsb-tiny"]
    assert rows["jsb-tiny"]["params"] == GPT(tiny.model_config(pe="pope", **tiny.model)).num_params()
    assert (
        rows["indirect-indexing-tiny"]["params"]
        == GPT(PRESETS["indirect-indexing-tiny"].model_config(pe="pope", vocab_size=VOCAB_SIZE)).num_params()
    )
    assert main(["presets", "jsb"]) == 0 and '"dataset": "jsb"' in capsys.readouterr().out
    assert main(["presets", "nope-preset"]) == 1
    assert "unknown preset 'nope-preset'; valid presets:" in capsys.readouterr().err


def test_train_list_and_help_name_the_presets(capsys):
    with pytest.raises(SystemExit) as info:  # no PRESET/--pe/--out needed, like --version
        main(["train", "--list"])
    assert info.value.code == 0
    assert "owt-124m" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "presets: genome, genome-small, genome-tiny," in help_text and "owt-774m" in help_text


def test_data_commands_start_without_torch(tmp_path):
    """`pope data ...` needs no torch, so it does not import it (~1.5 s a call: scripts run `pope data info` once a
    stage); the parser names the presets in `pope train --help` only when that help is shown."""
    from pope.data.writer import PreparedWriter

    with PreparedWriter(tmp_path / "tokens", 50) as writer:
        for split in ("train", "valid", "test"):
            writer.add_document(split, list(range(1, 40)))
        writer.finish(
            {
                "name": "tokens",
                "vocab": {"pad_id": None},
                "seq_len": 16,
                "request": {"dataset": "tokens"},
                "source": {"description": "test"},
                "train_transform": None,
            }
        )
    code = (
        "import sys; from pope.cli import main; code = main(['data', 'info', sys.argv[1], '--verify']); "
        "print('exit', code, 'torch', 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "tokens")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split()[-4:] == ["exit", "0", "torch", "False"], result.stdout + result.stderr


def test_pe_list_shows_encodings_and_their_options(capsys):
    from pope.encodings import list_positional_encodings

    assert main(["pe", "--list"]) == 0
    out = capsys.readouterr().out
    names = {line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")}
    assert set(list_positional_encodings()) <= names
    assert "delta_init='zero'" in out and "use_delta=True" in out and "base=10000.0" in out
    assert main(["pe", "pope"]) == 0 and "rope " not in capsys.readouterr().out
    assert main(["pe", "foo"]) == 1 and "unknown positional encoding 'foo'" in capsys.readouterr().err
