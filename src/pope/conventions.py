"""The conventions every attention backend shares: where the queries sit and the default softmax scale.

Query i sits at position q_offset + i, key j at position j; by default the queries are the last Nq of the Nk
positions (q_offset = Nk - Nq, as in a KV-cache decode) and softmax_scale = 1 / sqrt(head_dim). The API
(pope.attention), the reference and the operators (pope.ops) take these defaults from here, so they agree.
"""

from __future__ import annotations

import math

import torch


def resolve_defaults(
    q: torch.Tensor, k: torch.Tensor, q_offset: int | None, softmax_scale: float | None
) -> tuple[int, float]:
    """(q_offset, softmax_scale) with the defaults filled in, the one place they are computed: q_offset = Nk - Nq
    (the queries are the last Nq positions, as in a KV-cache decode), softmax_scale = 1 / sqrt(head_dim)."""
    q_offset = default_q_offset(q.shape[2], k.shape[2]) if q_offset is None else int(q_offset)
    softmax_scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    return q_offset, softmax_scale


def default_q_offset(seq_q: int, seq_k: int) -> int:
    return seq_k - seq_q
