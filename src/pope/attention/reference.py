"""The reference backend: pure PyTorch, any device, differentiable.

reference_pope_attention materialises the 2d-channel q' and k' (angles exactly range-reduced and trigonometry in
fp32, then the input dtype) and calls scaled_dot_product_attention (`sdpa`: grouped-query heads, bottom-right
causal alignment, masked keys never reaching an output); a packed batch runs one such call per sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pope.attention.checks import packed_lengths
from pope.conventions import default_q_offset
from pope.frequencies import angles, pope_frequencies
from pope.magnitudes import MAGNITUDES


def reference_pope_attention(
    q,
    k,
    v,
    delta,
    *,
    base,
    causal,
    softmax_scale,
    q_offset,
    magnitude,
    rotary_dim,
    dropout_p=0.0,
    position_shift: int = 0,
) -> torch.Tensor:
    """Reference PoPE (no input checks; call pope_attention for those).

    Angles (exactly range-reduced), trigonometry and magnitudes in float32 (float64 for float64 inputs); q'/k' are
    then cast to the input dtype, as a materialised implementation would feed them to a low-precision kernel.
    position_shift adds a constant to every query and key position (PoPE must not notice).
    """
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    r = rotary_dim or d
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    # float64 frequencies whatever the compute dtype: fp32 angles reduced exactly from them (pope.frequencies.angles),
    # within ~3e-7 rad of the float64 angles at any position; float64 inputs get the plain float64 product.
    theta = pope_frequencies(r, base, device=q.device, dtype=torch.float64)
    positions_q = torch.arange(nq, device=q.device) + (q_offset + position_shift)
    positions_k = torch.arange(nk, device=q.device) + position_shift
    with torch.autocast(device_type=q.device.type, enabled=False):
        # one call for both (the frequencies' turn words are computed once): rows :Nq are the queries'
        phases = angles(torch.cat([positions_q, positions_k]), theta, dtype=compute)  # (Nq + Nk, r)
        phase_q, phase_k = phases[:nq], phases[nq:]  # (Nq, r), (Nk, r)
        if delta is not None:
            phase_q = phase_q[None] - delta.to(compute)[:, None, :]  # (Hq, Nq, r)
        f = MAGNITUDES[magnitude].function
        mag_q = f(q[..., :r].to(compute))  # (B, Hq, Nq, r)
        mag_k = f(k[..., :r].to(compute))  # (B, Hkv, Nk, r)
        q_cart = torch.cat([mag_q * phase_q.cos(), mag_q * phase_q.sin(), q[..., r:].to(compute)], dim=-1)
        k_cart = torch.cat([mag_k * phase_k.cos(), mag_k * phase_k.sin(), k[..., r:].to(compute)], dim=-1)
    return sdpa(
        q_cart.to(q.dtype),
        k_cart.to(k.dtype),
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        q_offset=q_offset,
        dropout_p=dropout_p,
    )


def sdpa(
    q, k, v, *, causal: bool, softmax_scale: float, q_offset: int | None = None, attn_bias=None, dropout_p: float = 0.0
) -> torch.Tensor:
    """scaled_dot_product_attention with grouped-query heads and bottom-right causal alignment.

    q: (B, Hq, Nq, e); k: (B, Hkv, Nk, e); v: (B, Hkv, Nk, dv). Query i sits at position q_offset + i
    (default Nk - Nq), key j at j; causal: key j visible iff j <= q_offset + i.
    attn_bias: None or additive float bias broadcastable to (B, Hq, Nq, Nk).
    Uses the fused is_causal path when queries and keys are aligned, an explicit mask otherwise.
    """
    nq, nk = q.shape[2], k.shape[2]
    q_offset = default_q_offset(nq, nk) if q_offset is None else q_offset
    n_rep = q.shape[1] // k.shape[1]
    # SDPA's is_causal is top-left aligned, which is only right when queries and keys coincide. Decided by an `if`:
    # with dynamic shapes (a compiled model called at another length) the comparisons are symbolic, the branch makes
    # torch.compile guard on them, and SDPA gets the plain bool it takes.
    use_fused_causal = False
    if causal and attn_bias is None and nq == nk and q_offset == 0:
        use_fused_causal = True
    rows_seeing_bad_keys = None
    # An additive mask lets a masked key's NaN / inf into the scores; so does SDPA's math kernel under is_causal
    # (CPU, float64, or key and value widths that differ, as PoPE's 2d / d). Its CUDA flash and memory-efficient
    # kernels mask by assignment and are left alone (no extra pass over the keys on the training path).
    if causal and (not use_fused_causal or q.device.type != "cuda" or q.dtype == torch.float64):
        k, rows_seeing_bad_keys = _finite_masked_keys(k, q_offset, nq)
    if n_rep > 1:
        # (B, Hkv, Nk, e) -> (B, Hq, Nk, e): SDPA's own GQA path is not available on every backend.
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    mask = attn_bias
    if causal and not use_fused_causal:
        positions_q = torch.arange(nq, device=q.device) + q_offset
        visible = torch.arange(nk, device=q.device)[None, :] <= positions_q[:, None]  # (Nq, Nk)
        causal_bias = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, float("-inf"))
        mask = causal_bias if mask is None else mask.to(q.dtype) + causal_bias
    if mask is not None:
        mask = mask.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=use_fused_causal, scale=softmax_scale
    )
    if rows_seeing_bad_keys is not None:
        out = out.masked_fill(rows_seeing_bad_keys.repeat_interleave(n_rep, dim=1)[..., None], float("nan"))
    return out


def _finite_masked_keys(k: torch.Tensor, q_offset: int, seq_q: int):
    """An additive mask (score + -inf) turns a NaN or inf score into NaN: the keys that some query cannot see
    (positions > q_offset) get zeros wherever they are not finite, and the query rows that do see such a key come
    out NaN, as the formula gives them. Returns (k, rows (B, Hkv, Nq) bool, or None when there is nothing masked).
    Only keys past q_offset are looked at: none at all in a one-query decode step."""
    first = q_offset + 1
    if first >= k.shape[2]:
        return k, None
    tail = k[:, :, first:]
    bad = ~torch.isfinite(tail).all(dim=-1)  # (B, Hkv, Nk - first)
    k = torch.cat([k[:, :, :first], tail.masked_fill(bad[..., None], 0.0)], dim=2)
    index = torch.arange(bad.shape[-1], device=k.device)
    # (B, Hkv): tail index of the first bad key; past every query's reach where there is none
    first_bad = torch.where(bad, index, bad.shape[-1] + seq_q).amin(dim=-1)
    # query i (position q_offset + i) sees tail key m (position first + m) iff m <= i - 1
    rows = first_bad[..., None] <= torch.arange(seq_q, device=k.device) - 1
    return k, rows


def varlen_reference(q, k, v, delta, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options):
    """pope_attention_varlen as one reference pope_attention call per non-empty sequence (lengths read on the host)."""
    lengths_q, lengths_k = packed_lengths(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )
    starts_q, starts_k = _prefix_sums(lengths_q), _prefix_sums(lengths_k)
    pieces = []
    for start_q, nq, start_k, nk in zip(starts_q, lengths_q, starts_k, lengths_k):
        if nq == 0:
            continue
        # (1, H, N, d) views of this sequence: no copy.
        q_seq, k_seq, v_seq = (
            x[start : start + n].transpose(0, 1)[None]
            for x, start, n in ((q, start_q, nq), (k, start_k, nk), (v, start_k, nk))
        )
        out = reference_pope_attention(q_seq, k_seq, v_seq, delta, q_offset=nk - nq, rotary_dim=None, **options)
        pieces.append(out[0].transpose(0, 1))
    return torch.cat(pieces) if pieces else q[:0] * 1  # (0, Hq, d) still part of q's graph


def _prefix_sums(lengths: list[int]) -> list[int]:
    starts, total = [], 0
    for n in lengths:
        starts.append(total)
        total += n
    return starts
