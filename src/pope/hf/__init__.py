"""PoPE in Hugging Face transformers: the Llama architecture with PoPE attention (extra ``[hf]``).

    import pope.hf                                   # registers model_type "pope_llama" with the Auto classes
    from transformers import AutoModelForCausalLM, LlamaConfig
    config = pope.hf.from_llama_config(LlamaConfig(hidden_size=512, ...), delta_init="zero")
    model = pope.hf.PoPELlamaForCausalLM(config)     # train with Trainer, generate(), save_pretrained(dir)
    model = AutoModelForCausalLM.from_pretrained(dir)

See docs/hf.md.
"""

from __future__ import annotations

from pope.hf.compat import transformers as _transformers
from pope.hf.config import POPE_OPTIONS, PoPELlamaConfig, from_llama_config
from pope.hf.modeling import PoPELlamaForCausalLM, PoPELlamaModel, PoPELlamaPreTrainedModel


def _register() -> None:
    """Register with AutoConfig / AutoModel / AutoModelForCausalLM (idempotent: a second import is a no-op)."""
    try:
        _transformers.AutoConfig.register(PoPELlamaConfig.model_type, PoPELlamaConfig)
    except ValueError:  # already registered by an earlier import (e.g. a reloaded module)
        pass
    for auto, model in (
        (_transformers.AutoModel, PoPELlamaModel),
        (_transformers.AutoModelForCausalLM, PoPELlamaForCausalLM),
    ):
        try:
            auto.register(PoPELlamaConfig, model)
        except ValueError:
            pass


_register()

__all__ = [
    "POPE_OPTIONS",
    "PoPELlamaConfig",
    "PoPELlamaForCausalLM",
    "PoPELlamaModel",
    "PoPELlamaPreTrainedModel",
    "from_llama_config",
]
