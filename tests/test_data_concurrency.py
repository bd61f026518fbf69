"""Several processes preparing one cached dataset at once (seed sweeps, torchrun ranks) all succeed and
read the same complete, verified files (pope.files.exclusive_lock around every check-then-build)."""

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path

from pope.files import sha256_file

PROCESSES = 4
ROUNDS = 12  # each round: a fresh empty cache, every process starting at one barrier
SIZES = {"train": 3000, "valid": 300, "test": 300}
SPLIT_FILES = {"train.txt", "valid.txt", "test.txt", "manifest.json"}


def _run_rounds(prepare, cache_dirs, barrier, results) -> None:
    """Worker: for each cache directory, wait at the barrier, then prepare; report file hashes or the error."""
    outcome = []
    for cache in cache_dirs:
        os.environ["POPE_CACHE"] = cache
        try:
            barrier.wait(timeout=60)
            outcome.append(prepare())
        except Exception as err:  # reported to the test, which names it
            outcome.append(f"{type(err).__name__}: {err}")
    results.put((os.getpid(), outcome))


def _prepare_indirect_indexing() -> dict:
    from pope.data import indirect_indexing as task

    directory = task.ensure_splits(None, seed=0, sizes=SIZES)
    for split in SIZES:  # checksum-verified reads, right after this process's call returns
        assert len(task.load_split(directory, split, verify=True)) == SIZES[split]
    return {path.name: sha256_file(path) for path in sorted(directory.iterdir())}


def _prepare_jsb_json() -> dict:
    from pope.data import registry

    cache = Path(os.environ["POPE_CACHE"])
    dataset = registry.prepare(
        "jsb", out_dir=cache / "data" / "jsb", source=cache.parent.parent / "chorales.json", progress=False
    )
    dataset.verify()
    # every file the prepare wrote (another process's transient .pope-write-probe-* is not one)
    names = json.loads((dataset.path / ".pope-dataset").read_text())["files"] + [".pope-dataset"]
    return {name: sha256_file(dataset.path / name) for name in sorted(names)}


def _race(prepare, tmp_path: Path) -> list[list]:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    caches = [str(tmp_path / f"round{r}" / "cache") for r in range(ROUNDS)]
    workers = [context.Process(target=_run_rounds, args=(prepare, caches, barrier, results)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120)[1] for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    return [[outcome[r] for outcome in outcomes] for r in range(ROUNDS)]  # per round, one entry per process


def test_concurrent_indirect_indexing_preparation(tmp_path):
    for round_index, outcomes in enumerate(_race(_prepare_indirect_indexing, tmp_path)):
        failures = [outcome for outcome in outcomes if isinstance(outcome, str)]
        assert not failures, f"round {round_index}: {failures}"
        assert all(outcome == outcomes[0] for outcome in outcomes)  # every process read the same files
        directory = tmp_path / f"round{round_index}" / "cache" / "data" / "indirect-indexing-seed0"
        assert {path.name for path in directory.iterdir()} == SPLIT_FILES  # no temporaries left behind
        assert {path.name for path in directory.parent.iterdir()} == {directory.name}  # nor lock files
        manifest = json.loads((directory / "manifest.json").read_text())
        assert {name: info["sha256"] for name, info in manifest["splits"].items()} == {
            f"{name}": outcomes[0][f"{name}.txt"] for name in SIZES
        }


def test_concurrent_prepared_dataset_preparation(tmp_path):
    chorale = [[60 + step % 12, 55, 52, 36] for step in range(40)]
    (tmp_path / "chorales.json").write_text(json.dumps({"train": [chorale] * 3, "valid": [chorale], "test": [chorale]}))
    for round_index, outcomes in enumerate(_race(_prepare_jsb_json, tmp_path)):
        failures = [outcome for outcome in outcomes if isinstance(outcome, str)]
        assert not failures, f"round {round_index}: {failures}"
        assert all(outcome == outcomes[0] for outcome in outcomes)
        data = tmp_path / f"round{round_index}" / "cache" / "data"
        assert not [path.name for path in data.iterdir() if ".partial-" in path.name or path.suffix == ".lock"]


def test_exclusive_lock_serialises_and_survives_a_killed_holder(tmp_path):
    from pope.files import exclusive_lock

    target = tmp_path / "cache" / "entry"
    inside, overlaps = [], []

    def hold():
        with exclusive_lock(target):
            overlaps.append(len(inside))
            inside.append(1)
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(3)]  # flock on separate descriptors: threads wait too
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert overlaps == [0, 0, 0]
    assert not (tmp_path / "cache" / ".entry.lock").exists() and not target.exists()  # the lock file is removed

    # a holder killed mid-block leaves its lock file behind; the kernel released the lock, so the next run proceeds
    context = multiprocessing.get_context("spawn")
    holder = context.Process(target=_hold_forever, args=(str(target),))
    holder.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "cache" / "holding").exists():
        assert time.monotonic() < deadline and holder.is_alive()
        time.sleep(0.02)
    holder.kill()
    holder.join(timeout=10)
    assert (tmp_path / "cache" / ".entry.lock").is_file()  # left behind, but no longer locked
    with exclusive_lock(target):
        pass
    assert not (tmp_path / "cache" / ".entry.lock").exists()


def _hold_forever(target: str) -> None:
    from pope.files import exclusive_lock

    with exclusive_lock(target):
        (Path(target).parent / "holding").touch()
        time.sleep(600)


def test_lock_is_skipped_where_it_cannot_be_taken(tmp_path, monkeypatch):
    import errno
    import fcntl

    from pope.files import exclusive_lock

    def refuse(descriptor, operation):
        raise OSError(errno.ENOLCK, "No locks available")  # e.g. a network filesystem without flock

    monkeypatch.setattr(fcntl, "flock", refuse)
    ran = []
    with exclusive_lock(tmp_path / "entry"):  # the block runs unlocked
        ran.append(True)
    assert ran == [True]
