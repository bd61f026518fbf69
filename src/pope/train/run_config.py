"""The configuration of one training run (``RunConfig``) and the ``--set section.key=value`` overrides.

A ``RunConfig`` carries typed sections; ``to_dict()`` is what ``RUN/config.json`` holds::

    {"preset": ..., "pe": ..., "seed": ...,
     "model":  GPTConfig fields (vocab_size filled from the data),
     "recipe": pope.presets.Recipe fields,
     "train":  TrainOptions fields (how this trainer runs: devices, compile, logging, ...),
     "finetune": {...}   (fine-tunes only: where the weights came from)}

``--set`` keys are ``model.FIELD``, ``recipe.FIELD`` or ``train.FIELD``; values are read by the field's
type with pope.parsing's rule (booleans true/false/yes/no/on/off/1/0, integers without a fraction,
``none`` for optional fields). An unknown or repeated key is a ValueError listing the valid keys.
Every section validates itself on construction; ``RunConfig`` checks what spans sections. On
``--resume`` the stored config must equal the new one except ``RESUME_MUTABLE`` keys (how the run is
executed, not what it computes) and ``RESUME_EXTENDABLE`` ones, which may grow (a longer run).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Literal

from pope.data.indirect_indexing import VOCAB_SIZE as TASK_VOCAB_SIZE
from pope.encodings import parse_pe_spec
from pope.model import GPTConfig
from pope.parsing import check_fields, field_types, from_dict, parse_assignments
from pope.presets import Recipe, get_preset, with_recipe
from pope.train.schedule import fit_warmup

SECTIONS = ("model", "recipe", "train")
EVAL_SPLITS = ("valid", "test")


@dataclass(kw_only=True, frozen=True)
class TrainOptions:
    """How the trainer executes a recipe. Defaults of None are resolved at run time (documented)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """'auto' (CUDA when available), 'cuda' or 'cpu'."""
    autocast: Literal["auto", "bf16", "none"] = "auto"
    """'bf16' (bf16 autocast; weights and optimizer stay fp32), 'none', or 'auto' = bf16 on CUDA, none on CPU."""
    fp32_matmul: Literal["ieee", "tf32"] = "ieee"
    """How fp32 matrix products run (all of them under autocast 'none'; those autocast keeps in fp32 otherwise):
    'ieee' exact, on FMA units (torch.set_float32_matmul_precision('highest'), PyTorch's default) or 'tf32' on
    tensor cores ('high': 10-bit mantissa products, fp32 sums). Set process-wide by the trainer; pope's kernels
    follow it. docs/training.md has what each cost on the H200."""
    compile: bool | None = None
    """torch.compile the model; None = on for CUDA, off for CPU."""
    cuda_graph: bool | None = None
    """Capture the whole optimizer step (forward, backward, clipping, fused AdamW) in one CUDA graph and
    replay it; None = on when possible (one CUDA process, example data on the GPU, no per-step host work)."""
    pack: bool = False
    """Document datasets (a pad id: JSB, MAESTRO): train on the padded path's pieces packed end to end in steps of
    about batch_size * seq_len tokens: no padding compute (attention of encodings without a packed kernel still
    pads per step, PositionalEncoding.forward_varlen); pope.train.packing says what is equivalent.
    Shapes change every step: no CUDA graph, and compile defaults to off (on request: dynamic shapes)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
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
    """Stop (after checkpointing) once this step (1..recipe.max_steps) is reached, without finishing the
    schedule; for splitting a run over several invocations (resume with --resume)."""
    max_seconds: float | None = None
    """Stop (after checkpointing) once this invocation has trained this long; resume with --resume.
    For machines that allow only bounded jobs."""
    tensorboard: bool = True
    """Write TensorBoard events under RUN/tensorboard."""
    progress: bool = True
    """Show training progress: a live bar where stdout and stderr are terminals, else one plain line per log interval;
    false: the evaluation lines only."""

    def __post_init__(self):
        check_fields(self)
        positive = {
            "log_interval": self.log_interval,
            "checkpoint_interval": self.checkpoint_interval,
            "eval_batch_size": self.eval_batch_size,
            "stop_at_step": self.stop_at_step,
            "max_seconds": self.max_seconds,
        }
        for name, value in positive.items():
            if value is not None and not value > 0:
                raise ValueError(f"train.{name} must be positive (or none); got {value}")
        if self.data_seed < 0:
            raise ValueError(f"train.data_seed must be non-negative; got {self.data_seed}")
        if self.best_metric is not None and not self.best_metric.endswith(("_loss", "_accuracy")):
            raise ValueError("train.best_metric must end with _loss or _accuracy, e.g. valid_loss")
        if self.pack and self.cuda_graph:
            raise ValueError(
                "train.pack=true gives every step a batch of a different shape, and a CUDA graph replays "
                "one fixed shape: set train.cuda_graph=false (or none) with train.pack=true"
            )
        for split in self.eval_splits.split(","):
            if split.strip() not in (*EVAL_SPLITS, ""):
                raise ValueError(f"train.eval_splits: unknown split {split!r}; use valid and/or test")

    @property
    def splits(self) -> list[str]:
        """The evaluated splits, in order."""
        return [s.strip() for s in self.eval_splits.split(",") if s.strip()]


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """Everything one training run computes with; ``RUN/config.json`` is ``to_dict()``."""

    preset: str
    pe: str
    seed: int
    model: GPTConfig
    recipe: Recipe
    train: TrainOptions = field(default_factory=TrainOptions)
    finetune: dict | None = None
    """Fine-tunes only (pope.train.finetune): the source checkpoint, scale and method."""

    def __post_init__(self):
        check_fields(self)
        if self.seed < 0:
            raise ValueError(f"the seed must be a non-negative integer; got {self.seed}")
        if self.recipe.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"recipe.seq_len {self.recipe.seq_len} exceeds model.max_seq_len "
                f"{self.model.max_seq_len}; "
                "set model.max_seq_len too"
            )
        stop = self.train.stop_at_step
        if stop is not None and stop > self.recipe.max_steps:
            raise ValueError(
                f"train.stop_at_step {stop} is past recipe.max_steps {self.recipe.max_steps}; "
                f"give a step in 1..{self.recipe.max_steps} (or none to finish the schedule)"
            )

    def to_dict(self, *, complete: bool = False) -> dict:
        """config.json's content: every setting except the WRITTEN_WHEN_SET keys at their default, or, ``complete``,
        every setting (what ``pope train --print-config`` prints)."""

        def recorded(section: str, values: dict) -> dict:
            return {
                key: value
                for key, value in values.items()
                if complete
                or not (f"{section}.{key}" in WRITTEN_WHEN_SET and value == WRITTEN_WHEN_SET[f"{section}.{key}"])
            }

        data = {
            "preset": self.preset,
            "pe": self.pe,
            "seed": self.seed,
            "model": recorded("model", self.model.to_dict()),
            "recipe": recorded("recipe", self.recipe.to_dict()),
            "train": recorded("train", dataclasses.asdict(self.train)),
        }
        if self.finetune is not None:
            data["finetune"] = self.finetune
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """From ``config.json``'s layout (or a dict built the same way); unknown keys are refused."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown run-config keys {unknown}; valid keys: {', '.join(sorted(known))}")
        return cls(
            preset=data.get("preset"),
            pe=data.get("pe"),
            seed=data.get("seed"),
            model=GPTConfig.from_dict(data.get("model", {})),
            recipe=from_dict(Recipe, data.get("recipe", {})),
            train=from_dict(TrainOptions, data.get("train", {})),
            finetune=data.get("finetune"),
        )

    @classmethod
    def coerce(cls, config: RunConfig | dict) -> RunConfig:
        return config if isinstance(config, cls) else cls.from_dict(config)


# keys added after runs were recorded: written only when they differ from this default, so the config.json of an
# earlier run still equals its config's to_dict(), still resumes and `pope report` groups it with new runs
WRITTEN_WHEN_SET = {
    "train.pack": False,
    "train.fp32_matmul": "ieee",
    "recipe.lr_decay": "cosine",
    "recipe.weight_decay_params": "matrices",
    "model.init": "gpt2",
}

RESUME_MUTABLE = {
    "train.device",
    "train.parallel",
    "train.compile",
    "train.cuda_graph",
    "train.log_interval",
    "train.stop_at_step",
    "train.tensorboard",
    "train.progress",
    "train.checkpoint_interval",
    "train.data_dir",
    "train.max_seconds",
}


RESUME_EXTENDABLE = {"recipe.max_steps"}
"""Keys that may grow on ``--resume``, extending a run (a finished one included): the added steps continue its
learning-rate schedule as pope.train.schedule says (the decay keeps its end, the added steps run at min_lr).
Shrinking is refused (train.stop_at_step stops a run early)."""


def resume_differences(stored: dict, new: dict) -> list[str]:
    """Why ``new`` may not continue a run recorded as ``stored`` (config.json's layout): each changed key that is
    neither resume-mutable nor extendable, and an extendable key that shrinks; empty when it may."""
    differences = config_differences(stored, new, ignore=RESUME_MUTABLE | RESUME_EXTENDABLE)
    for key in sorted(RESUME_EXTENDABLE):
        section, _, name = key.partition(".")
        before, after = (stored.get(section) or {}).get(name), (new.get(section) or {}).get(name)
        if isinstance(before, int) and isinstance(after, int) and after < before:
            differences.append(f"{key}: {before} -> {after} (it may only grow, to extend the run)")
        elif before != after and not (isinstance(before, int) and isinstance(after, int)):
            differences.append(f"{key}: {json.dumps(before)} -> {json.dumps(after)}")
    return differences


def resume_config(stored: dict, overrides: list[str] | None, *, seed: int | None = None) -> RunConfig:
    """The config that continues a run from its own ``config.json`` (``stored``) with ``--set`` ``overrides`` on top
    (what `pope train --resume RUN` runs): ``train.stop_at_step`` is the stored invocation's own stop and is not
    carried over (it would end the new invocation at once); any other stored key is (``seed`` replaces the seed,
    to be refused by the check when it differs). The result is checked by
    ``resume_differences`` when the trainer opens the run."""
    changes = parse_overrides(overrides)
    data = json.loads(json.dumps(stored))  # a deep copy of plain JSON values
    data.setdefault("train", {}).pop("stop_at_step", None)
    for section in SECTIONS:
        data.setdefault(section, {}).update(changes[section])
    if seed is not None:
        data["seed"] = seed
    try:
        return RunConfig.from_dict(data)
    except TypeError as err:  # a config.json edited into something RunConfig cannot hold
        raise ValueError(f"the run's config.json cannot be read as a run config ({err})") from None


def _section_types() -> dict[str, dict]:
    return {"model": field_types(GPTConfig), "recipe": field_types(Recipe), "train": field_types(TrainOptions)}


def parse_overrides(items: list[str] | None) -> dict[str, dict]:
    """['recipe.lr=1e-3', 'model.n_layer=2'] -> {'model': {'n_layer': 2}, 'recipe': {'lr': 0.001}, 'train': {}}."""
    items = list(items or [])
    if any(item.partition("=")[0].strip() == "model.pe" for item in items):
        raise ValueError("choose the positional encoding with --pe, not --set model.pe")
    types = {
        f"{section}.{name}": annotation
        for section, fields_ in _section_types().items()
        for name, annotation in fields_.items()
    }
    flat = parse_assignments(items, types, where="--set")
    result: dict[str, dict] = {section: {} for section in SECTIONS}
    for key, value in flat.items():
        section, _, name = key.partition(".")
        result[section][name] = value
    return result


def resolve_run_config(
    preset_name: str, pe: str, *, seed: int = 0, overrides: list[str] | None = None, vocab_size: int | None = None
) -> RunConfig:
    """The full, validated run config. ``vocab_size`` comes from the data when the preset has none."""
    preset = get_preset(preset_name)  # unknown -> ValueError listing valid presets
    parse_pe_spec(pe)  # unknown -> ValueError listing valid encodings
    changes = parse_overrides(overrides)
    recipe = changes["recipe"]
    if "max_steps" in recipe and "warmup_steps" not in recipe:  # a shorter run keeps the preset's warmup share
        base = preset.recipe
        what = f"recipe.max_steps={recipe['max_steps']}"
        recipe["warmup_steps"], notice = fit_warmup(base.warmup_steps, recipe["max_steps"], base.max_steps, what=what)
        if notice:
            print(f"pope train: notice: {notice} (recipe.warmup_steps)", file=sys.stderr)
    preset = with_recipe(preset, **recipe)
    model_fields = {**preset.model, **changes["model"]}
    if "vocab_size" not in model_fields:
        if vocab_size is None and preset.recipe.dataset.partition(":")[0] == "indirect-indexing":
            vocab_size = TASK_VOCAB_SIZE
        if vocab_size is None:
            raise ValueError(f"preset {preset_name!r} takes its vocab_size from the data; none was given")
        model_fields["vocab_size"] = vocab_size
    return RunConfig(
        preset=preset_name,
        pe=pe,
        seed=seed,
        model=preset.model_config(pe=pe, **model_fields),
        recipe=preset.recipe,
        train=TrainOptions(**changes["train"]),
    )


def config_differences(old: dict, new: dict, *, ignore: set[str] = RESUME_MUTABLE) -> list[str]:
    """Human-readable differences 'section.key: old -> new' between two run configs (dict layout)."""
    differences = []

    def walk(a, b, prefix):
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{prefix}.{key}" if prefix else key)
        elif a != b and prefix not in ignore:
            differences.append(f"{prefix}: {json.dumps(a)} -> {json.dumps(b)}")

    walk(old, new, "")
    return differences
