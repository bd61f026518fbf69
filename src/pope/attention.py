"""`pope_attention`: the functional PoPE attention API, its input checks and backend dispatch.

Backends:
  "reference"  pure PyTorch: materialise the 2d-channel q'/k' (fp32 trigonometry, then the input dtype)
               and call scaled_dot_product_attention. Clear, differentiable, any device.
  "triton"     the fused Triton kernels (pope.ops / pope.kernels), CUDA only.
  "auto"       "triton" when the inputs are on CUDA, Triton is importable and the kernels can run the
               call; "reference" otherwise.

Score between the query at position t and the key at position s (r = rotary_dim, f = magnitude):
    softmax_scale * ( sum_{c<r} f(q_c) f(k_c) cos((s - t) theta_c + delta_c) + sum_{c>=r} q_c k_c )
which is the real dot product of
    q' = [f(q) cos(t theta - delta), f(q) sin(t theta - delta), q[r:]]
    k' = [f(k) cos(s theta),         f(k) sin(s theta),         k[r:]]
delta sits in the query phase so that k' does not depend on the query head (GQA shares keys).

The inputs are checked here, once, for every backend (the kernels' layer asks only whether it can run a call:
device, dtype, head dim); bad input is a ValueError or TypeError saying what is wrong. Masked keys do not count:
keys past every query's position are not read at all, and a key masked from a query (causal) reaches none of that
query's outputs whatever its values, NaN and inf included (the masks select, they do not add).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from pope.conventions import default_q_offset, resolve_defaults
from pope.frequencies import angles, pope_frequencies
from pope.magnitudes import MAGNITUDES
from pope.ops import triton_pope_attention, triton_pope_attention_varlen, triton_unsupported_reason

BACKENDS = ("auto", "reference", "triton")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Positions are 32-bit integers in the kernels (with room for a tile past the last one): q_offset + Nq below this.
MAX_POSITION = 2**30


def pope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    delta: torch.Tensor | None,
    *,
    base: float = 10000.0,
    causal: bool = True,
    softmax_scale: float | None = None,
    q_offset: int | None = None,
    magnitude: str = "softplus",
    rotary_dim: int | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """PoPE attention.

    q: (B, Hq, Nq, d); k, v: (B, Hkv, Nk, d) with Hq a multiple of Hkv (grouped-query attention) and
    Nq <= Nk; delta: (Hq, rotary_dim or d) key-phase bias (already in [-2π, 0]: pope.PoPE brings it there) or None.
    Query i sits at position q_offset + i (default Nk - Nq: the queries are the last Nq positions, as
    in a KV-cache decode), key j at position j; causal masking is by position (bottom-right aligned).
    softmax_scale defaults to 1/sqrt(d). Returns (B, Hq, Nq, d) in the dtype of q.
    """
    _check_inputs(
        q,
        k,
        v,
        delta,
        base=base,
        causal=causal,
        softmax_scale=softmax_scale,
        q_offset=q_offset,
        magnitude=magnitude,
        rotary_dim=rotary_dim,
        dropout_p=dropout_p,
        backend=backend,
    )
    q_offset, softmax_scale = resolve_defaults(q, k, q_offset, softmax_scale)
    if causal and q_offset + q.shape[2] < k.shape[2]:
        # Keys past the last query's position are masked from every query: not read at all (a preallocated cache
        # may hold anything there).
        k, v = k[:, :, : q_offset + q.shape[2]], v[:, :, : q_offset + q.shape[2]]
    options = dict(
        base=float(base),
        causal=causal,
        softmax_scale=softmax_scale,
        q_offset=q_offset,
        magnitude=magnitude,
        rotary_dim=rotary_dim,
    )
    return _run_backend(q, k, v, delta, backend, dropout_p, options)


def _run_backend(q, k, v, delta, backend: str, dropout_p: float, options: dict) -> torch.Tensor:
    """The checked call on the backend it asks for: the kernels where they can run it ("triton" raises saying why
    they cannot), else the reference. options: base, causal, softmax_scale, q_offset, magnitude, rotary_dim."""
    if backend != "reference":
        reason = _triton_unsupported_reason(q, k, v, rotary_dim=options["rotary_dim"], dropout_p=dropout_p)
        if reason is None:
            return triton_pope_attention(q, k, v, delta, **options, supported=True)
        if backend == "triton":
            raise ValueError(f"backend='triton' cannot run this call: {reason}. Use backend='reference' or 'auto'.")
    return reference_pope_attention(q, k, v, delta, dropout_p=dropout_p, **options)


def pope_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    delta: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
    base: float = 10000.0,
    magnitude: str = "softplus",
    backend: str = "auto",
) -> torch.Tensor:
    """PoPE attention over packed variable-length sequences, in flash-attn's `flash_attn_varlen_func` layout.

    q: (total_q, Hq, d); k, v: (total_k, Hkv, d), Hq a multiple of Hkv (GQA); delta: (Hq, d) or None.
    cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) cumulative lengths on q's device, starting at 0, non-decreasing,
    ending at total_q / total_k: sequence b is q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] against
    k, v[cu_seqlens_k[b]:cu_seqlens_k[b + 1]], with Nq_b <= Nk_b. max_seqlen_q / max_seqlen_k: ints at least every
    sequence's length (as flash-attn takes them). Positions restart at 0 in every sequence: its keys sit at
    0..Nk_b - 1, its queries at the last Nq_b positions (Nk_b - Nq_b + i), causal bottom-right per sequence.
    Returns (total_q, Hq, d) in q's dtype, equal to pope_attention called on each sequence alone (an empty
    sequence, Nq_b = 0, contributes no rows); no sequence's output or gradient depends on another's (finite) values.
    Differentiable in q, k and v (and delta) on every backend.

    Backends as pope_attention's. "triton" (and "auto" on CUDA) runs the fused kernels once for the whole batch: one
    launch per kernel, whatever the number of sequences, cu_seqlens never read on the host (no synchronisation,
    CUDA-graph safe); there the checks of cu_seqlens' values (start, order, end, max_seqlen bounds, Nq_b <= Nk_b)
    run on the device as one asynchronous torch._assert_async: bad values fail the next CUDA synchronisation with
    a device-side assertion (on CUDA without its message; the same call with CPU tensors or backend="reference"
    says which entry is wrong). Elsewhere
    ("reference", CPU, float64) one reference (pure PyTorch) call per non-empty sequence, the values checked on
    the host first (ValueError). "triton" on a call the kernels cannot run (device, dtype, head dim) is a
    ValueError saying why.
    """
    _check_tensors(q, k, v, 3, "(total_tokens, heads, head_dim)")
    (total_q, hq, d), (total_k, hkv, dk) = q.shape, k.shape
    if dk != d:
        raise ValueError(f"q has head_dim {d} but k/v have head_dim {dk}")
    if hq == 0 or d == 0:
        raise ValueError(f"empty input: q has shape {tuple(q.shape)}; heads and head_dim must be >= 1")
    if hkv == 0 or hq % hkv:
        raise ValueError(
            f"query heads ({hq}) must be a multiple of key/value heads ({hkv}) for grouped-query attention"
        )
    _check_options(
        q,
        delta,
        hq=hq,
        d=d,
        base=base,
        causal=causal,
        softmax_scale=softmax_scale,
        magnitude=magnitude,
        rotary_dim=None,
        backend=backend,
    )
    for name, cu_seqlens in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_cu_seqlens(name, cu_seqlens, q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"cu_seqlens_q describes {cu_seqlens_q.numel() - 1} sequences but cu_seqlens_k "
            f"{cu_seqlens_k.numel() - 1}; they must have the same length (batch + 1)"
        )
    for name, bound, total in (("max_seqlen_q", max_seqlen_q, total_q), ("max_seqlen_k", max_seqlen_k, total_k)):
        if not _is_int(bound):
            raise TypeError(f"{name} must be an int (the longest sequence's length); got {bound!r}")
        if bound > MAX_POSITION:
            raise ValueError(f"{name}={bound}: positions must stay below 2**30")
        if bound < 1 and total > 0:
            raise ValueError(
                f"{name}={bound} but the packed tensor has {total} tokens; pass the longest sequence's length (or more)"
            )
    softmax_scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    options = dict(base=float(base), causal=causal, softmax_scale=softmax_scale, magnitude=magnitude)
    if backend != "reference":
        reason = _triton_unsupported_reason(q, k, v, rotary_dim=None, dropout_p=0.0)
        if reason is None:
            if q.device.type == "cuda":
                _assert_packing_on_device(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k)
            else:  # (CPU tensors: the kernels under Triton's interpreter) host reads cost no synchronisation
                _packed_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k)
            if total_q == 0:
                return q[:0] * 1  # (0, Hq, d), still part of q's graph
            return triton_pope_attention_varlen(
                q, k, v, delta, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options
            )
        if backend == "triton":
            raise ValueError(f"backend='triton' cannot run this call: {reason}. Use backend='reference' or 'auto'.")
    return _varlen_reference(q, k, v, delta, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options)


def _varlen_reference(q, k, v, delta, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options):
    """pope_attention_varlen as one reference pope_attention call per non-empty sequence (lengths read on the host)."""
    lengths_q, lengths_k = _packed_lengths(
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


def check_cu_seqlens(name: str, cu_seqlens, device, tokens: str = "q") -> None:
    """What a cumulative-length tensor must be, checked without reading it: int32, 1-D, >= 2 entries, on device
    (the device of the packed tensor named `tokens`)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 cumulative lengths; got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{name} must be int32 (flash-attn's layout); got {cu_seqlens.dtype}: use .to(torch.int32)")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries; got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(f"{name} is on {cu_seqlens.device} but {tokens} is on {device}")


def _packed_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
    """(lengths_q, lengths_k) of a packed batch, read on the host, after checking its values: each cumulative
    length from 0, non-decreasing, ending at its total; max_seqlen_* at least every length; Nq_b <= Nk_b."""
    lengths_q = sequence_lengths("cu_seqlens_q", cu_seqlens_q, total_q)
    lengths_k = sequence_lengths("cu_seqlens_k", cu_seqlens_k, total_k)
    check_max_seqlen("max_seqlen_q", max_seqlen_q, lengths_q)
    check_max_seqlen("max_seqlen_k", max_seqlen_k, lengths_k)
    for index, (nq, nk) in enumerate(zip(lengths_q, lengths_k)):
        if nq > nk:
            raise ValueError(
                f"sequence {index} has {nq} queries but only {nk} keys: each sequence's queries must be "
                f"its last Nq <= Nk positions"
            )
    return lengths_q, lengths_k


def _assert_packing_on_device(
    cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q: int, max_seqlen_k: int
) -> None:
    """_packed_lengths' checks as one asynchronous device-side assertion (no host synchronisation)."""
    lengths_q, lengths_k = cu_seqlens_q.diff(), cu_seqlens_k.diff()
    bad = ((lengths_q < 0) | (lengths_q > lengths_k) | (lengths_q > max_seqlen_q) | (lengths_k > max_seqlen_k)).any()
    bad = (
        bad
        | (cu_seqlens_q[0] != 0)
        | (cu_seqlens_k[0] != 0)
        | (cu_seqlens_q[-1] != total_q)
        | (cu_seqlens_k[-1] != total_k)
    )
    torch._assert_async(
        ~bad,
        "pope_attention_varlen: cu_seqlens_q / cu_seqlens_k must start at 0, be non-decreasing "
        "and end at total_q / total_k, every length at most max_seqlen_q / max_seqlen_k and "
        "Nq_b <= Nk_b",
    )


def check_max_seqlen(name: str, bound: int, lengths: list[int]) -> None:
    """A max_seqlen argument must be at least every sequence's length."""
    longest = max(lengths, default=0)
    if bound < longest:
        raise ValueError(
            f"{name}={bound} is smaller than sequence {lengths.index(longest)}'s length {longest}; "
            f"pass the longest length (or more)"
        )


def sequence_lengths(name: str, cu_seqlens, total: int) -> list[int]:
    """The lengths a (checked) cumulative-length tensor describes, read on the host, after checking its values:
    from 0, non-decreasing, ending at total."""
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0:
        raise ValueError(f"{name} must start at 0; got {bounds[0]}")
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if any(n < 0 for n in lengths):
        index = next(i for i, n in enumerate(lengths) if n < 0)
        raise ValueError(
            f"{name} must be non-decreasing; entry {index + 1} ({bounds[index + 1]}) < entry {index} ({bounds[index]})"
        )
    if bounds[-1] != total:
        raise ValueError(
            f"{name} ends at {bounds[-1]} but the packed tensor has {total} tokens; the last entry must "
            f"be the total length"
        )
    return lengths


def _prefix_sums(lengths: list[int]) -> list[int]:
    starts, total = [], 0
    for n in lengths:
        starts.append(total)
        total += n
    return starts


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
    # SDPA's is_causal is top-left aligned, which is only right when queries and keys coincide.
    use_fused_causal = causal and attn_bias is None and nq == nk and q_offset == 0
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


def _triton_unsupported_reason(q, k, v, *, rotary_dim, dropout_p) -> str | None:
    """Why the Triton backend cannot run this call, or None when it can ("auto" takes it on CUDA only)."""
    if q.device.type != "cuda":
        return f"the Triton kernels run on CUDA tensors only (got device {q.device})"
    return triton_unsupported_reason(q, k, v, rotary_dim=rotary_dim, dropout_p=dropout_p)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_inputs(q, k, v, delta, *, base, causal, softmax_scale, q_offset, magnitude, rotary_dim, dropout_p, backend):
    _check_tensors(q, k, v, 4, "(batch, heads, seq, head_dim)")
    (b, hq, nq, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if bk != b:
        raise ValueError(f"q has batch {b} but k/v have batch {bk}")
    if dk != d:
        raise ValueError(f"q has head_dim {d} but k/v have head_dim {dk}")
    if hkv == 0 or hq % hkv:
        raise ValueError(
            f"query heads ({hq}) must be a multiple of key/value heads ({hkv}) for grouped-query attention"
        )
    if nq == 0 or nk == 0:
        raise ValueError(f"empty sequence: q has {nq} positions, k has {nk}")
    if b == 0 or hq == 0 or d == 0:
        raise ValueError(f"empty input: q has shape {tuple(q.shape)}; batch, heads and head_dim must be >= 1")
    if nq > nk:
        raise ValueError(f"q has {nq} positions but k/v only {nk}: queries must be the last Nq <= Nk positions")
    _check_options(
        q,
        delta,
        hq=hq,
        d=d,
        base=base,
        causal=causal,
        softmax_scale=softmax_scale,
        magnitude=magnitude,
        rotary_dim=rotary_dim,
        backend=backend,
    )
    if q_offset is not None:
        if not _is_int(q_offset):
            raise TypeError(f"q_offset must be an int (position of the first query) or None; got {q_offset!r}")
        if q_offset < 0:
            raise ValueError(f"q_offset must be a non-negative int (position of the first query); got {q_offset!r}")
        if q_offset + nq > MAX_POSITION:
            raise ValueError(
                f"q_offset {q_offset} puts the last query at position {q_offset + nq - 1}; positions must "
                f"stay below 2**30 (q_offset <= {MAX_POSITION - nq})"
            )
    if not _is_real(dropout_p):
        raise TypeError(f"dropout_p must be a number; got {dropout_p!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")


def _check_tensors(q, k, v, dims: int, layout: str) -> None:
    """q, k, v: tensors of one float dtype and one device, with `dims` dims (layout names them)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64; got {t.dtype}")
        if t.dim() != dims:
            raise ValueError(f"{name} must have {dims} dims {layout}; got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape {layout}; got {tuple(k.shape)} and {tuple(v.shape)}")


def _check_options(q, delta, *, hq, d, base, causal, softmax_scale, magnitude, rotary_dim, backend) -> None:
    """The options shared by pope_attention and pope_attention_varlen: causal, magnitude, backend, rotary_dim,
    delta (hq, r), base, softmax_scale."""
    if type(causal) is not bool:
        raise TypeError(f"causal must be True or False; got {causal!r}")
    if not isinstance(magnitude, str) or magnitude not in MAGNITUDES:
        raise ValueError(f"unknown magnitude {magnitude!r}; choose one of {sorted(MAGNITUDES)}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if rotary_dim is not None and not (_is_int(rotary_dim) and 0 < rotary_dim <= d):
        raise ValueError(f"rotary_dim must be an int in [1, head_dim={d}] or None; got {rotary_dim!r}")
    r = rotary_dim or d
    if delta is not None:
        if not isinstance(delta, torch.Tensor) or not delta.is_floating_point():
            raise TypeError(f"delta must be a floating-point tensor of shape ({hq}, {r}) or None")
        if tuple(delta.shape) != (hq, r):
            raise ValueError(f"delta must have shape (query_heads, rotary_dim) = ({hq}, {r}); got {tuple(delta.shape)}")
        if delta.device != q.device:
            raise ValueError(f"delta is on {delta.device} but q is on {q.device}")
    if not _is_real(base):
        raise TypeError(f"base must be a number; got {base!r}")
    if not (base > 0 and math.isfinite(base)):
        raise ValueError(f"base must be a positive finite number; got {base!r}")
    if softmax_scale is not None:
        if not _is_real(softmax_scale):
            raise TypeError(f"softmax_scale must be a number or None; got {softmax_scale!r}")
        if not (softmax_scale > 0 and math.isfinite(softmax_scale)):
            raise ValueError(f"softmax_scale must be positive and finite; got {softmax_scale!r}")
