"""The paper's setups as named presets: model shape + training recipe (+ the paper's numbers).

`get_preset(name)` returns a `Preset`; `preset.model_config(pe=..., vocab_size=...)` builds the
GPTConfig. Values come from the paper (see docs/paper.md); where the paper is silent the field's
docstring or the `assumed` note says what we chose. Each `*-tiny` preset is its full preset shrunk by
`tiny()` (same data, optimizer betas and weight decay; a 2-layer model and a 300-step schedule), small
enough for 2 CPU cores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal

from pope.encodings import parse_pe_spec
from pope.model import GPTConfig
from pope.parsing import check_fields, did_you_mean

DECAY_SHAPES = ("cosine", "linear")
"""The learning-rate decays a recipe may name (`Recipe.lr_decay`; pope.train.schedule computes them)."""
DECAY_PARAMS = ("matrices", "all")
"""The parameter groups a recipe's weight decay may apply to (`Recipe.weight_decay_params`; pope.train.optimizer
builds them)."""


@dataclass(kw_only=True, frozen=True)
class Recipe:
    """How a preset trains. Every field validated."""

    dataset: str
    """Prepared dataset name (pope data prepare NAME) or 'indirect-indexing' (generated)."""
    batch_size: int
    """Sequences per optimizer step (global, over all ranks and accumulation steps)."""
    seq_len: int
    """Training sequence length in tokens."""
    lr: float
    """Peak learning rate after warmup."""
    min_lr: float
    """Final learning rate of the decay."""
    warmup_steps: int
    """Linear warmup steps from 0 to lr."""
    max_steps: int
    """Optimizer steps; the decay reaches min_lr here."""
    lr_decay: Literal[DECAY_SHAPES] = "cosine"
    """Shape of the decay from lr to min_lr after warmup (`pope.train.schedule`). The paper states the two
    ends, not the shape; cosine is our choice."""
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.01
    weight_decay_params: Literal[DECAY_PARAMS] = "matrices"
    """Which parameters AdamW decays: "matrices" = weight matrices and the token embedding only (not norm
    gains, biases or positional-encoding parameters such as PoPE's delta; `pope.train.optimizer`);
    "all" = every parameter, as ``AdamW(model.parameters())`` does. The paper does not say which."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 disables)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    eval_interval: int = 1000
    """Steps between evaluations on the validation/test splits."""
    eval_batches: int = 50
    """Batches per periodic evaluation of a token stream (document datasets evaluate every document; the
    final evaluation scores every target of a token stream once)."""
    assumed: str = ""
    """Which values the paper does not state and we chose."""

    def __post_init__(self):
        check_fields(self)
        for name in ("batch_size", "seq_len", "max_steps", "grad_accum", "eval_interval", "eval_batches"):
            if getattr(self, name) <= 0:
                raise ValueError(f"recipe.{name} must be positive; got {getattr(self, name)}")
        if self.warmup_steps < 0 or self.warmup_steps > self.max_steps:
            raise ValueError(
                f"recipe.warmup_steps ({self.warmup_steps}) must be in [0, recipe.max_steps = "
                f"{self.max_steps}]; set one that fits, e.g. --set recipe.warmup_steps="
                f"{min(max(self.warmup_steps, 0), self.max_steps // 10)}, or leave it unset (a max_steps set "
                f"alone scales the preset's warmup)"
            )
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(
                f"recipe needs 0 < min_lr <= lr; got lr={self.lr}, min_lr={self.min_lr} "
                "(set recipe.lr and recipe.min_lr together)"
            )
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"recipe.beta1 and beta2 must be in [0, 1); got {self.beta1}, {self.beta2}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("recipe.weight_decay and recipe.grad_clip must be non-negative")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"recipe.batch_size ({self.batch_size}) must be divisible by recipe.grad_accum ({self.grad_accum})"
            )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True, frozen=True)
class Preset:
    name: str
    description: str
    model: dict
    """GPTConfig fields except pe (and vocab_size where it comes from the data)."""
    recipe: Recipe
    pope_delta_init: str = "uniform"
    """delta init used when the PE is plain 'pope' (the paper: zero for OpenWebText, uniform elsewhere)."""
    paper: dict = field(default_factory=dict)
    """The paper's numbers for this setup: {'metric': ..., 'rope': ..., 'pope': ...}, and its baselines' by PE
    name where it reports them (e.g. 'rope-half')."""

    def resolve_pe(self, pe: str) -> str:
        """Add the preset's delta init to a PoPE spec that does not set one."""
        name, options = parse_pe_spec(pe)
        if name == "pope" and "delta_init" not in options:
            return f"{pe}{',' if ':' in pe else ':'}delta_init={self.pope_delta_init}"
        return pe

    def model_config(self, pe: str = "pope", **overrides) -> GPTConfig:
        data = {**self.model, **overrides, "pe": self.resolve_pe(overrides.pop("pe", pe))}
        if "vocab_size" not in data:
            raise ValueError(f"preset {self.name!r} takes its vocab_size from the data: pass vocab_size=")
        return GPTConfig.from_dict(data)


def _owt(name: str, n_layer: int, d_model: int, n_head: int, rope_ppl: float, pope_ppl: float) -> Preset:
    return Preset(
        name=name,
        description=f"OpenWebText GPT-2 {name.split('-')[1].upper()} (context 1024)",
        model=dict(vocab_size=50257, n_layer=n_layer, d_model=d_model, n_head=n_head, max_seq_len=1024, dropout=0.0),
        recipe=Recipe(
            dataset="openwebtext",
            batch_size=64,
            seq_len=1024,
            lr=6e-4,
            min_lr=6e-5,
            warmup_steps=1000,
            max_steps=100_000,
            beta2=0.95,
            weight_decay=0.01,
            grad_clip=1.0,
            eval_interval=2000,
            eval_batches=100,
        ),
        pope_delta_init="zero",
        paper={"metric": "valid_ppl", "rope": rope_ppl, "pope": pope_ppl},
    )


_FULL_PRESETS = [
    Preset(
        name="indirect-indexing",
        description="Indirect indexing (paper Sec. 4.1): 8 layers, d_model 512, 8 heads",
        model=dict(n_layer=8, d_model=512, n_head=8, max_seq_len=48, dropout=0.0),
        recipe=Recipe(
            dataset="indirect-indexing",
            batch_size=64,
            seq_len=48,
            lr=2e-4,
            min_lr=2e-5,
            warmup_steps=4000,
            max_steps=100_000,
            beta2=0.99,
            weight_decay=0.01,
            grad_clip=1.0,
            eval_interval=5000,
            eval_batches=157,
            assumed="seq_len 48 (the paper's 40 cannot hold a 40-letter string plus its suffix)",
        ),
        paper={
            "metric": "test_accuracy",
            "rope": 0.1116,
            "pope": 0.9482,
            "rope-half": 0.2850,
            "alibi-half": 0.2735,
            "learned-abs": 0.1008,
            "sinusoidal-abs": 0.0190,
        },
    ),
    Preset(
        name="jsb",
        description="JSB chorales: 6 layers, d_model 256, 8 heads, dropout 0.2",
        model=dict(vocab_size=90, n_layer=6, d_model=256, n_head=8, max_seq_len=2048, dropout=0.2),
        recipe=Recipe(
            dataset="jsb",
            batch_size=4,
            seq_len=2048,
            lr=6e-4,
            min_lr=6e-5,
            warmup_steps=10,
            max_steps=3000,
            beta2=0.99,
            weight_decay=0.01,
            grad_clip=1.0,
            eval_interval=100,
        ),
        paper={"metric": "test_nll", "rope": 0.5081, "pope": 0.4889},
    ),
    Preset(
        name="maestro",
        description="MAESTRO REMI: 6 layers, d_model 384, 8 heads, dropout 0.1",
        model=dict(vocab_size=328, n_layer=6, d_model=384, n_head=8, max_seq_len=2048, dropout=0.1),
        recipe=Recipe(
            dataset="maestro",
            batch_size=16,
            seq_len=2048,
            lr=6e-4,
            min_lr=6e-5,
            warmup_steps=500,
            max_steps=60_000,
            beta2=0.99,
            weight_decay=0.01,
            grad_clip=1.0,
            eval_interval=1000,
            assumed="beta2, weight decay and clip not stated for MAESTRO; JSB's values used",
        ),
        paper={"metric": "test_nll", "rope": 1.501, "pope": 1.486},
    ),
    Preset(
        name="genome",
        description="Human reference genome, 6-mer tokens: 16 layers, d_model 1024, 16 heads",
        model=dict(vocab_size=4107, n_layer=16, d_model=1024, n_head=16, max_seq_len=1000, dropout=0.1),
        recipe=Recipe(
            dataset="genome",
            batch_size=64,
            seq_len=1000,
            lr=2.5e-4,
            min_lr=2.5e-5,
            warmup_steps=4000,
            max_steps=100_000,
            beta2=0.999,
            weight_decay=0.01,
            grad_clip=1.0,
            eval_interval=2000,
            assumed="weight decay and clip not stated for the genome; 0.01 and 1.0 used",
        ),
        paper={"metric": "test_nll", "rope": 4.217, "pope": 4.152},
    ),
    _owt("owt-124m", 12, 768, 12, 21.55, 21.33),
    _owt("owt-253m", 16, 1024, 16, 18.88, 18.55),
    _owt("owt-774m", 36, 1280, 20, 15.85, 15.45),
]


def tiny(
    full: Preset,
    *,
    label: str,
    name: str | None = None,
    batch_size: int = 8,
    lr: float = 2e-3,
    dropout: float | None = None,
) -> Preset:
    """The CPU-sized variant of ``full``: the same data, betas, weight decay, clipping and PoPE delta init;
    a 2-layer, d_model 64, 4-head model at context min(256, full's); 300 steps (20 warmup, cosine to lr/10),
    evaluated every 100 steps on 8 batches. ``name`` defaults to full's name + '-tiny'; ``dropout`` None keeps
    full's."""
    max_seq_len = min(256, full.model["max_seq_len"])
    model = {**full.model, "n_layer": 2, "d_model": 64, "n_head": 4, "max_seq_len": max_seq_len}
    if dropout is not None:
        model["dropout"] = dropout
    recipe = replace(
        full.recipe,
        batch_size=batch_size,
        seq_len=min(max_seq_len, full.recipe.seq_len),
        lr=lr,
        min_lr=lr / 10,
        warmup_steps=20,
        max_steps=300,
        eval_interval=100,
        eval_batches=8,
        assumed="",
    )
    return replace(
        full,
        name=name or f"{full.name}-tiny",
        description=f"{label} on CPU: 2 layers, d_model 64, 4 heads",
        model=model,
        recipe=recipe,
        paper={},
    )


def _reproduction_presets(full: dict[str, Preset]) -> list[Preset]:
    """Smaller setups for the reproduction table, where the paper's own runs are out of reach: the genome model
    at 8 x 512 on a 2,000-step schedule (the paper's is 16 x 1024 for 100k steps), and a text LM trained at 256
    tokens for zero-shot length extrapolation (evaluated at 1x..20x)."""
    genome, owt = full["genome"], full["owt-124m"]
    return [
        replace(
            genome,
            name="genome-small",
            description="Genome, smaller model and schedule: 8 layers, d_model 512, 8 heads, 2000 steps",
            model={**genome.model, "n_layer": 8, "d_model": 512, "n_head": 8},
            recipe=replace(
                genome.recipe,
                max_steps=2000,
                warmup_steps=200,
                eval_interval=250,
                eval_batches=20,
                assumed=genome.recipe.assumed + "; a smaller model (8 x 512) and a 2000-step schedule, "
                "not the paper's 16 x 1024 for 100k steps",
            ),
            paper={},
        ),
        replace(
            owt,
            name="text-256",
            description="Offline English prose LM at context 256 (length extrapolation): "
            "6 layers, d_model 384, 6 heads, dropout 0.1",
            model={**owt.model, "n_layer": 6, "d_model": 384, "n_head": 6, "max_seq_len": 256, "dropout": 0.1},
            recipe=replace(
                owt.recipe,
                dataset="text",
                batch_size=32,
                seq_len=256,
                warmup_steps=100,
                max_steps=1500,
                eval_interval=250,
                eval_batches=20,
                assumed="the paper's OpenWebText optimizer at 256 tokens on the 3.4M-token offline "
                "text set (1500 steps x 8k tokens = ~4 epochs); not a paper setup",
            ),
            paper={},
        ),
    ]


_FULL_PRESETS += _reproduction_presets({p.name: p for p in _FULL_PRESETS})
_FULL = {p.name: p for p in _FULL_PRESETS}
_TINY_PRESETS = [
    tiny(_FULL["indirect-indexing"], label="Indirect indexing", batch_size=32, lr=1e-3),
    tiny(_FULL["jsb"], label="JSB chorales", dropout=0.1),
    tiny(_FULL["maestro"], label="MAESTRO"),
    tiny(_FULL["genome"], label="Genome"),
    tiny(_FULL["owt-124m"], label="GPT-2 text", name="owt-tiny"),
    tiny(_FULL["text-256"], label="Offline text at 256 tokens"),
]
PRESETS: dict[str, Preset] = {p.name: p for p in _FULL_PRESETS + _TINY_PRESETS}
PRESET_ALIASES = {"genome-h200": "genome-small"}
"""Earlier names of presets. A run records the preset name it was started with in config.json, and
``pope train NAME ... --resume`` must name the same preset, so `get_preset` still resolves an earlier name: runs
recorded under it resume, and `pope report` groups them by the name they recorded. Not listed by `list_presets`."""


def list_presets() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[PRESET_ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}{did_you_mean(name, list_presets())}; valid presets: {', '.join(list_presets())}"
        ) from None


def recipe_fields() -> list[str]:
    return [f.name for f in fields(Recipe)]


def with_recipe(preset: Preset, **changes) -> Preset:
    """A copy of preset with recipe fields changed (validated)."""
    unknown = set(changes) - set(recipe_fields())
    if unknown:
        hint = did_you_mean(min(unknown), recipe_fields()) if len(unknown) == 1 else ""
        raise ValueError(f"unknown recipe fields {sorted(unknown)}{hint}; valid: {', '.join(recipe_fields())}")
    return replace(preset, recipe=replace(preset.recipe, **changes))
