"""Which data a trained run learned from, and whether the data an evaluation is given is of that kind.

Every command that scores a run on data the user names (`pope eval accuracy --data`, `pope eval length --data`,
`pope analyze frequencies --data/--text`) asks here first, before any model is loaded, so a run is never scored
on data it cannot read: the score of a chorale model on indirect-indexing examples is a number, not a result.

The rule: the data must be in the run's format and vocabulary.
- A run trained on the indirect-indexing task is scored on files of its examples (`pope eval accuracy`), in the
  field order it was trained on; anything else (a prepared dataset, a split directory, a binary file) is refused.
  Examples outside its training distribution (strings of other lengths, shift 0) are scored with a notice naming
  both, since scoring them is how generalisation is measured.
- A run trained on a prepared dataset is scored on prepared data with the same vocabulary: the same dataset, or
  another prepared with the same tokenizer (PG-19 for an OpenWebText model, as the paper does), which is accepted
  with a notice naming both. Another vocabulary (MAESTRO's for a JSB run, a task file, a non-dataset path) is
  refused.
Every refusal names the run's data and what was given, and says what to give instead. A run whose config does not
record its data (a bare checkpoint directory) is scored with a notice saying the data could not be checked.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from pope.checkpoint import STATE_FILE, find_checkpoint
from pope.data import indirect_indexing as task
from pope.data.indirect_indexing import is_task_spec, line_fields
from pope.data.prepared import resolve_dataset
from pope.data.registry import canonical_name

# prepared datasets whose builders share one tokenizer (used only when the run's own dataset is not on this machine)
_TOKENIZER_FAMILIES = {"text": "gpt2", "openwebtext": "gpt2", "pg19": "gpt2", "genome": "genome", "genome-hf": "genome"}


@dataclass(frozen=True)
class TrainedData:
    """What ``config.json`` says a run trained on: ``spec`` (recipe.dataset, e.g. 'jsb' or
    'indirect-indexing:query_first=true'), ``location`` (train.data_dir, or None) and whether it is the task."""

    spec: str
    location: str | None

    @property
    def is_task(self) -> bool:

        return is_task_spec(self.spec)

    def describe(self) -> str:
        if self.is_task:
            where = f" from {self.location}" if self.location else ""
            return f"the indirect-indexing task ({self.spec}){where}"
        if self.location:
            return f"dataset {self.location!r}"
        return f"dataset {self.spec!r}"


def run_config_of(run: str | Path) -> dict | None:
    """The run config of a run directory or of one of its ``checkpoints/NAME`` directories: its config.json, else
    the one its checkpoint stores (a bare checkpoint directory); None when neither exists (e.g. a Hugging Face
    model directory). A config.json that is not valid JSON is an error naming it (a torn write), not a run
    without a config. Reads no weights."""
    path = Path(run).expanduser()
    for candidate in (path / "config.json", path.parent.parent / "config.json"):
        if candidate.is_file() and (candidate.parent == path or path.parent.name == "checkpoints"):
            try:
                config = json.loads(candidate.read_text())
            except ValueError as err:
                raise ValueError(
                    f"{candidate} is not valid JSON ({err}): a write was cut off; `pope train --resume "
                    f"{candidate.parent}` rebuilds it from the run's checkpoint"
                ) from None
            return config if isinstance(config, dict) else None
    return _checkpoint_run_config(path)


def _checkpoint_run_config(path: Path) -> dict | None:

    try:
        state = torch.load(find_checkpoint(path) / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # no checkpoint here, or an unreadable one: the loader that follows names the problem
        return None
    config = state.get("run_config") if isinstance(state, dict) else None
    return config if isinstance(config, dict) else None


def trained_data(config: dict | None) -> TrainedData | None:
    if not config or not isinstance(config.get("recipe"), dict) or not config["recipe"].get("dataset"):
        return None
    location = (config.get("train") or {}).get("data_dir")
    return TrainedData(spec=str(config["recipe"]["dataset"]), location=str(location) if location else None)


def _notice(text: str) -> None:
    print(f"notice: {text}", file=sys.stderr, flush=True)


def describe_data_path(path: str | Path) -> str:
    """What a --data argument is, in words: 'indirect-indexing examples', 'prepared dataset 'jsb'', 'split file
    test.bin of prepared dataset 'jsb'', ... (for messages that name what was given)."""
    path = Path(path).expanduser()
    if path.is_dir():
        manifest = _read_manifest(path / "manifest.json")
        if manifest is None:
            return f"{path}, a directory without a dataset manifest"
        if manifest.get("task") == "indirect-indexing":
            return f"{path}, a directory of indirect-indexing example files"
        return f"{path}, prepared dataset {manifest.get('name')!r}"
    if path.is_file():
        manifest = _read_manifest(path.parent / "manifest.json")
        if manifest is not None and manifest.get("task") == "indirect-indexing":
            return f"{path}, a file of indirect-indexing examples"
        if manifest is not None and manifest.get("name"):
            return f"{path}, a file of prepared dataset {manifest.get('name')!r}"
        if _looks_like_task_file(path):
            return f"{path}, a file of indirect-indexing examples"
        return f"{path}, a file that is not a prepared dataset"
    return f"{path} (it does not exist)"


def _read_manifest(path: Path) -> dict | None:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _looks_like_task_file(path: Path) -> bool:

    try:
        with open(path, "rb") as handle:
            first = handle.readline(200).decode("ascii").strip()
        line_fields(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return True


# ------------------------------------------------------------------------------------------- the task
def check_task_file(run: str | Path, config: dict | None, path: str | Path) -> None:
    """`pope eval accuracy RUN --data FILE`: RUN must have trained on the indirect-indexing task and FILE must be a
    file of its examples in the field order it trained on; ValueError/FileNotFoundError naming both otherwise.
    Examples of another length range or with shift 0 are scored, with a notice."""

    path = Path(path).expanduser()
    data = trained_data(config)
    if data is None:
        _notice(f"{run} does not record what it trained on (no config.json); {path} is scored without that check")
    elif not data.is_task:
        raise ValueError(
            f"{run} was trained on {data.describe()}, not on the indirect-indexing task, so `pope eval accuracy` "
            f"cannot score it on --data {describe_data_path(path)}; score it on its own data with "
            f"`pope eval length {run} --data {data.location or data.spec} --lengths ...`"
        )
    trained = f"{run} was trained on {data.describe() if data is not None else 'the indirect-indexing task'}"
    example = _task_test_file(config) if data is not None else None
    advice = f"e.g. --data {example}" if example else "e.g. the test.txt of the run's split directory"
    if path.is_dir():
        if (path / "test.txt").is_file():
            advice = f"e.g. --data {path / 'test.txt'}"
        raise ValueError(
            f"--data {describe_data_path(path)}: a directory, not a file of examples; {trained}: give one file of "
            f"its examples, one per line ({advice})"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"--data {path} does not exist; {trained}: give a file of its examples, one per line ({advice})"
        )
    if not _looks_like_task_file(path):
        raise ValueError(
            f"--data {describe_data_path(path)}: its first line is not an indirect-indexing example "
            f"(<string>,<source>,<signed shift>,<target>); {trained}: give a file of its examples ({advice})"
        )
    if data is None:
        return
    options = task.parse_task_spec(data.spec)
    with open(path) as handle:
        lines = [line for line in handle.read().splitlines() if line]
    orders = {task.line_fields(line)[4] for line in lines[:1000]}
    if orders != {options.query_first}:
        order = "query first (<source>,<shift>,<string>,<target>)" if options.query_first else "in the paper's order"
        given = "query first" if True in orders else "in the paper's order"
        raise ValueError(
            f"{trained}, whose examples are {order}, but --data {path} has examples {given}; the model cannot "
            f"read them: give examples of the task it trained on ({advice})"
        )
    lengths = {len(task.line_fields(line)[0]) for line in lines}
    shifts = {task.line_fields(line)[2] for line in lines}
    outside = []
    if min(lengths) < options.min_len or max(lengths) > options.max_len:
        outside.append(
            f"strings of {min(lengths)}..{max(lengths)} letters (it trained on {options.min_len}..{options.max_len})"
        )
    if not options.zero_shift and any(int(shift) == 0 for shift in shifts if shift.lstrip("+-").isdigit()):
        outside.append("shift 0 (it trained without it)")
    if outside:
        _notice(f"{path} holds examples outside what {run} trained on: {'; '.join(outside)}; scored as given")


def _task_test_file(config: dict) -> Path | None:
    """The test.txt of the split directory a task run trained on (its train.data_dir, else the default directory
    of its task variant and data seed), whether or not it exists here."""

    data = trained_data(config)
    if data is None or not data.is_task:
        return None
    if data.location:
        return Path(data.location) / "test.txt"
    try:
        options = task.parse_task_spec(data.spec)
        return task.default_data_dir(int((config.get("train") or {}).get("data_seed") or 0), options) / "test.txt"
    except (ValueError, TypeError):
        return None


# -------------------------------------------------------------------------------------- prepared data
def vocabulary_key(manifest: dict) -> tuple:
    """What makes two prepared datasets' token ids mean the same: the vocabulary size, the token strings (small
    vocabularies list them) and the tokenizer's encoding (large ones name it); not the library version, nor the pad
    id (how training batches documents, not what an id means: the demo trains on the chorales without it)."""
    vocab = manifest.get("vocab") or {}
    tokens = vocab.get("tokens")
    tokenizer = vocab.get("tokenizer") or {}
    encoding = tokenizer.get("encoding") if isinstance(tokenizer, dict) else tokenizer
    return (vocab.get("size"), tuple(tokens) if tokens else None, encoding)


def check_prepared_data(run: str | Path, config: dict | None, data: str) -> None:
    """`pope eval length RUN --data DATA` (and `pope analyze frequencies --data`): RUN must have trained on prepared
    data and DATA must be a prepared dataset with its vocabulary; ValueError naming both otherwise. Another
    dataset with the same vocabulary (pg19 for an openwebtext run) is accepted with a notice. Checked from
    manifests only (no model loaded, no token read)."""

    trained = trained_data(config)
    given_path = Path(str(data)).expanduser()
    if trained is not None and trained.is_task:
        example = _task_test_file(config)
        raise ValueError(
            f"{run} was trained on {trained.describe()}, not on a prepared dataset, so it cannot be scored on "
            f"--data {describe_data_path(given_path) if given_path.exists() else repr(str(data))}; score it "
            f"with `pope eval accuracy {run} --data {example or 'FILE'}` (a file of the task's examples)"
        )
    own = _trained_manifest(trained) if trained is not None else None
    wanted = f"--data {trained.location or trained.spec}" if trained is not None else "a prepared dataset"
    ran = f"{run} was trained on {trained.describe()}" if trained is not None else f"{run} needs prepared data"
    if _names_a_path(str(data)) and given_path.exists() and not _is_prepared_dir(given_path):
        raise ValueError(
            f"--data {describe_data_path(given_path)}: not a prepared dataset (a directory that `pope data prepare` "
            f"wrote); {ran}: give {wanted}"
        )
    try:
        given = resolve_dataset(data)
    except FileNotFoundError:  # a known name not prepared here: refuse at once if it could not fit anyway
        if trained is not None and _family(str(data)) not in (None, _family(trained.spec, own)):
            raise ValueError(
                f"vocabulary mismatch: {ran}, but --data {data!r} is another dataset with another vocabulary; "
                f"give {wanted}"
            ) from None
        raise
    if trained is None:
        _notice(f"{run} does not record what it trained on (no config.json); {given.name!r} is scored unchecked")
        return
    if own is not None:
        if vocabulary_key(own) == vocabulary_key(given.manifest):
            if own.get("name") != given.name:
                _notice(
                    f"{run} was trained on dataset {own.get('name')!r}; scoring it on {given.name!r} "
                    f"({given.path}), which has the same vocabulary and tokenizer"
                )
            return
        raise ValueError(
            f"vocabulary mismatch: {ran} (dataset {own.get('name')!r}, {own['vocab'].get('size')} token ids), but "
            "--data is dataset "
            f"{given.name!r} ({given.path}, {given.vocab_size} token ids) with another vocabulary: its token ids mean "
            f"other things to this model; give {wanted} or data prepared with the same tokenizer"
        )
    family = _family(trained.spec)
    if family is None:
        _notice(f"{trained.describe()} ({run}'s data) is not on this machine; {given.name!r} is scored unchecked")
    elif family != _family(given.name, given.manifest):
        raise ValueError(
            f"vocabulary mismatch: {ran}, but --data is dataset {given.name!r} ({given.path}) with another "
            f"vocabulary; give {wanted} "
            f"(`pope data prepare {trained.spec}` prepares it) or data prepared with the same tokenizer"
        )
    elif _family(trained.spec) != given.name:
        _notice(f"{ran}; scoring it on {given.name!r}, which shares its tokenizer")


def _names_a_path(data: str) -> bool:
    """Whether resolve_dataset reads ``data`` as a path rather than a dataset name (its rule)."""
    if os.sep in data or data.startswith((".", "~")) or (Path(data).expanduser() / "manifest.json").is_file():
        return True
    return _family(data) is None


def _is_prepared_dir(path: Path) -> bool:
    manifest = _read_manifest(path / "manifest.json") if path.is_dir() else None
    return manifest is not None and "task" not in manifest


def _family(name: str, manifest: dict | None = None) -> str | None:
    """The tokenizer family of a registry dataset name (text, openwebtext and pg19 share GPT-2's), or of a manifest's
    dataset name; None for a name the registry does not know."""

    name = str((manifest or {}).get("name") or name)
    try:
        canonical = canonical_name(name)
    except ValueError:
        return None
    return _TOKENIZER_FAMILIES.get(canonical, canonical)


def _trained_manifest(trained: TrainedData) -> dict | None:
    """The manifest of the prepared dataset a run trained on, when it is on this machine."""

    try:
        return resolve_dataset(trained.location or trained.spec).manifest
    except (OSError, ValueError):
        return None


def check_tokenizer(run: str | Path, config: dict | None, tokenizer_name: str) -> None:
    """`pope analyze frequencies RUN --text FILE --tokenizer NAME`: the tokenizer must be the run's data's (a text
    run's gpt2); a run trained on other data (chorales, the task, DNA) cannot read text at all."""
    trained = trained_data(config)
    if trained is None:
        return
    if trained.is_task:
        raise ValueError(
            f"vocabulary mismatch: {run} was trained on {trained.describe()}, not on text, so it cannot read --text "
            "with the "
            f"{tokenizer_name} tokenizer; analyse it on its own data with --data"
        )
    own = _trained_manifest(trained)
    if own is not None:
        tokenizer = (own.get("vocab") or {}).get("tokenizer")
        encoding = tokenizer.get("encoding") if isinstance(tokenizer, dict) else None
        if encoding != tokenizer_name:
            what = f"the {encoding} tokenizer" if encoding else "its own vocabulary, not a text tokenizer"
            raise ValueError(
                f"vocabulary mismatch: {run} was trained on {trained.describe()} ({what}), but --text is read with the "
                f"{tokenizer_name} tokenizer; "
                + (f"pass --tokenizer {encoding}" if encoding else f"analyse it with --data {trained.spec}")
            )
