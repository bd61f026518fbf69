"""The indirect-indexing task (paper: "Setups"), the sharpest PoPE-vs-RoPE diagnostic.

One example is one line of text::

    <string>,<source char>,<signed shift>,<target char>      e.g.  QEOHoUbKfeSrMVNlCzXu,z,-3,N

- ``<string>``: 20..40 (uniform) distinct letters drawn without replacement from [A-Za-z].
- ``<source char>``: a letter of the string, its index ``src`` uniform over the string.
- ``<signed shift>``: uniform over the non-zero shifts in [-15, +15] that land inside the string
  (``0 <= src + shift < len(string)``), always written with its sign: ``+3``, ``-12``. The paper's
  vocabulary lists '+', so positive shifts carry it; every shift is then 2..3 characters.
- ``<target char>`` = ``string[src + shift]``.

A line is 27..48 characters. The model reads all but the last character (<= 47 input tokens: the
paper's "sequence length 40" cannot hold it) and is scored on the final target token only: loss and
accuracy on that one position; padding goes to the right (invisible under causal attention).

Tokens are single characters: ``A-Z a-z 0-9 , + -`` (ids 0..64) and a padding id 65
(``VOCAB_SIZE = 66``). Chance accuracy is 1/52.

Splits are deterministic from a seed (default 1M train / 10k valid / 10k test) and disjoint: no
letter string of one split appears in another (hence no example either). They are written as
``{train,valid,test}.txt`` (one example per line) plus ``manifest.json`` with counts and SHA-256
checksums, so a held-out test file can be evaluated later (``pope eval accuracy RUN --data test.txt``).
``ensure_splits`` generates them on first use; processes that ask for one set at once (seed sweeps,
torchrun ranks) take turns, so all of them read the same complete, verified files.

Task variants (``TaskOptions``; defaults = the paper's setup above), chosen in a run through the dataset
spec ``indirect-indexing:OPTION=VALUE,...``, e.g. ``--set recipe.dataset=indirect-indexing:fresh=true``:

- ``min_len``, ``max_len``: the string length range (paper 20..40; e.g. 20..32 reads the paper's
  "sequence length 40" literally); within 20..40, so the model's 47 input tokens always suffice.
- ``zero_shift``: shift 0 allowed (written ``+0``; the target is then the source letter itself).
- ``query_first``: the query before the string, ``<source char>,<signed shift>,<string>,<target char>``
  (e.g. ``z,-3,QEOHoUbKfeSrMVNlCzXu,N``). Not the paper's task: a diagnostic. Under the causal mask a string
  token sees only the letters before it, so in the paper's order a target before its source (negative shift)
  is read from what the source token gathered behind it, while a target after its source must be found as
  the token whose letter |shift| back is the source; with the query first every string token can also see
  which letter and shift are asked for. Comparing the two orders per shift tests whether the order is what
  makes one direction harder.
- ``fresh``: training examples drawn fresh for every step (never repeated; strings of the valid and test
  splits are redrawn) instead of epochs over the fixed training split.

Length range, zero shift and query order define the task, so its splits are generated with them (own cache
directory); ``fresh`` changes only how training examples are drawn. The two orders are told apart by the line
itself (a query-first line starts with one letter and a signed shift), so readers that get no options
(``shifts_of_file``) read both.
"""

from __future__ import annotations

import json
import os
import string
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from pope.data.paths import cache_root  # $POPE_CACHE with ~ expanded, like every other dataset
from pope.files import exclusive_lock, write_json_atomic, write_text_atomic
from pope.files import sha256_file as _sha256

LETTERS = string.ascii_uppercase + string.ascii_lowercase  # 52 letters, ids 0..51
CHARACTERS = LETTERS + string.digits + ",+-"  # ids 0..64
PAD_ID = len(CHARACTERS)  # 65: right padding; never a target
VOCAB_SIZE = len(CHARACTERS) + 1  # 66
MIN_LETTERS, MAX_LETTERS = 20, 40
MAX_SHIFT = 15
MAX_EXAMPLE_CHARS = MAX_LETTERS + len(",x,+15,y")  # 48 characters in the longest example
SEQ_LEN = MAX_EXAMPLE_CHARS - 1  # 47 input tokens (the last character is only predicted)
DEFAULT_SPLIT_SIZES = {"train": 1_000_000, "valid": 10_000, "test": 10_000}
FORMAT_VERSION = 1

# byte value -> token id, -1 for bytes outside the vocabulary
_BYTE_TO_ID = np.full(256, -1, dtype=np.int64)
_BYTE_TO_ID[np.frombuffer(CHARACTERS.encode(), dtype=np.uint8)] = np.arange(len(CHARACTERS))
_LETTER_BYTES = np.frombuffer(LETTERS.encode(), dtype=np.uint8)


@dataclass(frozen=True)
class TaskOptions:
    """A variant of the task; the defaults are the paper's setup (see the module docstring)."""

    min_len: int = MIN_LETTERS
    max_len: int = MAX_LETTERS
    zero_shift: bool = False
    fresh: bool = False
    query_first: bool = False

    def __post_init__(self):
        if not (
            isinstance(self.min_len, int)
            and isinstance(self.max_len, int)
            and MIN_LETTERS <= self.min_len <= self.max_len <= MAX_LETTERS
        ):
            raise ValueError(
                f"indirect-indexing: need {MIN_LETTERS} <= min_len <= max_len <= {MAX_LETTERS}; got "
                f"min_len={self.min_len}, max_len={self.max_len}"
            )

    def split_key(self) -> str:
        """'' for the paper's splits, else a suffix naming what changes them (fresh does not)."""
        parts = (
            [f"len{self.min_len}-{self.max_len}"] if (self.min_len, self.max_len) != (MIN_LETTERS, MAX_LETTERS) else []
        )
        return "-".join(parts + (["shift0"] if self.zero_shift else []) + (["query-first"] if self.query_first else []))

    def split_options(self) -> dict:
        return {
            "min_len": self.min_len,
            "max_len": self.max_len,
            "zero_shift": self.zero_shift,
            "query_first": self.query_first,
        }

    def format_line(self, letters: str, source: str, shift: int, target: str) -> str:
        """One example line in this variant's field order."""
        if self.query_first:
            return f"{source},{shift:+d},{letters},{target}"
        return f"{letters},{source},{shift:+d},{target}"


PAPER_TASK = TaskOptions()


def parse_task_spec(spec: str) -> TaskOptions:
    """'indirect-indexing' -> the paper's task; 'indirect-indexing:fresh=true,min_len=20,max_len=32' -> a variant."""
    name, _, text = str(spec).partition(":")
    if name != "indirect-indexing":
        raise ValueError(f"{spec!r} is not an indirect-indexing dataset spec (indirect-indexing[:OPTION=VALUE,...])")
    valid = {f.name: f.type for f in fields(TaskOptions)}
    values: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip().lower()
        if not eq or key not in valid:
            raise ValueError(
                f"dataset spec {spec!r}: {item!r} is not OPTION=VALUE with OPTION one of {', '.join(valid)}"
            )
        if key in ("zero_shift", "fresh", "query_first"):
            if value not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"dataset spec {spec!r}: {key} must be true or false, got {value!r}")
            values[key] = value in ("true", "1", "yes")
        else:
            if not value.isdigit():
                raise ValueError(f"dataset spec {spec!r}: {key} must be an integer, got {value!r}")
            values[key] = int(value)
    return TaskOptions(**values)


def is_task_spec(spec: str) -> bool:
    return str(spec).partition(":")[0] == "indirect-indexing"


@dataclass(frozen=True)
class Example:
    """One parsed example."""

    string: str
    source: str
    shift: int
    target: str

    def to_line(self, options: TaskOptions = PAPER_TASK) -> str:
        return options.format_line(self.string, self.source, self.shift, self.target)


def line_fields(line: str) -> tuple[str, str, str, str, bool]:
    """(string, source, shift text, target, query_first) of one example line in either field order: a line
    whose first field is one letter followed by a signed shift is query-first. Checks only the field count."""
    parts = line.strip("\n").split(",")
    if len(parts) != 4:
        raise ValueError(
            f"indirect-indexing example {line!r}: expected 4 comma-separated fields "
            "<string>,<source>,<signed shift>,<target> (or, query first, <source>,<signed shift>,"
            "<string>,<target>)"
        )
    if len(parts[0]) == 1 and parts[1][:1] in ("+", "-"):
        source, shift_text, letters, target = parts
        return letters, source, shift_text, target, True
    letters, source, shift_text, target = parts
    return letters, source, shift_text, target, False


def parse_example(line: str, options: TaskOptions = PAPER_TASK) -> Example:
    """Parse one line and check every rule of the task (variant); raises ValueError naming the broken rule."""
    letters, source, shift_text, target, query_first = line_fields(line)
    if query_first != options.query_first:
        order = "query-first (<source>,<shift>,<string>,<target>)" if query_first else "the paper's order"
        raise ValueError(
            f"indirect-indexing example {line!r} is in {order}, but the task asks for "
            f"{'query_first=true' if options.query_first else 'the paper order'}"
        )
    if not (options.min_len <= len(letters) <= options.max_len) or any(c not in LETTERS for c in letters):
        raise ValueError(
            f"indirect-indexing example {line!r}: the string must be {options.min_len}..{options.max_len} "
            "letters from [A-Za-z]"
        )
    if len(set(letters)) != len(letters):
        raise ValueError(f"indirect-indexing example {line!r}: the string's letters must be distinct")
    if len(source) != 1 or source not in letters:
        raise ValueError(f"indirect-indexing example {line!r}: the source must be one letter of the string")
    if len(shift_text) < 2 or shift_text[0] not in "+-" or not shift_text[1:].isdigit():
        raise ValueError(f"indirect-indexing example {line!r}: the shift must be signed, e.g. +3 or -12")
    shift = int(shift_text)
    if (shift == 0 and not options.zero_shift) or abs(shift) > MAX_SHIFT:
        raise ValueError(
            f"indirect-indexing example {line!r}: the shift must be in [-{MAX_SHIFT}, +{MAX_SHIFT}]"
            + ("" if options.zero_shift else " and not 0")
        )
    position = letters.index(source) + shift
    if not 0 <= position < len(letters):
        raise ValueError(f"indirect-indexing example {line!r}: source + shift lands outside the string")
    if target != letters[position]:
        raise ValueError(
            f"indirect-indexing example {line!r}: the target must be string[source + shift] = {letters[position]!r}"
        )
    return Example(letters, source, shift, target)


def generate_examples(
    count: int, rng: np.random.Generator, *, chunk_size: int = 100_000, options: TaskOptions = PAPER_TASK
) -> list[str]:
    """``count`` random example lines (not yet de-duplicated) of the task variant, drawn with ``rng``.
    Variants change only the ranges drawn from, not the order of the draws."""
    lines: list[str] = []
    for start in range(0, count, chunk_size):
        n = min(chunk_size, count - start)
        lengths = rng.integers(options.min_len, options.max_len + 1, size=n)  # (n,)
        # a random permutation of the 52 letters per row; the first `length` are the string
        letter_order = np.argsort(rng.random((n, len(LETTERS))), axis=1)[:, :MAX_LETTERS]  # (n, 40)
        letter_bytes = _LETTER_BYTES[letter_order]  # (n, 40) uint8
        source_index = (rng.random(n) * lengths).astype(np.int64)  # uniform over the string
        # shifts landing inside the string: [lowest, highest], without 0 unless zero_shift
        lowest = np.maximum(-MAX_SHIFT, -source_index)
        highest = np.minimum(MAX_SHIFT, lengths - 1 - source_index)
        n_valid = highest - lowest + int(options.zero_shift)  # >= 1 since length >= 20
        shift = lowest + (rng.random(n) * n_valid).astype(np.int64)
        if not options.zero_shift:
            shift += shift >= 0  # skip 0
        rows = np.arange(n)
        source_bytes = letter_bytes[rows, source_index]
        target_bytes = letter_bytes[rows, source_index + shift]
        for i in range(n):
            lines.append(
                options.format_line(
                    letter_bytes[i, : lengths[i]].tobytes().decode(),
                    chr(source_bytes[i]),
                    int(shift[i]),
                    chr(target_bytes[i]),
                )
            )
    return lines


def make_splits(
    seed: int = 0, sizes: dict[str, int] | None = None, options: TaskOptions = PAPER_TASK
) -> dict[str, list[str]]:
    """Deterministic, disjoint splits of the task (variant). Test is drawn first, then valid, then train, so
    the held-out sets do not change when the training set size does; a string already used is drawn again."""
    sizes = dict(DEFAULT_SPLIT_SIZES if sizes is None else sizes)
    for name, size in sizes.items():
        if name not in DEFAULT_SPLIT_SIZES:
            raise ValueError(f"unknown split {name!r}; valid splits: {sorted(DEFAULT_SPLIT_SIZES)}")
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"split {name!r} size must be a positive int, got {size!r}")
    rng = np.random.default_rng([seed, 0x1D1EC7])
    used_strings: set[str] = set()
    splits: dict[str, list[str]] = {}
    for name in ("test", "valid", "train"):
        if name not in sizes:
            continue
        chosen: list[str] = []
        while len(chosen) < sizes[name]:
            for line in generate_examples(sizes[name] - len(chosen), rng, options=options):
                letters = line_fields(line)[0]
                if letters not in used_strings:
                    used_strings.add(letters)
                    chosen.append(line)
        splits[name] = chosen
    return splits


def write_splits(
    directory: str | os.PathLike, seed: int = 0, sizes: dict[str, int] | None = None, options: TaskOptions = PAPER_TASK
) -> Path:
    """Generate the splits and write ``{split}.txt`` + ``manifest.json`` atomically into ``directory``.
    The manifest records the variant's options (``task_options``) only when they are not the paper's.

    Each file goes to a temporary name unique to this process and is renamed into place; the manifest
    comes last, so a directory without one is incomplete (``ensure_splits`` regenerates it) and a
    crash while rewriting a set leaves files that the manifest's checksums reject. The output is
    deterministic, so two processes writing one directory at once leave the same bytes; use
    ``ensure_splits`` to prepare a shared directory (it also makes them take turns)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    splits = make_splits(seed, sizes, options)
    manifest = {
        "task": "indirect-indexing",
        "format_version": FORMAT_VERSION,
        "seed": seed,
        "characters": CHARACTERS,
        "pad_id": PAD_ID,
        "vocab_size": VOCAB_SIZE,
        "splits": {},
    }
    if options.split_key():
        manifest["task_options"] = options.split_options()
    for name, lines in splits.items():
        path = write_text_atomic(directory / f"{name}.txt", "\n".join(lines) + "\n")
        manifest["splits"][name] = {"file": path.name, "examples": len(lines), "sha256": _sha256(path)}
    write_json_atomic(directory / "manifest.json", manifest)  # written last: its presence means the set is complete
    return directory


def default_data_dir(seed: int = 0, options: TaskOptions = PAPER_TASK) -> Path:
    key = options.split_key()
    return cache_root() / "data" / (f"indirect-indexing-seed{seed}" + (f"-{key}" if key else ""))


def split_task_options(manifest: dict) -> TaskOptions:
    """The task variant a split directory's manifest was generated for (the paper's when it names none)."""
    return TaskOptions(**manifest.get("task_options", {}))


def ensure_splits(
    directory: str | os.PathLike | None = None,
    seed: int = 0,
    sizes: dict[str, int] | None = None,
    options: TaskOptions = PAPER_TASK,
) -> Path:
    """The split directory for ``seed`` (and the task variant), generated on first use (a few seconds for
    1M examples). An existing directory made with another seed, other sizes or another variant is refused,
    not silently reused.

    Safe when several processes (seed sweeps, torchrun ranks) call it for one directory at once: they
    take turns under ``pope.files.exclusive_lock``, so one generates the splits and the others wait, then
    reuse them; every caller returns only once the complete set (manifest last) is on disk."""
    directory = default_data_dir(seed, options) if directory is None else Path(directory)
    if _existing_splits(directory, seed, sizes, options):  # the common case: no lock, no write access needed
        return directory
    with exclusive_lock(directory):
        if _existing_splits(directory, seed, sizes, options):  # another process generated it meanwhile
            return directory
        return write_splits(directory, seed, sizes, options)


def _existing_splits(directory: Path, seed: int, sizes: dict[str, int] | None, options: TaskOptions) -> bool:
    """True when ``directory`` holds a complete set (manifest present) made with these settings; False when
    it has none; ValueError when its set was made with other settings."""
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        return False
    manifest = json.loads(manifest_path.read_text())
    wanted = dict(DEFAULT_SPLIT_SIZES if sizes is None else sizes)
    found = {name: info["examples"] for name, info in manifest["splits"].items()}
    found_options = split_task_options(manifest).split_options()
    if manifest.get("seed") != seed or found != wanted or found_options != options.split_options():
        raise ValueError(
            f"{directory} holds indirect-indexing splits with seed {manifest.get('seed')}, sizes "
            f"{found} and task {found_options}, but seed {seed}, sizes {wanted} and task "
            f"{options.split_options()} were asked for; use another directory"
        )
    return True


@dataclass
class EncodedExamples:
    """Token ids of a set of examples: ``inputs`` (N, SEQ_LEN) int64, right-padded with PAD_ID;
    ``targets`` (N, SEQ_LEN) int64, -100 everywhere except the final target token."""

    inputs: np.ndarray
    targets: np.ndarray

    def __len__(self) -> int:
        return len(self.inputs)


def encode_lines(data: bytes, *, source: str = "<bytes>") -> EncodedExamples:
    """Encode newline-separated example lines (vectorised; 1M lines in about a second).
    Checks the vocabulary, line lengths and the ``,<target>`` ending; the full rules are checked by
    ``parse_example`` (``validate_file``)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if len(raw) and raw[-1] != ord("\n"):
        raw = np.concatenate([raw, np.array([ord("\n")], dtype=np.uint8)])
    ends = np.flatnonzero(raw == ord("\n"))  # (N,) index of each line's newline
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts
    if len(ends) == 0:
        raise ValueError(f"{source}: no examples found")
    bad = np.flatnonzero((lengths < MIN_LETTERS + 7) | (lengths > MAX_EXAMPLE_CHARS))
    if len(bad):
        raise ValueError(
            f"{source}: line {bad[0] + 1} has {lengths[bad[0]]} characters; an indirect-indexing "
            f"example has {MIN_LETTERS + 7}..{MAX_EXAMPLE_CHARS} (is this the right file?)"
        )
    ids = _BYTE_TO_ID[raw]
    bad_bytes = np.flatnonzero((ids < 0) & (raw != ord("\n")))
    if len(bad_bytes):
        line = int(np.searchsorted(ends, bad_bytes[0]))
        raise ValueError(
            f"{source}: line {line + 1} has character {chr(raw[bad_bytes[0]])!r} outside the task's "
            f"vocabulary {CHARACTERS!r}"
        )
    if np.any(raw[ends - 2] != ord(",")):
        line = int(np.flatnonzero(raw[ends - 2] != ord(","))[0])
        raise ValueError(f"{source}: line {line + 1} does not end with ',<target letter>'")
    offsets = np.arange(SEQ_LEN)  # (T,)
    gather = np.minimum(starts[:, None] + offsets, len(raw) - 1)  # (N, T)
    inside = offsets[None, :] < (lengths - 1)[:, None]  # input positions: all characters but the last
    inputs = np.where(inside, ids[gather], PAD_ID)
    targets = np.full_like(inputs, -100)
    rows = np.arange(len(lengths))
    targets[rows, lengths - 2] = ids[ends - 1]  # predicted from the position of the last ','
    return EncodedExamples(inputs=inputs.astype(np.int64), targets=targets.astype(np.int64))


def load_file(path: str | os.PathLike) -> EncodedExamples:
    """Read and encode one examples file (``{split}.txt`` or any file of example lines)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"indirect-indexing examples file {path} does not exist; create splits with "
            "pope.data.indirect_indexing.write_splits(DIR) (or let `pope train indirect-indexing` do it)"
        )
    return encode_lines(path.read_bytes(), source=str(path))


def shifts_of_file(path: str | os.PathLike) -> np.ndarray:
    """(N,) int64: the signed shift of every example line of a file, in order (either field order)."""
    lines = Path(path).read_text().splitlines()
    try:
        return np.array([int(line_fields(line)[2]) for line in lines if line], dtype=np.int64)
    except ValueError as error:
        raise ValueError(
            f"{path}: a line without a '<string>,<source>,<shift>,<target>' shift ({error}); is this "
            "an indirect-indexing examples file?"
        ) from error


def load_split(directory: str | os.PathLike, split: str, *, verify: bool = True) -> EncodedExamples:
    """One split of a directory written by ``write_splits``; ``verify`` checks its SHA-256."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        raise FileNotFoundError(
            f"{manifest_path} is missing: {directory} is not a complete indirect-indexing split "
            "directory (write one with pope.data.indirect_indexing.write_splits)"
        )
    manifest = json.loads(manifest_path.read_text())
    if split not in manifest["splits"]:
        raise ValueError(f"split {split!r} not in {directory}; it has {sorted(manifest['splits'])}")
    info = manifest["splits"][split]
    path = directory / info["file"]
    if verify and _sha256(path) != info["sha256"]:
        raise ValueError(
            f"{path} does not match the checksum in its manifest (corrupt or edited); delete "
            f"{directory} to regenerate it"
        )
    return load_file(path)


def validate_file(path: str | os.PathLike, options: TaskOptions = PAPER_TASK) -> int:
    """Check every line of a file with ``parse_example``; returns the number of examples."""
    count = 0
    with open(path) as handle:
        for line in handle:
            parse_example(line, options)
            count += 1
    return count


def fresh_examples(
    count: int, rng: np.random.Generator, options: TaskOptions, held_out: set[str] = frozenset()
) -> EncodedExamples:
    """``count`` newly drawn, encoded examples of the variant whose strings are not in ``held_out``
    (the valid/test strings); what ``fresh=true`` trains on, one global batch per step."""
    lines: list[str] = []
    while len(lines) < count:
        lines += [
            line
            for line in generate_examples(count - len(lines), rng, options=options)
            if line_fields(line)[0] not in held_out
        ]
    return encode_lines(("\n".join(lines) + "\n").encode(), source="fresh examples")
