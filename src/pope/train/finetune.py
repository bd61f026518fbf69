"""Context extension by fine-tuning (``pope finetune RUN --context 4096 --steps 500``).

The paper's recipe (docs/paper.md): from a model trained at context L, fine-tune at context L' for 500
steps, batch 64, AdamW lr 6e-5 with 20 warmup steps and no decay (min_lr = lr).
* RoPE -> YaRN with scale s = L'/L, alpha 1, beta 32: frequencies from pope.frequencies.yarn_frequencies
  and the attention temperature (0.1 ln s + 1)^2 folded into the softmax scale (pope.encodings "yarn").
* PoPE -> the same encoding, no interpolation ("PoPE+ft").
Other relative encodings (ALiBi, NoPE, sinusoidal) are fine-tuned unchanged; already-extended ones
(yarn, pi, ntk) and learned absolute embeddings are refused.

Training reuses pope.train's Trainer: the run config is the original run's, with the model's PE and
max_seq_len and the recipe changed; the Trainer builds the new model and optimizer and the original
weights are copied into it before the first step (positional encodings have no weights that depend on
the context, so every tensor fits). ``--resume`` continues an interrupted fine-tune from its own
checkpoints/last like any run.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from pope.checkpoint import find_checkpoint, load_checkpoint
from pope.encodings import RoPE, build_positional_encoding, parse_pe_spec
from pope.model import GPTConfig
from pope.presets import Recipe
from pope.train.data_match import check_prepared_data, trained_data
from pope.train.run_config import TrainOptions, parse_overrides
from pope.train.schedule import fit_warmup
from pope.train.trainer import Trainer

FINETUNE_RECIPE = {"batch_size": 64, "lr": 6e-5, "warmup_steps": 20}
FINETUNE_STEPS = 500  # the paper's fine-tune length, which its 20 warmup steps are for
YARN_ALPHA, YARN_BETA = 1.0, 32.0
_EXTENDED = ("yarn", "pi", "ntk")


def extended_pe(pe: str, *, head_dim: int, n_heads: int, scale: float, original_max_len: int) -> str:
    """The PE spec for fine-tuning at ``scale`` × the training context (see module docstring)."""
    name, _ = parse_pe_spec(pe)
    if name in _EXTENDED:
        raise ValueError(f"the run's encoding {pe!r} is already context-extended; fine-tune the original RoPE run")
    if name == "learned-abs":
        raise ValueError(
            "learned absolute position embeddings have no positions beyond the training context; "
            "they cannot be context-extended by fine-tuning"
        )
    layer = build_positional_encoding(pe, n_heads=n_heads, head_dim=head_dim)
    if not isinstance(layer, RoPE):
        return pe  # PoPE (PoPE+ft) and encodings without frequencies to interpolate: unchanged
    if layer.scaling != "none":
        raise ValueError(f"the run's encoding {pe!r} already scales its frequencies ({layer.scaling})")
    return (
        f"yarn:base={layer.base:g},layout={layer.layout},rotary_dim={layer.rotary_dim},scale={scale:g},"
        f"original_max_len={original_max_len},alpha={YARN_ALPHA:g},beta={YARN_BETA:g}"
    )


def finetune_config(
    run_config: dict,
    *,
    context: int,
    steps: int,
    batch_size: int = FINETUNE_RECIPE["batch_size"],
    lr: float = FINETUNE_RECIPE["lr"],
    warmup_steps: int | None = None,
    overrides: list[str] | None = None,
    source: dict | None = None,
) -> dict:
    """The fine-tune's run config: the original one with the new PE, context and recipe (validated). ``warmup_steps``
    None: the paper's 20 steps, scaled when ``steps`` is shorter (pope.train.schedule.fit_warmup)."""
    if not isinstance(context, int) or context < 2:
        raise ValueError(f"--context must be an integer >= 2, got {context!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--steps must be a positive integer, got {steps!r}")
    config = copy.deepcopy(run_config)
    model = config["model"]
    original_max_len = int(config["recipe"].get("seq_len") or model["max_seq_len"])
    if context <= original_max_len:
        raise ValueError(
            f"--context {context} is not longer than the run's training context {original_max_len}; "
            f"context extension needs a longer context"
        )
    scale = context / original_max_len
    head_dim = model["d_model"] // model["n_head"]
    new_pe = extended_pe(
        model["pe"], head_dim=head_dim, n_heads=model["n_head"], scale=scale, original_max_len=original_max_len
    )
    model.update(pe=new_pe, max_seq_len=max(context, model["max_seq_len"]))
    config["pe"] = new_pe
    if warmup_steps is None:  # the paper's 20 of 500 steps, scaled to a shorter fine-tune
        warmup_steps, notice = fit_warmup(
            FINETUNE_RECIPE["warmup_steps"], steps, FINETUNE_STEPS, what=f"--steps {steps}"
        )
        if notice:
            print(f"pope finetune: notice: {notice} (--warmup)", file=sys.stderr)
    elif warmup_steps > steps:
        raise ValueError(f"--warmup {warmup_steps} is longer than --steps {steps}; give a warmup of at most {steps}")
    config["recipe"].update(
        batch_size=batch_size,
        lr=lr,
        min_lr=lr,
        warmup_steps=warmup_steps,
        max_steps=steps,
        seq_len=context,
        eval_interval=min(config["recipe"].get("eval_interval", steps), steps),
    )
    changes = parse_overrides(overrides)
    if changes["model"]:
        raise ValueError(
            f"a fine-tune keeps the trained model's shape; --set model.* is not allowed "
            f"(got {sorted(changes['model'])})"
        )
    trained = trained_data(run_config)
    data = changes["train"].get("data_dir") or changes["recipe"].get("dataset")
    if data and trained is not None and not trained.is_task and str(data) != (trained.location or trained.spec):
        # another dataset to fine-tune on: it must have the vocabulary the weights were trained with
        check_prepared_data((source or {}).get("run") or "the run", run_config, str(data))
    config["recipe"].update(changes["recipe"])
    config["train"].update(changes["train"])
    Recipe(**config["recipe"])  # validation
    GPTConfig.from_dict(model)
    TrainOptions(**config["train"])
    config["finetune"] = {
        "from": source or {},
        "original_pe": run_config["model"]["pe"],
        "original_context": original_max_len,
        "context": context,
        "scale": scale,
        "method": "yarn" if new_pe.startswith("yarn") else "no interpolation",
    }
    return config


def build_finetune_trainer(
    run: str | Path,
    out: str | Path,
    *,
    context: int,
    steps: int,
    batch_size: int = FINETUNE_RECIPE["batch_size"],
    lr: float = FINETUNE_RECIPE["lr"],
    warmup_steps: int | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
):
    """A pope.train Trainer for the fine-tune, holding the original weights (or the fine-tune's own
    checkpoint when resuming)."""
    checkpoint = load_checkpoint(find_checkpoint(run), map_location="cpu")
    run_config = checkpoint.trainer_state.get("run_config")
    if not run_config:
        raise ValueError(
            f"checkpoint {checkpoint.path} records no run config (was it written by `pope train`?); "
            f"cannot derive the fine-tune's data and recipe"
        )
    source = {"run": str(run), "checkpoint": str(checkpoint.path), "step": checkpoint.trainer_state.get("step")}
    config = finetune_config(
        run_config,
        context=context,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        overrides=overrides,
        source=source,
    )
    # a fresh fine-tune starts from the trained weights; a resumed one from its own checkpoint
    return Trainer(config, out, resume=resume, init_from=checkpoint)


def run_finetune(run: str | Path, out: str | Path, **kwargs) -> dict:
    trainer = build_finetune_trainer(run, out, **kwargs)
    try:
        return trainer.train()
    finally:
        trainer.close()
