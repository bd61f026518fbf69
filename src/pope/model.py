"""A decoder-only GPT with a pluggable positional encoding (the paper's model).

Pre-norm RMSNorm blocks, causal self-attention whose positional encoding is chosen by a config string
(see pope.encodings), a GELU MLP of ratio 4, no biases, tied input/output embeddings, dropout.
`forward(..., cu_seqlens=, max_seqlen=)` runs documents packed end to end (flash-attn's varlen layout) as if
each ran alone. `generate()` decodes with a KV cache of d channels per key (raw keys, or PoPE's magnitudes f(k): RoPE's
cache memory) and gives the same logits as a full forward pass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from pope.encodings import PackedSequences, build_absolute_embedding, build_positional_encoding, parse_pe_spec
from pope.parsing import check_fields, from_dict


@dataclass(kw_only=True)
class GPTConfig:
    """Model shape and positional encoding. Every field is validated on construction, the positional encoding's
    options against the head layout included, so a config that builds gives a model that builds."""

    vocab_size: int
    """Number of token ids."""
    n_layer: int
    """Transformer blocks."""
    n_head: int
    """Query heads per attention layer."""
    d_model: int
    """Residual width; head_dim = d_model // n_head."""
    max_seq_len: int
    """Training context length (learned absolute embeddings cannot go past it; other encodings can)."""
    n_kv_head: int | None = None
    """Key/value heads (grouped-query attention); None means n_head."""
    dropout: float = 0.0
    """Dropout on attention weights, residual branches and embeddings."""
    pe: str = "pope"
    """Positional-encoding config string, e.g. 'pope', 'pope:delta_init=uniform', 'rope', 'yarn:scale=4'."""
    mlp_ratio: int = 4
    """MLP hidden width = mlp_ratio * d_model."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_embeddings: bool = True
    """Share the token embedding with the output projection."""
    init: Literal["gpt2", "fan-in"] = "gpt2"
    """Weight initialisation. "gpt2": every linear and embedding weight N(0, 0.02), the residual branches' output
    projections N(0, 0.02 / sqrt(2 n_layer)) (GPT-2, nanoGPT). "fan-in": every linear weight
    N(0, sqrt(2 / (n_layer * fan_in))) and every embedding N(0, 1 / sqrt(d_model)), a pre-norm scheme whose
    scale follows each layer's input width. Encodings' own parameters (PoPE's delta) keep their init."""

    def __post_init__(self):
        check_fields(self)  # real types: GPTConfig(n_kv_head=2.0) or tie_embeddings="no" is a TypeError
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len", "mlp_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive int; got {getattr(self, name)!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"GPTConfig.d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head is not None and (self.n_kv_head <= 0 or self.n_head % self.n_kv_head):
            raise ValueError(f"GPTConfig.n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1); got {self.dropout}")
        if not self.norm_eps > 0:
            raise ValueError(f"GPTConfig.norm_eps must be positive; got {self.norm_eps}")
        parse_pe_spec(self.pe)  # raises with the valid names/options
        # the option values against this head layout (rope:rotary_dim=3, an odd head_dim for RoPE, pope:backend=x):
        # one layer built here (a few bytes) says so now, not when GPT(config) builds the model
        build_positional_encoding(self.pe, n_heads=self.n_head, n_kv_heads=self.kv_heads, head_dim=self.head_dim)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GPTConfig:
        return from_dict(cls, data)


def check_token_ids(ids: torch.Tensor, vocab_size: int, *, name: str = "idx", ignore: int | None = None) -> None:
    """ValueError naming the first id of ``ids`` outside [0, vocab_size) (``ignore``: a value left out, e.g. -100 in
    targets), its position and what to do; TypeError for ids that are not integers (a dtype: checked everywhere).
    The range is checked for CPU tensors outside torch.compile only, where that costs no device synchronisation and
    no graph break; elsewhere it is not (see GPT._check_call). The test is torch._assert_async, which on CPU raises at
    once and reads nothing back through the dispatcher, so the step keeps the form a CUDA graph captures; the
    position is looked up only once it failed."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of token ids; got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids; got {ids.dtype}: pass {name}.long()")
    if ids.device.type != "cpu" or torch.compiler.is_compiling() or ids.numel() == 0:
        return
    outside = (ids < 0) | (ids >= vocab_size)
    if ignore is not None:
        outside &= ids != ignore
    try:
        torch._assert_async(~outside.any(), "token id outside the vocabulary")
        return
    except RuntimeError:
        pass
    position = tuple(outside.nonzero()[0].tolist())
    what = "a token id" if ignore is None else f"a token id (or {ignore}, for positions left out of the loss)"
    raise ValueError(
        f"{name} holds {int(ids[position])} at position {position}, outside the model's vocabulary [0, {vocab_size}) "
        f"(each entry must be {what}); encode the input with the tokenizer the model was trained with, or build the "
        "model with a larger vocab_size"
    )


class KVCacheInterface:
    """What GPT.forward needs of a key/value cache: ``length`` (positions already cached), ``update(layer, k, v)``
    (store a layer's new keys/values (B, Hkv, T, hd) after the cached ones; return all of them) and ``advance(n)``.
    `KVCache` is the one pope allocates; pope.hf adapts transformers' caches to it."""

    length: int

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def advance(self, n: int) -> None:
        raise NotImplementedError

    def check_fits(self, config: GPTConfig, idx: torch.Tensor) -> None:
        """Raise ValueError, saying how to make a fitting one, if this cache cannot serve a forward of ``idx``."""


class KVCache(KVCacheInterface):
    """Preallocated keys/values for every layer: (n_layer, B, Hkv, max_len, head_dim) each.

    Keys are stored as the layer's encoding caches them (`PositionalEncoding.cache_keys`): raw keys, RoPE's
    rotated keys, or PoPE's magnitudes f(k) (its phases come from positions), d channels per key in every
    case, so PoPE's cache costs what RoPE's does.
    The model writes each layer's new entries with `update` and then calls `advance`.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device=None, dtype=torch.float32):
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"KVCache {name} must be a positive int; got {value!r}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"KVCache dtype must be a floating-point torch.dtype; got {dtype!r}")
        shape = (config.n_layer, batch_size, config.kv_heads, max_len, config.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0
        self.max_len = max_len

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, Hkv, T, hd) after the cached ones; return all keys/values (B, Hkv, length+T, hd)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for. Make a larger cache.")
        if k.shape[0] != self.k.shape[1]:
            raise ValueError(f"KV cache was made for batch {self.k.shape[1]}; got batch {k.shape[0]}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def check_fits(self, config: GPTConfig, idx: torch.Tensor) -> None:
        """Made for this model (new_kv_cache): its layers, heads and head size, idx's batch and device (its dtype may
        differ from the weights', e.g. bf16 under autocast)."""
        expected = (config.n_layer, idx.shape[0], config.kv_heads, config.head_dim)
        found = (self.k.shape[0], self.k.shape[1], self.k.shape[2], self.k.shape[4])
        if found != expected:
            raise ValueError(
                f"kv_cache was made for (layers, batch, kv heads, head_dim) = {found}, this call needs {expected}; "
                f"make it with this model's new_kv_cache({idx.shape[0]}, max_len)"
            )
        if self.k.device != idx.device:
            raise ValueError(
                f"kv_cache is on {self.k.device} but idx is on {idx.device}; make it with new_kv_cache(..., "
                f"device='{idx.device}')"
            )


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        kv_width = self.n_kv_head * self.head_dim
        # Separate projections so analysis tools can hook raw q and k.
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.k_proj = nn.Linear(config.d_model, kv_width, bias=False)
        self.v_proj = nn.Linear(config.d_model, kv_width, bias=False)
        self.o_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.pe = build_positional_encoding(
            config.pe, n_heads=self.n_head, n_kv_heads=self.n_kv_head, head_dim=self.head_dim
        )
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, kv_cache: KVCache | None = None, packed: PackedSequences | None = None
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim)  # (B, T, H, hd)
        k = self.k_proj(x).view(b, t, self.n_kv_head, self.head_dim)  # (B, T, Hkv, hd)
        v = self.v_proj(x).view(b, t, self.n_kv_head, self.head_dim)
        dropout_p = self.dropout if self.training else 0.0
        if packed is not None:  # B == 1, T == total: (total, H, hd) is flash-attn's varlen layout
            y = self.pe.forward_varlen(q[0], k[0], v[0], packed, dropout_p=dropout_p)[None]  # (1, total, H, hd)
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
            if kv_cache is not None:
                # The cache holds keys as the encoding caches them (PoPE: magnitudes f(k)): (B, Hkv, cached + T, hd)
                k, v = kv_cache.update(self.layer_idx, self.pe.cache_keys(k, kv_cache.length), v)
                y = self.pe.attend_cached(q, k, v, causal=True, dropout_p=dropout_p)  # (B, H, T, hd)
            else:
                y = self.pe(q, k, v, causal=True, dropout_p=dropout_p)
            y = y.transpose(1, 2)  # (B, T, H, hd)
        return self.resid_dropout(self.o_proj(y.reshape(b, t, self.n_head * self.head_dim)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.d_model
        self.up = nn.Linear(config.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, config.d_model, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, packed=None):
        x = x + self.attn(self.attn_norm(x), kv_cache, packed)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        if not isinstance(config, GPTConfig):
            raise TypeError(
                f"GPT takes a GPTConfig; got {type(config).__name__} (for a dict of its fields: "
                "GPT(GPTConfig.from_dict(d)))"
            )
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = build_absolute_embedding(
            config.pe, d_model=config.d_model, max_seq_len=config.max_seq_len
        )
        self.embed_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.final_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight
        self.apply(lambda module: self._init_module(module, config))  # children first, as nn.Module.apply
        if config.init == "gpt2":
            for name, param in self.named_parameters():  # GPT-2's scaled init of residual projections
                if name.endswith(("o_proj.weight", "down.weight")):
                    nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_module(self, module: nn.Module, config: GPTConfig) -> None:
        """One module's weight by ``config.init`` (GPTConfig.init); the order of the draws is nn.Module.apply's,
        so a seed gives the same "gpt2" weights as it always has (a tied head is drawn twice, as before)."""
        if isinstance(module, nn.Embedding):
            std = 0.02 if config.init == "gpt2" else 1 / math.sqrt(config.d_model)
        elif isinstance(module, nn.Linear):
            if config.init == "fan-in" and config.tie_embeddings and module is self.lm_head:
                return  # tied: the token embedding's init stands
            std = 0.02 if config.init == "gpt2" else math.sqrt(2 / (config.n_layer * module.in_features))
        else:
            return
        nn.init.normal_(module.weight, mean=0.0, std=std)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        cu_seqlens_host=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> logits (B, T, V) and the mean cross-entropy over targets != -100.

        Packed (cu_seqlens given): idx (total,) or (1, total) holds sequences end to end; cu_seqlens int32
        (n + 1,) on idx's device their cumulative lengths, max_seqlen an int >= the longest (flash-attn's varlen
        layout). Positions restart at 0 in every sequence and attention never crosses one, so the logits
        (idx's shape + (V,)) equal running each sequence alone; no KV cache. cu_seqlens is read on the host once
        to check it (a device sync), unless cu_seqlens_host, the same values as a numpy array or list of ints, is
        given (the trainer's packed batches pass it): then the checks read that and the forward syncs nothing.
        The unpacked forward has no sync."""
        packed = None
        if cu_seqlens_host is not None and cu_seqlens is None:
            raise ValueError("cu_seqlens_host is the host copy of cu_seqlens: pass cu_seqlens (on idx's device) too")
        if cu_seqlens is not None or max_seqlen is not None:
            if kv_cache is not None or idx.dim() not in (1, 2) or (idx.dim() == 2 and idx.shape[0] != 1):
                raise ValueError(
                    f"a packed forward takes idx (total,) or (1, total) and no KV cache; got idx of "
                    f"shape {tuple(idx.shape)}{' and a KV cache' if kv_cache is not None else ''}"
                )
            packed = PackedSequences.build(cu_seqlens, max_seqlen, idx.numel(), idx.device, cu_seqlens_host)
        if idx.dtype not in (torch.int64, torch.int32) or (idx.dim() != 2 and packed is None):
            raise TypeError(f"idx must be a (batch, seq) integer tensor; got {idx.dtype} of shape {tuple(idx.shape)}")
        self._check_call(idx, targets)
        if kv_cache is not None:
            self._check_cache(kv_cache, idx)
        tokens = idx.view(1, -1) if packed is not None else idx
        b, t = tokens.shape
        start = kv_cache.length if kv_cache is not None else 0
        x = self.token_embedding(tokens)  # (B, T, C)
        if self.position_embedding is not None:
            x = x + (
                self.position_embedding(start, t, idx.device)
                if packed is None
                else self.position_embedding.packed(packed)
            )
        x = self.embed_dropout(x)
        for block in self.blocks:
            x = block(x, kv_cache, packed)
        if kv_cache is not None:
            kv_cache.advance(t)
        logits = self.lm_head(self.final_norm(x)).view(*idx.shape, -1)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=-100)
        return logits, loss

    def _check_cache(self, cache: KVCacheInterface, idx: torch.Tensor) -> None:
        """A key/value cache (KVCacheInterface) that fits this model and idx (KVCache checks its layers, heads, head
        size, idx's batch and device: metadata only)."""
        if not isinstance(cache, KVCacheInterface):
            raise TypeError(f"kv_cache must be a KVCache (model.new_kv_cache(...)); got {type(cache).__name__}")
        cache.check_fits(self.config, idx)

    def _check_call(self, idx: torch.Tensor, targets: torch.Tensor | None) -> None:
        """What forward's inputs must be beyond their dtype: no empty sequence, on the model's device, targets of
        idx's shape as int64 class ids, and every id in range. Shapes, dtypes and devices are metadata (free, and
        constant to torch.compile). The id ranges are values: they are read only from CPU tensors outside
        torch.compile, where reading them costs no device synchronisation; a CUDA forward is never made to sync
        (the trainer checks every token id of its data before training, the evaluation tools theirs, generate() its
        prompt; a bad id on CUDA ends in torch's device-side assertion)."""
        if idx.shape[-1] == 0:
            raise ValueError(f"idx has no tokens (shape {tuple(idx.shape)}); give at least one token per sequence")
        weight = self.token_embedding.weight
        if idx.device != weight.device and weight.device.type != "meta":
            raise ValueError(
                f"idx is on {idx.device} but the model is on {weight.device}; move one to the other "
                f"(idx.to('{weight.device}') or model.to('{idx.device}'))"
            )
        if targets is not None:
            if not isinstance(targets, torch.Tensor) or targets.shape != idx.shape:
                shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
                raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}; got {shape}")
            if targets.dtype not in (torch.int64, torch.uint8):  # what cross_entropy takes as class ids
                raise TypeError(
                    f"targets must be int64 token ids (-100 for positions left out of the loss); got {targets.dtype}: "
                    "pass targets.long()"
                )
            if targets.device != idx.device:
                raise ValueError(f"targets are on {targets.device} but idx is on {idx.device}; put them on one device")
        check_token_ids(idx, self.config.vocab_size, name="idx")
        if targets is not None:
            check_token_ids(targets, self.config.vocab_size, name="targets", ignore=-100)

    def new_kv_cache(self, batch_size: int, max_len: int, device=None, dtype=None) -> KVCache:
        param = self.token_embedding.weight
        return KVCache(self.config, batch_size, max_len, device=device or param.device, dtype=dtype or param.dtype)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample max_new_tokens after the prompt idx (B, T) of token ids in [0, vocab_size) with a KV cache;
        temperature 0 is greedy. Returns (B, T + max_new_tokens)."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise TypeError(
                f"generate() takes the prompt as a (batch, seq) integer tensor of token ids; got {shape}"
                f"{f' {idx.dtype}' if isinstance(idx, torch.Tensor) else ''} (one prompt: idx[None])"
            )
        if idx.shape[1] == 0:
            raise ValueError("generate() needs a prompt of at least one token per sequence")
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"prompt token ids must lie in [0, {self.config.vocab_size}) (the model's vocab_size); "
                f"got ids from {low} to {high}: encode the prompt with the model's own tokenizer"
            )
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int; got {max_new_tokens!r}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be non-negative (0 is greedy); got {temperature!r}")
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise ValueError(f"top_k must be a positive int or None; got {top_k!r}")
        cache = self.new_kv_cache(idx.shape[0], idx.shape[1] + max_new_tokens)
        logits, _ = self(idx, kv_cache=cache)
        out = [idx]
        for _ in range(max_new_tokens):
            next_logits = logits[:, -1, :].float()
            if temperature == 0:
                token = next_logits.argmax(dim=-1, keepdim=True)
            else:
                next_logits = next_logits / temperature
                if top_k is not None:
                    kth = torch.topk(next_logits, min(top_k, next_logits.shape[-1])).values[:, -1:]
                    next_logits = next_logits.masked_fill(next_logits < kth, float("-inf"))
                token = torch.multinomial(F.softmax(next_logits, dim=-1), 1, generator=generator)
            out.append(token)
            logits, _ = self(token, kv_cache=cache)
        return torch.cat(out, dim=1)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (shared tensors once); non_embedding leaves out token/position embeddings."""
        total = sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
        if non_embedding:
            total -= self.token_embedding.weight.numel()
            if self.position_embedding is not None and self.position_embedding.kind == "learned":
                total -= self.position_embedding.weight.numel()
        return total

    def estimate_flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward = 3 × forward).

        Matmuls: 6 × (non-embedding params + the output projection V·C). Attention: per layer 2·T·C for
        QK^T (× the encoding's QK channel factor: 2 for PoPE) and 2·T·C for AV, each × 3, without the
        causal halving (as in the PaLM/nanoGPT convention).
        """
        cfg = self.config
        t = seq_len or cfg.max_seq_len
        dense = 6 * (self.num_params(non_embedding=True) + cfg.vocab_size * cfg.d_model)
        qk_factor = self.blocks[0].attn.pe.qk_channel_factor
        attention = cfg.n_layer * 6 * t * cfg.d_model * (qk_factor + 1)
        return float(dense + attention)
