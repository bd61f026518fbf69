"""pope: Polar Coordinate Positional Embeddings for Transformer attention.

    import torch, pope
    out = pope.pope_attention(q, k, v, delta)                   # functional, (B, H, N, d)
    layer = pope.PoPE(n_heads=8, n_kv_heads=8, head_dim=64)      # owns delta, calls pope_attention
    model = pope.GPT(pope.GPTConfig(vocab_size=..., n_layer=..., n_head=..., d_model=..., max_seq_len=..., pe="pope"))

Names are imported on first use, so `import pope` (and the data tools, which need no torch) stay light.
"""

from __future__ import annotations

import importlib

from pope.version import __version__

_EXPORTS = {
    "pope_attention": "pope.attention",
    "pope_attention_varlen": "pope.attention",
    "PoPE": "pope.encodings",
    "RoPE": "pope.encodings",
    "PositionalEncoding": "pope.encodings",
    "build_positional_encoding": "pope.encodings",
    "describe_positional_encoding": "pope.encodings",
    "list_positional_encodings": "pope.encodings",
    "GPT": "pope.model",
    "GPTConfig": "pope.model",
    "KVCache": "pope.model",
    "Preset": "pope.presets",
    "Recipe": "pope.presets",
    "get_preset": "pope.presets",
    "list_presets": "pope.presets",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next lookup is a plain attribute
    return value


def __dir__():
    return __all__
