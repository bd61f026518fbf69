"""Checkpoints: atomic save, verified load, and ``load_model`` for other tools.

Layout (docs/ARCHITECTURE.md)::

    RUN/checkpoints/{last,best}/
        model.safetensors     weights (tied tensors stored once; aliases in the file's metadata)
        model_config.json     GPTConfig.to_dict(): the model rebuilds from this directory alone
        trainer_state.pt      step, optimizer, schedule, RNG states (python/numpy/torch/cuda), data position,
                              best-metric bookkeeping and the resolved run config
        manifest.json         size + SHA-256 of the three files; written last

A checkpoint is written into a hidden temporary directory, fsynced, then renamed into place; the
previous one is renamed aside first and deleted only after the new one is in place, so a crash at
any moment leaves either the old or the new checkpoint complete (``.NAME.old`` is picked up if the
crash fell between the two renames). A write that fails (a full disk) removes its temporary directory and
raises an OSError naming the checkpoint; the temporary directory of a process killed mid-write is removed by
the next write of that checkpoint. Loading verifies the manifest (missing / truncated / corrupt
files give a ValueError naming the file) and reads everything into memory before any tensor is
copied into a model, so a bad checkpoint never leaves a half-loaded model.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from pope.files import fsync_dir, fsync_file, sha256_file
from pope.model import GPT, GPTConfig
from pope.optional import require

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "model_config.json"
STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"
CHECKPOINT_FORMAT = 1


def _require_safetensors():
    return require("safetensors.torch", "train", "checkpoints")


def _dedup_tied(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """safetensors refuses tensors that share memory (tied embeddings): keep one, record aliases."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if key in seen and tensor.numel() > 0:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = tensor.detach().to("cpu").contiguous()
    return unique, aliases


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    model_state: dict[str, torch.Tensor],
    model_config: dict,
    trainer_state: dict | None = None,
) -> Path:
    """Write one checkpoint directory atomically (see module docstring). Returns its path."""
    st = _require_safetensors()
    directory = Path(directory)
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{directory.name}.tmp-{os.getpid()}"
    old = parent / f".{directory.name}.old"
    _remove_stale_temporaries(parent, directory.name)
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        tensors, aliases = _dedup_tied(model_state)
        st.save_file(
            tensors, str(tmp / MODEL_FILE), metadata={"aliases": json.dumps(aliases), "format": str(CHECKPOINT_FORMAT)}
        )
        (tmp / CONFIG_FILE).write_text(json.dumps(model_config, indent=2, sort_keys=True) + "\n")
        torch.save(trainer_state or {}, tmp / STATE_FILE)
        manifest = {"format": CHECKPOINT_FORMAT, "files": {}}
        for name in (MODEL_FILE, CONFIG_FILE, STATE_FILE):
            fsync_file(tmp / name)
            manifest["files"][name] = {"bytes": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        fsync_file(tmp / MANIFEST_FILE)
        fsync_dir(tmp)
    except BaseException as err:  # a full disk, a signal: the half-written copy goes, the previous one stays
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError) and err.errno is not None:
            kept = "the previous checkpoint there is unchanged" if directory.exists() else "none was there before"
            raise type(err)(err.errno, f"{err.strerror} while writing checkpoint {directory} ({kept})") from err
        raise
    if old.exists():
        shutil.rmtree(old)
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    fsync_dir(parent)
    if old.exists():
        shutil.rmtree(old)
    return directory


def _remove_stale_temporaries(parent: Path, name: str) -> None:
    """Delete the temporary directories of earlier writes of checkpoint ``name`` whose process is gone (killed
    mid-write): never a checkpoint, only disk space. A temporary of a live process is left alone."""
    for stale in parent.glob(f".{name}.tmp-*"):
        pid = stale.name.rpartition("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or not ours to judge)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except PermissionError:
            continue


@dataclass
class Checkpoint:
    path: Path
    model_state: dict[str, torch.Tensor]
    model_config: dict
    trainer_state: dict


def _resolve_checkpoint_dir(path: Path) -> Path:
    if (path / MANIFEST_FILE).exists() or (path / MODEL_FILE).exists():
        return path
    old = path.parent / f".{path.name}.old"
    if not path.exists() and (old / MANIFEST_FILE).exists():
        return old  # the process died between moving the old checkpoint aside and moving the new one in
    return path


def verify_checkpoint(directory: str | os.PathLike, *, hashes: bool = True) -> Path:
    """Check that a checkpoint directory is complete and intact; returns the directory to read. ``hashes=False``
    checks every file's presence and size only (a torn write), without reading the files."""
    directory = _resolve_checkpoint_dir(Path(directory))
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.exists():
        raise ValueError(
            f"checkpoint {directory} is incomplete: {MANIFEST_FILE} is missing (the write did not "
            "finish); use another checkpoint (e.g. checkpoints/last or best)"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"checkpoint {directory}: {MANIFEST_FILE} is corrupt ({err})") from err
    for name in (MODEL_FILE, CONFIG_FILE, STATE_FILE):
        path = directory / name
        if name not in files:
            raise ValueError(f"checkpoint {directory}: {MANIFEST_FILE} does not list {name}")
        if not path.exists():
            raise ValueError(f"checkpoint {directory} is incomplete: {name} is missing")
        size = path.stat().st_size
        if size != files[name]["bytes"]:
            raise ValueError(
                f"checkpoint {directory}: {name} is truncated or altered ({size} bytes, "
                f"expected {files[name]['bytes']})"
            )
        if hashes and sha256_file(path) != files[name]["sha256"]:
            raise ValueError(f"checkpoint {directory}: {name} is corrupt (SHA-256 does not match its manifest)")
    return directory


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The step a checkpoint directory was written at, or None when it is incomplete or unreadable."""
    try:
        directory = verify_checkpoint(path)
        return int(torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)["step"])
    except (ValueError, FileNotFoundError, KeyError, RuntimeError, OSError):
        return None


def load_checkpoint(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Verify and read a whole checkpoint into memory (nothing is applied to any model here)."""
    st = _require_safetensors()
    directory = verify_checkpoint(directory)
    try:
        with st.safe_open(str(directory / MODEL_FILE), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            state = {name: handle.get_tensor(name) for name in handle.keys()}
        for alias, name in json.loads(metadata.get("aliases", "{}")).items():
            state[alias] = state[name]
        model_config = json.loads((directory / CONFIG_FILE).read_text())
        trainer_state = torch.load(directory / STATE_FILE, map_location=map_location, weights_only=True)
    except ValueError:
        raise
    except Exception as err:  # unreadable despite a matching checksum: a format problem, say which file
        raise ValueError(f"checkpoint {directory} could not be read: {type(err).__name__}: {err}") from err
    if str(map_location) != "cpu":
        state = {k: v.to(map_location) for k, v in state.items()}
    return Checkpoint(path=directory, model_state=state, model_config=model_config, trainer_state=trainer_state)


def apply_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor], *, source: str = "checkpoint") -> None:
    """Copy weights into ``model`` only after checking every name, shape and dtype matches."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(n for n in set(expected) & set(state) if expected[n].shape != state[n].shape)
    if missing or unexpected or mismatched:
        raise ValueError(
            f"{source} does not fit the model: missing {missing[:8]}, unexpected {unexpected[:8]}, "
            f"shape mismatch {[(n, tuple(state[n].shape), tuple(expected[n].shape)) for n in mismatched[:8]]}"
        )
    model.load_state_dict(state, strict=True)


def find_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from a run directory (best if present, else last) or a checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a `pope train` run directory or a checkpoint directory")
    if (path / MANIFEST_FILE).exists() or (path / MODEL_FILE).exists():
        return path
    for name in ("best", "last"):
        candidate = _resolve_checkpoint_dir(path / "checkpoints" / name)
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"no checkpoint in {path}: expected {path}/checkpoints/best or last, or a directory "
        f"holding {MODEL_FILE} and {MANIFEST_FILE}"
    )


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu"):
    """Rebuild a trained GPT. ``path``: run dir (best checkpoint if present, else last) or checkpoint dir.
    Returns ``(model, info)``; ``info`` has ``path``, ``step``, ``run_config`` and ``metrics``
    (the best/last evaluation recorded with the checkpoint). The model is in eval mode."""
    found = find_checkpoint(path)
    try:
        checkpoint = load_checkpoint(found, map_location="cpu")
    except ValueError as err:  # torn or corrupt: say which other checkpoint of the run to use
        others = [found.parent / n for n in ("last", "best") if n != found.name and (found.parent / n).is_dir()]
        advice = f"give {others[0]} instead" if others else "no other checkpoint of the run is there; retrain it"
        raise ValueError(f"{err}; {advice}") from None
    model = GPT(GPTConfig.from_dict(checkpoint.model_config))
    apply_model_state(model, checkpoint.model_state, source=f"checkpoint {checkpoint.path}")
    model.to(map_location).eval()
    state = checkpoint.trainer_state
    info = {
        "path": str(checkpoint.path),
        "step": state.get("step"),
        "run_config": state.get("run_config"),
        "metrics": state.get("metrics"),
        "model_config": checkpoint.model_config,
    }
    return model, info
