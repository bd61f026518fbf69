"""The input checks of pope_attention and pope_attention_varlen, the one place a call is validated.

The inputs are checked here, once, for every backend (the kernels' layer asks only whether it can run a call:
device, dtype, head dim); bad input is a ValueError or TypeError saying what is wrong and what to do. A packed
batch's cumulative lengths are checked on the host, or on the device as one asynchronous assertion (no
synchronisation) where the fused kernels take the call.
"""

from __future__ import annotations

import math
import numbers

import torch

from pope.magnitudes import MAGNITUDES

BACKENDS = ("auto", "cudnn", "flash-attn-4", "reference", "triton")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Positions are 32-bit integers in the kernels (with room for a tile past the last one): q_offset + Nq below this.
MAX_POSITION = 2**30


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


def packed_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
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


def assert_packing_on_device(
    cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q: int, max_seqlen_k: int
) -> None:
    """packed_lengths' checks as one asynchronous device-side assertion (no host synchronisation)."""
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


def is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_inputs(q, k, v, delta, *, base, causal, softmax_scale, q_offset, magnitude, rotary_dim, dropout_p, backend):
    check_tensors(q, k, v, 4, "(batch, heads, seq, head_dim)")
    (b, hq, nq, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if bk != b:
        raise ValueError(f"q has batch {b} but k/v have batch {bk}")
    if dk != d:
        raise ValueError(f"q has head_dim {d} but k/v have head_dim {dk}")
    if hkv == 0 or hq % hkv:
        raise ValueError(
            f"query heads ({hq}) must be a multiple of key/value heads ({hkv}) for grouped-query attention"
            + layout_hint(q, k, delta)
        )
    if nq == 0 or nk == 0:
        raise ValueError(f"empty sequence: q has {nq} positions, k has {nk}")
    if b == 0 or hq == 0 or d == 0:
        raise ValueError(f"empty input: q has shape {tuple(q.shape)}; batch, heads and head_dim must be >= 1")
    if nq > nk:
        raise ValueError(
            f"q has {nq} positions but k/v only {nk}: queries must be the last Nq <= Nk positions"
            + layout_hint(q, k, delta)
        )
    check_options(
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
        k=k,
    )
    if q_offset is not None:
        if not is_int(q_offset):
            raise TypeError(f"q_offset must be an int (position of the first query) or None; got {q_offset!r}")
        if q_offset < 0:
            raise ValueError(f"q_offset must be a non-negative int (position of the first query); got {q_offset!r}")
        if q_offset + nq > MAX_POSITION:
            raise ValueError(
                f"q_offset {q_offset} puts the last query at position {q_offset + nq - 1}; positions must "
                f"stay below 2**30 (q_offset <= {MAX_POSITION - nq})"
            )
    if not is_real(dropout_p):
        raise TypeError(f"dropout_p must be a number; got {dropout_p!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")


def layout_hint(q, k, delta=None) -> str:
    """A sentence for a shape error when q and k read as (batch, seq, heads, head_dim), flash-attn's layout, would make
    a valid call (heads a multiple of kv heads, Nq <= Nk, delta's rows the query heads); else ''. Shapes only."""
    (_, nq, hq, _), (_, nk, hkv, _) = q.shape, k.shape
    fits = hkv > 0 and hq % hkv == 0 and 0 < nq <= nk and (delta is None or delta.shape[0] == hq)
    if not fits:
        return ""
    return (
        f". q {tuple(q.shape)} and k {tuple(k.shape)} look like (batch, seq, heads, head_dim), flash-attn's layout; "
        "pope_attention takes (batch, heads, seq, head_dim): pass q.transpose(1, 2), k.transpose(1, 2), "
        "v.transpose(1, 2) (and transpose the output back)"
    )


def check_tensors(q, k, v, dims: int, layout: str) -> None:
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


def check_options(q, delta, *, hq, d, base, causal, softmax_scale, magnitude, rotary_dim, backend, k=None) -> None:
    """The options shared by pope_attention and pope_attention_varlen: causal, magnitude, backend, rotary_dim,
    delta (hq, r), base, softmax_scale. ``k`` (pope_attention's) lets a delta of the wrong shape point at a transposed
    layout."""
    if type(causal) is not bool:
        raise TypeError(f"causal must be True or False; got {causal!r}")
    if not isinstance(magnitude, str) or magnitude not in MAGNITUDES:
        raise ValueError(f"unknown magnitude {magnitude!r}; choose one of {sorted(MAGNITUDES)}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if rotary_dim is not None and not (is_int(rotary_dim) and 0 < rotary_dim <= d):
        raise ValueError(f"rotary_dim must be an int in [1, head_dim={d}] or None; got {rotary_dim!r}")
    r = rotary_dim or d
    if delta is not None:
        if not isinstance(delta, torch.Tensor) or not delta.is_floating_point():
            raise TypeError(f"delta must be a floating-point tensor of shape ({hq}, {r}) or None")
        if tuple(delta.shape) != (hq, r):
            raise ValueError(
                f"delta must have shape (query_heads, rotary_dim) = ({hq}, {r}); got {tuple(delta.shape)}"
                + (layout_hint(q, k, delta) if k is not None and q.dim() == 4 else "")
            )
        if delta.device != q.device:
            raise ValueError(f"delta is on {delta.device} but q is on {q.device}")
    if not is_real(base):
        raise TypeError(f"base must be a number; got {base!r}")
    if not (base > 0 and _finite(base)):
        raise ValueError(f"base must be a positive finite number; got {base!r}")
    if softmax_scale is not None:
        if not is_real(softmax_scale):
            raise TypeError(f"softmax_scale must be a number or None; got {softmax_scale!r}")
        if not (softmax_scale > 0 and _finite(softmax_scale)):
            raise ValueError(f"softmax_scale must be positive and finite; got {softmax_scale!r}")


def _finite(x) -> bool:
    """math.isfinite written with comparisons only: compiled code may see a float argument as symbolic (dynamo's
    automatic dynamic shapes), and torch.compile breaks the graph on math.isfinite of a symbolic float."""
    return x == x and x != math.inf and x != -math.inf
