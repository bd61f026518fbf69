"""What the seeds of a sweep share, and what a sweep's record says: the setting that groups runs (a config without its
execution keys), the --seeds list, and sweep.json read back for `pope train --resume SWEEP`. Importing this module
imports no torch (sweeps are driven from shell scripts, one import per run).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path


@functools.cache
def _execution_keys() -> frozenset[str]:
    from pope.train.run_config import RESUME_MUTABLE  # here: it imports torch, and importing a sweep must not

    return frozenset(RESUME_MUTABLE) | {"seed", "train.eval_batch_size"}


def __getattr__(name):
    # EXECUTION_KEYS: config keys that say how a run is executed, not what it computes (the seed apart): the
    # seeds of one sweep share everything else, and `pope report` groups runs by everything else. Computed on
    # first use because pope.train.run_config imports torch, and run_finished must stay light.
    if name == "EXECUTION_KEYS":
        return _execution_keys()
    raise AttributeError(f"module 'pope.train.sweep_settings' has no attribute {name!r}")


def setting_of(config: dict) -> dict:
    """A run config flattened to {'section.key': value} without the EXECUTION_KEYS: what a sweep's seeds share."""

    def flatten(tree: dict, prefix: str) -> dict:
        flat = {}
        for key, value in tree.items():
            name = f"{prefix}.{key}" if prefix else key
            flat.update(flatten(value, name) if isinstance(value, dict) else {name: value})
        return flat

    return {k: v for k, v in flatten(config, "").items() if k not in _execution_keys()}


def parse_seeds(text: str) -> list[int]:
    """'0-7' -> [0..7]; '0,3,5' -> [0, 3, 5]; '0-2,9' -> [0, 1, 2, 9]. Raises ValueError on anything else."""
    seeds: list[int] = []
    parts = [p.strip() for p in str(text).split(",")]
    if not text or not text.strip() or any(not p for p in parts):
        raise ValueError(f"--seeds {text!r}: give seeds like 0-7, 0,3,5 or 0-2,9 (non-negative integers)")
    for part in parts:
        low, dash, high = part.partition("-")
        if not low.strip().isdigit() or (dash and not high.strip().isdigit()):
            raise ValueError(f"--seeds {text!r}: {part!r} is not a seed or a range A-B of non-negative integers")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"--seeds {text!r}: range {part!r} runs backwards; write {last}-{first}")
        seeds.extend(range(first, last + 1))
    duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
    if duplicates:
        raise ValueError(f"--seeds {text!r}: seed(s) {duplicates} given twice")
    return seeds


def merge_overrides(earlier: list[str], later: list[str]) -> list[str]:
    """``--set`` items of ``earlier`` whose key ``later`` does not set, then ``later``'s: the overrides a sweep ran
    with after an invocation that changed some of them (recipe.max_steps, to extend it)."""
    given = {item.partition("=")[0].strip() for item in later}
    return [item for item in earlier if item.partition("=")[0].strip() not in given] + list(later)


def extends_run(key: str, before, after) -> bool:
    """Whether a setting's change from ``before`` to ``after`` extends its runs (RESUME_EXTENDABLE, growing)."""
    from pope.train.run_config import RESUME_EXTENDABLE  # imports torch, which this module's importers do without

    return key in RESUME_EXTENDABLE and isinstance(before, int) and isinstance(after, int) and after >= before


def recorded_sweep(path: Path) -> tuple[str, str, list[str], str]:
    """(preset, pe, --set overrides, seeds as '0,1,...') of the sweep DIR/sweep.json records, for `pope train
    --resume DIR`; a recorded train.stop_at_step is left out (an earlier invocation's stop, as resume_command and
    pope.train.run_config.resume_config leave it out). A ValueError saying what to give instead when the record
    cannot say."""
    try:
        record = json.loads(Path(path).read_text())
        preset, pe, overrides = record["preset"], record["pe"], list(record.get("overrides") or [])
        seeds = sorted(int(seed) for seed in record["seeds"])
        if not (isinstance(preset, str) and isinstance(pe, str) and seeds):
            raise ValueError("no preset, pe or seeds")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path} cannot say which sweep to resume ({err}); give it in full: pope train PRESET --pe PE --seeds "
            f"LIST --out {Path(path).parent} --resume"
        ) from None
    kept = [str(item) for item in overrides if str(item).partition("=")[0].strip() != "train.stop_at_step"]
    return preset, pe, kept, ",".join(map(str, seeds))
