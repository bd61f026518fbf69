"""`pope data prepare` never deletes what it did not create; damaged data and sources are named as such."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pope.cli import main
from pope.data import offline
from pope.data.paths import cache_root, data_root
from pope.data.prepared import DamagedDatasetError, PreparedDataset
from pope.data.writer import MARKER_NAME, PreparedWriter

CHORALE = [[60, 55, 52, 48]] * 8  # 8 sixteenth-note steps of one C-major chord


def _jsb_json(path: Path) -> Path:
    if not path.exists():  # written once: its mtime is part of the prepare's request
        path.write_text(json.dumps({"train": [CHORALE] * 3, "valid": [CHORALE], "test": [CHORALE]}))
    return path


def _prepare(tmp_path, out, *extra) -> int:
    return main(
        [
            "data",
            "prepare",
            "jsb",
            "--source",
            str(_jsb_json(tmp_path / "jsb.json")),
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ]
    )


def _user_files(directory: Path) -> dict[str, bytes]:
    files = {"model.bin": b"my model weights", "manifest.json.bak": b'{"mine": 1}', "notes.txt": b"keep"}
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_bytes(content)
    return files


def test_prepare_refuses_a_directory_it_did_not_make_and_says_what_it_would_overwrite(tmp_path, capsys):
    out = tmp_path / "mine"
    files = _user_files(out)
    (out / "train.bin").write_bytes(b"a user's own train.bin")
    assert _prepare(tmp_path, out) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pope data prepare: error: ")
    assert f"{out} was not made by `pope data prepare`" in err and MARKER_NAME in err
    assert "would overwrite train.bin" in err and "--force" in err and "Traceback" not in err
    assert {n: (out / n).read_bytes() for n in files} == files
    assert (out / "train.bin").read_bytes().startswith(b"a user")
    assert not (out / "manifest.json").exists()
    # --force says which of the user's files it replaces, and keeps the rest
    assert _prepare(tmp_path, out, "--force") == 0
    err = capsys.readouterr().err
    assert "--force: replacing train.bin" in err and "kept 3 file(s)" in err
    assert {n: (out / n).read_bytes() for n in files} == files


def test_force_writes_beside_user_files_and_keeps_every_one(tmp_path, capsys):
    out = tmp_path / "mine"
    files = _user_files(out)
    assert _prepare(tmp_path, out, "--force") == 0
    assert "kept 3 file(s)" in capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in files} == files
    PreparedDataset(out).verify()
    # the directory is now marked; a rebuild (--force) replaces only the prepare's own files
    marker = json.loads((out / MARKER_NAME).read_text())
    assert "model.bin" not in marker["files"] and "train.bin" in marker["files"]
    assert _prepare(tmp_path, out, "--force") == 0
    assert {n: (out / n).read_bytes() for n in files} == files
    PreparedDataset(out).verify()


def test_rebuilding_a_marked_dataset_keeps_files_added_later(tmp_path, capsys):
    out = tmp_path / "ds"
    assert _prepare(tmp_path, out) == 0
    (out / "model.bin").write_bytes(b"added by the user after the prepare")
    (out / "manifest.json.bak").write_bytes(b"{}")
    data = bytearray((out / "train.bin").read_bytes())
    data[0] ^= 1  # tampered: the next prepare rebuilds it
    (out / "train.bin").write_bytes(bytes(data))
    capsys.readouterr()
    assert _prepare(tmp_path, out) == 0
    err = capsys.readouterr().err
    # one statement: the dataset's name, the file, what happens
    assert "dataset 'jsb'" in err and "train.bin was modified or corrupted" in err and "rebuilding it" in err
    assert (out / "model.bin").read_bytes() == b"added by the user after the prepare"
    assert (out / "manifest.json.bak").read_bytes() == b"{}"
    PreparedDataset(out).verify()


def test_stale_partials_are_removed_only_when_marked(tmp_path):
    stranger = tmp_path / ".ds.partial-mine"
    stranger.mkdir()
    (stranger / "model.bin").write_bytes(b"x")
    with PreparedWriter(tmp_path / "ds", 10) as writer:
        for split in ("train", "valid", "test"):
            writer.add_document(split, np.array([1, 2]))
        writer.finish({"name": "t", "vocab": {}})
    assert (stranger / "model.bin").exists()


@pytest.mark.parametrize("where", ["file", "under_file", "unwritable"])
def test_bad_out_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, where):
    (tmp_path / "afile").write_text("x")
    out = {"file": tmp_path / "afile", "under_file": tmp_path / "afile" / "ds", "unwritable": tmp_path / "ro" / "ds"}[
        where
    ]
    if where == "unwritable":  # tests run as root, where chmod does not stop writes: refuse the probe file
        import tempfile

        (tmp_path / "ro").mkdir()
        real = tempfile.mkstemp

        def refuse(*args, dir=None, **kwargs):
            if Path(dir) == tmp_path / "ro":
                raise PermissionError(13, "Permission denied")
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert _prepare(tmp_path, out) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    expected = {
        "file": "is an existing file, not a directory",
        "under_file": "lies under",
        "unwritable": "cannot be written",
    }
    assert f"--out {out}" in err and expected[where] in err
    assert (tmp_path / "afile").read_text() == "x"


def test_empty_split_of_any_source_is_refused_before_publishing(tmp_path):
    with pytest.raises(ValueError, match=r"split\(s\) 'test' received no documents from corpus-x"):
        with PreparedWriter(tmp_path / "ds", 10) as writer:
            writer.add_document("train", np.array([1]))
            writer.add_document("valid", np.array([1]))
            writer.finish({"name": "t", "vocab": {}, "source": {"path": "corpus-x"}})
    assert not (tmp_path / "ds").exists()


def test_tampered_or_truncated_dataset_names_the_file_and_the_command(tmp_path, capsys):
    out = tmp_path / "ds"
    assert _prepare(tmp_path, out) == 0
    data = bytearray((out / "test.bin").read_bytes())
    data[0] = 200  # an id no prepare writes (jsb has 90)
    (out / "test.bin").write_bytes(bytes(data))
    dataset = PreparedDataset(out)
    with pytest.raises(DamagedDatasetError, match=r"test.bin was modified or corrupted: checksum mismatch"):
        dataset.check_own_vocabulary("test")
    dataset.check_own_vocabulary("train")  # the untouched split passes
    capsys.readouterr()
    assert main(["data", "info", str(out), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "test.bin was modified or corrupted" in err and f"`pope data prepare jsb --out {out} --force`" in err
    (out / "valid.docs.npy").write_bytes(b"garbage")
    with pytest.raises(DamagedDatasetError, match=r"valid.docs.npy is unreadable .*modified or corrupted"):
        PreparedDataset(out).split("valid")


def test_offline_status_calls_a_tampered_source_modified(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POPE_CACHE", str(tmp_path))
    source = offline.SOURCES["gpt2-tokenizer"]
    source.path.mkdir(parents=True)
    (source.path / "encoder.json").write_text("{}")  # present, but not the pinned files
    assert offline.source_state("gpt2-tokenizer")[0] == "MODIFIED"
    assert offline.source_state("maestro")[0] == "MISSING"
    assert main(["data", "offline", "status"]) == 1
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("gpt2-tokenizer"))
    assert "MODIFIED" in line and "MISSING" not in line
    assert "1 files, the pin has 2" in out and "pope data offline fetch --only gpt2-tokenizer" in out
    with pytest.raises(ValueError, match="was modified or corrupted.*fetch it again"):
        offline.source_path("gpt2-tokenizer")


def test_a_source_verified_under_one_cache_root_is_not_trusted_under_another(tmp_path, monkeypatch):
    # The verified-in-this-process memo is per directory: switching $POPE_CACHE (tests, or a user pointing a
    # second run elsewhere) must not carry one root's verdict over to another root's copy.
    source, memo = offline.SOURCES["gpt2-tokenizer"], set()
    monkeypatch.setattr(offline, "_verified", memo)
    monkeypatch.setenv("POPE_CACHE", str(tmp_path / "good"))
    good = source.path
    good.mkdir(parents=True)
    real_digest = offline.directory_digest
    monkeypatch.setattr(
        offline,
        "directory_digest",  # the good root's copy matches the pin
        lambda d: (source.n_files, source.digest) if d == good else real_digest(d),
    )
    assert offline.source_state("gpt2-tokenizer")[0] == "ok" and memo == {good}
    monkeypatch.setenv("POPE_CACHE", str(tmp_path / "bad"))
    source.path.mkdir(parents=True)
    (source.path / "encoder.json").write_text("{}")
    assert offline.source_state("gpt2-tokenizer")[0] == "MODIFIED"


def test_pope_cache_with_a_tilde_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("POPE_CACHE", "~/x")
    monkeypatch.delenv("POPE_DATA_DIR", raising=False)
    assert cache_root() == tmp_path / "x" and data_root() == tmp_path / "x" / "data"
    assert offline.sources_root() == tmp_path / "x" / "sources"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda m: m.pop("dtype"), "dtype is missing"),
        (lambda m: m["splits"]["test"].pop("sha256"), "splits.test.sha256 is missing"),
        (lambda m: m["vocab"].update(size="90"), "vocab.size is missing or not a int"),
        (lambda m: m.update(dtype="float32"), "dtype 'float32' is not uint16 or uint32"),
    ],
)
def test_a_damaged_manifest_is_named_field_by_field(tmp_path, capsys, damage, message):
    out = tmp_path / "ds"
    assert _prepare(tmp_path, out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    damage(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["data", "info", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json is damaged: " + message in err and "--force" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-docs", "0"], "argument --max-docs: must be an integer >= 1, got 0"),
        (["--max-bases", "-5"], "argument --max-bases: must be an integer >= 1, got -5"),
    ],
)
def test_integer_options_below_one_are_refused(capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["data", "prepare", "pg19", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_sources_of_the_wrong_kind_are_named(tmp_path, capsys):
    for name in ("jsb", "genome"):
        assert main(["data", "prepare", name, "--source", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
        assert f"{tmp_path} is a directory; pass the" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main(["data", "info", str(tmp_path / "afile")]) == 1
    assert "is a file, not a prepared dataset directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, message",
    [
        ({"force": "no"}, "force must be a bool, got 'no'"),
        ({"max_bases": "5"}, "max_bases must be a int, got '5'"),
        ({"ambiguous_as_n": 1}, "ambiguous_as_n must be a bool"),
    ],
)
def test_prepare_options_take_real_types(tmp_path, options, message):
    from pope.data.registry import prepare

    with pytest.raises(TypeError, match=message):
        prepare("genome", out_dir=tmp_path / "g", **options)
    assert not (tmp_path / "g").exists()
