"""PoPE in Hugging Face transformers (extra ``[hf]``): the Llama architecture with PoPE attention, and
pope.model.GPT (the model `pope train` trains) as a transformers model.

    import pope.hf                                   # registers "pope_llama" and "pope_gpt" with the Auto classes
    from transformers import AutoModelForCausalLM, LlamaConfig
    config = pope.hf.from_llama_config(LlamaConfig(hidden_size=512, ...), delta_init="zero")
    model = pope.hf.PoPELlamaForCausalLM(config)     # train with Trainer, generate(), save_pretrained(dir)

    # in any process, without importing pope.hf (save_pretrained writes the remote code, pope.hf.remote):
    model = AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)

`pope export hf RUN OUT` writes a trained run as a PoPEGPTForCausalLM directory (pope.hf.export). See docs/hf.md.
"""

from __future__ import annotations

from pope.hf.compat import transformers as _transformers
from pope.hf.config import POPE_OPTIONS, PoPELlamaConfig, from_llama_config
from pope.hf.gpt import PoPEGPTConfig, PoPEGPTForCausalLM
from pope.hf.modeling import PoPELlamaForCausalLM, PoPELlamaModel, PoPELlamaPreTrainedModel


def _register() -> None:
    """Register with AutoConfig / AutoModel / AutoModelForCausalLM (idempotent: a second import is a no-op)."""
    for config in (PoPELlamaConfig, PoPEGPTConfig):
        try:
            _transformers.AutoConfig.register(config.model_type, config)
        except ValueError:  # already registered by an earlier import (e.g. a reloaded module)
            pass
    for auto, config, model in (
        (_transformers.AutoModel, PoPELlamaConfig, PoPELlamaModel),
        (_transformers.AutoModelForCausalLM, PoPELlamaConfig, PoPELlamaForCausalLM),
        (_transformers.AutoModelForCausalLM, PoPEGPTConfig, PoPEGPTForCausalLM),
    ):
        try:
            auto.register(config, model)
        except ValueError:
            pass


_register()

__all__ = [
    "POPE_OPTIONS",
    "PoPEGPTConfig",
    "PoPEGPTForCausalLM",
    "PoPELlamaConfig",
    "PoPELlamaForCausalLM",
    "PoPELlamaModel",
    "PoPELlamaPreTrainedModel",
    "from_llama_config",
]
