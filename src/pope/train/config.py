"""The resolved configuration of one training run and the ``--set section.key=value`` overrides.

A run config is a plain dict, saved as ``RUN/config.json``::

    {"preset": ..., "pe": ..., "seed": ...,
     "model":  GPTConfig fields (vocab_size filled from the data),
     "recipe": pope.presets.Recipe fields,
     "train":  TrainOptions fields (how this trainer runs: devices, compile, logging, ...)}

``--set`` keys are ``model.FIELD``, ``recipe.FIELD`` or ``train.FIELD``; values are parsed by the
field's type (``true``/``false``, ints, floats, ``none``). An unknown key raises a ValueError listing
the valid keys. On ``--resume`` the stored config must equal the new one except ``RESUME_MUTABLE``
keys (how the run is executed, not what it computes).
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, fields

SECTIONS = ("model", "recipe", "train")


@dataclass(kw_only=True)
class TrainOptions:
    """How the trainer executes a recipe. Defaults of None are resolved at run time (documented)."""

    device: str = "auto"
    """'auto' (CUDA when available), 'cuda' or 'cpu'."""
    autocast: str = "auto"
    """'bf16' (bf16 autocast; weights and optimizer stay fp32), 'none', or 'auto' = bf16 on CUDA, none on CPU."""
    compile: bool | None = None
    """torch.compile the model; None = on for CUDA, off for CPU."""
    cuda_graph: bool | None = None
    """Capture the whole optimizer step (forward, backward, clipping, fused AdamW) in one CUDA graph and
    replay it; None = on when possible (one CUDA process, example data on the GPU, no per-step host work)."""
    parallel: str = "ddp"
    """Under torchrun: 'ddp' or 'fsdp' (FSDP2 fully_shard per block; for the largest presets)."""
    data_seed: int = 0
    """Seed of the generated indirect-indexing splits (fixed across training seeds, like a dataset)."""
    data_dir: str | None = None
    """Dataset directory or name overriding recipe.dataset (prepared data, or an indirect-indexing split dir)."""
    eval_splits: str = "valid,test"
    """Comma-separated splits evaluated every recipe.eval_interval steps and at the end."""
    eval_batch_size: int | None = None
    """Sequences per evaluation batch; None = recipe.batch_size."""
    best_metric: str | None = None
    """Metric selecting checkpoints/best, e.g. 'valid_loss' (lower is better) or 'valid_accuracy'
    (higher is better); None = valid_accuracy for indirect-indexing, else valid_loss."""
    log_interval: int = 100
    """Steps between train-loss records (each costs one host sync)."""
    checkpoint_interval: int | None = None
    """Steps between checkpoints/last; None = recipe.eval_interval."""
    stop_at_step: int | None = None
    """Stop (after checkpointing) once this step is reached, without finishing the schedule; for
    splitting a run over several invocations (resume with --resume)."""
    max_seconds: float | None = None
    """Stop (after checkpointing) once this invocation has trained this long; resume with --resume.
    For machines that allow only bounded jobs."""
    tensorboard: bool = True
    progress: bool = True


RESUME_MUTABLE = {"train.device", "train.compile", "train.cuda_graph", "train.log_interval", "train.stop_at_step",
                  "train.tensorboard", "train.progress", "train.checkpoint_interval", "train.data_dir",
                  "train.max_seconds"}


def _field_types(cls) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def _parse_typed(text: str, annotation, key: str):
    lowered = text.strip().lower()
    args = typing.get_args(annotation)
    allowed = [a for a in args if a is not type(None)] if args else [annotation]
    if type(None) in args and lowered in ("none", "null"):
        return None
    for kind in allowed:
        if kind is bool:
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            continue
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                if kind is float:
                    continue
                try:
                    as_float = float(text)
                except ValueError:
                    continue
                if as_float.is_integer():
                    return int(as_float)
                continue
        if kind is str:
            return text
    raise ValueError(f"--set {key}={text}: cannot read {text!r} as {annotation}")


def _model_field_types() -> dict[str, typing.Any]:
    from pope.model import GPTConfig
    return _field_types(GPTConfig)


def _recipe_field_types() -> dict[str, typing.Any]:
    from pope.presets import Recipe
    return _field_types(Recipe)


def valid_override_keys() -> list[str]:
    return ([f"model.{k}" for k in _model_field_types()] + [f"recipe.{k}" for k in _recipe_field_types()]
            + [f"train.{k}" for k in _field_types(TrainOptions)])


def parse_overrides(items: list[str] | None) -> dict[str, dict[str, typing.Any]]:
    """['recipe.lr=1e-3', 'model.n_layer=2'] -> {'recipe': {'lr': 0.001}, 'model': {'n_layer': 2}}."""
    types = {"model": _model_field_types(), "recipe": _recipe_field_types(), "train": _field_types(TrainOptions)}
    result: dict[str, dict] = {s: {} for s in SECTIONS}
    for item in items or []:
        key, eq, value = item.partition("=")
        key = key.strip()
        section, dot, name = key.partition(".")
        if not eq or not dot or section not in types or name not in types[section]:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of: {', '.join(valid_override_keys())}")
        if section == "model" and name == "pe":
            raise ValueError("choose the positional encoding with --pe, not --set model.pe")
        result[section][name] = _parse_typed(value, types[section][name], key)
    return result


def resolve_run_config(preset_name: str, pe: str, *, seed: int = 0, overrides: list[str] | None = None,
                       vocab_size: int | None = None) -> dict:
    """The full, validated run config. ``vocab_size`` comes from the data when the preset has none."""
    from pope.encodings import parse_pe_spec
    from pope.presets import get_preset, with_recipe

    preset = get_preset(preset_name)  # unknown -> ValueError listing valid presets
    parse_pe_spec(pe)  # unknown -> ValueError listing valid encodings
    changes = parse_overrides(overrides)
    preset = with_recipe(preset, **changes["recipe"])
    model_fields = {**preset.model, **changes["model"]}
    if "vocab_size" not in model_fields:
        if vocab_size is None and preset.recipe.dataset == "indirect-indexing":
            from pope.data.indirect_indexing import VOCAB_SIZE as vocab_size
        if vocab_size is None:
            raise ValueError(f"preset {preset_name!r} takes its vocab_size from the data; none was given")
        model_fields["vocab_size"] = vocab_size
    model_config = preset.model_config(pe=pe, **model_fields)
    if preset.recipe.seq_len > model_config.max_seq_len:
        raise ValueError(f"recipe.seq_len {preset.recipe.seq_len} exceeds model.max_seq_len {model_config.max_seq_len}")
    options = TrainOptions(**changes["train"])
    _validate_options(options)
    return {"preset": preset_name, "pe": pe, "seed": int(seed), "model": model_config.to_dict(),
            "recipe": preset.recipe.to_dict(), "train": dataclasses.asdict(options)}


def _validate_options(options: TrainOptions) -> None:
    checks = [(options.device in ("auto", "cpu", "cuda"), "train.device must be auto, cpu or cuda"),
              (options.autocast in ("auto", "bf16", "none"), "train.autocast must be auto, bf16 or none"),
              (options.parallel in ("ddp", "fsdp"), "train.parallel must be ddp or fsdp"),
              (options.log_interval > 0, "train.log_interval must be positive"),
              (options.checkpoint_interval is None or options.checkpoint_interval > 0,
               "train.checkpoint_interval must be positive"),
              (options.eval_batch_size is None or options.eval_batch_size > 0, "train.eval_batch_size must be positive"),
              (options.best_metric is None or options.best_metric.endswith(("_loss", "_accuracy")),
               "train.best_metric must end with _loss or _accuracy, e.g. valid_loss")]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    for split in options.eval_splits.split(","):
        if split.strip() not in ("valid", "test", ""):
            raise ValueError(f"train.eval_splits: unknown split {split!r}; use valid and/or test")


def config_differences(old: dict, new: dict, *, ignore: set[str] = RESUME_MUTABLE) -> list[str]:
    """Human-readable differences 'section.key: old -> new' between two run configs."""
    differences = []

    def walk(a, b, prefix):
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{prefix}.{key}" if prefix else key)
        elif a != b and prefix not in ignore:
            differences.append(f"{prefix}: {json.dumps(a)} -> {json.dumps(b)}")

    walk(old, new, "")
    return differences


def train_options(config: dict) -> TrainOptions:
    return TrainOptions(**config["train"])
