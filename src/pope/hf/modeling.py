"""`PoPELlamaModel` / `PoPELlamaForCausalLM`: the Llama architecture with PoPE attention (transformers >= 4.50, 5.x).

Same module names and weights as transformers' Llama (embed_tokens, layers.N.self_attn.{q,k,v,o}_proj,
mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm, norm, lm_head) plus one PoPE phase bias
per layer (layers.N.self_attn.pe.delta, (heads, rotary_dim)); no rotary embedding module.

Attention paths, chosen once per forward pass:
* fused: no padding in attention_mask and position_ids that are the token indices plus a per-row constant
  (HF's defaults): `pope.pope_attention` (the Triton kernels on CUDA, GQA native; the reference elsewhere).
  PoPE depends on s - t only, so a constant shift of the positions changes nothing.
* masked: padding (e.g. left-padded batches): PoPE's q'/k' are materialised and SDPA runs with an additive
  mask (pads and causality); positions are the token indices (the shift is irrelevant, as above).
* explicit positions: position_ids that are not indices plus a constant (e.g. packed sequences restarting
  at 0): phases from position_ids, causal by token order, without a cache (the cache stores no positions).
The cache (a transformers DynamicCache) holds what pope.PoPE.cache_keys gives: the key magnitudes f(k),
d channels per key (RoPE's cache memory), and the values; a decode step computes phases from positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from transformers.cache_utils import Cache, DynamicCache  # noqa: E402  (the version is checked by pope.hf.compat)
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaMLP  # noqa: E402

from pope.axial import phase_attention, position_phases
from pope.encodings import PoPE
from pope.frequencies import pope_frequencies
from pope.hf.compat import CACHE_FIELD, EagerAttentionOnly, new_dynamic_cache, tied_weights_keys, transformers
from pope.hf.config import PoPELlamaConfig
from pope.hf.remote import RemoteCodeModel
from pope.model import check_token_ids

_ACCEPTED_KWARGS = {"cache_position", "return_dict", "num_items_in_batch", "output_attentions"}


@dataclass
class AttentionPlan:
    """How every layer of one forward pass attends (see the module docstring)."""

    past_length: int  # cached tokens before this call
    bias: torch.Tensor | None  # (B, 1, Nq, Nk) additive mask incl. causality; None: the fused causal path
    positions_q: torch.Tensor | None = None  # (B or 1, Nq) for the masked paths
    positions_k: torch.Tensor | None = None  # (B or 1, Nk)


def plan_attention(
    attention_mask, position_ids, *, past_length: int, n: int, batch: int, device, dtype, has_cache: bool
) -> AttentionPlan:
    """Check attention_mask (B, past + n) of 1/0 (or bool) and position_ids (B or 1, n), and pick the path."""
    total = past_length + n
    valid = None
    if attention_mask is not None:
        if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, total):
            raise ValueError(
                f"attention_mask must be a 2-D (batch, past + new tokens) = ({batch}, {total}) mask of 1s "
                f"(attend) and 0s (padding); got shape {tuple(attention_mask.shape)}. 4-D masks are not "
                f"supported by PoPELlama"
            )
        valid = attention_mask.to(device=device).bool()  # (B, total)
    index = torch.arange(past_length, total, device=device)  # (n,)
    checks = []
    if valid is not None:
        checks.append((~valid).any())
    if position_ids is not None:
        if position_ids.dim() != 2 or position_ids.shape[-1] != n or position_ids.shape[0] not in (1, batch):
            raise ValueError(f"position_ids must have shape ({batch} or 1, {n}); got {tuple(position_ids.shape)}")
        shift = position_ids.to(device) - index  # (B or 1, n); must be constant over the real tokens of a row
        real = valid[:, past_length:] if valid is not None else torch.ones_like(shift, dtype=torch.bool)
        big = torch.iinfo(torch.long).max
        high = shift.long().masked_fill(~real, -big).amax(-1)
        low = shift.long().masked_fill(~real, big).amin(-1)
        checks.append(((high != low) & real.any(-1)).any())
    flags = torch.stack(checks).tolist() if checks else []  # one host sync for both checks
    padded = bool(flags[0]) if valid is not None else False
    explicit = bool(flags[-1]) if position_ids is not None else False
    if not padded and not explicit:
        return AttentionPlan(past_length, None)
    if explicit and has_cache:
        raise ValueError(
            "position_ids are not the token indices plus a constant per row (e.g. packed sequences); "
            "PoPELlama supports that without a cache only: pass use_cache=False, or give position_ids "
            "that continue the cached ones"
        )
    key_index = torch.arange(total, device=device)
    visible = key_index[None, :] <= index[:, None]  # (n, total) causal by token order
    visible = visible[None] & (valid[:, None, :] if valid is not None else True)  # (B or 1, n, total)
    visible = visible | ~visible.any(-1, keepdim=True)  # fully masked (pad) rows attend everywhere: no NaN
    bias = torch.zeros(visible.shape, device=device, dtype=dtype).masked_fill(~visible, float("-inf"))[:, None]
    if explicit:
        positions = position_ids.to(device)
        return AttentionPlan(past_length, bias, positions, positions)
    return AttentionPlan(past_length, bias, index[None], key_index[None])


class PoPELlamaRMSNorm(nn.Module):
    """Llama's RMSNorm (weight * x / rms(x), computed in float32), in float64 for float64 inputs."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * y.to(x.dtype)


class PoPELlamaAttention(nn.Module):
    """Llama's attention projections with PoPE (pope.PoPE holds delta and calls pope.pope_attention)."""

    def __init__(self, config: PoPELlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim_or_default
        self.attention_dropout = float(config.attention_dropout or 0.0)
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=bias)
        self.pe = PoPE(
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            base=config.pope_base,
            magnitude=config.pope_magnitude,
            delta_init=config.pope_delta_init,
            delta_range=config.pope_delta_range,
            use_delta=config.pope_use_delta,
            rotary_dim=config.pope_rotary_dim,
            backend=config.pope_backend,
        )

    def forward(self, hidden_states: torch.Tensor, plan: AttentionPlan, cache: Cache | None) -> torch.Tensor:
        b, n, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, n, hd)
        k = self.k_proj(hidden_states).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, n, hd)
        v = self.v_proj(hidden_states).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        dropout_p = self.attention_dropout if self.training else 0.0
        if cache is not None:  # the cache holds f(k): (B, Hkv, past + n, hd)
            k, v = cache.update(self.pe.cache_keys(k, plan.past_length), v, self.layer_idx)
        if plan.bias is None and cache is not None:
            y = self.pe.attend_cached(q, k, v, q_offset=plan.past_length, causal=True, dropout_p=dropout_p)
        elif plan.bias is None:
            y = self.pe(q, k, v, causal=True, dropout_p=dropout_p)
        else:
            y = self._masked(q, k, v, plan, keys_are_magnitudes=cache is not None, dropout_p=dropout_p)
        return self.o_proj(y.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim))

    def _masked(self, q, k, v, plan: AttentionPlan, *, keys_are_magnitudes: bool, dropout_p: float):
        """PoPE over materialised q'/k' with plan's positions and additive mask (same scores as the fused path)."""
        pe = self.pe
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        theta = pope_frequencies(pe.rotary_dim or self.head_dim, pe.base, device=q.device, dtype=compute)
        phase_q = position_phases(plan.positions_q, theta)[:, None]  # (B or 1, 1, n, r)
        phase_k = position_phases(plan.positions_k, theta)[:, None]  # (B or 1, 1, Nk, r)
        delta = pe.bounded_delta()
        if delta is not None:
            phase_q = phase_q - delta.to(compute)[:, None, :]  # (B or 1, H, n, r)
        return phase_attention(
            q,
            k,
            v,
            phase_q,
            phase_k,
            magnitude_q=pe.magnitude,
            magnitude_k="identity" if keys_are_magnitudes else pe.magnitude,
            softmax_scale=pe.softmax_scale,
            attn_bias=plan.bias,
            dropout_p=dropout_p,
        )


class PoPELlamaDecoderLayer(nn.Module):
    def __init__(self, config: PoPELlamaConfig, layer_idx: int):
        super().__init__()
        self.self_attn = PoPELlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = PoPELlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = PoPELlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, plan: AttentionPlan, cache: Cache | None = None):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), plan, cache)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class PoPELlamaPreTrainedModel(RemoteCodeModel, EagerAttentionOnly, transformers.PreTrainedModel):
    config_class = PoPELlamaConfig
    config: PoPELlamaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["PoPELlamaDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_flash_attn = _supports_flash_attn_2 = _supports_sdpa = _supports_flex_attn = False
    _supports_cache_class = True  # transformers 4.x
    _can_compile_fullgraph = False  # the attention path is chosen from the mask's content (one host sync)

    @classmethod
    def refuse_attn_implementation(cls, requested_attention) -> str:
        """Only "eager" (the default) applies: attention is always pope.pope_attention."""
        if requested_attention in (None, "eager"):
            return "eager"
        raise ValueError(
            f"attn_implementation={requested_attention!r} does not apply to {cls.__name__}: its "
            f"attention is pope.pope_attention (fused Triton kernels on CUDA, PyTorch reference "
            f"elsewhere; choose with config.pope_backend). Leave attn_implementation unset or 'eager'"
        )

    def _init_weights(self, module):
        super()._init_weights(module)
        delta = getattr(module, "delta", None) if isinstance(module, PoPE) else None
        if delta is not None and not getattr(delta, "_is_hf_initialized", False):  # not loaded from a checkpoint
            module.reset_parameters()


def _cache_argument(past_key_values, cache):
    if past_key_values is not None and cache is not None:
        raise ValueError("give the cache as past_key_values or cache, not both")
    return cache if cache is not None else past_key_values


def _refuse_unused(kwargs: dict) -> None:
    unknown = set(kwargs) - _ACCEPTED_KWARGS
    if unknown:
        raise TypeError(f"PoPELlama forward got unexpected arguments {sorted(unknown)}")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions=True is not supported: PoPE's fused kernels do not form attention weights")


class PoPELlamaModel(PoPELlamaPreTrainedModel):
    def __init__(self, config: PoPELlamaConfig):
        super().__init__(config)
        config.validate_pope()
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(PoPELlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = PoPELlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        use_cache=None,
        output_hidden_states=None,
        cache=None,
        **kwargs,
    ):
        _refuse_unused(kwargs)
        cache = _cache_argument(past_key_values, cache)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            check_token_ids(input_ids, self.config.vocab_size, name="input_ids")  # CPU ids only: no device sync
            inputs_embeds = self.embed_tokens(input_ids)  # (B, n, C)
        if use_cache is None:  # training steps make no cache unless asked (the fused kernels' fastest path)
            use_cache = self.config.use_cache and not self.training
        if self.gradient_checkpointing and self.training and use_cache:
            use_cache = False  # a checkpointed layer recomputes its forward; a cache would be written twice
        if not use_cache:
            cache = None
        elif cache is None:
            cache = new_dynamic_cache(self.config)
        elif not isinstance(cache, DynamicCache):  # a StaticCache returns unfilled slots as keys
            raise TypeError(
                f"PoPELlama's cache must be a transformers DynamicCache (what generate() makes by "
                f"default); got {type(cache).__name__}. Leave cache_implementation unset"
            )
        b, n = inputs_embeds.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        plan = plan_attention(
            attention_mask,
            position_ids,
            past_length=past,
            n=n,
            batch=b,
            device=inputs_embeds.device,
            dtype=inputs_embeds.dtype,
            has_cache=cache is not None,
        )
        hidden = inputs_embeds
        all_hidden = [] if output_hidden_states else None
        for layer in self.layers:
            if all_hidden is not None:
                all_hidden.append(hidden)
            if self.gradient_checkpointing and self.training:
                hidden = self._gradient_checkpointing_func(layer.__call__, hidden, plan, cache)
            else:
                hidden = layer(hidden, plan, cache)
        hidden = self.norm(hidden)
        if all_hidden is not None:
            all_hidden.append(hidden)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden,
            hidden_states=None if all_hidden is None else tuple(all_hidden),
            **{CACHE_FIELD: cache},
        )


class PoPELlamaForCausalLM(PoPELlamaPreTrainedModel, transformers.GenerationMixin):
    _tied_weights_keys = tied_weights_keys("lm_head.weight", "model.embed_tokens.weight")

    def __init__(self, config: PoPELlamaConfig):
        super().__init__(config)
        self.model = PoPELlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_hidden_states=None,
        logits_to_keep=0,
        cache=None,
        **kwargs,
    ):
        """Llama's causal-LM forward: logits (B, n, V) (the last logits_to_keep positions when > 0), the
        shifted cross-entropy over labels != -100, and the cache."""
        num_items = kwargs.get("num_items_in_batch")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            cache=_cache_argument(past_key_values, cache),
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            hidden = hidden[:, logits_to_keep]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            extra = {} if num_items is None else {"num_items_in_batch": num_items}
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **extra)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
        )
