"""`PoPELlamaConfig`: a LlamaConfig with PoPE instead of RoPE, and `from_llama_config` for PoPE twins."""

from __future__ import annotations

import warnings

from pope.attention import BACKENDS, MAGNITUDES
from pope.hf.compat import transformers
from pope.hf.remote import RemoteCodeConfig

LlamaConfig = transformers.LlamaConfig

#: PoPE options of PoPELlamaConfig (config field = "pope_" + name) with their defaults.
POPE_OPTIONS = {
    "base": 10000.0,  # theta_c = base^(-(c-1)/d)
    "magnitude": "softplus",  # "softplus" (paper), "relu", "identity"
    "delta_init": "zero",  # "zero" (best for length extrapolation) or "uniform" (U(-2π, 0))
    "delta_range": "clamp",  # how delta stays in [-2π, 0]: "clamp" (the paper's reading) or "wrap" (modulo 2π)
    "use_delta": True,  # False removes the learned phase bias delta
    "rotary_dim": None,  # PoPE on the first rotary_dim channels of each head, plain dot product on the rest
    "backend": "auto",  # pope.pope_attention backend: "auto" (Triton on CUDA), "reference", "triton"
}


class PoPELlamaConfig(RemoteCodeConfig, LlamaConfig):
    """Every LlamaConfig field, plus PoPE's options as ``pope_base``, ``pope_magnitude``, ``pope_delta_init``,
    ``pope_delta_range``, ``pope_use_delta``, ``pope_rotary_dim`` and ``pope_backend`` (see POPE_OPTIONS). RoPE's fields
    (rope_theta / rope_scaling / rope_parameters) are kept for the record but unused: PoPE's frequencies
    come from pope_base, and a RoPE scaling other than the default is refused. ``auto_map`` always names
    pope.hf's remote-code classes (pope.hf.remote), whatever a loaded config.json held."""

    model_type = "pope_llama"
    remote_config = "PoPELlamaConfig"
    remote_models = {"AutoModel": "PoPELlamaModel", "AutoModelForCausalLM": "PoPELlamaForCausalLM"}

    def __init__(
        self,
        pope_base: float = 10000.0,
        pope_magnitude: str = "softplus",
        pope_delta_init: str = "zero",
        pope_delta_range: str = "clamp",
        pope_use_delta: bool = True,
        pope_rotary_dim: int | None = None,
        pope_backend: str = "auto",
        **kwargs,
    ):
        self.pope_base = pope_base
        self.pope_magnitude = pope_magnitude
        self.pope_delta_init = pope_delta_init
        self.pope_delta_range = pope_delta_range
        self.pope_use_delta = pope_use_delta
        self.pope_rotary_dim = pope_rotary_dim
        self.pope_backend = pope_backend
        kwargs.pop("auto_map", None)
        _check_sizes(kwargs)
        super().__init__(**kwargs)
        self.set_auto_map()
        self.validate_pope()

    def validate_pope(self) -> None:
        """Raise ValueError naming the bad PoPE option (called on construction and by the model)."""
        if isinstance(self.pope_base, bool) or not isinstance(self.pope_base, (int, float)) or not self.pope_base > 0:
            raise ValueError(f"PoPELlamaConfig.pope_base must be a positive number; got {self.pope_base!r}")
        if self.pope_magnitude not in MAGNITUDES:
            raise ValueError(
                f"PoPELlamaConfig.pope_magnitude must be one of {sorted(MAGNITUDES)}; got {self.pope_magnitude!r}"
            )
        if self.pope_delta_init not in ("zero", "uniform"):
            raise ValueError(
                f"PoPELlamaConfig.pope_delta_init must be 'zero' or 'uniform'; got {self.pope_delta_init!r}"
            )
        if self.pope_delta_range not in ("clamp", "wrap"):  # "project" needs a clamp after every optimizer step
            raise ValueError(
                f"PoPELlamaConfig.pope_delta_range must be 'clamp' or 'wrap'; got "
                f"{self.pope_delta_range!r} ('project' is pope's trainer's: it clamps delta after "
                f"every optimizer step, which a transformers training loop does not do)"
            )
        if not isinstance(self.pope_use_delta, bool):
            raise ValueError(f"PoPELlamaConfig.pope_use_delta must be True or False; got {self.pope_use_delta!r}")
        if self.pope_backend not in BACKENDS:
            raise ValueError(f"PoPELlamaConfig.pope_backend must be one of {BACKENDS}; got {self.pope_backend!r}")
        _check_sizes({name: getattr(self, name, None) for name in (*_SIZES, "head_dim")})
        head_dim = self.head_dim_or_default
        r = self.pope_rotary_dim
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 0 < r <= head_dim):
            raise ValueError(
                f"PoPELlamaConfig.pope_rotary_dim must be None or an int in [1, head_dim={head_dim}]; got {r!r}"
            )
        scaling = rope_scaling_of(self)
        if scaling:
            raise ValueError(
                f"PoPELlamaConfig has RoPE scaling {scaling!r}, which PoPE does not use; remove "
                f"rope_scaling (PoPE extrapolates without it; its frequency base is pope_base)"
            )

    @property
    def head_dim_or_default(self) -> int:
        return getattr(self, "head_dim", None) or self.hidden_size // self.num_attention_heads


_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)


def _check_sizes(fields: dict) -> None:
    """The model sizes among ``fields`` are positive ints and the heads divide as attention needs (query heads a
    multiple of key/value heads; hidden_size a multiple of the heads unless head_dim is given): a ValueError naming
    the field, before transformers' own checks (some of which divide by them)."""
    for name in _SIZES:
        value = fields.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"PoPELlamaConfig.{name} must be a positive int; got {value!r}")
    heads, kv_heads = fields.get("num_attention_heads"), fields.get("num_key_value_heads")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        divisors = [h for h in range(1, heads + 1) if heads % h == 0]
        raise ValueError(
            f"PoPELlamaConfig.num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads}) "
            f"(grouped-query attention); use num_key_value_heads in {divisors}"
        )
    hidden, head_dim = fields.get("hidden_size"), fields.get("head_dim")
    if heads is not None and hidden is not None and head_dim is None and hidden % heads:
        raise ValueError(
            f"PoPELlamaConfig.hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}); change "
            "one of them"
        )


def rope_theta_of(config) -> float | None:
    """RoPE's base of a Llama-family config (transformers 4.x: rope_theta; 5.x: rope_parameters)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return None if theta is None else float(theta)


def rope_scaling_of(config) -> dict | None:
    """A RoPE scaling other than the default, or None."""
    for name in ("rope_scaling", "rope_parameters"):
        value = getattr(config, name, None)
        if isinstance(value, dict) and value.get("rope_type", value.get("type", "default")) not in ("default", None):
            return value
    return None


def from_llama_config(llama_config, **pope_options) -> PoPELlamaConfig:
    """A PoPELlamaConfig with every field of ``llama_config`` (any Llama-family config or its dict) and the
    given PoPE options (names of POPE_OPTIONS: base, magnitude, delta_init, delta_range, use_delta, rotary_dim,
    backend).
    base defaults to the config's RoPE base (rope_theta). A RoPE scaling (YaRN, llama3, ...) and a sliding
    window (Mistral) are dropped with a warning: the twin is the Llama architecture at that config's sizes.
    For training from scratch: the weights are not converted."""
    unknown = set(pope_options) - set(POPE_OPTIONS)
    if unknown:
        raise ValueError(f"unknown PoPE options {sorted(unknown)}; valid: {', '.join(POPE_OPTIONS)}")
    data = dict(llama_config) if isinstance(llama_config, dict) else llama_config.to_dict()
    options = {**POPE_OPTIONS, **pope_options}
    if "base" not in pope_options:
        theta = rope_theta_of(_AttributeView(data))
        options["base"] = theta if theta is not None else POPE_OPTIONS["base"]
    scaling = rope_scaling_of(_AttributeView(data))
    if scaling:
        warnings.warn(f"from_llama_config: dropping RoPE scaling {scaling} (PoPE does not use it)", stacklevel=2)
        if "rope_scaling" in data:
            data["rope_scaling"] = None
        if isinstance(data.get("rope_parameters"), dict):
            data["rope_parameters"] = {"rope_type": "default", "rope_theta": data["rope_parameters"].get("rope_theta")}
    window = sliding_window_of(data)
    if window:
        warnings.warn(
            f"from_llama_config: dropping the sliding-window attention ({window}); the PoPE twin attends "
            f"over the whole causal context",
            stacklevel=2,
        )
        for key in ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types"):
            data.pop(key, None)
    for key in ("model_type", "architectures", "transformers_version", "auto_map", "_name_or_path"):
        data.pop(key, None)
    data = {key: value for key, value in data.items() if not key.startswith("pope_")}
    return PoPELlamaConfig(**{f"pope_{name}": value for name, value in options.items()}, **data)


def sliding_window_of(data: dict) -> str | None:
    """A description of the sliding-window attention a config dict asks for (Mistral, Qwen2...), or None."""
    layer_types = data.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        return f"layer_types {sorted(set(layer_types))}"
    if data.get("sliding_window") is not None and data.get("use_sliding_window") is not False:
        return f"sliding_window={data['sliding_window']}"
    return None


class _AttributeView:
    def __init__(self, data: dict):
        self.__dict__.update(data)
