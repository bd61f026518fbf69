"""JSB chorales: the paper's serialisation and its two sources.

Serialisation (paper, "JSB"): a chorale is a (T, 4) grid of MIDI pitches, one row per 16th note and
one column per voice in the order soprano, alto, tenor, bass; silence is ``REST = -1``. The grid is
read in raster order (the four voices of step 0, then of step 1, ...) into tokens:

    token = midi_pitch - 21   for the 88 piano keys, MIDI 21 (A0) .. 108 (C8)  -> ids 0..87
    SILENCE_ID = 88           a voice that sounds nothing at this 16th
    PAD_ID = 89               padding only (never inside a chorale)

so the vocabulary has 90 symbols. The piano range is the range the canonical JSB-Chorales files
declare ("MIDI note numbers, between 21 and 108 inclusive"); the real chorales use 36..81. A pitch
outside 21..108 is an error naming the chorale, never dropped. Chorales longer than 512 steps
(2048 tokens) are cut at step boundaries into documents of at most 2048 tokens (counted in the
manifest).

Sources:
- the canonical JSON (``Jsb16thSeparated.json``: {"train"|"valid"|"test": [chorale, ...]}, a chorale
  is a list of steps, a step is four numbers S, A, T, B; silence may be NaN, null or -1), given with
  ``--source``; its own 229/76/77 split is kept.
- otherwise music21's Bach corpus: every ``bach/*.mxl`` score with exactly four parts (364 in
  music21 10.5.1), sampled on the 16th grid (a voice's value at step t is the note sounding at
  quarter-length t/4; notes that cover no grid point, i.e. grace notes and ornaments shorter than a
  16th between grid points, are counted in the manifest), transposition-free, exact duplicate grids
  removed, and split deterministically in the canonical proportions 229:76:77 by sha256 of the id.
  Parsing takes ~30-70 s, so the grids are cached under $POPE_CACHE/sources/.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pope.data.paths import cache_root
from pope.data.prepared import PreparedDataset, assign_splits, file_fingerprint, warn
from pope.data.writer import PreparedWriter, reuse_if_prepared
from pope.optional import require

N_VOICES = 4
VOICE_NAMES = ("soprano", "alto", "tenor", "bass")
LOWEST_PITCH, HIGHEST_PITCH = 21, 108  # the 88 piano keys, inclusive
N_PITCH_TOKENS = HIGHEST_PITCH - LOWEST_PITCH + 1  # 88
SILENCE_ID = N_PITCH_TOKENS  # 88
PAD_ID = SILENCE_ID + 1  # 89
VOCAB_SIZE = PAD_ID + 1  # 90
REST = -1  # silence in a pitch grid
MAX_SEQ_LEN = 2048
MAX_STEPS_PER_DOC = MAX_SEQ_LEN // N_VOICES  # 512 sixteenth notes
CANONICAL_SPLIT_SIZES = {"train": 229, "valid": 76, "test": 77}
GRID_CACHE_VERSION = 1  # bump when the music21 -> grid conversion changes

_NOTE_NAMES = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")


def vocabulary() -> list[str]:
    """Token strings by id: "A0" .. "C8", "silence", "pad"."""
    names = [f"{_NOTE_NAMES[p % 12]}{p // 12 - 1}" for p in range(LOWEST_PITCH, HIGHEST_PITCH + 1)]
    return names + ["silence", "pad"]


@dataclass(frozen=True)
class Chorale:
    chorale_id: str
    grid: np.ndarray  # (T, 4) int16 MIDI pitch or REST, voices S, A, T, B


# ------------------------------------------------------------------------------------ encode / decode
def encode_grid(grid: np.ndarray, chorale_id: str = "<grid>") -> np.ndarray:
    """(T, 4) pitch grid (REST = -1 for silence) -> (4T,) int64 tokens in raster order."""
    grid = np.asarray(grid)
    if grid.ndim != 2 or grid.shape[1] != N_VOICES:
        raise ValueError(f"chorale {chorale_id}: a grid must have shape (T, 4), got {grid.shape}")
    if grid.dtype.kind not in "iu":
        raise TypeError(f"chorale {chorale_id}: grid pitches must be integers, got dtype {grid.dtype}")
    silent = grid == REST
    bad = ~silent & ((grid < LOWEST_PITCH) | (grid > HIGHEST_PITCH))
    if bad.any():
        step, voice = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"chorale {chorale_id}: pitch {int(grid[step, voice])} at step {step}, voice "
            f"{VOICE_NAMES[voice]} is outside the token range MIDI {LOWEST_PITCH}..{HIGHEST_PITCH} "
            f"({int(bad.sum())} such notes)"
        )
    tokens = np.where(silent, SILENCE_ID, grid.astype(np.int64) - LOWEST_PITCH)
    return tokens.reshape(-1).astype(np.int64)  # row-major = the 4 voices of a step, then the next step


def decode_tokens(tokens: np.ndarray | list[int]) -> np.ndarray:
    """(4T,) tokens -> (T, 4) int16 pitch grid with REST for silence (inverse of encode_grid)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size % N_VOICES:
        raise ValueError(
            f"chorale tokens must be a 1-D array whose length is a multiple of 4, got shape {tokens.shape}"
        )
    if tokens.size and (tokens.min() < 0 or tokens.max() > SILENCE_ID):
        position = int(np.flatnonzero((tokens < 0) | (tokens > SILENCE_ID))[0])
        raise ValueError(
            f"token {int(tokens[position])} at position {position} is not a note or silence "
            f"(pad is {PAD_ID}; strip padding before decoding)"
        )
    grid = np.where(tokens == SILENCE_ID, REST, tokens.astype(np.int64) + LOWEST_PITCH)
    return grid.reshape(-1, N_VOICES).astype(np.int16)


def chunk_steps(n_steps: int, max_steps: int = MAX_STEPS_PER_DOC) -> list[tuple[int, int]]:
    """[start, stop) step ranges of at most max_steps covering 0..n_steps (no step lost)."""
    return [(start, min(start + max_steps, n_steps)) for start in range(0, n_steps, max_steps)]


# ---------------------------------------------------------------------------------- canonical JSON
def load_jsb_json(path: str | os.PathLike) -> dict[str, list[Chorale]]:
    """Read the canonical JSB-Chorales JSON (16th-note, voices separated) into grids per split."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"JSB chorales JSON {path} is a directory; pass the Jsb16thSeparated.json file itself")
    if not path.is_file():
        raise FileNotFoundError(f"JSB chorales JSON {path} does not exist (expected Jsb16thSeparated.json)")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}") from err
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {err.start}); expected the JSB chorales JSON") from err
    expected = ("train", "valid", "test")
    if not isinstance(payload, dict) or not all(key in payload for key in expected):
        keys = list(payload) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"{path}: expected an object with keys {list(expected)} (the Jsb16thSeparated.json layout), found {keys}"
        )
    result: dict[str, list[Chorale]] = {}
    for split in expected:
        chorales = payload[split]
        if not isinstance(chorales, list):
            raise ValueError(f"{path}: [{split!r}] must be a list of chorales, got {type(chorales).__name__}")
        parsed = []
        for index, steps in enumerate(chorales):
            where = f"{path}: [{split!r}][{index}]"
            if not isinstance(steps, list) or not steps:
                raise ValueError(f"{where} must be a non-empty list of time steps, got {type(steps).__name__}")
            grid = np.empty((len(steps), N_VOICES), dtype=np.int16)
            for step_index, step in enumerate(steps):
                if not isinstance(step, list) or len(step) != N_VOICES:
                    raise ValueError(f"{where}[{step_index}] must be a list of 4 pitches (S, A, T, B), got {step!r}")
                for voice, value in enumerate(step):
                    grid[step_index, voice] = _json_pitch(value, f"{where}[{step_index}][{voice}]")
            chorale = Chorale(f"{split}/{index}", grid)
            encode_grid(grid, chorale.chorale_id)  # range check with the chorale id in the message
            parsed.append(chorale)
        result[split] = parsed
    empty = [split for split in expected if not result[split]]
    if empty:
        raise ValueError(
            f"{path}: split {' and '.join(map(repr, empty))} {'is' if len(empty) == 1 else 'are'} empty "
            f"(0 chorales); the file needs chorales in each of train, valid and test, like "
            f"Jsb16thSeparated.json (229/76/77), or omit --source to build from music21's corpus"
        )
    return result


def _json_pitch(value: Any, where: str) -> int:
    if value is None:
        return REST
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: a pitch must be a number, null or NaN, got {value!r}")
    if isinstance(value, float) and math.isnan(value):
        return REST
    if value != int(value):
        raise ValueError(f"{where}: pitch {value!r} is not a whole MIDI note number")
    value = int(value)
    if value == REST:
        return REST
    if not LOWEST_PITCH <= value <= HIGHEST_PITCH:
        raise ValueError(f"{where}: pitch {value} is outside MIDI {LOWEST_PITCH}..{HIGHEST_PITCH}")
    return value


# -------------------------------------------------------------------------------- music21 builder
def _require_music21():
    return require("music21", "data", "the JSB chorales builder")


def _music21_score_to_grid(path: str) -> dict[str, Any]:
    """Worker: parse one corpus file -> {"id", "grid" | "skip", "unsampled", "overlaps"}."""
    chord, converter = require("music21.chord"), require("music21.converter")

    chorale_id = Path(path).name.removesuffix(".mxl")
    score = converter.parse(path)
    parts = list(score.parts)
    if len(parts) != N_VOICES:
        return {"id": chorale_id, "skip": f"{len(parts)} parts, not 4 (instrumental parts or a fragment)"}
    events = []  # (voice, first_step, stop_step, midi)
    unsampled = overlaps = 0
    end_step = 0
    for voice, part in enumerate(parts):
        for element in part.flatten().notesAndRests:
            if element.isRest:
                continue
            if element.duration.isGrace:
                unsampled += 1
                continue
            if isinstance(element, chord.Chord):  # divisi: outer voice (top for S/A, bottom for T/B)
                pitches = sorted(p.midi for p in element.pitches)
                midi = pitches[-1] if voice < 2 else pitches[0]
            else:
                midi = element.pitch.midi
            onset = Fraction(element.offset) * 4
            release = (Fraction(element.offset) + Fraction(element.duration.quarterLength)) * 4
            first, stop = math.ceil(onset), math.ceil(release)  # grid steps t with onset <= t < release
            end_step = max(end_step, stop)
            if stop <= first:
                unsampled += 1  # shorter than a 16th and between two grid points
                continue
            events.append((voice, first, stop, midi))
    grid = np.full((end_step, N_VOICES), REST, dtype=np.int16)
    for voice, first, stop, midi in events:
        window = grid[first:stop, voice]
        overlaps += int((window != REST).sum())
        window[window == REST] = midi  # two notes of one voice at one 16th: keep the first
    return {"id": chorale_id, "grid": grid, "unsampled": unsampled, "overlaps": overlaps}


def music21_chorale_paths() -> list[str]:
    music21 = _require_music21()
    corpus = require("music21.corpus")

    paths = sorted(str(p) for p in corpus.getComposer("bach") if str(p).endswith(".mxl"))
    if not paths:
        raise FileNotFoundError(
            f"music21 {music21.__version__} has no Bach .mxl files in its corpus; "
            f"reinstall music21 (pip install 'pope-attention[data]')"
        )
    return paths


def music21_grid_cache_path() -> Path:
    music21 = _require_music21()
    return (
        cache_root() / "sources" / "music21-chorales" / f"grids-music21-{music21.__version__}-v{GRID_CACHE_VERSION}.npz"
    )


def build_music21_chorales(*, progress: bool = True, workers: int | None = None) -> tuple[list[Chorale], dict]:
    """All 4-part Bach chorales of music21's corpus as 16th grids (cached), plus a report dict
    (skipped scores with reasons, duplicates removed, unsampled/overlapping note counts)."""
    cache_path = music21_grid_cache_path()
    if cache_path.is_file():
        return _load_grid_cache(cache_path)
    paths = music21_chorale_paths()
    workers = workers or max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 8))
    results = []
    bar = tqdm(total=len(paths), desc="music21 chorales", unit="score", disable=not progress)
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for result in pool.imap(_music21_score_to_grid, paths, chunksize=4):
                results.append(result)
                bar.update()
    else:
        for path in paths:
            results.append(_music21_score_to_grid(path))
            bar.update()
    bar.close()
    chorales, skipped, duplicates, seen = [], [], [], {}
    unsampled = overlaps = 0
    for result in results:
        if "skip" in result:
            skipped.append({"id": result["id"], "reason": result["skip"]})
            continue
        key = result["grid"].tobytes() + bytes(str(result["grid"].shape), "ascii")
        if key in seen:
            duplicates.append({"id": result["id"], "same_as": seen[key]})
            continue
        seen[key] = result["id"]
        chorale = Chorale(result["id"], result["grid"])
        encode_grid(chorale.grid, chorale.chorale_id)  # range check: an error names the chorale
        chorales.append(chorale)
        unsampled += result["unsampled"]
        overlaps += result["overlaps"]
    music21 = _require_music21()
    report = {
        "scores_read": len(paths),
        "chorales": len(chorales),
        "skipped": skipped,
        "duplicates_removed": duplicates,
        "notes_between_grid_points": unsampled,
        "overlapping_notes_in_a_voice": overlaps,
        "music21_version": music21.__version__,
    }
    _save_grid_cache(cache_path, chorales, report)
    return chorales, report


def _save_grid_cache(path: Path, chorales: list[Chorale], report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = np.array([c.grid.shape[0] for c in chorales], dtype=np.int64)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}.npz")
    np.savez(
        tmp,
        grids=np.concatenate([c.grid for c in chorales]),
        lengths=lengths,
        ids=np.array([c.chorale_id for c in chorales]),
        report=np.array(json.dumps(report)),
    )
    os.replace(tmp, path)


def _load_grid_cache(path: Path) -> tuple[list[Chorale], dict]:
    try:
        with np.load(path) as cached:
            grids, lengths, ids = cached["grids"], cached["lengths"], cached["ids"]
            report = json.loads(str(cached["report"]))
    except Exception as err:  # a damaged cache is rebuilt, not trusted
        path.unlink(missing_ok=True)
        raise ValueError(
            f"the music21 chorale cache {path} was unreadable ({err}) and has been removed; "
            f"run the command again to rebuild it"
        ) from err
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    chorales = [Chorale(str(ids[i]), grids[bounds[i] : bounds[i + 1]]) for i in range(len(ids))]
    return chorales, report


def split_music21_chorales(chorales: Iterable[Chorale]) -> dict[str, list[Chorale]]:
    """Deterministic split in the canonical proportions 229:76:77 (by sha256 of the chorale id)."""
    chorales = list(chorales)
    total = sum(CANONICAL_SPLIT_SIZES.values())
    fractions = tuple(CANONICAL_SPLIT_SIZES[s] / total for s in ("train", "valid", "test"))
    assignment = assign_splits([c.chorale_id for c in chorales], fractions)
    ordered = sorted(chorales, key=lambda c: c.chorale_id)  # the output does not depend on the input order
    return {split: [c for c in ordered if assignment[c.chorale_id] == split] for split in ("train", "valid", "test")}


# ----------------------------------------------------------------------------------------- prepare
def prepare_jsb(
    out_dir: str | os.PathLike, *, source: str | os.PathLike | None = None, force: bool = False, progress: bool = True
) -> PreparedDataset:
    """Write the prepared "jsb" dataset: canonical JSON when `source` is given, else music21's corpus."""
    if source is not None:
        source_path = Path(source).expanduser().absolute()
        if not source_path.exists():
            raise FileNotFoundError(
                f"JSB source {source_path} does not exist; pass the Jsb16thSeparated.json "
                f"file, or omit --source to build from music21's Bach corpus"
            )
        request = {
            "dataset": "jsb",
            "source": "json",
            "path": str(source_path),
            "fingerprint": file_fingerprint([source_path]),
            "grid_version": GRID_CACHE_VERSION,
        }
    else:
        music21 = _require_music21()
        request = {
            "dataset": "jsb",
            "source": "music21",
            "music21": music21.__version__,
            "grid_version": GRID_CACHE_VERSION,
        }
    existing = reuse_if_prepared(out_dir, request, force=force)
    if existing is not None:
        return existing

    if source is not None:
        splits = load_jsb_json(source_path)
        source_info = {
            "description": "canonical JSB-Chorales JSON (16th notes, voices separated)",
            "path": str(source_path),
            "split": "the file's own train/valid/test",
        }
        report: dict[str, Any] = {}
    else:
        chorales, report = build_music21_chorales(progress=progress)
        splits = split_music21_chorales(chorales)
        source_info = {
            "description": "music21 Bach chorale corpus: 4-part .mxl scores sampled on the 16th grid, "
            "no transposition, duplicates removed, deterministic 229:76:77 split",
            "libraries": {"music21": report["music21_version"]},
        }
        if report["skipped"]:
            listed = ", ".join(f"{item['id']} ({item['reason'].split(',')[0]})" for item in report["skipped"][:6])
            warn(
                f"skipped {len(report['skipped'])} of {report['scores_read']} scores that are not 4-part chorales "
                f"(all listed in the manifest): {listed}{' ...' if len(report['skipped']) > 6 else ''}"
            )

    chunked = []
    with PreparedWriter(out_dir, VOCAB_SIZE, force=force) as writer:
        total = sum(len(v) for v in splits.values())
        for split, chorales in splits.items():
            for chorale in tqdm(chorales, desc=f"jsb {split}", unit="chorale", disable=not progress or total < 2):
                tokens = encode_grid(chorale.grid, chorale.chorale_id)
                ranges = chunk_steps(chorale.grid.shape[0])
                if len(ranges) > 1:
                    chunked.append(
                        {"id": chorale.chorale_id, "steps": int(chorale.grid.shape[0]), "documents": len(ranges)}
                    )
                for start, stop in ranges:
                    writer.add_document(split, tokens[start * N_VOICES : stop * N_VOICES])
        return writer.finish(
            {
                "name": "jsb",
                "vocab": {
                    "tokens": vocabulary(),
                    "pad_id": PAD_ID,
                    "silence_id": SILENCE_ID,
                    "encoding": "token = MIDI pitch - 21 (MIDI 21..108); 88 = silence; 89 = pad; "
                    "raster order S, A, T, B per 16th-note step",
                },
                "seq_len": MAX_SEQ_LEN,
                "request": request,
                "source": source_info,
                "train_transform": None,
                "stats": {
                    "chorales_per_split": {s: len(c) for s, c in splits.items()},
                    "chorales_cut_into_documents_of_at_most_2048_tokens": chunked,
                    **report,
                },
            }
        )
