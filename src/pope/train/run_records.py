"""What a run writes and says about itself, apart from the loop: config.json and env.json, the start banner, the
summary of a run that has nothing left to train, a finished run's summary kept when it is extended, and the one-line
error of a write the disk refused. Functions of the Trainer (pope.train.trainer), which calls them.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from pope.checkpoint import checkpoint_step
from pope.encodings.registry import parse_pe_spec, resolved_options
from pope.files import keep_aside, write_text_atomic
from pope.provenance import cuda_mps_active, device_name, git_commit, library_versions, portable_argv


def write_records(trainer) -> None:
    """config.json and env.json (env.resume-STEP.json on resume), each written atomically; a config.json a crash
    tore is kept as config.json.damaged (resume_checkpoint read the checkpoint's copy instead)."""
    if not trainer.is_main:
        return
    config_path = trainer.run_dir / "config.json"
    if config_path.is_file():
        try:
            json.loads(config_path.read_text())
        except (ValueError, UnicodeDecodeError):
            keep_aside(config_path)
    write_text_atomic(config_path, json.dumps(trainer.config.to_dict(), indent=2, sort_keys=True) + "\n")
    env = {
        "versions": library_versions(),
        "git": git_commit(),
        "device": str(trainer.device),
        "device_name": device_name(trainer.device),
        "world_size": trainer.context.world_size,
        "host": platform.node(),
        "command": portable_argv(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "resumed_from_step": trainer.step,
        "resumed_from_world_size": trainer.resumed_from_world_size,
        "compile": trainer.compile,
        "cuda_graph": trainer.use_graph,
        "cuda_mps": cuda_mps_active(),
        "autocast": str(trainer.autocast_dtype),
        "fp32_matmul_precision": torch.get_float32_matmul_precision(),
        "model_params": trainer.model.num_params(),
    }
    if trainer.extended_from is not None:
        env["extended"] = {"schedule_steps": trainer.extended_from, "max_steps": trainer.recipe.max_steps}
    name = "env.json" if trainer.step == 0 else f"env.resume-{trainer.step}.json"
    write_text_atomic(trainer.run_dir / name, json.dumps(env, indent=2) + "\n")


def start_banner(trainer) -> str:
    """What is about to run, in a few lines: the preset, the encoding with every option resolved (and what the
    preset added to --pe), the model and its parameter count, the schedule, the device, the run directory."""
    config, model, recipe = trainer.config, trainer.model_config, trainer.recipe
    options = resolved_options(model.pe, head_dim=model.head_dim)
    given = parse_pe_spec(config.pe)[1] if config.pe != model.pe else {}
    added = {key: value for key, value in parse_pe_spec(model.pe)[1].items() if key not in given}
    origin = f" (--pe {config.pe} with the preset's {options_text(added)})" if config.pe != model.pe else ""
    state = f"resuming at step {trainer.step}" if trainer.step else "new run"
    autocast = "bf16 autocast" if trainer.autocast_dtype is not None else "fp32"
    return "\n".join(
        [
            f"pope train: preset {config.preset}, seed {config.seed}, {trainer.run_dir} ({state})",
            f"  encoding  {model.pe}{origin}: {options_text(options)}",
            f"  model     {model.n_layer} layers, d_model {model.d_model}, {model.n_head} heads, "
            f"{trainer.model.num_params() / 1e6:.2f}M parameters",
            f"  schedule  {recipe.max_steps} steps (warmup {recipe.warmup_steps}, {recipe.lr_decay} lr "
            f"{recipe.lr:g} -> {recipe.min_lr:g}), batch {recipe.batch_size} x {trainer.data.seq_len} tokens, "
            f"evaluated every {recipe.eval_interval} steps",
            f"  device    {device_name(trainer.device)}, {autocast}, compile "
            f"{'on' if trainer.compile else 'off'}, world size {trainer.context.world_size}",
        ]
    )


def nothing_to_train(trainer, stop: int) -> dict:
    """--resume of a run whose checkpoint is at recipe.max_steps (finished) or at or past train.stop_at_step:
    nothing is trained or written, except a summary.json that is missing or torn, which is rebuilt from the
    checkpoint (a torn one kept aside). Returns the run's summary."""
    finished = trainer.step >= trainer.recipe.max_steps
    reason = "finished" if finished else "stop_at_step"
    path = trainer.run_dir / "summary.json"
    summary = None
    if path.is_file():
        try:
            summary = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            summary = "damaged"
    usable = (
        isinstance(summary, dict)
        and summary.get("step") == trainer.step
        and bool(summary.get("finished")) == (finished)
    )
    if not usable:
        rebuilt = trainer.summary(trainer.last_metrics, trainer.seconds_before or None, reason)
        if trainer.is_main:
            if summary == "damaged":
                kept = keep_aside(path)
                print(f"notice: {path} was torn (not valid JSON); kept as {kept.name}", file=sys.stderr)
            write_text_atomic(path, json.dumps(rebuilt, indent=2) + "\n")
            print(f"notice: rebuilt {path} from checkpoints/last (step {trainer.step})", file=sys.stderr)
        summary = rebuilt
    if trainer.is_main and finished:
        print(
            f"{trainer.run_dir} is finished (step {trainer.step} of recipe.max_steps {trainer.recipe.max_steps}); "
            f"nothing to train and nothing changed. To train it further, extend it: pope train --resume "
            f"{trainer.run_dir} --set recipe.max_steps=N with N > {trainer.recipe.max_steps} (the added steps run at "
            "min_lr, where its schedule ended)",
            file=sys.stderr,
            flush=True,
        )
    elif trainer.is_main:
        print(
            f"{trainer.run_dir} is at step {trainer.step}, and train.stop_at_step {stop} is not after it: nothing to "
            f"train and nothing changed. To continue, leave train.stop_at_step out (pope train --resume "
            f"{trainer.run_dir}) or give a step after {trainer.step}",
            file=sys.stderr,
            flush=True,
        )
    return summary


def archive_finished_summary(trainer) -> None:
    """Extending a finished run: its summary.json (the whole-split evaluation at its end, its wall time) is kept
    as summary.step-N.json; summary.json returns when this invocation ends. A summary.json a crash tore is kept
    as summary.json.damaged (with a notice) whatever the run."""
    path = trainer.run_dir / "summary.json"
    if not (trainer.is_main and trainer.resume_from is not None and path.is_file()):
        return
    try:
        previous = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        kept = keep_aside(path)
        print(f"notice: {path} was torn (not valid JSON); kept as {kept.name}", file=sys.stderr)
        return
    if (
        trainer.extended_from is not None
        and isinstance(previous, dict)
        and previous.get("finished")
        and isinstance(previous.get("step"), int)
    ):
        kept = path.with_name(f"summary.step-{previous['step']}.json")
        os.replace(path, kept)
        print(
            f"notice: extending {trainer.run_dir}: its summary at step {previous['step']} is kept as {kept.name}",
            file=sys.stderr,
        )


def write_failure(trainer, err: OSError) -> OSError:
    """A write of the run's records that failed mid-run (a full disk, a read-only or vanished directory): one
    error naming the file, the cause and how to continue from the last checkpoint, which is intact."""
    step = checkpoint_step(trainer.run_dir / "checkpoints" / "last")
    if step is not None:
        then = (
            f"checkpoints/last (step {step}) is intact: free space or make the directory writable, then "
            f"continue with: pope train --resume {trainer.run_dir}"
        )
    else:
        then = (
            "no checkpoint was written yet: free space or make the directory writable, then start the run "
            "again with another --out"
        )
    what = f"{err.filename}: " if err.filename else ""
    return type(err)(
        err.errno, f"{what}{err.strerror or err}; training {trainer.run_dir} stopped at step {trainer.step}; {then}"
    )


def summary_seconds(run_dir: Path, step: int) -> float:
    """The wall time summary.json records for ``step`` (0.0 when it records another step or cannot be read)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        return float(summary["seconds"]) if summary.get("step") == step else 0.0
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0.0


def options_text(options: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in options.items()) or "no options"
