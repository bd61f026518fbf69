"""MAESTRO: REMI with the paper's 328-token vocabulary, round trips, chunking, transposition, bad MIDI."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("miditok")

from pope.data import maestro  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return maestro.build_tokenizer()


@pytest.fixture(scope="module")
def maestro_dir():
    from pope.data.offline import source_path

    return source_path("maestro")


def test_vocabulary_is_328_with_specials(tokenizer):
    assert len(tokenizer) == 328
    for special in ("PAD_None", "BOS_None", "EOS_None", "MASK_None"):
        assert special in tokenizer.vocab
    kinds = {}
    for name in tokenizer.vocab:
        kinds[name.split("_")[0]] = kinds.get(name.split("_")[0], 0) + 1
    assert kinds == {
        "PAD": 1,
        "BOS": 1,
        "EOS": 1,
        "MASK": 1,
        "Bar": 1,
        "Position": 96,
        "Pitch": 88,
        "Velocity": 32,
        "Duration": 64,
        "TimeSig": 9,
        "Tempo": 32,
        "Pedal": 1,
        "PedalOff": 1,
    }
    low, high = maestro.pitch_token_range(tokenizer)
    assert (tokenizer[low], tokenizer[high]) == ("Pitch_21", "Pitch_108") and high - low == 87


@pytest.mark.data
def test_remi_roundtrip_on_the_ten_maestro_files(tokenizer, maestro_dir):
    files = maestro.find_midi_files(maestro_dir)
    assert len(files) == 10
    total_notes = 0
    for path in files:
        score = maestro.read_score(path)
        ids, counts = maestro.encode_score(tokenizer, score)
        assert counts["notes_outside_keyboard"] == 0 and ids.max() < 328
        decoded = maestro.decode_ids(tokenizer, ids)
        original = score.tracks[0].notes.numpy()
        result = decoded.tracks[0].notes.numpy()
        assert len(result["pitch"]) == len(original["pitch"])  # no note lost
        # Onsets in beats; REMI's grid has 8 positions per beat, so quantisation moves an onset by at most
        # half a step = 1/16 beat. Quantisation is monotonic, so per pitch the sorted onsets pair up.
        step = 1 / 8
        onsets = original["time"] / score.ticks_per_quarter
        decoded_onsets = result["time"] / decoded.ticks_per_quarter
        assert sorted(original["pitch"].tolist()) == sorted(result["pitch"].tolist()), path.name
        for pitch in np.unique(original["pitch"]):
            before = np.sort(onsets[original["pitch"] == pitch])
            after = np.sort(decoded_onsets[result["pitch"] == pitch])
            assert np.abs(before - after).max() <= step / 2 + 1e-9, (path.name, int(pitch))
        total_notes += len(original["pitch"])
    assert total_notes > 90_000  # the 10 real performances (~102k notes)


def test_chunking_at_bars_never_loses_tokens():
    bar, positions = 4, {10, 11}
    piece = np.array([1] + [4, 10, 50, 60] * 3 + [4] + [10, 50] * 5 + [2])  # BOS, bars, one long bar, EOS
    chunks, finer = maestro.chunk_piece(piece, bar, positions, max_len=9)
    assert np.concatenate(chunks).tolist() == piece.tolist()
    assert max(len(c) for c in chunks) <= 9 and finer == 1
    assert chunks[1][0] == bar  # the second chunk starts at a bar
    chunks, finer = maestro.chunk_piece(piece, bar, positions, max_len=2048)
    assert len(chunks) == 1 and finer == 0


@pytest.mark.data
def test_prepare_offline_maestro_with_a_bad_file(tmp_path, maestro_dir, capsys):
    source = tmp_path / "midi"
    shutil.copytree(maestro_dir, source)
    (source / "broken.mid").write_bytes(b"MThd\x00\x00\x00\x06\x00\x01\x00\x02\x01\xe0MTrk\x00\x00\x10\x00\x00\xff")
    (source / "sub").mkdir()
    (source / "sub" / "text.midi").write_text("this is not MIDI")
    dataset = maestro.prepare_maestro(tmp_path / "out", source=source, progress=False)
    err = capsys.readouterr().err
    assert "skipped unreadable MIDI" in err and "broken.mid" in err and "text.midi" in err
    skipped = {item["file"]: item["reason"] for item in dataset.manifest["skipped_files"]}
    assert set(skipped) == {"broken.mid", "sub/text.midi"}
    assert "not a readable MIDI file" in skipped["broken.mid"]
    assert dataset.vocab_size == 328 and dataset.pad_id == 0 and dataset.seq_len == 2048
    assert dataset.manifest["stats"]["pieces_per_split"] == {"train": 8, "valid": 1, "test": 1}
    bos, eos = dataset.manifest["vocab"]["bos_id"], dataset.manifest["vocab"]["eos_id"]
    n_bos = 0
    for split in ("train", "valid", "test"):
        tokens = dataset.split(split)
        assert tokens.document_lengths().max() <= 2048
        n_bos += int((np.asarray(tokens.tokens) == bos).sum())
        assert (np.asarray(tokens.tokens) == eos).sum() == (np.asarray(tokens.tokens) == bos).sum()
    assert n_bos == 10  # one per piece: pieces are never split across documents' BOS

    transform = dataset.train_transform
    rng = np.random.default_rng(0)
    document = np.asarray(dataset.split("train").document(0)).astype(np.int64)
    low, high = maestro.pitch_token_range(maestro.build_tokenizer())
    is_pitch = (document >= low) & (document <= high)
    shifts = set()
    for _ in range(300):
        out = transform(document, rng)
        np.testing.assert_array_equal(out[~is_pitch], document[~is_pitch])  # only pitches move
        delta = np.unique(out[is_pitch] - document[is_pitch])
        assert len(delta) == 1 and out[is_pitch].min() >= low and out[is_pitch].max() <= high
        shifts.add(int(delta[0]))
    assert shifts == set(range(-3, 4))


def test_unreadable_midi_and_missing_source(tmp_path):
    path = tmp_path / "bad.mid"
    path.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match="bad.mid: not a readable MIDI file"):
        maestro.read_score(path)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        maestro.prepare_maestro(tmp_path / "out", source=tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no .mid/.midi files"):
        maestro.prepare_maestro(tmp_path / "out", source=empty)
    only_bad = tmp_path / "only_bad"
    only_bad.mkdir()
    shutil.copy(path, only_bad / "bad.mid")
    with pytest.raises(ValueError, match="none of the 1 MIDI files"):
        maestro.prepare_maestro(tmp_path / "out", source=only_bad, progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.data
def test_worker_processes_give_identical_tokens(maestro_dir, monkeypatch):
    files = maestro.find_midi_files(maestro_dir)[:4]
    sequential = maestro._tokenize_all(files, progress=False)
    monkeypatch.setattr(maestro, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setattr(maestro, "PARALLEL_MIN_CORES", 1)
    monkeypatch.setattr(maestro.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    parallel = maestro._tokenize_all(files, progress=False)
    assert len(parallel) == 4
    for one, other in zip(sequential, parallel):
        np.testing.assert_array_equal(one["ids"], other["ids"])
