"""`PoPEGPTForCausalLM`: pope.model.GPT, the model `pope train` trains, as a transformers model (model_type
"pope_gpt"); `pope export hf RUN OUT` (pope.hf.export) writes a trained run as one.

The transformers model holds the GPT itself as ``gpt`` and runs its forward, so it is the same network with the same
weight names (``gpt.token_embedding``, ``gpt.blocks.N.attn.{q,k,v,o}_proj``, ``gpt.blocks.N.attn.pe.delta`` for
PoPE, ``gpt.blocks.N.mlp.{up,down}``, the RMSNorms, ``gpt.lm_head`` tied to the embedding): pre-norm RMSNorm blocks,
GELU MLP, every positional encoding of pope.encodings, and logits equal to the trained GPT's (a float64 test).
transformers adds the causal-LM loss over ``labels``, ``generate()`` through a ``DynamicCache`` (the GPT's own KV
cache path: keys as the encoding caches them, PoPE's magnitudes f(k)), save/load, and the Auto classes.

What the GPT does not have is refused with one line rather than ignored: padded batches (an ``attention_mask`` with
zeros; lm-eval's generation tasks need ``--batch_size 1``), ``position_ids`` (positions are the token indices after
the cached ones), ``inputs_embeds``, ``output_attentions`` / ``output_hidden_states``, and an ``attn_implementation``
other than "eager" (attention is the encoding's: pope.pope_attention for PoPE).
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from pope.encodings import ALiBi
from pope.hf.compat import CACHE_FIELD, EagerAttentionOnly, new_dynamic_cache, tied_weights_keys, transformers
from pope.hf.remote import RemoteCodeConfig, RemoteCodeModel
from pope.model import GPT, GPTConfig, KVCacheInterface

_GPT_FIELDS = tuple(field.name for field in dataclasses.fields(GPTConfig))
_ACCEPTED_KWARGS = {"cache_position", "return_dict", "num_items_in_batch"}


class PoPEGPTConfig(RemoteCodeConfig, transformers.PretrainedConfig):
    """Every pope.model.GPTConfig field under its own name (vocab_size, n_layer, n_head, d_model, max_seq_len,
    n_kv_head, dropout, pe, mlp_ratio, norm_eps, tie_embeddings, init), validated by GPTConfig; transformers' usual
    names (hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings) read them.
    ``max_position_embeddings`` is the training context, which lm-eval takes as its window length."""

    model_type = "pope_gpt"
    remote_config = "PoPEGPTConfig"
    remote_models = {"AutoModelForCausalLM": "PoPEGPTForCausalLM"}
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "max_seq_len",
    }

    def __init__(
        self,
        vocab_size: int = 256,
        n_layer: int = 2,
        n_head: int = 4,
        d_model: int = 64,
        max_seq_len: int = 256,
        n_kv_head: int | None = None,
        dropout: float = 0.0,
        pe: str = "pope",
        mlp_ratio: int = 4,
        norm_eps: float = 1e-6,
        tie_embeddings: bool = True,
        init: str = "gpt2",
        **kwargs,
    ):
        gpt = GPTConfig(
            vocab_size=vocab_size,
            n_layer=n_layer,
            n_head=n_head,
            d_model=d_model,
            max_seq_len=max_seq_len,
            n_kv_head=n_kv_head,
            dropout=dropout,
            pe=pe,
            mlp_ratio=mlp_ratio,
            norm_eps=norm_eps,
            tie_embeddings=tie_embeddings,
            init=init,
        )  # raises naming the bad field
        for name, value in gpt.to_dict().items():
            setattr(self, name, value)
        kwargs.pop("auto_map", None)
        kwargs["tie_word_embeddings"] = tie_embeddings  # transformers ties lm_head to the embedding by this flag
        super().__init__(**kwargs)
        self.set_auto_map()

    def gpt_config(self) -> GPTConfig:
        """The pope.model.GPTConfig these fields describe."""
        return GPTConfig.from_dict({name: getattr(self, name) for name in _GPT_FIELDS})

    @classmethod
    def from_gpt_config(cls, config: GPTConfig, **kwargs) -> PoPEGPTConfig:
        """The config of a GPT with ``config``; ``kwargs`` are further transformers fields (bos_token_id, ...)."""
        return cls(**config.to_dict(), **kwargs)


class _CacheView(KVCacheInterface):
    """pope.model.KVCache's interface (``length``, ``update(layer, k, v)``, ``advance(n)``) over a transformers
    cache, so that GPT.forward decodes with it unchanged."""

    def __init__(self, cache):
        self.cache, self.length = cache, cache.get_seq_length()

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(k, v, layer)

    def advance(self, n: int) -> None:
        self.length += n


class PoPEGPTForCausalLM(
    RemoteCodeModel, EagerAttentionOnly, transformers.PreTrainedModel, transformers.GenerationMixin
):
    """pope.model.GPT behind transformers' causal-LM interface (see the module docstring)."""

    config_class = PoPEGPTConfig
    config: PoPEGPTConfig
    base_model_prefix = "gpt"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_flash_attn = _supports_flash_attn_2 = _supports_sdpa = _supports_flex_attn = False
    _supports_cache_class = True  # transformers 4.x
    _tied_weights_keys = tied_weights_keys("gpt.lm_head.weight", "gpt.token_embedding.weight")

    def __init__(self, config: PoPEGPTConfig):
        super().__init__(config)
        self.gpt = GPT(config.gpt_config())  # initialised by the GPT's own scheme (GPTConfig.init)
        self.post_init()

    @classmethod
    def refuse_attn_implementation(cls, requested_attention) -> str:
        """Only "eager" (the default) applies: attention is the positional encoding's own."""
        if requested_attention in (None, "eager"):
            return "eager"
        raise ValueError(
            f"attn_implementation={requested_attention!r} does not apply to {cls.__name__}: attention is its "
            f"positional encoding's own (pope.pope_attention for PoPE). Leave attn_implementation unset or 'eager'"
        )

    def _init_weights(self, module) -> None:
        """Weights come from the GPT's constructor or the checkpoint; only what no checkpoint holds is rebuilt
        here (transformers 5 builds the model on the meta device and fills non-persistent buffers through this)."""
        if isinstance(module, ALiBi):
            module.reset_buffers()

    def get_input_embeddings(self):
        return self.gpt.token_embedding

    def set_input_embeddings(self, value):
        self.gpt.token_embedding = value

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.gpt.lm_head = new_embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cache=None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """input_ids (B, n) -> logits (B, n, V) (the last logits_to_keep positions when > 0), the shifted
        cross-entropy over labels != -100, and the cache (a DynamicCache holding what GPT.generate's cache holds)."""
        _refuse_unsupported(kwargs)
        if input_ids is None:
            raise ValueError("PoPEGPTForCausalLM takes input_ids (token ids); inputs_embeds are not supported")
        if past_key_values is not None and cache is not None:
            raise ValueError("give the cache as past_key_values or cache, not both")
        cache = cache if cache is not None else past_key_values
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError(
                "PoPEGPTForCausalLM attends to every token: a padded batch (attention_mask with zeros) is not "
                "supported; give prompts of one length or one at a time (lm-eval: --batch_size 1)"
            )
        if use_cache is None:
            use_cache = getattr(self.config, "use_cache", True) and not self.training
        if not use_cache:
            cache = None
        elif cache is None:
            cache = new_dynamic_cache(self.config)
        logits, _ = self.gpt(input_ids, kv_cache=_CacheView(cache) if cache is not None else None)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            logits = logits[:, logits_to_keep]
        loss = None
        if labels is not None:
            extra = (
                {} if kwargs.get("num_items_in_batch") is None else {"num_items_in_batch": kwargs["num_items_in_batch"]}
            )
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **extra)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})


def _refuse_unsupported(kwargs: dict) -> None:
    refused = {
        "position_ids": "positions are the token indices (after the cached ones)",
        "inputs_embeds": "it takes token ids",
        "output_attentions": "the fused kernels form no attention weights",
        "output_hidden_states": "it returns logits only",
    }
    for name, why in refused.items():
        if kwargs.get(name) not in (None, False):
            raise ValueError(f"PoPEGPTForCausalLM does not support {name}: {why}")
    unknown = set(kwargs) - _ACCEPTED_KWARGS - set(refused)
    if unknown:
        raise TypeError(f"PoPEGPTForCausalLM forward got unexpected arguments {sorted(unknown)}")
