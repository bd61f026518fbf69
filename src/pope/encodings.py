"""Positional encodings behind one interface, and the registry that builds them from config strings.

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

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from pope.attention import (
    MAGNITUDES,
    check_cu_seqlens,
    check_max_seqlen,
    pope_attention,
    pope_attention_varlen,
    sdpa,
    sequence_lengths,
)
from pope.frequencies import (
    angles,
    cos_sin_table,
    linear_interpolation_frequencies,
    ntk_frequencies,
    rope_frequencies,
    yarn_frequencies,
)

TWO_PI = 2 * math.pi
DELTA_RANGES = ("clamp", "wrap", "project")
"""How PoPE keeps delta in [-2π, 0] (PoPE's docstring)."""


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


class PositionalEncoding(nn.Module):
    """Base class: a relative positional encoding that computes attention for one layer."""

    #: QK channels per head channel (PoPE's score is a 2d-channel product) — used for FLOP counts.
    qk_channel_factor: float = 1.0

    def __init__(self, *, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
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
        if q.shape[1] != self.n_heads or q.shape[-1] != self.head_dim or k.shape[1] != self.n_kv_heads:
            raise ValueError(
                f"{type(self).__name__} was built for {self.n_heads} query heads, {self.n_kv_heads} kv heads and "
                f"head_dim {self.head_dim}; got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )


class NoPE(PositionalEncoding):
    """No positional information in attention (causal masking alone); also the attention of absolute encodings."""

    def forward(self, q, k, v, *, q_offset=None, causal=True, dropout_p=0.0):
        self._check(q, k)
        return sdpa(q, k, v, causal=causal, softmax_scale=self.softmax_scale, q_offset=q_offset, dropout_p=dropout_p)


class PoPE(PositionalEncoding):
    """Polar Coordinate Positional Embedding for one attention layer.

    Owns the key-phase bias delta (n_heads, rotary_dim), brought into [-2π, 0] in the forward pass, and
    calls `pope.pope_attention`. Options:
      base           frequency base (theta_c = base^(-(c-1)/d))
      magnitude      "softplus" (paper), "relu" or "identity" (ablations)
      delta_init     "zero" (best for length extrapolation) or "uniform" (U(-2π, 0))
      delta_range    how delta is kept in [-2π, 0] (the paper clamps it, not saying how): "clamp" (in the
                     forward pass: an entry that steps outside gets no gradient again and stays there), "wrap"
                     (delta modulo 2π: the same scores, cos being 2π-periodic, with the gradient never cut; equal
                     to "clamp" while delta is inside) or "project" (the parameter itself clamped in place after
                     every optimizer step, by `project_deltas_`, which pope's trainer calls: an entry pushed past
                     a bound is put back on it, inside, where it keeps its gradient and can move back; the
                     forward pass clamps as "clamp" does, which changes nothing once delta is projected)
      use_delta      False removes delta (ablation)
      rotary_dim     apply PoPE to the first rotary_dim channels only; the rest are a plain dot product
      softmax_scale  the logits' scale; None = 1/sqrt(head_dim) (d, not PoPE's 2d QK channels: the paper does
                     not state it)
      backend        "auto", "reference" or "triton"
    """

    def __init__(
        self,
        *,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        base: float = 10000.0,
        magnitude: str = "softplus",
        delta_init: str = "zero",
        delta_range: str = "clamp",
        use_delta: bool = True,
        rotary_dim: int | None = None,
        softmax_scale: float | None = None,
        backend: str = "auto",
    ):
        super().__init__(n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        if magnitude not in MAGNITUDES:
            raise ValueError(f"unknown PoPE magnitude {magnitude!r}; choose one of {sorted(MAGNITUDES)}")
        if delta_init not in ("zero", "uniform"):
            raise ValueError(f"unknown PoPE delta_init {delta_init!r}; choose 'zero' or 'uniform'")
        if delta_range not in DELTA_RANGES:
            raise ValueError(f"unknown PoPE delta_range {delta_range!r}; choose one of {', '.join(DELTA_RANGES)}")
        if softmax_scale is not None and not (math.isfinite(softmax_scale) and softmax_scale > 0):
            raise ValueError(
                f"PoPE softmax_scale must be a positive number (or none for 1/sqrt(head_dim)); got {softmax_scale}"
            )
        if rotary_dim is not None and not 0 < rotary_dim <= head_dim:
            raise ValueError(f"PoPE rotary_dim must be in [1, head_dim={head_dim}]; got {rotary_dim}")
        if not base > 0:
            raise ValueError(f"PoPE base must be positive; got {base}")
        self.base, self.magnitude, self.delta_init, self.backend = float(base), magnitude, delta_init, backend
        self.delta_range = delta_range
        self._softmax_scale = super().softmax_scale if softmax_scale is None else float(softmax_scale)
        self.rotary_dim = rotary_dim if rotary_dim not in (None, head_dim) else None
        rotated = self.rotary_dim or head_dim
        self.qk_channel_factor = (2 * rotated + head_dim - rotated) / head_dim
        if use_delta:
            self.delta = nn.Parameter(torch.zeros(n_heads, rotated))
            self.reset_parameters()
        else:
            self.register_parameter("delta", None)

    def reset_parameters(self) -> None:
        if self.delta is not None:
            with torch.no_grad():
                if self.delta_init == "uniform":
                    self.delta.uniform_(-TWO_PI, 0.0)
                else:
                    self.delta.zero_()

    @property
    def softmax_scale(self) -> float:
        return self._softmax_scale  # a float fixed at construction: torch.compile traces it as a constant

    def bounded_delta(self) -> torch.Tensor | None:
        """delta as the score uses it, in [-2π, 0]: clamped ("clamp", "project": zero gradient outside the
        interval, where a projected delta never is) or wrapped modulo 2π ("wrap": gradient 1 everywhere; values
        inside the interval pass unchanged)."""
        if self.delta is None:
            return None
        if self.delta_range == "wrap":  # delta - 2π·ceil(delta / 2π): (-2π, 0] -> itself, exactly
            return self.delta - TWO_PI * torch.ceil(self.delta.detach() / TWO_PI)
        return self.delta.clamp(-TWO_PI, 0.0)

    def forward(self, q, k, v, *, q_offset=None, causal=True, dropout_p=0.0):
        return self._attend(q, k, v, self.magnitude, q_offset=q_offset, causal=causal, dropout_p=dropout_p)

    def cache_keys(self, k: torch.Tensor, start: int) -> torch.Tensor:
        """PoPE's keys reach the score only through their magnitudes f(k) (phases come from positions): the
        cache holds f(k) (d channels per key, RoPE's cache memory), so a decode step does not recompute f
        over the whole cache."""
        return self._magnitudes(k)

    def attend_cached(self, q, cached_k, v, *, q_offset=None, causal=True, dropout_p=0.0):
        return self._attend(
            self._magnitudes(q), cached_k, v, "identity", q_offset=q_offset, causal=causal, dropout_p=dropout_p
        )

    def forward_varlen(self, q, k, v, packed: PackedSequences, *, dropout_p: float = 0.0) -> torch.Tensor:
        """pope_attention_varlen (no padding compute) when it can run the layer: full rotary_dim and no dropout,
        which it does not take; otherwise the generic padded implementation."""
        if self.rotary_dim is not None or dropout_p > 0:
            return super().forward_varlen(q, k, v, packed, dropout_p=dropout_p)
        self._check(q, k)  # (total, H, d): heads at dim 1 as in forward's layout
        return pope_attention_varlen(
            q,
            k,
            v,
            self.bounded_delta(),
            packed.cu_seqlens,
            packed.cu_seqlens,
            packed.max_seqlen,
            packed.max_seqlen,
            causal=True,
            softmax_scale=self.softmax_scale,
            base=self.base,
            magnitude=self.magnitude,
            backend=self.backend,
        )

    def _attend(self, q, k, v, magnitude: str, *, q_offset, causal, dropout_p):
        """pope_attention with this layer's delta, base, rotary_dim and backend."""
        self._check(q, k)
        return pope_attention(
            q,
            k,
            v,
            self.bounded_delta(),
            base=self.base,
            causal=causal,
            q_offset=q_offset,
            softmax_scale=self.softmax_scale,
            magnitude=magnitude,
            rotary_dim=self.rotary_dim,
            dropout_p=dropout_p,
            backend=self.backend,
        )

    def _magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """f on the first rotary_dim channels (in float32, float64 for float64 input, as pope_attention computes
        it), the rest unchanged; returned in x's dtype."""
        if self.magnitude == "identity":
            return x
        rotated = self.rotary_dim or self.head_dim
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        magnitudes = MAGNITUDES[self.magnitude](x[..., :rotated].to(compute)).to(x.dtype)
        return magnitudes if rotated == self.head_dim else torch.cat([magnitudes, x[..., rotated:]], dim=-1)

    def extra_repr(self) -> str:
        return (
            f"heads={self.n_heads}, head_dim={self.head_dim}, base={self.base}, magnitude={self.magnitude}, "
            f"delta={'off' if self.delta is None else f'{self.delta_init}, {self.delta_range}'}, "
            f"rotary_dim={self.rotary_dim}, softmax_scale={self.softmax_scale:.4g}"
        )


def projected_deltas(model: nn.Module) -> list[nn.Parameter]:
    """The delta parameters of ``model``'s PoPE layers with ``delta_range="project"`` (those `project_deltas_`
    clamps), in module order; empty when there are none."""
    return [
        module.delta
        for module in model.modules()
        if isinstance(module, PoPE) and module.delta is not None and module.delta_range == "project"
    ]


@torch.no_grad()
def project_deltas_(deltas: nn.Module | list[torch.Tensor]) -> None:
    """Clamp delta in place into [-2π, 0]: every PoPE layer with ``delta_range="project"`` of a model, or the
    given parameters (`projected_deltas` of it). Call it after every optimizer step of such a model (pope's
    trainer does); in-place, so it can be captured in a CUDA graph with the step."""
    for delta in projected_deltas(deltas) if isinstance(deltas, nn.Module) else deltas:
        delta.clamp_(-TWO_PI, 0.0)


class RoPE(PositionalEncoding):
    """Rotary position embedding and its context-extension variants.

      base          frequency base
      layout        "half" (rotate-half, GPT-NeoX/Llama) or "interleaved" (adjacent pairs, GPT-J)
      rotary_dim    rotate the first rotary_dim channels only (even); "rope-half" uses head_dim // 2
      scaling       "none", "linear" (position interpolation), "ntk" (NTK-aware base) or "yarn"
      scale         context-extension factor s >= 1 (new context / original context)
      original_max_len, alpha, beta   YaRN's ramp (alpha=1, beta=32 as in the paper)
    YaRN multiplies the logits by (0.1 ln s + 1)^2, folded into softmax_scale.
    """

    def __init__(
        self,
        *,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        base: float = 10000.0,
        layout: str = "half",
        rotary_dim: int | None = None,
        scaling: str = "none",
        scale: float = 1.0,
        original_max_len: int = 1024,
        alpha: float = 1.0,
        beta: float = 32.0,
    ):
        super().__init__(n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        if layout not in ("half", "interleaved"):
            raise ValueError(f"unknown RoPE layout {layout!r}; choose 'half' or 'interleaved'")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            raise ValueError(
                f"RoPE rotates channel pairs: rotary_dim must be even and in [2, {head_dim}]; "
                f"got {rotary_dim} (head_dim {head_dim})"
            )
        self.base, self.layout, self.rotary_dim = float(base), layout, rotary_dim
        self.scaling, self.scale, self.original_max_len = scaling, float(scale), int(original_max_len)
        self.alpha, self.beta = float(alpha), float(beta)
        _, self.attention_factor = self.frequencies()  # validates the scaling options

    def frequencies(self, device=None) -> tuple[torch.Tensor, float]:
        """(rotary_dim // 2,) float32 frequencies and the attention factor.

        Computed on demand rather than stored as a buffer, so casting the model to bf16 cannot round them.
        """
        dim, base, s = self.rotary_dim, self.base, self.scale
        if self.scaling == "none":
            return rope_frequencies(dim, base, device), 1.0
        if self.scaling == "linear":
            return linear_interpolation_frequencies(dim, base, s, device), 1.0
        if self.scaling == "ntk":
            return ntk_frequencies(dim, base, s, device), 1.0
        if self.scaling == "yarn":
            return yarn_frequencies(dim, base, s, self.original_max_len, self.alpha, self.beta, device)
        raise ValueError(f"unknown RoPE scaling {self.scaling!r}; choose 'none', 'linear', 'ntk' or 'yarn'")

    @property
    def softmax_scale(self) -> float:
        return self.attention_factor**2 / math.sqrt(self.head_dim)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x (B, H, N, d) at positions (N,); trigonometry in fp32, result in x's dtype."""
        r = self.rotary_dim
        cos, sin = cos_sin_table(positions, self.frequencies(x.device)[0])  # (N, r/2) fp32 each
        with torch.autocast(device_type=x.device.type, enabled=False):
            xr = x[..., :r].float()
            if self.layout == "half":
                x1, x2 = xr[..., : r // 2], xr[..., r // 2 :]
                rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
            else:
                x1, x2 = xr[..., 0::2], xr[..., 1::2]
                rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        return torch.cat([rotated.to(x.dtype), x[..., r:]], dim=-1)

    def forward(self, q, k, v, *, q_offset=None, causal=True, dropout_p=0.0):
        return self.attend_cached(q, self.cache_keys(k, 0), v, q_offset=q_offset, causal=causal, dropout_p=dropout_p)

    def cache_keys(self, k: torch.Tensor, start: int) -> torch.Tensor:
        """RoPE's cache holds rotated keys (each rotated once, when it is stored)."""
        return self.rotate(k, torch.arange(k.shape[2], device=k.device) + start)

    def attend_cached(self, q, cached_k, v, *, q_offset=None, causal=True, dropout_p=0.0):
        self._check(q, cached_k)
        nq, nk = q.shape[2], cached_k.shape[2]
        q_offset = nk - nq if q_offset is None else q_offset
        q = self.rotate(q, torch.arange(nq, device=q.device) + q_offset)
        return sdpa(
            q, cached_k, v, causal=causal, softmax_scale=self.softmax_scale, q_offset=q_offset, dropout_p=dropout_p
        )

    def extra_repr(self) -> str:
        return (
            f"base={self.base}, layout={self.layout}, rotary_dim={self.rotary_dim}, scaling={self.scaling}, "
            f"scale={self.scale}"
        )


class ALiBi(PositionalEncoding):
    """Attention with linear biases (Press et al. 2022): score -= slope_h * (t - s).

    heads="all" gives every head its slope (geometric 2^(-8h/H')); heads="half" biases only the first
    half of the heads (with the slopes of an H/2-head model) and leaves the others position-free, as in
    the paper's "ALiBi on half the heads" baseline. Non-causal attention uses |t - s|.
    """

    def __init__(self, *, n_heads: int, n_kv_heads: int, head_dim: int, heads: str = "all"):
        super().__init__(n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        if heads not in ("all", "half"):
            raise ValueError(f"ALiBi heads must be 'all' or 'half'; got {heads!r}")
        self.heads = heads
        n_biased = n_heads if heads == "all" else max(1, n_heads // 2)
        slopes = torch.zeros(n_heads)
        slopes[:n_biased] = alibi_slopes(n_biased)
        self.register_buffer("slopes", slopes, persistent=False)  # (H,) fp32

    def forward(self, q, k, v, *, q_offset=None, causal=True, dropout_p=0.0):
        self._check(q, k)
        nq, nk = q.shape[2], k.shape[2]
        q_offset = nk - nq if q_offset is None else q_offset
        distance = torch.arange(nq, device=q.device)[:, None] + q_offset - torch.arange(nk, device=q.device)[None, :]
        distance = distance.float() if causal else distance.abs().float()  # (Nq, Nk); masked entries irrelevant
        bias = -self.slopes[:, None, None] * distance  # (H, Nq, Nk)
        return sdpa(
            q,
            k,
            v,
            causal=causal,
            softmax_scale=self.softmax_scale,
            q_offset=q_offset,
            attn_bias=bias.unsqueeze(0),
            dropout_p=dropout_p,
        )


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes: 2^(-8h/n) for h = 1..n, with the paper's rule for n not a power of two."""

    def power_of_two_slopes(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two_slopes(closest)
    if closest < n_heads:  # interleave slopes of the next power of two
        slopes += power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class AbsolutePositionEmbedding(nn.Module):
    """Absolute position embeddings added to token embeddings: forward(start, length) -> (length, d_model) for
    positions start .. start + length - 1 (Python ints, so the range check never synchronises with the device and
    the step stays capturable in a CUDA graph); `packed(packed)` -> (total, d_model) at each packed token's
    position in its own sequence."""

    def __init__(self, *, d_model: int, max_seq_len: int, kind: str = "learned"):
        super().__init__()
        if kind not in ("learned", "sinusoidal"):
            raise ValueError(f"absolute embedding kind must be 'learned' or 'sinusoidal'; got {kind!r}")
        self.kind, self.d_model, self.max_seq_len = kind, d_model, max_seq_len
        if kind == "learned":
            self.weight = nn.Parameter(torch.randn(max_seq_len, d_model) * 0.02)

    def forward(self, start: int, length: int, device: torch.device | None = None) -> torch.Tensor:
        if length:
            self._check_end(start + length)
        return self._embed(torch.arange(start, start + length, device=device))

    def packed(self, packed: PackedSequences) -> torch.Tensor:
        self._check_end(packed.max_seqlen)
        return self._embed(packed.positions)

    def _check_end(self, end: int) -> None:
        """Positions below `end` (an int) are asked for: learned embeddings exist below max_seq_len only."""
        if self.kind == "learned" and end > self.max_seq_len:
            raise ValueError(
                f"learned absolute position embeddings exist for positions < {self.max_seq_len}; "
                f"position {end - 1} was asked for (they cannot extrapolate)"
            )

    def _embed(self, positions: torch.Tensor) -> torch.Tensor:
        if self.kind == "learned":
            return self.weight[positions]
        phase = angles(
            positions, rope_frequencies(self.d_model + self.d_model % 2, 10000.0, positions.device)
        )  # (N, d/2)
        return torch.stack([phase.sin(), phase.cos()], dim=-1).flatten(-2)[:, : self.d_model]


# ---------------------------------------------------------------------------------------------------
# Registry
@dataclass(frozen=True)
class EncodingSpec:
    """A named encoding: the per-layer attention class, fixed options, and an optional absolute embedding."""

    layer: type[PositionalEncoding]
    description: str
    defaults: dict = field(default_factory=dict)
    absolute: str | None = None  # "learned" or "sinusoidal"
    option_rules: Callable[[dict, int], dict] | None = None  # fills options that depend on head_dim


_REGISTRY: dict[str, EncodingSpec] = {
    "pope": EncodingSpec(PoPE, "Polar Coordinate Positional Embedding (softplus magnitudes, position-only phases)"),
    "rope": EncodingSpec(RoPE, "Rotary position embedding (rotate-half layout by default)"),
    "rope-half": EncodingSpec(
        RoPE,
        "RoPE on the first half of each head's channels",
        option_rules=lambda o, d: {"rotary_dim": (d // 2) - (d // 2) % 2, **o},
    ),
    "yarn": EncodingSpec(
        RoPE, "RoPE with YaRN context extension (set scale and original_max_len)", {"scaling": "yarn"}
    ),
    "pi": EncodingSpec(RoPE, "RoPE with linear position interpolation (set scale)", {"scaling": "linear"}),
    "ntk": EncodingSpec(RoPE, "RoPE with NTK-aware base scaling (set scale)", {"scaling": "ntk"}),
    "alibi": EncodingSpec(ALiBi, "ALiBi linear biases on all heads"),
    "alibi-half": EncodingSpec(ALiBi, "ALiBi linear biases on half the heads", {"heads": "half"}),
    "nope": EncodingSpec(NoPE, "No positional encoding (causal mask only)"),
    "learned-abs": EncodingSpec(NoPE, "Learnable absolute position embeddings", absolute="learned"),
    "sinusoidal-abs": EncodingSpec(NoPE, "Sinusoidal absolute position embeddings", absolute="sinusoidal"),
}
_STRUCTURAL = {"self", "n_heads", "n_kv_heads", "head_dim"}


def list_positional_encodings() -> list[str]:
    return sorted(_REGISTRY)


def describe_positional_encoding(name: str) -> dict:
    """Options (with defaults) that `name` accepts in a config string."""
    spec = _spec(name)
    params = inspect.signature(spec.layer.__init__).parameters
    return {p: params[p].default for p in params if p not in _STRUCTURAL and p not in spec.defaults}


def parse_pe_spec(spec: str) -> tuple[str, dict]:
    """'name:key=value,key=value' -> (name, {key: value}), each value read by the type of the layer's
    option (pope.parsing: booleans true/false/yes/no/on/off/1/0, integers without a fraction, 'none' for
    optional values); unknown or repeated options are a ValueError listing the valid ones."""
    from pope.parsing import parse_assignments

    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"a positional-encoding spec must be a non-empty string like 'pope' or 'rope:base=500000'; got {spec!r}"
        )
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    items = [part.strip() for part in rest.split(",") if part.strip()]
    return name, parse_assignments(items, option_types(name), where=f"positional encoding {spec!r}", noun="option")


def option_types(name: str) -> dict:
    """{option: annotation} of the options that `name` accepts in a config string."""
    spec = _spec(name)
    hints = typing.get_type_hints(spec.layer.__init__)
    return {option: hints[option] for option in describe_positional_encoding(name)}


def build_positional_encoding(
    spec: str, *, n_heads: int, n_kv_heads: int | None = None, head_dim: int
) -> PositionalEncoding:
    """Build the per-layer encoding named by `spec` (see module docstring)."""
    name, options = parse_pe_spec(spec)
    entry = _REGISTRY[name]
    if entry.option_rules is not None:
        options = entry.option_rules(options, head_dim)
    return entry.layer(
        n_heads=n_heads, n_kv_heads=n_kv_heads or n_heads, head_dim=head_dim, **{**entry.defaults, **options}
    )


def build_absolute_embedding(spec: str, *, d_model: int, max_seq_len: int) -> AbsolutePositionEmbedding | None:
    """The model-level absolute embedding for `spec`, or None for relative encodings."""
    name, _ = parse_pe_spec(spec)
    kind = _REGISTRY[name].absolute
    return None if kind is None else AbsolutePositionEmbedding(d_model=d_model, max_seq_len=max_seq_len, kind=kind)


def _spec(name: str) -> EncodingSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown positional encoding {name!r}; valid names: {', '.join(list_positional_encodings())}"
        ) from None
