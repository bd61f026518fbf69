"""pope: Polar Coordinate Positional Embeddings for Transformer attention.

    import torch, pope
    out = pope.pope_attention(q, k, v, delta)                   # functional, (B, H, N, d)
    layer = pope.PoPE(n_heads=8, n_kv_heads=8, head_dim=64)      # owns delta, calls pope_attention
    model = pope.GPT(pope.GPTConfig(vocab_size=..., n_layer=..., n_head=..., d_model=..., max_seq_len=..., pe="pope"))
"""
from pope.attention import pope_attention
from pope.encodings import (
    PoPE,
    PositionalEncoding,
    RoPE,
    build_positional_encoding,
    describe_positional_encoding,
    list_positional_encodings,
)
from pope.model import GPT, GPTConfig, KVCache
from pope.presets import Preset, Recipe, get_preset, list_presets
from pope.version import __version__

__all__ = [
    "GPT", "GPTConfig", "KVCache", "PoPE", "PositionalEncoding", "Preset", "Recipe", "RoPE", "__version__",
    "build_positional_encoding", "describe_positional_encoding", "get_preset", "list_positional_encodings",
    "list_presets", "pope_attention",
]
