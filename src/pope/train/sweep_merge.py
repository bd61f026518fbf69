"""Merging one seed sweep into another: seeds of one setting run at different times (e.g. in separate time-limited jobs,
each its own `pope train --seeds` directory) become one sweep directory, as if one sweep had run them all, so
that `pope report` counts them as one setting.

`merge_sweep(source, destination)` checks everything before it changes anything: both are sweep directories
(sweep.json), of the same preset and encoding, and every source seed's config equals the destination's setting
apart from the seed and execution keys (pope.train.sweep_settings.setting_of). A seed present in both is refused,
unless the destination's copy is unfinished and `replace_unfinished` is given (a seed stopped in one job and rerun
whole in another), and refused when the source's copy is itself unfinished and got less far; so is a seed whose log the
destination already holds. A seed the source records as running but that is not finished (its directory was
archived while it ran, and its machine or process went away) is merged as "unfinished" at its last logged step.
Then each source seed's directory is copied in whole before it replaces anything, with its log, and the source's
invocations and seed records are added to the destination's sweep.json (written atomically). The source is left as
it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pope.files import write_json_atomic
from pope.train.seed_runs import last_step, run_finished
from pope.train.sweep_settings import setting_of


def _sweep_record(directory: Path, role: str) -> dict:
    path = directory / "sweep.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{role} {directory} has no sweep.json: give a directory written by pope train --seeds"
        ) from None
    except ValueError as error:
        raise ValueError(f"{role} {path} is not valid JSON ({error}); restore it before merging") from None


def _setting(run_dir: Path) -> dict:
    path = run_dir / "config.json"
    try:
        return {k: v for k, v in setting_of(json.loads(path.read_text())).items() if k != "seed"}
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read {path} ({error}): every seed directory needs its config.json") from None


def merge_sweep(source: str | Path, destination: str | Path, *, replace_unfinished: bool = False) -> list[str]:
    """Copies source's seeds into destination (see the module docstring); returns one line per merged seed.
    Raises ValueError, having changed nothing, when the sweeps differ or a seed would be overwritten."""
    source, destination = Path(source), Path(destination)
    if source.resolve() == destination.resolve():
        raise ValueError(f"source and destination are the same directory ({source})")
    theirs, ours = _sweep_record(source, "source"), _sweep_record(destination, "destination")
    for key in ("preset", "pe"):
        if theirs.get(key) != ours.get(key):
            raise ValueError(
                f"the sweeps differ in {key}: {theirs.get(key)!r} (source) vs {ours.get(key)!r} "
                "(destination); only seeds of one setting can be merged"
            )
    existing = sorted(destination.glob("seed-*/config.json"))
    reference = _setting(existing[0].parent) if existing else None
    seeds = sorted(theirs.get("seeds", {}), key=int)
    if not seeds:
        raise ValueError(f"source {source} records no seeds in its sweep.json")
    replaced = []
    for seed in seeds:
        run_dir = source / theirs["seeds"][seed].get("run_dir", f"seed-{seed}")
        if not run_dir.is_dir():
            raise ValueError(f"source seed {seed}: {run_dir} is missing")
        setting = _setting(run_dir)
        if reference is not None and setting != reference:
            differing = sorted(k for k in set(setting) | set(reference) if setting.get(k) != reference.get(k))
            raise ValueError(
                f"source seed {seed} was not run with the destination's setting: "
                + "; ".join(f"{k}: {setting.get(k)!r} vs {reference.get(k)!r}" for k in differing)
            )
        reference = setting
        target = destination / run_dir.name
        if target.exists():
            if run_finished(target):
                raise ValueError(
                    f"seed {seed} is in both sweeps and {target} is finished; leave it out of the "
                    "source or remove one copy by hand"
                )
            if not replace_unfinished:
                raise ValueError(
                    f"seed {seed} is in both sweeps ({target} is unfinished); pass "
                    "--replace-unfinished to replace it with the source's copy"
                )
            theirs_step, ours_step = last_step(run_dir / "metrics.jsonl"), last_step(target / "metrics.jsonl")
            if not run_finished(run_dir) and theirs_step < ours_step:
                raise ValueError(
                    f"seed {seed}: the source's copy is unfinished at step {theirs_step}, short of the "
                    f"destination's unfinished copy at step {ours_step}; keep the destination's"
                )
            replaced.append(seed)
        log = destination / theirs["seeds"][seed].get("log", f"seed-{seed}.log")
        if log.exists() and seed not in replaced:
            raise ValueError(
                f"{log} exists without a seed-{seed} directory beside it; move it away before merging seed {seed}"
            )
    lines = []
    for seed in seeds:
        entry = dict(theirs["seeds"][seed])
        run_dir = source / entry.get("run_dir", f"seed-{seed}")
        if entry.get("status") == "running" and not run_finished(run_dir):
            # sweep.json is written as a seed starts: a copy archived mid-run still says "running", step 0
            entry.update(status="unfinished", step=last_step(run_dir / "metrics.jsonl"))
            entry["notes"] = [
                *entry.get("notes", []),
                "archived while running; its process ended without a summary "
                "(its machine went away, or it was killed): step is the last one logged",
            ]
        target = destination / run_dir.name
        staging = destination / f".{run_dir.name}.merging"  # copied whole before the old copy goes
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(run_dir, staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        log = source / entry.get("log", f"seed-{seed}.log")
        if log.is_file():
            shutil.copy2(log, destination / log.name)
        ours.setdefault("seeds", {})[seed] = entry
        lines.append(
            f"seed {seed}: {entry.get('status', '?')} at step {entry.get('step', '?')}"
            + (" (replaced the destination's unfinished copy)" if seed in replaced else "")
            + f" -> {target}"
        )
    known = {json.dumps(i, sort_keys=True) for i in ours.get("invocations", [])}
    ours["invocations"] = ours.get("invocations", []) + [
        {**i, "merged_from": source.name}
        for i in theirs.get("invocations", [])
        if json.dumps(i, sort_keys=True) not in known
    ]
    ours["seeds"] = dict(sorted(ours["seeds"].items(), key=lambda item: int(item[0])))
    write_json_atomic(destination / "sweep.json", ours)
    return lines
