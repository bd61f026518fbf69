"""The baseline encodings PoPE is compared with: RoPE and its context-extension variants (YaRN, linear
interpolation, NTK), ALiBi, and model-level absolute embeddings (learned, sinusoidal)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from pope.attention import (
    sdpa,
)
from pope.encodings.base import PackedSequences, PositionalEncoding
from pope.frequencies import (
    angles,
    cos_sin_table,
    linear_interpolation_frequencies,
    ntk_frequencies,
    rope_frequencies,
    yarn_frequencies,
)


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
        if not (isinstance(base, (int, float)) and not isinstance(base, bool) and math.isfinite(base) and base > 0):
            raise ValueError(f"RoPE base must be a positive finite number; got {base!r}")
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
        self.register_buffer("slopes", self._head_slopes(), persistent=False)  # (H,) fp32

    def _head_slopes(self) -> torch.Tensor:
        n_biased = self.n_heads if self.heads == "all" else max(1, self.n_heads // 2)
        slopes = torch.zeros(self.n_heads)
        slopes[:n_biased] = alibi_slopes(n_biased)
        return slopes

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Recompute the slopes in place. They are a non-persistent buffer (no checkpoint holds them), so a loader
        that builds the module on the meta device and fills only the saved tensors calls this."""
        self.slopes.copy_(self._head_slopes())

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
