"""Dataset names -> builders. Light to import: each builder module is imported only when used.

| name (aliases)            | default source (offline unless noted)            | --source                         |
|---------------------------|--------------------------------------------------|----------------------------------|
| jsb (chorales)            | music21's Bach chorale corpus                    | Jsb16thSeparated.json            |
| maestro                   | the 10 MAESTRO files of the miditok 3.1.0 sdist  | a MAESTRO v3 MIDI directory      |
| genome                    | human chrX (Debian smalt-examples)               | a FASTA file (plain or gzip)     |
| genome-hf                 | HF InstaDeepAI/human_reference_genome (internet) | another HF dataset id            |
| text (prose)              | State of the Union + Moby-Dick (npm @stdlib)     | a directory of .txt files        |
| openwebtext (owt)         | HF Skylion007/openwebtext (internet)             | another HF dataset id            |
| pg19                      | HF emozilla/pg19-test (internet)                 | another HF dataset id            |
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from pope.data.paths import data_root
from pope.files import check_output_dir, exclusive_lock

# canonical name -> (module, function); the function takes (out_dir, *, source, force, progress, **options)
BUILDERS: dict[str, tuple[str, str]] = {
    "jsb": ("pope.data.chorales", "prepare_jsb"),
    "maestro": ("pope.data.maestro", "prepare_maestro"),
    "genome": ("pope.data.genome", "prepare_genome"),
    "genome-hf": ("pope.data.genome", "prepare_genome_hf"),
    "text": ("pope.data.text", "prepare_text"),
    "openwebtext": ("pope.data.text", "prepare_openwebtext"),
    "pg19": ("pope.data.text", "prepare_pg19"),
}
ALIASES = {"chorales": "jsb", "jsb-chorales": "jsb", "owt": "openwebtext", "prose": "text", "pg-19": "pg19"}


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in BUILDERS:
        known = ", ".join(sorted(set(BUILDERS) | set(ALIASES)))
        raise ValueError(f"unknown dataset {name!r}; known names: {known} (or pass a prepared dataset directory)")
    return key


# Builder options and the types they take (a string where a bool or a number is meant is refused, not coerced).
_OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "force": (bool,),
    "progress": (bool,),
    "ambiguous_as_n": (bool,),
    "max_bases": (int,),
    "region_bases": (int,),
    "max_docs": (int,),
    "max_n_fraction": (int, float),
}


def _check_option_types(**options: Any) -> None:
    for key, value in options.items():
        kinds = _OPTION_TYPES.get(key)
        if kinds is None or value is None:
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(kind.__name__ for kind in kinds)
            raise TypeError(f"prepare option {key} must be a {names}, got {value!r} ({type(value).__name__})")


def prepare(
    name: str,
    *,
    out_dir: str | os.PathLike | None = None,
    source: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    **options: Any,
):
    """Prepare dataset `name` into out_dir (default $POPE_DATA_DIR/NAME); returns the PreparedDataset.

    Safe when several processes prepare one directory at once (seed sweeps, torchrun ranks, two `pope data
    prepare`): the builder's check-then-write runs under ``pope.files.exclusive_lock(out_dir)``, so one
    builds the dataset and the others wait, then reuse it (checksums verified) instead of racing it."""
    canonical = canonical_name(name)
    _check_option_types(force=force, progress=progress, **options)
    if out_dir is not None:
        out_dir = check_output_dir(out_dir)  # a file, a path under a file, unwritable: one clear error, first
    module_name, function_name = BUILDERS[canonical]
    builder = getattr(importlib.import_module(module_name), function_name)
    if canonical == "genome-hf":  # a hub dataset id instead of a source path, prepared as "genome"
        if source is not None:
            options["dataset_id"] = str(source)
        target = out_dir or data_root() / "genome"
    else:
        target = out_dir or data_root() / canonical
        options["source"] = source
    with exclusive_lock(target):
        return builder(target, force=force, progress=progress, **options)
