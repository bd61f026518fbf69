"""MAESTRO piano performances: MIDI -> REMI tokens (miditok 3.1.0), vocab 328, chunks of <= 2048 tokens.

The REMI configuration that gives the paper's 328 symbols (found by enumerating miditok 3.1.0's REMI
options; several combinations reach 328, this is the one that keeps what matters for solo-piano
performances: the 88 keys, velocity, sustain pedal and tempo, and drops drum pitches MAESTRO never
uses). miditok defaults otherwise:

    TokenizerConfig(pitch_range=(21, 108), use_tempos=True, use_sustain_pedals=True,
                    use_pitchdrum_tokens=False)
    PAD BOS EOS MASK 4 + Bar 1 + Position 96 + Pitch 88 + Velocity 32 + Duration 64
    + TimeSig 9 + Tempo 32 + Pedal/PedalOff 2 = 328

A piece is ``BOS + REMI(piece) + EOS`` (all tracks merged into one piano track). It is cut into
documents of at most 2048 tokens at bar boundaries (a bar longer than that is cut at Position tokens,
then hard, and counted in the manifest). Pieces (files) are split 90/5/5 by sha256 of their relative
path, so no piece straddles two splits. Training applies a pitch transposition uniform in {-3..+3}
(restricted per sequence to the shifts that keep every Pitch token on the keyboard):
``PreparedDataset.train_transform``, a pure-numpy shift of the contiguous Pitch-token id range.

Files that cannot be read as MIDI are skipped, listed on stderr and in the manifest.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pope.data.offline import source_path
from pope.data.prepared import PreparedDataset, assign_splits, file_fingerprint, library_version, warn
from pope.data.writer import PreparedWriter, reuse_if_prepared
from pope.optional import require

MIDITOK_VERSION = "3.1.0"
REMI_OPTIONS: dict[str, Any] = {
    "pitch_range": (21, 108),
    "use_tempos": True,
    "use_sustain_pedals": True,
    "use_pitchdrum_tokens": False,
}
VOCAB_SIZE = 328
MAX_SEQ_LEN = 2048
MAX_TRANSPOSE = 3
SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
MIDI_SUFFIXES = (".mid", ".midi")


def _require_miditok():
    miditok = require("miditok", "data", "MAESTRO/REMI tokenisation")
    require("symusic", "data", "miditok's MIDI reader")
    if library_version("miditok") != MIDITOK_VERSION:
        raise ImportError(
            f"the MAESTRO tokenisation is pinned to miditok {MIDITOK_VERSION} (its vocabulary "
            f"differs between versions), found {library_version('miditok')}: "
            f"pip install 'pope-attention[data]'"
        )
    return miditok


def build_tokenizer():
    """The REMI tokenizer with the paper's 328-symbol vocabulary."""
    miditok = _require_miditok()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = miditok.REMI(miditok.TokenizerConfig(**REMI_OPTIONS))
    if len(tokenizer) != VOCAB_SIZE:
        raise RuntimeError(f"REMI vocabulary has {len(tokenizer)} tokens, expected {VOCAB_SIZE}")
    return tokenizer


def pitch_token_range(tokenizer) -> tuple[int, int]:
    """(low, high) ids of Pitch_21 .. Pitch_108; checks they are contiguous and ordered by pitch."""
    low_pitch, high_pitch = REMI_OPTIONS["pitch_range"]
    low = tokenizer.vocab[f"Pitch_{low_pitch}"]
    for pitch in range(low_pitch, high_pitch + 1):
        if tokenizer.vocab[f"Pitch_{pitch}"] != low + pitch - low_pitch:
            raise RuntimeError("REMI Pitch tokens are not a contiguous id range; transposition would be wrong")
    return low, low + high_pitch - low_pitch


def read_score(path: str | os.PathLike):
    """symusic Score of a MIDI file; ValueError naming the file when it cannot be read."""
    _require_miditok()
    Score = require("symusic").Score
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MIDI file {path} does not exist")
    try:
        return Score(str(path))
    except Exception as err:  # symusic raises ValueError/RuntimeError with a parser message
        raise ValueError(f"{path}: not a readable MIDI file ({type(err).__name__}: {err})") from err


def encode_score(tokenizer, score) -> tuple[np.ndarray, dict[str, int]]:
    """Score -> (REMI ids without BOS/EOS, counts of notes outside the keyboard that REMI drops)."""
    merge_tracks = require("miditok.utils").merge_tracks
    low, high = REMI_OPTIONS["pitch_range"]
    outside = 0
    for track in score.tracks:
        pitches = track.notes.numpy()["pitch"]
        outside += int(((pitches < low) | (pitches > high)).sum())
    if len(score.tracks) > 1:
        score = score.copy()
        merged = merge_tracks(score, effects=True)
        score.tracks = [merged] if not isinstance(merged, list) else merged
    if len(score.tracks) == 0 or score.note_num() == 0:
        return np.zeros(0, dtype=np.int64), {"notes_outside_keyboard": outside}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sequences = tokenizer.encode(score)
    sequence = sequences[0] if isinstance(sequences, list) else sequences
    return np.asarray(sequence.ids, dtype=np.int64), {"notes_outside_keyboard": outside}


def decode_ids(tokenizer, ids: np.ndarray | list[int]):
    """REMI ids (BOS/EOS/PAD allowed and ignored) -> symusic Score (ticks per quarter = tokenizer's)."""
    special = {tokenizer.vocab[name] for name in ("PAD_None", "BOS_None", "EOS_None", "MASK_None")}
    body = [int(i) for i in ids if int(i) not in special]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tokenizer.decode([body])


def chunk_piece(
    ids: np.ndarray, bar_id: int, position_ids: set[int], max_len: int = MAX_SEQ_LEN
) -> tuple[list[np.ndarray], int]:
    """Cut one piece's tokens into chunks of <= max_len at bar starts (Position starts inside an
    over-long bar, then hard cuts). Returns (chunks, number of bars that needed a finer cut)."""
    if ids.size == 0:
        return [], 0
    bar_starts = [0] + [i for i in np.flatnonzero(ids == bar_id).tolist() if i != 0]
    units: list[np.ndarray] = []
    finer_cuts = 0
    for begin, end in zip(bar_starts, bar_starts[1:] + [ids.size]):
        unit = ids[begin:end]
        if unit.size <= max_len:
            units.append(unit)
            continue
        finer_cuts += 1
        cut_points = [0] + [i for i, t in enumerate(unit.tolist()) if t in position_ids and i != 0] + [unit.size]
        piece = []
        for a, b in zip(cut_points, cut_points[1:]):
            piece.append(unit[a:b])
        for part in piece:
            units.extend(part[i : i + max_len] for i in range(0, part.size, max_len))
    chunks, current, current_len = [], [], 0
    for unit in units:
        if current_len + unit.size > max_len and current:
            chunks.append(np.concatenate(current))
            current, current_len = [], 0
        current.append(unit)
        current_len += unit.size
    if current:
        chunks.append(np.concatenate(current))
    return chunks, finer_cuts


_WORKER_TOKENIZER = None
PARALLEL_MIN_FILES = 64  # below this, starting worker processes costs more than it saves
PARALLEL_MIN_CORES = 4  # on 2 cores, 70 files took 26 s in 2 workers vs 19 s in one process


def _tokenize_file(path: str) -> dict[str, Any]:
    """Worker: one MIDI file -> {"ids", "notes_outside_keyboard"} or {"error", "unreadable"}."""
    global _WORKER_TOKENIZER
    if _WORKER_TOKENIZER is None:
        _WORKER_TOKENIZER = build_tokenizer()
    try:
        ids, counts = encode_score(_WORKER_TOKENIZER, read_score(path))
    except (ValueError, RuntimeError) as err:
        return {"error": str(err), "unreadable": True}
    if ids.size == 0:
        return {"error": "it has no notes", "unreadable": False}
    return {"ids": ids, **counts}


def _tokenize_all(files: list[Path], progress: bool) -> list[dict[str, Any]]:
    workers = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 16)
    paths = [str(f) for f in files]
    if workers < PARALLEL_MIN_CORES or len(files) < PARALLEL_MIN_FILES:
        return [_tokenize_file(p) for p in tqdm(paths, desc="maestro", unit="file", disable=not progress)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return list(
            tqdm(
                pool.imap(_tokenize_file, paths, chunksize=4),
                total=len(paths),
                desc="maestro",
                unit="file",
                disable=not progress,
            )
        )


def find_midi_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in MIDI_SUFFIXES)


def prepare_maestro(
    out_dir: str | os.PathLike, *, source: str | os.PathLike | None = None, force: bool = False, progress: bool = True
) -> PreparedDataset:
    """Write the prepared "maestro" dataset from a directory of MIDI files (default: the offline 10)."""
    _require_miditok()
    if source is None:
        directory = source_path("maestro")
        description = "10 MAESTRO performances from the miditok 3.1.0 sdist (tests/MIDIs_one_track)"
    else:
        directory = Path(source).expanduser().absolute()
        if not directory.is_dir():
            raise FileNotFoundError(
                f"MAESTRO source {directory} is not a directory (expected the MAESTRO v3 "
                f"MIDI directory, searched recursively for .mid/.midi files)"
            )
        description = f"MIDI files under {directory}"
    files = find_midi_files(directory)
    if not files:
        raise FileNotFoundError(f"no .mid/.midi files under {directory}")
    request = {
        "dataset": "maestro",
        "path": str(directory),
        "fingerprint": file_fingerprint(files),
        "remi": {k: list(v) if isinstance(v, tuple) else v for k, v in REMI_OPTIONS.items()},
        "miditok": library_version("miditok"),
        "max_seq_len": MAX_SEQ_LEN,
        "chunking_version": 1,
    }
    existing = reuse_if_prepared(out_dir, request, force=force)
    if existing is not None:
        return existing

    tokenizer = build_tokenizer()
    bos, eos, bar = (tokenizer.vocab[k] for k in ("BOS_None", "EOS_None", "Bar_None"))
    position_ids = {i for name, i in tokenizer.vocab.items() if name.startswith("Position_")}
    pitch_low, pitch_high = pitch_token_range(tokenizer)
    # Tokenise every file first (in worker processes for a large directory), then split the readable
    # pieces 90/5/5, so an unreadable file never leaves a split empty.
    skipped, outside_keyboard, finer_cuts = [], 0, 0
    pieces: dict[str, list[np.ndarray]] = {}
    for path, result in zip(files, _tokenize_all(files, progress)):
        relative = path.relative_to(directory).as_posix()
        if "error" in result:
            skipped.append({"file": relative, "reason": result["error"]})
            warn(f"skipped {'unreadable MIDI ' if result['unreadable'] else ''}{path}: {result['error']}")
            continue
        outside_keyboard += result["notes_outside_keyboard"]
        chunks, cuts = chunk_piece(np.concatenate([[bos], result["ids"], [eos]]), bar, position_ids)
        finer_cuts += cuts
        pieces[relative] = chunks
    if not pieces:
        raise ValueError(f"none of the {len(files)} MIDI files under {directory} could be tokenised")
    assignment = assign_splits(pieces, SPLIT_FRACTIONS) if len(pieces) >= 3 else {p: "train" for p in pieces}
    pieces_per_split = {"train": 0, "valid": 0, "test": 0}
    with PreparedWriter(out_dir, VOCAB_SIZE, force=force) as writer:
        for relative in sorted(pieces):
            split = assignment[relative]
            pieces_per_split[split] += 1
            for chunk in pieces[relative]:
                writer.add_document(split, chunk)
        if outside_keyboard:
            warn(f"{outside_keyboard} note(s) outside MIDI 21..108 were dropped by REMI (counted in the manifest)")
        vocab_tokens = [name for name, _ in sorted(tokenizer.vocab.items(), key=lambda item: item[1])]
        return writer.finish(
            {
                "name": "maestro",
                "vocab": {
                    "tokens": vocab_tokens,
                    "pad_id": tokenizer.vocab["PAD_None"],
                    "bos_id": bos,
                    "eos_id": eos,
                    "mask_id": tokenizer.vocab["MASK_None"],
                    "tokenizer": {
                        "library": f"miditok {library_version('miditok')}",
                        "class": "REMI",
                        "config": request["remi"],
                    },
                },
                "seq_len": MAX_SEQ_LEN,
                "request": request,
                "source": {
                    "description": description,
                    "path": str(directory),
                    "n_files": len(files),
                    "libraries": {"miditok": library_version("miditok"), "symusic": library_version("symusic")},
                },
                "train_transform": {
                    "name": "token_range_shift",
                    "low": pitch_low,
                    "high": pitch_high,
                    "max_shift": MAX_TRANSPOSE,
                    "what": "pitch transposition uniform in {-3..+3}, limited to the keyboard",
                },
                "skipped_files": skipped,
                "stats": {
                    "pieces_per_split": pieces_per_split,
                    "notes_outside_keyboard_dropped": outside_keyboard,
                    "bars_longer_than_max_seq_len": finer_cuts,
                    "documents_are": "chunks of <= 2048 tokens of one piece, cut at bar starts; "
                    "BOS opens a piece's first chunk, EOS closes its last",
                },
            }
        )
