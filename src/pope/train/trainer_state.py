"""The trainer's checkpoints: what to resume from, saving and loading trainer state, RNG states.

``RUN/checkpoints/last`` is what ``--resume`` continues from; ``best`` follows ``train.best_metric``.
Both hold the same trainer state (step, optimizer, schedule, RNG states of python/numpy/torch/CUDA,
data position, best-metric bookkeeping, evaluation metrics and the run config as a dict), written
atomically by pope.checkpoint. ``--resume`` never restarts silently: without a valid ``last`` it
raises, saying what the directory holds and what to do.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import torch

from pope import checkpoint as ckpt
from pope.checkpoint import checkpoint_step
from pope.train.distributed import all_gather_object, barrier
from pope.train.metrics import parse_metrics
from pope.train.run_config import RESUME_EXTENDABLE, RESUME_MUTABLE, RunConfig, resume_differences
from pope.train.rundir import describe_run


def rng_state() -> dict:
    """This process's RNG states; "cuda" is the generator of the GPU it trains on."""
    legacy = np.random.get_state()
    state = {
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [legacy[0], legacy[1].tolist(), int(legacy[2]), int(legacy[3]), float(legacy[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore states saved by `rng_state` on this process; the CUDA one on the GPU this process trains on.
    (Checkpoints before this layout stored every visible GPU's state as a list: its first is rank 0's.)"""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda[0] if isinstance(cuda, (list, tuple)) else cuda)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resume_checkpoint(run_dir: Path, config: RunConfig) -> Path:
    """The verified ``checkpoints/last`` of a run that ``config`` may continue; otherwise an error that
    says what is there and what to do. Reads only; changes nothing in ``run_dir``.

    ``config`` is compared with the run's stored config (``resume_differences``: execution settings may change,
    recipe.max_steps may grow); the stored config is config.json, or the one ``checkpoints/last`` holds when
    config.json is missing or was torn by a crash mid-write (said in a notice; the trainer then rewrites it and
    keeps the torn file as config.json.damaged)."""
    last = run_dir / "checkpoints" / "last"
    stored = stored_run_config(run_dir)
    if (run_dir / "metrics.jsonl").is_file():
        parse_metrics(run_dir / "metrics.jsonl")  # a damaged record (not a torn last line) is refused before any write
    differences = resume_differences(stored, config.to_dict())
    if differences:
        raise ValueError(
            f"--resume refused: {run_dir} was trained with other settings ({'; '.join(differences)}); only "
            f"{', '.join(sorted(RESUME_MUTABLE))} may change, and {', '.join(sorted(RESUME_EXTENDABLE))} may grow: "
            f"leave the others as they were (`pope train --resume {run_dir}` continues the run as recorded), or "
            "start a new run with another --out"
        )
    try:
        verified = ckpt.verify_checkpoint(last)
    except (ValueError, FileNotFoundError) as err:
        problem = str(err)
    else:
        _say_if_best_is_damaged(run_dir / "checkpoints" / "best")
        return verified
    best = run_dir / "checkpoints" / "best"
    best_step = checkpoint_step(best) if best.exists() else None
    advice = (
        f"to continue from checkpoints/best (step {best_step}), copy it to checkpoints/last "
        f"(cp -r {best} {last}) and run with --resume again; or start over"
        if best_step is not None
        else "nothing can be resumed; start over"
    )
    raise ValueError(
        f"--resume: no valid checkpoints/last in {run_dir} ({problem}); the directory holds "
        f"{describe_run(run_dir)}; {advice} with a new --out (or delete {run_dir})"
    )


def _say_if_best_is_damaged(best: Path) -> None:
    """A notice when checkpoints/best is torn (sizes against its manifest; the weights are not re-hashed): the run
    continues from last, and best is replaced when an evaluation beats the one it holds."""
    if not best.exists():
        return
    try:
        ckpt.verify_checkpoint(best, hashes=False)
    except (ValueError, FileNotFoundError) as err:
        print(
            f"notice: {err}; training continues from checkpoints/last, and checkpoints/best is replaced when an "
            "evaluation beats the one it held (until then, evaluate RUN/checkpoints/last)",
            file=sys.stderr,
            flush=True,
        )


def stored_run_config(run_dir: Path, *, quiet: bool = False) -> dict:
    """The config a run was trained with: its config.json, or, when that is missing or not valid JSON (a crash
    while it was written), the run config stored in its ``checkpoints/last`` (with a notice on stderr). An error
    saying what the directory holds and what to do when neither can be read. ``quiet``: no notice (a caller that
    reads it again later, where the notice is printed)."""
    if not run_dir.is_dir():
        what = "is a file" if run_dir.exists() else "does not exist"
        raise FileNotFoundError(
            f"--resume: {run_dir} {what}, so it is not a run directory; give the --out of the run to continue, or "
            "start a new run without --resume"
        )
    config_path = run_dir / "config.json"
    problem = None
    if config_path.is_file():
        try:
            stored = json.loads(config_path.read_text())
            if isinstance(stored, dict):
                return stored
            problem = "is not a JSON object"
        except (ValueError, UnicodeDecodeError) as err:
            problem = f"is not valid JSON ({err}; a write cut off by a crash)"
    from_checkpoint = _checkpoint_run_config(run_dir / "checkpoints" / "last")
    if problem is None and from_checkpoint is None:
        raise FileNotFoundError(
            f"--resume: {config_path} not found; {run_dir} is not a run directory "
            f"(it holds {describe_run(run_dir)}); start a new run without --resume"
        )
    if from_checkpoint is None:
        raise ValueError(
            f"--resume: {config_path} {problem}, and no valid checkpoints/last holds the run's config (the directory "
            f"holds {describe_run(run_dir)}); nothing can be resumed: start over with a new --out"
        )
    if quiet:
        return from_checkpoint
    print(
        f"notice: {config_path} {problem or 'is missing'}; using the run config stored in checkpoints/last "
        "(config.json is rewritten from it" + (", the damaged file kept as config.json.damaged)" if problem else ")"),
        file=sys.stderr,
        flush=True,
    )
    return from_checkpoint


def _checkpoint_run_config(path: Path) -> dict | None:
    """The run config a verified checkpoint stores, or None (no checkpoint, a damaged one, or none stored)."""
    try:
        directory = ckpt.verify_checkpoint(path)
        state = torch.load(directory / ckpt.STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    except (ValueError, OSError, RuntimeError):
        return None
    config = state.get("run_config") if isinstance(state, dict) else None
    return config if isinstance(config, dict) else None


class CheckpointManager:
    """Saves and restores the trainer's state through a parallel strategy (rank 0 writes)."""

    def __init__(self, run_dir: Path, strategy, *, is_main: bool) -> None:
        self.directory = run_dir / "checkpoints"
        self.strategy, self.is_main = strategy, is_main

    def save(self, name: str, *, model, optimizer, model_config: dict, trainer_state: dict) -> None:
        """Write checkpoints/NAME; ``trainer_state`` gets the optimizer state and RNG states added."""
        model_state = self.strategy.model_state(model)  # collectives under FSDP2: every rank calls them
        optimizer_state = self.strategy.optimizer_state(model, optimizer)
        rng = all_gather_object(rng_state())  # (a collective) every rank's states
        if self.is_main:
            state = {**trainer_state, "optimizer": optimizer_state, "rng": rng[0]}
            if len(rng) > 1:
                state["rank_rng"] = rng
            ckpt.save_checkpoint(
                self.directory / name, model_state=model_state, model_config=model_config, trainer_state=state
            )
        barrier()

    @staticmethod
    def load_model(path: Path, model, data_state) -> ckpt.Checkpoint:
        """Read a checkpoint (verified, fully in memory) and copy its weights into ``model``;
        ``data_state(step)`` is this run's sampler state, which must match the checkpoint's."""
        loaded = ckpt.load_checkpoint(path, map_location="cpu")
        stored = loaded.trainer_state.get("data")
        expected = data_state(loaded.trainer_state.get("step"))
        if stored != expected:
            raise ValueError(
                f"checkpoint {path} was written for other data ({stored}); this run has {expected}: resume it on the "
                "data it trained on (the train.data_dir it was trained with, or none)"
            )
        ckpt.apply_model_state(model, loaded.model_state, source=f"checkpoint {path}")
        return loaded

    def load_trainer_state(self, state: dict, *, model, optimizer) -> None:
        """Restore the optimizer and the RNG states (the caller restores step and best). On the world size that
        wrote the checkpoint every rank gets its own RNG states back; on another, every rank gets rank 0's (as a
        new run seeds every rank alike): the same continuation unless ranks drew differently (dropout over
        packed micro-batches of different lengths), where no other choice would be either."""
        self.strategy.load_optimizer_state(model, optimizer, state["optimizer"])
        context = self.strategy.context
        per_rank = state.get("rank_rng")
        set_rng_state(per_rank[context.rank] if per_rank and len(per_rank) == context.world_size else state["rng"])
