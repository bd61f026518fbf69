"""The positional-encoding interface: `PositionalEncoding` (one instance per attention layer), `PackedSequences`
(flash-attn's varlen layout for forward_varlen) and `NoPE` (attention without positional information)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from pope.attention import (
    check_cu_seqlens,
    check_max_seqlen,
    sdpa,
    sequence_lengths,
)


@dataclass(frozen=True)
class PackedSequences:
    """Sequences stored end to end along one token axis (flash-attn's varlen layout).

    cu_seqlens  int32 (n + 1,) cumulative lengths, 0 .. total, on the tokens' device
    max_seqlen  int >= every sequence's length (a Python int, so shapes built from it need no device sync)
    positions   int64 (total,) each token's position in its own sequence (0, 1, ...)
    sequence_ids int64 (total,) the sequence each token belongs to
    Build with `PackedSequences.build`, which checks the lengths: one host read of cu_seqlens, or none when the
    caller hands over a host copy of it.
    """

    cu_seqlens: torch.Tensor
    max_seqlen: int
    positions: torch.Tensor
    sequence_ids: torch.Tensor

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    @classmethod
    def build(
        cls, cu_seqlens: torch.Tensor, max_seqlen: int, total: int, device: torch.device, cu_seqlens_host=None
    ) -> PackedSequences:
        """Check cu_seqlens (int32, 1-D, on `device`, 0 .. total, non-decreasing) and max_seqlen (an int at least
        the longest length), then derive each token's position and sequence on the device.

        cu_seqlens_host: the same values already on the host (numpy array or list of ints, as the data loader that
        built cu_seqlens has them): checked instead, so cu_seqlens is never read back (no device sync); the caller
        guarantees both hold the same values (only the shapes are compared)."""
        check_cu_seqlens("cu_seqlens", cu_seqlens, device, tokens="the packed tokens")
        if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen < 1:
            raise TypeError(f"max_seqlen must be a positive int (the longest sequence's length); got {max_seqlen!r}")
        if cu_seqlens_host is None:
            lengths = sequence_lengths("cu_seqlens", cu_seqlens, total)  # the one host read of a packed forward
        elif isinstance(cu_seqlens_host, torch.Tensor):  # DDP/FSDP2 would move a tensor argument to the GPU
            raise TypeError(
                "cu_seqlens_host must be a numpy array or a list of ints (the host copy of cu_seqlens), "
                f"not a tensor; got {cu_seqlens_host.dtype} on {cu_seqlens_host.device}"
            )
        else:
            host = np.asarray(cu_seqlens_host)
            if host.shape != tuple(cu_seqlens.shape) or host.dtype.kind not in "iu":
                raise ValueError(
                    "cu_seqlens_host must be the integer host copy of cu_seqlens "
                    f"{tuple(cu_seqlens.shape)}; got {host.dtype} of shape {host.shape}"
                )
            lengths = sequence_lengths("cu_seqlens", host, total)
        check_max_seqlen("max_seqlen", max_seqlen, lengths)
        token = torch.arange(total, device=device)
        starts = cu_seqlens.long()
        sequence_ids = torch.searchsorted(starts[1:], token, right=True)  # (total,)
        return cls(cu_seqlens, max_seqlen, token - starts[sequence_ids], sequence_ids)


def check_head_layout(owner: str, *, n_heads, n_kv_heads, head_dim) -> None:
    """n_heads, n_kv_heads and head_dim are positive ints and n_heads a multiple of n_kv_heads; else a
    TypeError/ValueError naming ``owner``, the bad value and what would work."""
    for name, value in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{owner}: {name} must be an int; got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"{owner}: {name} must be a positive int; got {value}")
    if n_heads % n_kv_heads:
        divisors = [h for h in range(1, n_heads + 1) if n_heads % h == 0]
        raise ValueError(
            f"{owner}: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}) for grouped-query "
            f"attention (each kv head serves n_heads / n_kv_heads query heads); use n_kv_heads in {divisors}"
        )


class PositionalEncoding(nn.Module):
    """Base class: a relative positional encoding that computes attention for one layer."""

    #: QK channels per head channel (PoPE's score is a 2d-channel product) — used for FLOP counts.
    qk_channel_factor: float = 1.0

    def __init__(self, *, n_heads: int, n_kv_heads: int, head_dim: int):
        """Raises ValueError/TypeError here, at construction, for head counts no call could satisfy: positive ints
        with n_heads a multiple of n_kv_heads (grouped-query attention), so a wrong shape is not found only when
        the layer is first called."""
        super().__init__()
        check_head_layout(type(self).__name__, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def forward(self, q, k, v, *, q_offset: int | None = None, causal: bool = True, dropout_p: float = 0.0):
        raise NotImplementedError

    def cache_keys(self, k: torch.Tensor, start: int) -> torch.Tensor:
        """Keys (B, Hkv, T, d) at positions start .. start + T - 1 as a KV cache stores them; `attend_cached`
        reads them back. Raw keys here."""
        return k

    def attend_cached(
        self, q, cached_k, v, *, q_offset: int | None = None, causal: bool = True, dropout_p: float = 0.0
    ):
        """Attention over keys that went through `cache_keys` (a KV cache's content); same contract as forward."""
        return self(q, cached_k, v, q_offset=q_offset, causal=causal, dropout_p=dropout_p)

    def forward_varlen(self, q, k, v, packed: PackedSequences, *, dropout_p: float = 0.0) -> torch.Tensor:
        """Causal attention within each packed sequence: q (total, Hq, d), k, v (total, Hkv, d) -> (total, Hq, d),
        equal to `forward` on each sequence alone (positions restart at 0).

        Generic implementation: the sequences are scattered into a right-padded (n, H, max_seqlen, d) batch with
        zeros, `forward` runs on it and the real rows are gathered back. Causal masking keeps every query off its
        sequence's padding (it lies past the query), so no mask is needed; attention then costs the padded
        batch's, the projections and MLP only the real tokens'. Encodings with a packed kernel override this."""
        rows = (packed.sequence_ids, packed.positions)

        def padded(x: torch.Tensor) -> torch.Tensor:  # (total, H, d) -> (n, H, max_seqlen, d)
            out = x.new_zeros(packed.num_sequences, packed.max_seqlen, *x.shape[1:])
            out[rows] = x
            return out.transpose(1, 2)

        out = self(padded(q), padded(k), padded(v), causal=True, dropout_p=dropout_p)  # (n, Hq, max_seqlen, d)
        return out.transpose(1, 2)[rows]

    def _check(self, q, k) -> None:
        """Shapes only (no tensor values are read: nothing synchronises with the device)."""
        if q.dim() != k.dim() or q.dim() not in (3, 4):
            raise ValueError(
                f"{type(self).__name__} takes q, k, v of shape (batch, heads, seq, head_dim) (or (total, heads, "
                f"head_dim) packed); got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        if q.shape[1] != self.n_heads or q.shape[-1] != self.head_dim or k.shape[1] != self.n_kv_heads:
            hint = ""
            if q.dim() == 4 and q.shape[2] == self.n_heads and k.shape[2] == self.n_kv_heads:
                hint = (
                    ": these look like (batch, seq, heads, head_dim), flash-attn's layout; pass q.transpose(1, 2), "
                    "k.transpose(1, 2), v.transpose(1, 2)"
                )
            raise ValueError(
                f"{type(self).__name__} was built for {self.n_heads} query heads, {self.n_kv_heads} kv heads and "
                f"head_dim {self.head_dim}, in the layout (batch, heads, seq, head_dim); got q {tuple(q.shape)} and "
                f"k {tuple(k.shape)}{hint}"
            )


class NoPE(PositionalEncoding):
    """No positional information in attention (causal masking alone); also the attention of absolute encodings."""

    def forward(self, q, k, v, *, q_offset=None, causal=True, dropout_p=0.0):
        self._check(q, k)
        return sdpa(q, k, v, causal=causal, softmax_scale=self.softmax_scale, q_offset=q_offset, dropout_p=dropout_p)
