"""Positional encodings behind one interface (base), PoPE (polar), the baselines (baselines), and the registry that
builds them from config strings (registry).

Two kinds of encoding exist:
- relative encodings act inside attention. Each is a `PositionalEncoding`, one instance per attention
  layer, that turns raw per-head q, k, v into the attention output:
      forward(q (B,Hq,Nq,d), k (B,Hkv,Nk,d), v (B,Hkv,Nk,d), *, q_offset=None, causal=True, dropout_p=0.)
  Keys cover positions 0..Nk-1 (cached keys included); query i sits at q_offset + i (default Nk - Nq).
  Packed sequences (flash-attn's varlen layout, `PackedSequences`) go through
      forward_varlen(q (total,Hq,d), k (total,Hkv,d), v (total,Hkv,d), packed, *, dropout_p=0.)
  causal within each sequence, positions restarting at 0 in each: equal to `forward` on each sequence alone.
- absolute encodings are added to token embeddings once per model (`AbsolutePositionEmbedding`);
  their attention layers use `NoPE`.

Config strings name an encoding and options: "pope", "pope:delta_init=zero,magnitude=relu",
"rope:base=500000", "yarn:scale=4,original_max_len=1024", "alibi-half". `list_positional_encodings()`
gives the names; `describe_positional_encoding(name)` their options.
"""

from pope.encodings.base import NoPE, PackedSequences, PositionalEncoding
from pope.encodings.baselines import AbsolutePositionEmbedding, ALiBi, RoPE, alibi_slopes
from pope.encodings.polar import (
    DELTA_RANGES,
    TWO_PI,
    PoPE,
    delta_outside,
    delta_outside_counts,
    learned_deltas,
    project_deltas_,
    projected_deltas,
)
from pope.encodings.registry import (
    EncodingSpec,
    build_absolute_embedding,
    build_positional_encoding,
    describe_positional_encoding,
    list_positional_encodings,
    option_types,
    parse_pe_spec,
)

__all__ = [
    "DELTA_RANGES",
    "TWO_PI",
    "ALiBi",
    "AbsolutePositionEmbedding",
    "EncodingSpec",
    "NoPE",
    "PackedSequences",
    "PoPE",
    "PositionalEncoding",
    "RoPE",
    "alibi_slopes",
    "build_absolute_embedding",
    "build_positional_encoding",
    "delta_outside",
    "delta_outside_counts",
    "describe_positional_encoding",
    "learned_deltas",
    "list_positional_encodings",
    "option_types",
    "parse_pe_spec",
    "project_deltas_",
    "projected_deltas",
]
