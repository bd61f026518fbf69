"""JSB chorales: the 90-token raster serialisation, the canonical JSON loader, the music21 builder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pope.data import chorales
from pope.data.chorales import (
    PAD_ID,
    REST,
    SILENCE_ID,
    VOCAB_SIZE,
    decode_tokens,
    encode_grid,
    load_jsb_json,
    vocabulary,
)


def test_vocabulary_layout():
    vocab = vocabulary()
    assert len(vocab) == VOCAB_SIZE == 90
    assert vocab[0] == "A0" and vocab[60 - 21] == "C4" and vocab[87] == "C8"
    assert vocab[SILENCE_ID] == "silence" and vocab[PAD_ID] == "pad"


def test_raster_order_and_roundtrip():
    grid = np.array([[72, 67, 64, 48], [74, REST, 65, 50]], dtype=np.int16)
    tokens = encode_grid(grid)
    # step 0: S A T B, then step 1
    assert tokens.tolist() == [72 - 21, 67 - 21, 64 - 21, 48 - 21, 74 - 21, SILENCE_ID, 65 - 21, 50 - 21]
    np.testing.assert_array_equal(decode_tokens(tokens), grid)
    with pytest.raises(ValueError, match="pad is 89"):
        decode_tokens(np.array([1, 2, 3, PAD_ID]))
    with pytest.raises(ValueError, match="multiple of 4"):
        decode_tokens(np.array([1, 2, 3]))


def test_out_of_range_pitch_names_the_chorale():
    grid = np.array([[72, 67, 64, 48], [110, 67, 64, 20]], dtype=np.int16)
    with pytest.raises(ValueError, match=r"chorale bwv999: pitch 110 at step 1, voice soprano .*\(2 such notes\)"):
        encode_grid(grid, "bwv999")


def _canonical_json(path, train, valid, test):
    path.write_text(json.dumps({"test": test, "train": train, "valid": valid}).replace('"NaN"', "NaN"))
    return path


def test_canonical_json_loader(tmp_path):
    # Canonical layout: {"train"|"valid"|"test": [chorale]}, chorale = [[S, A, T, B], ...] as floats,
    # silence written as NaN (Python's json reads it), null or -1.
    train = [[[74.0, 70.0, 65.0, 58.0], [74.0, 70.0, 65.0, 58.0], [75.0, "NaN", 67.0, None]], [[60, 55, 52, 36]]]
    valid = [[[81, 72, 64, 45], [81, 72, 64, -1]]]
    test = [[[62.0, 57.0, 53.0, 38.0]]]
    path = _canonical_json(tmp_path / "Jsb16thSeparated.json", train, valid, test)
    splits = load_jsb_json(path)
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [2, 1, 1]
    first = splits["train"][0].grid
    assert first.shape == (3, 4) and first[2].tolist() == [75, REST, 67, REST]
    tokens = encode_grid(first)
    assert tokens[8:].tolist() == [75 - 21, SILENCE_ID, 67 - 21, SILENCE_ID]
    np.testing.assert_array_equal(decode_tokens(tokens), first)
    assert splits["valid"][0].grid[1, 3] == REST

    dataset = chorales.prepare_jsb(tmp_path / "out", source=path, progress=False)
    assert dataset.vocab_size == 90 and dataset.pad_id == PAD_ID and dataset.seq_len == 2048
    assert dataset.split("train").n_docs == 2 and len(dataset.split("train")) == 12 + 4
    np.testing.assert_array_equal(decode_tokens(np.asarray(dataset.split("train").document(0))), first)
    assert dataset.manifest["source"]["split"].startswith("the file's own")


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"train": [], "valid": []}, r"expected an object with keys \['train', 'valid', 'test'\]"),
        ([1, 2, 3], "expected an object with keys"),
        ({"train": [[[60, 60, 60]]], "valid": [], "test": []}, r"\['train'\]\[0\]\[0\] must be a list of 4 pitches"),
        ({"train": [[[60, 60, "C4", 60]]], "valid": [], "test": []}, r"\['train'\]\[0\]\[0\]\[2\]: a pitch must be"),
        (
            {"train": [], "valid": [[[60, 60, 60.5, 60]]], "test": []},
            r"\['valid'\]\[0\]\[0\]\[2\]: pitch 60.5 is not a whole",
        ),
        ({"train": [], "valid": [], "test": [[[60, 60, 60, 12]]]}, r"\['test'\]\[0\]\[0\]\[3\]: pitch 12 is outside"),
        ({"train": {"a": 1}, "valid": [], "test": []}, r"\['train'\] must be a list of chorales"),
        ({"train": [[]], "valid": [], "test": []}, r"\['train'\]\[0\] must be a non-empty list"),
        (
            {"train": [[[60, 60, 60, 60]]], "valid": [], "test": []},
            r"split 'valid' and 'test' are empty \(0 chorales\)",
        ),
        ({"train": [[[60, 60, 60, 60]]], "valid": [[[60, 60, 60, 60]]], "test": []}, r"split 'test' is empty"),
    ],
)
def test_json_with_wrong_structure_is_a_clear_error(tmp_path, payload, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=message) as info:
        load_jsb_json(path)
    assert str(path) in str(info.value)


def test_json_not_json_and_missing(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"train": [[[60, 60,')
    with pytest.raises(ValueError, match="not valid JSON at line 1 column"):
        load_jsb_json(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        chorales.prepare_jsb(tmp_path / "out", source=tmp_path / "missing.json")


def test_long_chorales_are_cut_at_step_boundaries():
    assert chorales.chunk_steps(1030) == [(0, 512), (512, 1024), (1024, 1030)]
    assert chorales.chunk_steps(512) == [(0, 512)]


@pytest.mark.data
@pytest.mark.slow  # ~70 s on 2 cores the first time (music21 parse); the grids are cached afterwards
def test_music21_builder_gives_300_four_voice_chorales(tmp_path):
    music21 = pytest.importorskip("music21")
    from music21 import corpus

    chorale_list, report = chorales.build_music21_chorales(progress=False)
    assert len(chorale_list) >= 300
    assert report["scores_read"] == len(chorale_list) + len(report["skipped"]) + len(report["duplicates_removed"])
    for chorale in chorale_list:
        assert chorale.grid.ndim == 2 and chorale.grid.shape[1] == 4
        tokens = encode_grid(chorale.grid, chorale.chorale_id)
        assert tokens.min() >= 0 and tokens.max() < VOCAB_SIZE and PAD_ID not in tokens
        np.testing.assert_array_equal(decode_tokens(tokens), chorale.grid)

    # Independent check of the 16th grid on one chorale: the note music21 says sounds at t/4 quarters.
    by_id = {c.chorale_id: c for c in chorale_list}
    # bwv432 has notes that do not start on a 16th, so it checks the sampling rule too.
    for chorale_id in ("bwv66.6", "bwv432"):
        score = corpus.parse(f"bach/{chorale_id}")
        grid = by_id[chorale_id].grid
        for voice, part in enumerate(score.parts):
            notes = [n for n in part.flatten().notes if n.quarterLength > 0]
            for step in range(grid.shape[0]):
                time = step / 4
                sounding = [n for n in notes if n.offset <= time < n.offset + n.quarterLength]
                expected = sounding[0].pitch.midi if sounding else REST
                assert grid[step, voice] == expected, (chorale_id, step, voice)

    splits = chorales.split_music21_chorales(chorale_list)
    sizes = [len(splits[s]) for s in ("train", "valid", "test")]
    assert sum(sizes) == len(chorale_list)
    assert math.isclose(sizes[1] / sum(sizes), 76 / 382, abs_tol=0.01)
    assert math.isclose(sizes[2] / sum(sizes), 77 / 382, abs_tol=0.01)
    again = chorales.split_music21_chorales(reversed(chorale_list))  # deterministic, order-independent
    assert {s: [c.chorale_id for c in v] for s, v in splits.items()} == {
        s: [c.chorale_id for c in v] for s, v in again.items()
    }

    dataset = chorales.prepare_jsb(tmp_path / "jsb", progress=False)
    lengths = np.concatenate([dataset.split(s).document_lengths() for s in ("train", "valid", "test")])
    assert lengths.max() <= 2048 and (lengths % 4 == 0).all()
    assert dataset.manifest["source"]["libraries"]["music21"] == music21.__version__
    assert len(dataset.manifest["stats"]["skipped"]) == len(report["skipped"])
