"""`PoPE`, Polar Coordinate Positional Embedding for one attention layer (its key-phase bias delta kept in
[-2π, 0]), the projection of delta after optimizer steps (`projected_deltas`, `project_deltas_`), and how much of a
model's delta lies outside [-2π, 0] (`learned_deltas`, `delta_outside`, `delta_outside_counts`)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from pope.attention import (
    BACKENDS,
    MAGNITUDES,
    pope_attention,
    pope_attention_varlen,
)
from pope.encodings.base import PackedSequences, PositionalEncoding

TWO_PI = 2 * math.pi
DELTA_RANGES = ("clamp", "wrap", "project")
"""How PoPE keeps delta in [-2π, 0] (PoPE's docstring)."""


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
      backend        "auto", "cudnn", "flash-attn-4", "reference" or "triton" (pope.attention)
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
        if not (isinstance(base, (int, float)) and not isinstance(base, bool) and math.isfinite(base) and base > 0):
            raise ValueError(f"PoPE base must be a positive finite number; got {base!r}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown PoPE backend {backend!r}; choose one of {', '.join(BACKENDS)}")
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


def learned_deltas(model: nn.Module):
    """(block index, PoPE module, δ as a whole (n_head, F) tensor on the CPU) for every PoPE layer with a learned δ of
    a model whose attention layers are ``model.blocks[i].attn`` (pope.model.GPT). Under FSDP2 δ is a sharded
    DTensor, gathered here: a collective, so every rank must call this."""
    for index, block in enumerate(model.blocks):
        pe = block.attn.pe
        if isinstance(pe, PoPE) and pe.delta is not None:
            raw = pe.delta.detach()
            yield index, pe, (raw.full_tensor() if hasattr(raw, "full_tensor") else raw).cpu()


def delta_outside(raw: torch.Tensor) -> tuple[int, int]:
    """(entries of δ below −2π, entries above 0)."""
    # compared in δ's own dtype, as the clamp compares it: -2π rounded to fp32 lies below -2π and is inside
    return int((raw < -TWO_PI).sum()), int((raw > 0).sum())


def delta_outside_counts(model: nn.Module) -> dict:
    """{"delta_below": entries below −2π, "delta_above": entries above 0} over every PoPE layer with a learned δ
    (the trainer logs them at each evaluation; pope.eval.delta_state reports them per layer); {} when there is none.
    A collective under FSDP2 (every rank)."""
    counts = [delta_outside(raw) for _, _, raw in learned_deltas(model)]
    if not counts:
        return {}
    return {"delta_below": sum(below for below, _ in counts), "delta_above": sum(above for _, above in counts)}
