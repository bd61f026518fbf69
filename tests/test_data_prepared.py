"""The prepared-data format: writer, reader, idempotence, interrupted prepares, transforms, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pope.data import paths
from pope.data.prepared import (
    MANIFEST_NAME,
    PreparedDataset,
    TokenRangeShift,
    assign_splits,
    resolve_dataset,
    split_counts,
    token_dtype_for,
)
from pope.data.writer import PreparedWriter, reuse_if_prepared

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _write_small(out_dir: Path, vocab_size: int = 50, request: dict | None = None) -> PreparedDataset:
    with PreparedWriter(out_dir, vocab_size) as writer:
        writer.add_document("train", np.arange(10) % vocab_size)
        writer.add_document("train", np.array([1, 2, 3]))
        writer.add_document("valid", np.array([4, 5]))
        writer.add_document("test", np.array([vocab_size - 1]))
        return writer.finish(
            {
                "name": "small",
                "vocab": {"pad_id": 0},
                "seq_len": 16,
                "request": request or {"dataset": "small"},
                "source": {"description": "test"},
                "train_transform": None,
            }
        )


def test_writer_reader_roundtrip(tmp_path):
    dataset = _write_small(tmp_path / "small")
    assert dataset.vocab_size == 50 and dataset.pad_id == 0 and dataset.seq_len == 16
    assert dataset.token_dtype == np.uint16
    train = dataset.split("train")
    assert isinstance(train.tokens, np.memmap) and train.tokens.dtype == np.uint16
    assert train.doc_offsets.tolist() == [0, 10, 13] and train.doc_offsets.dtype == np.int64
    np.testing.assert_array_equal(train.document(1), [1, 2, 3])
    np.testing.assert_array_equal(train.document(-2), np.arange(10))
    assert dataset.split("test").tokens.tolist() == [49]
    manifest = json.loads((tmp_path / "small" / MANIFEST_NAME).read_text())
    assert manifest["complete"] is True and manifest["splits"]["valid"]["n_tokens"] == 2
    assert set(manifest["splits"]["train"]["sha256"]) == {"train.bin", "train.docs.npy"}
    dataset.verify()
    assert sorted(p.name for p in (tmp_path / "small").iterdir()) == sorted(
        [MANIFEST_NAME, ".pope-dataset"]
        + [f"{s}{ext}" for s in ("train", "valid", "test") for ext in (".bin", ".docs.npy")]
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers
    with pytest.raises(ValueError, match="no split 'dev'.*train, valid, test"):
        dataset.split("dev")


def test_dtype_follows_vocab_and_ids_are_checked(tmp_path):
    assert token_dtype_for(65535) == np.uint16 and token_dtype_for(65536) == np.uint32
    with PreparedWriter(tmp_path / "big", 70000, splits=("train",)) as writer:
        writer.add_document("train", np.array([69999, 0]))
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 70000\)"):
            writer.add_document("train", np.array([70000]))
        with pytest.raises(TypeError, match="1-D integer"):
            writer.add_document("train", np.array([[1, 2]]))
        dataset = writer.finish({"name": "big", "vocab": {"pad_id": None}, "request": {}, "source": {}})
    assert dataset.split("train").tokens.dtype == np.uint32
    assert dataset.split("train").tokens.tolist() == [69999, 0]


def test_exception_inside_writer_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with PreparedWriter(tmp_path / "ds", 10) as writer:
            writer.add_document("train", np.array([1, 2]))
            raise KeyboardInterrupt  # Ctrl-C in the middle of a prepare
    assert list(tmp_path.iterdir()) == []


def test_killed_prepare_never_claims_completeness_and_is_cleaned_up(tmp_path):
    # A prepare killed mid-way (no exception handling runs) over an existing good dataset.
    good = _write_small(tmp_path / "ds")
    good_manifest = (tmp_path / "ds" / MANIFEST_NAME).read_text()
    script = textwrap.dedent(f"""
        import os, numpy as np
        from pope.data.writer import PreparedWriter
        writer = PreparedWriter({str(tmp_path / "ds")!r}, 50)
        writer.add_document("train", np.arange(5))
        os._exit(9)  # killed before finish()
    """)
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": SRC})
    assert result.returncode == 9
    partials = [p for p in tmp_path.iterdir() if p.name.startswith(".ds.partial-")]
    assert len(partials) == 1 and not (partials[0] / MANIFEST_NAME).exists()
    # the published dataset is untouched and still verifies
    assert (tmp_path / "ds" / MANIFEST_NAME).read_text() == good_manifest
    PreparedDataset(tmp_path / "ds").verify()
    # a killed first prepare leaves no dataset directory at all
    fresh = subprocess.run(
        [sys.executable, "-c", script.replace(str(tmp_path / "ds"), str(tmp_path / "fresh"))],
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert fresh.returncode == 9 and [p for p in tmp_path.iterdir() if p.name.startswith(".fresh.partial-")]
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PreparedDataset(tmp_path / "fresh")
    # the next prepare of the same target removes the stale partial directory
    _write_small(tmp_path / "ds")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ds.partial-")]
    assert good.split("train").tokens.tolist()[:3] == [0, 1, 2]


def test_incomplete_or_damaged_manifest_is_refused(tmp_path):
    _write_small(tmp_path / "ds")
    manifest_path = tmp_path / "ds" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    manifest["complete"] = False
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="does not claim completeness"):
        PreparedDataset(tmp_path / "ds")
    manifest_path.write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        PreparedDataset(tmp_path / "ds")
    manifest_path.unlink()
    with pytest.raises(FileNotFoundError, match="has no manifest.json"):
        PreparedDataset(tmp_path / "ds")


def test_reuse_verifies_checksums_and_settings(tmp_path, capsys):
    request = {"dataset": "small", "option": 1}
    _write_small(tmp_path / "ds", request=request)
    reused = reuse_if_prepared(tmp_path / "ds", request)
    assert reused is not None and reused.reused
    with pytest.raises(ValueError, match="different settings.*--force"):
        reuse_if_prepared(tmp_path / "ds", {"dataset": "small", "option": 2})
    assert reuse_if_prepared(tmp_path / "ds", {"dataset": "small", "option": 2}, force=True) is None
    # the same settings in an older layout (a *_version key raised, or added): rebuilt with a notice
    assert reuse_if_prepared(tmp_path / "ds", {**request, "layout_version": 2}) is None
    assert "prepared in an older layout (layout_version unset -> 2); rebuilding it" in capsys.readouterr().err
    _write_small(tmp_path / "newer", request={**request, "layout_version": 2})
    for other in ({**request, "layout_version": 1}, {**request, "layout_version": 3, "option": 2}, request):
        with pytest.raises(ValueError, match="different settings"):  # a downgrade, or other settings too
            reuse_if_prepared(tmp_path / "newer", other)
    # flip one byte of the tokens (same size): the checksum catches it and a rebuild is requested
    bin_path = tmp_path / "ds" / "train.bin"
    data = bytearray(bin_path.read_bytes())
    data[0] ^= 1
    bin_path.write_bytes(bytes(data))
    with pytest.raises(
        ValueError,
        match=r"train.bin was modified or corrupted: checksum mismatch.*rebuild the "
        r"dataset with `pope data prepare small --out .*ds --force`",
    ):
        PreparedDataset(tmp_path / "ds").verify()
    assert reuse_if_prepared(tmp_path / "ds", request) is None
    notice = capsys.readouterr().err  # one statement: what is wrong, with the dataset's name, and what happens
    assert "dataset 'small'" in notice and "train.bin was modified or corrupted" in notice
    assert "rebuilding it from its source now" in notice and "re-run" not in notice
    # a truncated token file is caught on open, before any hashing
    bin_path.write_bytes(bytes(data[:-2]))
    with pytest.raises(ValueError, match="the manifest expects"):
        PreparedDataset(tmp_path / "ds")


def test_split_assignment_is_deterministic_and_complete():
    ids = [f"piece-{i}" for i in range(100)]
    first = assign_splits(ids, (0.9, 0.05, 0.05))
    assert first == assign_splits(list(reversed(ids)), (0.9, 0.05, 0.05))
    counts = {s: sum(v == s for v in first.values()) for s in ("train", "valid", "test")}
    assert counts == {"train": 90, "valid": 5, "test": 5}
    assert split_counts(10, (0.9, 0.05, 0.05)) == (8, 1, 1)  # small sets still get valid and test
    assert split_counts(382, (229 / 382, 76 / 382, 77 / 382)) == (229, 76, 77)
    with pytest.raises(ValueError, match="empty"):
        split_counts(0, (0.9, 0.05, 0.05))


def test_token_range_shift_stays_in_range_and_is_uniform():
    shift = TokenRangeShift(low=10, high=20, max_shift=3)
    rng = np.random.default_rng(0)
    tokens = np.array([0, 12, 15, 18, 5, 30], dtype=np.uint16)  # pitches 12..18, others untouched
    seen = []
    for _ in range(7000):
        out = shift(tokens, rng)
        assert out.dtype == tokens.dtype
        assert out[[0, 4, 5]].tolist() == [0, 5, 30]
        delta = int(out[1]) - 12
        assert (out[1:4].astype(int) - tokens[1:4]).tolist() == [delta] * 3
        seen.append(delta)
    values, counts = np.unique(seen, return_counts=True)
    assert values.tolist() == [-2, -1, 0, 1, 2]  # +-3 would leave [10, 20]
    assert counts.min() > 0.8 * 7000 / 5
    edge = np.array([20, 19], dtype=np.int64)  # at the top: only downward shifts
    assert {int(shift(edge, rng)[0]) - 20 for _ in range(200)} == {-3, -2, -1, 0}
    with pytest.raises(TypeError, match="integer"):
        shift(np.array([1.5]), rng)


def test_resolve_dataset_by_name_and_path(tmp_path, monkeypatch):
    monkeypatch.setenv("POPE_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match="pope data prepare jsb"):
        resolve_dataset("chorales")  # alias of jsb, not prepared yet
    with pytest.raises(ValueError, match="unknown dataset 'nonsense'"):
        resolve_dataset("nonsense")
    _write_small(tmp_path / "data" / "maestro")
    assert resolve_dataset("maestro").path == tmp_path / "data" / "maestro"
    assert resolve_dataset(str(tmp_path / "data" / "maestro")).vocab_size == 50
    monkeypatch.delenv("POPE_DATA_DIR")
    monkeypatch.setenv("POPE_CACHE", str(tmp_path / "cache"))
    assert paths.data_root() == tmp_path / "cache" / "data"


@pytest.mark.data  # GPT-2 BPE files from the offline cache
def test_cli_prepare_info_and_errors(tmp_path, monkeypatch, capsys):
    from pope.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(f"Document number {i}. " * 20)
    monkeypatch.setenv("POPE_DATA_DIR", str(tmp_path / "data"))
    assert main(["data", "prepare", "text", "--source", str(corpus), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "prepared in" in out and "vocab 50257 (uint16)" in out
    assert main(["data", "prepare", "text", "--source", str(corpus), "--no-progress"]) == 0
    assert "verified and reused" in capsys.readouterr().out
    assert main(["data", "info", "text", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "checksums: all files match" in out and "documents" in out
    assert main(["data", "info", str(tmp_path / "data" / "text"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["complete"] is True
    # bad input: one clear line naming the problem, exit code 1
    assert main(["data", "prepare", "text", "--source", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["data", "prepare", "jsb", "--max-bases", "5", "--out", str(tmp_path / "x")]) == 1
    assert "--max-bases does not apply to dataset 'jsb'" in capsys.readouterr().err
    assert main(["data", "info", str(tmp_path / "nowhere")]) == 1
    assert "pope data prepare" in capsys.readouterr().err


def test_never_replaces_a_directory_of_other_files(tmp_path):
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not made by `pope data prepare`.*holds notes.txt.*new or empty --out"):
        _write_small(precious)
    assert (precious / "notes.txt").read_text() == "keep me"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="is an existing file, not a directory"):
        _write_small(tmp_path / "afile")
    (tmp_path / "empty").mkdir()
    assert _write_small(tmp_path / "empty").split("valid").tokens.tolist() == [4, 5]
