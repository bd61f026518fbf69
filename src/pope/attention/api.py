"""pope_attention and pope_attention_varlen: check the call (pope.attention.checks), fill in the defaults
(pope.conventions), and run it on the backend it asks for: the fused kernels (pope.ops) or the reference
(pope.attention.reference)."""

from __future__ import annotations

import math

import torch

from pope import ops
from pope.attention.checks import (
    MAX_POSITION,
    assert_packing_on_device,
    check_cu_seqlens,
    check_inputs,
    check_options,
    check_tensors,
    is_int,
    packed_lengths,
)
from pope.attention.reference import reference_pope_attention, varlen_reference
from pope.conventions import resolve_defaults


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
    softmax_scale defaults to 1/sqrt(d). Returns (B, Hq, Nq, d) in the dtype of q; on the fused kernels the output and
    the gradients are laid out as their inputs (q, k, v transposed from (B, N, H, d) projections give out, dq, dk, dv
    the same way, as SDPA does), so a model's transpose back to (B, N, H * d) costs no copy.
    """
    check_inputs(
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
    if backend == "flash-attn-4" or (backend == "auto" and _auto_prefers_flash_attn_4(q, k, v, delta)):
        reason = _flash_attn_4_unsupported_reason(q, k, v, options, dropout_p)
        if reason is None:
            library_options = {name: value for name, value in options.items() if name != "rotary_dim"}
            return ops.flash_attn_4_pope_attention(q, k, v, delta, **library_options)
        if backend == "flash-attn-4":
            raise ValueError(
                f"backend='flash-attn-4' cannot run this call: {reason}. Use backend='triton', 'cudnn' or 'auto'."
            )
    if backend == "cudnn" or (backend == "auto" and _auto_prefers_cudnn(q, k)):
        reason = _cudnn_unsupported_reason(q, k, v, options, dropout_p)
        if reason is None:
            library_options = {name: value for name, value in options.items() if name != "rotary_dim"}
            return ops.cudnn_pope_attention(q, k, v, delta, **library_options)
        if backend == "cudnn":
            raise ValueError(f"backend='cudnn' cannot run this call: {reason}. Use backend='triton' or 'auto'.")
    if backend != "reference":
        reason = _triton_unsupported_reason(q, k, v, rotary_dim=options["rotary_dim"], dropout_p=dropout_p)
        if reason is None:
            return ops.triton_pope_attention(q, k, v, delta, **options, supported=True)
        if backend == "triton":
            raise ValueError(f"backend='triton' cannot run this call: {reason}. Use backend='reference' or 'auto'.")
    return reference_pope_attention(q, k, v, delta, dropout_p=dropout_p, **options)


def _auto_prefers_flash_attn_4(q, k, v, delta) -> bool:
    """Whether "auto" tries backend "flash-attn-4" first: on CUDA, with flash-attn-4 installed, where it measured
    faster (ops.FLASH_ATTN_4_PREFERRED: head dim, differentiated or not, grouped-query or not, and the fewest
    queries), outside torch.compile and unless torch.use_deterministic_algorithms(True) is on (its deterministic
    backward is not the one measured)."""
    if q.device.type != "cuda" or torch.are_deterministic_algorithms_enabled() or torch.compiler.is_compiling():
        return False
    call = (q.shape[-1], ops.will_be_differentiated(q, k, v, delta), q.shape[1] != k.shape[1])
    min_seq = ops.FLASH_ATTN_4_PREFERRED.get(call)
    # Queries too: a decode step (few queries against a long cache) stays on the split-K decode kernels.
    return min_seq is not None and q.shape[2] >= min_seq and ops.flash_attn_4_installed()


def _auto_prefers_cudnn(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether "auto" tries backend "cudnn" first: on CUDA, where it measured faster than the fused kernels
    (ops.CUDNN_PREFERRED: head dims and the shortest sequence), unless torch.use_deterministic_algorithms(True) is on:
    cuDNN's backward sums dq' with atomics (two runs differ in the last bits), the fused kernels' backward does not.
    A cheap question, asked on every call."""
    if q.device.type != "cuda" or torch.are_deterministic_algorithms_enabled():
        return False
    min_seq = ops.CUDNN_PREFERRED.get(q.shape[-1])
    return min_seq is not None and k.shape[2] >= min_seq


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
    check_tensors(q, k, v, 3, "(total_tokens, heads, head_dim)")
    (total_q, hq, d), (total_k, hkv, dk) = q.shape, k.shape
    if dk != d:
        raise ValueError(f"q has head_dim {d} but k/v have head_dim {dk}")
    if hq == 0 or d == 0:
        raise ValueError(f"empty input: q has shape {tuple(q.shape)}; heads and head_dim must be >= 1")
    if hkv == 0 or hq % hkv:
        raise ValueError(
            f"query heads ({hq}) must be a multiple of key/value heads ({hkv}) for grouped-query attention"
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
        rotary_dim=None,
        backend=backend,
    )
    if backend in ("cudnn", "flash-attn-4"):
        raise ValueError(f"backend={backend!r} does not take packed (varlen) batches; use backend='triton' or 'auto'")
    for name, cu_seqlens in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_cu_seqlens(name, cu_seqlens, q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"cu_seqlens_q describes {cu_seqlens_q.numel() - 1} sequences but cu_seqlens_k "
            f"{cu_seqlens_k.numel() - 1}; they must have the same length (batch + 1)"
        )
    for name, bound, total in (("max_seqlen_q", max_seqlen_q, total_q), ("max_seqlen_k", max_seqlen_k, total_k)):
        if not is_int(bound):
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
                assert_packing_on_device(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k)
            else:  # (CPU tensors: the kernels under Triton's interpreter) host reads cost no synchronisation
                packed_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k)
            if total_q == 0:
                return q[:0] * 1  # (0, Hq, d), still part of q's graph
            return ops.triton_pope_attention_varlen(
                q, k, v, delta, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options
            )
        if backend == "triton":
            raise ValueError(f"backend='triton' cannot run this call: {reason}. Use backend='reference' or 'auto'.")
    return varlen_reference(q, k, v, delta, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options)


def _cudnn_unsupported_reason(q, k, v, options: dict, dropout_p: float) -> str | None:
    """Why backend "cudnn" cannot run this call, or None when it can (CUDA only)."""
    if q.device.type != "cuda":
        return f"cuDNN's fused attention runs on CUDA tensors only (got device {q.device})"
    return ops.cudnn_unsupported_reason(
        q, k, v, causal=options["causal"], q_offset=options["q_offset"], rotary_dim=options["rotary_dim"],
        dropout_p=dropout_p,
    )  # fmt: skip


def _flash_attn_4_unsupported_reason(q, k, v, options: dict, dropout_p: float) -> str | None:
    """Why backend "flash-attn-4" cannot run this call, or None when it can (CUDA only)."""
    return ops.flash_attn_4_unsupported_reason(
        q, k, v, causal=options["causal"], q_offset=options["q_offset"], rotary_dim=options["rotary_dim"],
        dropout_p=dropout_p,
    )  # fmt: skip


def _triton_unsupported_reason(q, k, v, *, rotary_dim, dropout_p) -> str | None:
    """Why the Triton backend cannot run this call, or None when it can ("auto" takes it on CUDA only)."""
    if q.device.type != "cuda":
        return f"the Triton kernels run on CUDA tensors only (got device {q.device})"
    return ops.triton_unsupported_reason(q, k, v, rotary_dim=rotary_dim, dropout_p=dropout_p)
