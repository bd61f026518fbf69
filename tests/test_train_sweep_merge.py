"""Joining sweeps (pope.train.sweep_merge, scripts/merge_sweep.py): seeds of one setting run in several jobs merge
into one sweep directory, the source left as it was; another setting or encoding, a seed finished in both, or a
stray log is refused with the destination unchanged; an unfinished copy is replaced only when asked, and only by a
copy that got further. The sweep directories are synthetic (no run); shared set-up: tests/sweep_fixtures.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sweep_fixtures import SRC, _env

from pope.train.sweep import resolved_config, run_finished


def _fake_sweep(directory, seeds, *, finished=True, overrides=("recipe.lr=0.0002",), started="2026-12-02T08:00:00Z"):
    """A sweep directory as `pope train --seeds` leaves it (config.json, summary.json, log, sweep.json), no run."""
    directory.mkdir(parents=True)
    record = {
        "preset": "indirect-indexing-tiny",
        "pe": "pope",
        "overrides": list(overrides),
        "invocations": [
            {
                "command": ["pope", "train", "--seeds", ",".join(map(str, seeds))],
                "started_utc": started,
                "seeds": list(seeds),
            }
        ],
        "seeds": {},
    }
    for seed in seeds:
        run = directory / f"seed-{seed}"
        run.mkdir()
        config = resolved_config(
            "indirect-indexing-tiny", "pope", seed=seed, overrides=[*overrides, f"train.max_seconds={100 + seed}"]
        )  # execution keys may differ
        (run / "config.json").write_text(json.dumps(config))
        (run / "summary.json").write_text(json.dumps({"step": 4 if finished else 2, "finished": finished}))
        (directory / f"seed-{seed}.log").write_text(f"seed {seed}\n")
        record["seeds"][str(seed)] = {
            "status": "finished" if finished else "stopped",
            "run_dir": run.name,
            "log": f"seed-{seed}.log",
            "step": 4 if finished else 2,
        }
    (directory / "sweep.json").write_text(json.dumps(record))
    return directory


def _tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_merge_sweep_joins_seeds_of_one_setting_and_refuses_anything_else(tmp_path):
    from pope.train.sweep_merge import merge_sweep

    destination = _fake_sweep(tmp_path / "pope-tf32", [0, 1])
    later = _fake_sweep(tmp_path / "later" / "pope-tf32-s2", [2], started="2026-12-03T08:00:00Z")
    before = _tree(later)
    lines = merge_sweep(later, destination)
    assert lines == [f"seed 2: finished at step 4 -> {destination / 'seed-2'}"]
    assert _tree(later) == before  # the source is left as it was
    record = json.loads((destination / "sweep.json").read_text())
    assert list(record["seeds"]) == ["0", "1", "2"] and record["seeds"]["2"]["status"] == "finished"
    assert [i.get("merged_from") for i in record["invocations"]] == [None, "pope-tf32-s2"]
    assert (destination / "seed-2" / "config.json").read_bytes() == before["seed-2/config.json"]
    assert (destination / "seed-2.log").read_text() == "seed 2\n"
    merged = _tree(destination)

    # Refused, with the destination unchanged: a finished seed in both, another setting, another encoding.
    with pytest.raises(ValueError, match="seed 2 is in both sweeps and .* is finished"):
        merge_sweep(later, destination)
    other_lr = _fake_sweep(tmp_path / "lr" / "x", [3], overrides=("recipe.lr=0.0005",))
    with pytest.raises(
        ValueError,
        match=r"source seed 3 was not run with the destination's setting: recipe.lr: "
        r"0.0005 vs 0.0002",
    ):
        merge_sweep(other_lr, destination)
    other_pe = _fake_sweep(tmp_path / "pe" / "x", [4])
    record_pe = json.loads((other_pe / "sweep.json").read_text())
    (other_pe / "sweep.json").write_text(json.dumps({**record_pe, "pe": "rope"}))
    with pytest.raises(ValueError, match="the sweeps differ in pe: 'rope' .source. vs 'pope'"):
        merge_sweep(other_pe, destination)
    with pytest.raises(ValueError, match="has no sweep.json"):
        merge_sweep(tmp_path / "later", destination)
    (destination / "seed-6.log").write_text("a log of the user's\n")
    with pytest.raises(ValueError, match="seed-6.log exists without a seed-6 directory beside it"):
        merge_sweep(_fake_sweep(tmp_path / "six" / "x", [6]), destination)
    (destination / "seed-6.log").unlink()
    assert _tree(destination) == merged

    # An unfinished seed (stopped in one job) is replaced by a whole rerun only when asked.
    stopped = _fake_sweep(tmp_path / "stopped" / "pope-tf32", [5], finished=False)
    merge_sweep(stopped, destination)
    rerun = _fake_sweep(tmp_path / "rerun" / "pope-tf32-s5", [5], started="2026-12-04T08:00:00Z")
    with pytest.raises(ValueError, match="pass --replace-unfinished"):
        merge_sweep(rerun, destination)
    lines = merge_sweep(rerun, destination, replace_unfinished=True)
    assert lines[0].endswith(f"(replaced the destination's unfinished copy) -> {destination / 'seed-5'}")
    assert run_finished(destination / "seed-5")
    assert json.loads((destination / "sweep.json").read_text())["seeds"]["5"]["status"] == "finished"

    # A copy archived while it ran (no summary.json; sweep.json still says running at step 0) joins as unfinished at
    # its last logged step; a copy that got less far does not replace it.
    def archived_mid_run(name, last_step):
        lost = _fake_sweep(tmp_path / name / "pope-tf32-s7", [7], finished=False)
        (lost / "seed-7" / "summary.json").unlink()
        steps = range(500, last_step + 1, 500)
        (lost / "seed-7" / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in steps))
        record = json.loads((lost / "sweep.json").read_text())
        record["seeds"]["7"].update(status="running", step=0)
        (lost / "sweep.json").write_text(json.dumps(record))
        return lost

    assert merge_sweep(archived_mid_run("far", 1500), destination) == [
        f"seed 7: unfinished at step 1500 -> {destination / 'seed-7'}"
    ]
    entry = json.loads((destination / "sweep.json").read_text())["seeds"]["7"]
    assert entry["status"] == "unfinished" and "archived while running" in entry["notes"][-1]
    merged = _tree(destination)
    with pytest.raises(
        ValueError, match="unfinished at step 1000, short of the destination's unfinished copy at step 1500"
    ):
        merge_sweep(archived_mid_run("near", 1000), destination, replace_unfinished=True)
    assert _tree(destination) == merged


def test_merge_sweep_script_errors_in_one_line(tmp_path):
    destination = _fake_sweep(tmp_path / "a", [0])
    run = subprocess.run(
        [sys.executable, str(Path(SRC).parent / "scripts" / "merge_sweep.py"), str(destination), str(destination)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"merge_sweep.py: source and destination are the same directory ({destination})"
    ]
