"""The registry of positional encodings: config strings such as "pope", "rope:base=500000" or
"yarn:scale=4,original_max_len=1024" name an encoding and its options; this module parses them and builds the layers."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

from pope.encodings.base import NoPE, PositionalEncoding
from pope.encodings.baselines import AbsolutePositionEmbedding, ALiBi, RoPE
from pope.encodings.polar import PoPE
from pope.parsing import did_you_mean, parse_assignments


@dataclass(frozen=True)
class EncodingSpec:
    """A named encoding: the per-layer attention class, fixed options, and an optional absolute embedding."""

    layer: type[PositionalEncoding]
    description: str
    defaults: dict = field(default_factory=dict)
    absolute: str | None = None  # "learned" or "sinusoidal"
    option_rules: Callable[[dict, int], dict] | None = None  # fills options that depend on head_dim


_REGISTRY: dict[str, EncodingSpec] = {
    "pope": EncodingSpec(PoPE, "Polar Coordinate Positional Embedding (softplus magnitudes, position-only phases)"),
    "rope": EncodingSpec(RoPE, "Rotary position embedding (rotate-half layout by default)"),
    "rope-half": EncodingSpec(
        RoPE,
        "RoPE on the first half of each head's channels",
        option_rules=lambda o, d: {"rotary_dim": (d // 2) - (d // 2) % 2, **o},
    ),
    "yarn": EncodingSpec(
        RoPE, "RoPE with YaRN context extension (set scale and original_max_len)", {"scaling": "yarn"}
    ),
    "pi": EncodingSpec(RoPE, "RoPE with linear position interpolation (set scale)", {"scaling": "linear"}),
    "ntk": EncodingSpec(RoPE, "RoPE with NTK-aware base scaling (set scale)", {"scaling": "ntk"}),
    "alibi": EncodingSpec(ALiBi, "ALiBi linear biases on all heads"),
    "alibi-half": EncodingSpec(ALiBi, "ALiBi linear biases on half the heads", {"heads": "half"}),
    "nope": EncodingSpec(NoPE, "No positional encoding (causal mask only)"),
    "learned-abs": EncodingSpec(NoPE, "Learnable absolute position embeddings", absolute="learned"),
    "sinusoidal-abs": EncodingSpec(NoPE, "Sinusoidal absolute position embeddings", absolute="sinusoidal"),
}
_STRUCTURAL = {"self", "n_heads", "n_kv_heads", "head_dim"}


def list_positional_encodings() -> list[str]:
    return sorted(_REGISTRY)


def describe_positional_encoding(name: str) -> dict:
    """Options (with defaults) that `name` accepts in a config string."""
    spec = encoding_spec(name)
    params = inspect.signature(spec.layer.__init__).parameters
    return {p: params[p].default for p in params if p not in _STRUCTURAL and p not in spec.defaults}


def parse_pe_spec(spec: str) -> tuple[str, dict]:
    """'name:key=value,key=value' -> (name, {key: value}), each value read by the type of the layer's
    option (pope.parsing: booleans true/false/yes/no/on/off/1/0, integers without a fraction, 'none' for
    optional values); unknown or repeated options are a ValueError listing the valid ones."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"a positional-encoding spec must be a non-empty string like 'pope' or 'rope:base=500000'; got {spec!r}"
        )
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    items = [part.strip() for part in rest.split(",") if part.strip()]
    return name, parse_assignments(items, option_types(name), where=f"positional encoding {spec!r}", noun="option")


def option_types(name: str) -> dict:
    """{option: annotation} of the options that `name` accepts in a config string."""
    spec = encoding_spec(name)
    hints = typing.get_type_hints(spec.layer.__init__)
    return {option: hints[option] for option in describe_positional_encoding(name)}


def build_positional_encoding(
    spec: str, *, n_heads: int, n_kv_heads: int | None = None, head_dim: int
) -> PositionalEncoding:
    """Build the per-layer encoding named by `spec` (see module docstring). Every option and the head layout are
    checked here (n_heads a multiple of n_kv_heads, positive sizes, option values), so a layer that builds is
    one that its calls can use; n_kv_heads None means n_heads."""
    name, options = parse_pe_spec(spec)
    entry = _REGISTRY[name]
    if entry.option_rules is not None:
        options = entry.option_rules(options, head_dim)
    return entry.layer(
        n_heads=n_heads,
        n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
        head_dim=head_dim,
        **{**entry.defaults, **options},
    )


def resolved_options(spec: str, *, head_dim: int) -> dict:
    """Every option the layer that ``spec`` builds gets, with its value: the spec's own, the name's fixed ones and
    head-size rules (rope-half's rotary_dim), else the defaults (`describe_positional_encoding`)."""
    name, options = parse_pe_spec(spec)
    entry = encoding_spec(name)
    if entry.option_rules is not None:
        options = entry.option_rules(options, head_dim)
    return {**describe_positional_encoding(name), **options}


def build_absolute_embedding(spec: str, *, d_model: int, max_seq_len: int) -> AbsolutePositionEmbedding | None:
    """The model-level absolute embedding for `spec`, or None for relative encodings."""
    name, _ = parse_pe_spec(spec)
    kind = _REGISTRY[name].absolute
    return None if kind is None else AbsolutePositionEmbedding(d_model=d_model, max_seq_len=max_seq_len, kind=kind)


def encoding_spec(name: str) -> EncodingSpec:
    """The registry entry named `name`; an unknown name is a ValueError listing the valid ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        names = list_positional_encodings()
        raise ValueError(
            f"unknown positional encoding {name!r}{did_you_mean(name, names)}; valid names: {', '.join(names)}"
        ) from None
