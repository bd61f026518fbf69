"""The fused Triton kernels as PyTorch operators: `torch.library.custom_op`s over pope.kernels' launchers.

Two operators, each with a fake (meta) implementation so that `torch.compile` traces through them with
no graph break (eager calls take an equivalent autograd.Function over the same launchers, which costs
less host time per call):
    pope::flash_attention_forward_v3(q, k, v, delta, theta, ..., save_primes) -> (out, lse, q', k')
    pope::flash_attention_backward_v3(do, q, k, v, delta, out, lse, theta, ..., q', k') -> (dq, dk, dv, d_delta)
wired together with `torch.library.register_autograd` (the forward saves q, k, v, delta, out, lse, the frequencies
theta, for a packed batch its cu_seqlens, and with save_primes the pre-pass's q', k', so that the backward does not
compute them again; without, q' and k' are empty (0,) tensors). pope.settings' reuse_prepass decides save_primes:
on, a call that will be differentiated saves 2 |q| + 2 |k| more (the price of one pre-pass launch less). theta is
(2, d) int32: the frequencies as fixed-point turns (pope.frequencies.pope_turn_words), from which the kernels
compute exactly reduced angles.

theta is an input, not something the operators look up: in a compiled graph the frequencies are computed by the
graph itself, so no operator call made by compiled code ever creates a tensor that outlives it (CUDA-graph
trees run a compiled function's first call with every allocation routed into the graph's private memory pool,
and a frequencies tensor cached from inside such a call would stay live in that pool). Eager calls take the
frequencies from a per-(head dim, base, device) cache.

`triton_pope_attention` (and `triton_pope_attention_varlen`, packed variable-length sequences: the same operators
given cu_seqlens) is what pope.attention dispatches backend="triton" to; the inputs are checked there, once.
`triton_unsupported_reason` answers only what the kernels can do (device, dtype, head dim, sizes, partial rotary,
dropout): None when they can run a call. Switches and caches live in pope.settings.
Importing this module imports torch only; Triton is imported on the first kernel call.
"""

from __future__ import annotations

import torch

from pope import kernels
from pope.conventions import resolve_defaults
from pope.frequencies import pope_turn_words
from pope.kernels import buffers as kernel_buffers  # outputs' layouts (torch only: no Triton import)
from pope.settings import SETTINGS

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128
# Few query rows per key head (generation with a KV cache): the split-K decode kernel instead.
DECODE_MAX_QUERIES = 16
DECODE_MAX_ROWS = 64


# The operators' outputs follow their inputs' layouts (pope.kernels.buffers.empty_in_layout_of), and so do the fake
# implementations: torch.compile must hand the operators inputs in the strides it traced them with, not a layout of
# its choosing, or a fake output's strides would not be the kernel's.
# The operators' names carry the version of that contract (shapes, dtypes, strides of what they return): PyTorch's
# compile caches key a graph on the operators' names, not on their fake implementations, so a graph compiled against
# an older contract and found in the cache would assert strides the kernels no longer give. A new contract, a new name.
OPERATOR_CONTRACT = "v3"
EXACT_STRIDES = tuple(getattr(torch.Tag, name) for name in ("needs_exact_strides",) if hasattr(torch.Tag, name)) or (
    torch.Tag.needs_fixed_stride_order,  # older PyTorch: the stride order, all the layout test asks
)


def _theta(head_dim: int, base: float, device: torch.device) -> torch.Tensor:
    cache = SETTINGS.caches.frequencies
    key = (head_dim, float(base), str(device))
    if key in cache:
        return cache[key]
    theta = pope_turn_words(head_dim, base, device=device)  # what compiled graphs compute (triton_pope_attention)
    # A tensor made during CUDA-graph capture lives in the graph's private pool: never cache that one.
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        cache[key] = theta
    return theta


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The kernels take any (batch, head, seq) strides but need unit stride along head_dim.
    return t if t.stride(-1) == 1 else t.contiguous()


def _use_decode_kernel(q: torch.Tensor, k: torch.Tensor) -> bool:
    seq_q, seq_k = q.shape[2], k.shape[2]
    rows = (q.shape[1] // k.shape[1]) * seq_q
    return seq_q <= DECODE_MAX_QUERIES and rows <= DECODE_MAX_ROWS and seq_k > seq_q


def _packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int):
    """The kernels' description of a packed batch (pope.kernels.host.Packed), or None for a batched call."""
    if cu_seqlens_q is None:
        return None
    return kernels.Packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def _forward(
    q, k, v, delta, theta, causal, softmax_scale, q_offset, magnitude, save_primes, eager: bool = False, packed=None
):
    """(out, lse, q', k') from the kernels; the body of both the custom operator and the eager autograd Function.
    save_primes: return the block kernels' pre-pass q', k' for the backward (else, and from the decode kernel, which
    makes none, empty (0,) tensors). eager: theta is the frequency cache's (it lives on), so the decode kernel may
    keep its key-phase table for the next step; an operator call (compiled code) may not keep anything (module
    docstring). packed: a packed (varlen) batch, run by the block kernels whatever its sequences' lengths."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    delta = delta.contiguous() if delta is not None else None
    options = dict(causal=causal, softmax_scale=softmax_scale, q_offset=q_offset, magnitude=magnitude)
    if packed is None and _use_decode_kernel(q, k):
        return *kernels.decode_forward(q, k, v, delta, theta, keep_phase_table=eager, **options), *_no_primes(q)
    if not save_primes:
        return *kernels.forward(q, k, v, delta, theta, **options, packed=packed), *_no_primes(q)
    out, lse, primes = kernels.forward(q, k, v, delta, theta, **options, packed=packed, return_primes=True)
    return out, lse, *primes


def _no_primes(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The operators' tensor outputs cannot be None: no q', k' is two empty tensors.
    return q.new_empty((0,)), q.new_empty((0,))


def _saved_primes(q_prime: torch.Tensor | None, k_prime: torch.Tensor | None) -> tuple | None:
    """The backward's primes argument (pope.kernels.backward): None when the forward saved no q', k'."""
    if q_prime is None or q_prime.numel() == 0:
        return None
    return q_prime, k_prime


def _backward_kernels(
    do, q, k, v, delta, out, lse, theta, causal, softmax_scale, q_offset, magnitude, packed=None, primes=None
):
    """(dq, dk, dv, d_delta or None) from the kernels; primes: the forward's (q', k'), or None to compute them."""
    q, k, v, out, do = (_last_dim_contiguous(t) for t in (q, k, v, out, do))
    delta = delta.contiguous() if delta is not None else None
    return kernels.backward(
        do,
        q,
        k,
        v,
        delta,
        out,
        lse.contiguous(),
        theta,
        causal=causal,
        softmax_scale=softmax_scale,
        q_offset=q_offset,
        magnitude=magnitude,
        packed=packed,
        primes=primes,
    )


@torch.library.custom_op(f"pope::flash_attention_forward_{OPERATOR_CONTRACT}", mutates_args=(), tags=EXACT_STRIDES)
def flash_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    delta: torch.Tensor | None,
    theta: torch.Tensor,
    causal: bool,
    softmax_scale: float,
    q_offset: int,
    magnitude: str,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    save_primes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched, or with cu_seqlens_q: a packed batch (q (total_q, Hq, d) -> out, lse (Hq, total_q)). Returns
    (out, lse, q', k'); q', k' are empty (0,) tensors unless save_primes (module docstring)."""
    return _forward(
        q,
        k,
        v,
        delta,
        theta,
        causal,
        softmax_scale,
        q_offset,
        magnitude,
        save_primes,
        packed=_packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
    )


@flash_attention_forward.register_fake
def _(
    q,
    k,
    v,
    delta,
    theta,
    causal,
    softmax_scale,
    q_offset,
    magnitude,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=0,
    max_seqlen_k=0,
    save_primes=False,
):
    # The kernels' out is in q's layout (kernel_buffers.empty_in_layout_of); the decode kernel's is contiguous.
    decode = cu_seqlens_q is None and _use_decode_kernel(q, k)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if decode else kernel_buffers.empty_in_layout_of(q)
    lse_shape = q.shape[:3] if cu_seqlens_q is None else (q.shape[1], q.shape[0])
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if decode or not save_primes:
        return out, lse, *_no_primes(q)
    block_d, packed = kernel_buffers.block_d(q.shape[-1]), cu_seqlens_q is not None
    # Packed tensors are (total, H, d): the kernels' batch view is (1, H, total, d).
    (batch, heads, rows), (kv_batch, kv_heads, kv_rows) = (
        ((1, t.shape[1], t.shape[0]) for t in (q, k)) if packed else (q.shape[:3], k.shape[:3])
    )
    return (
        out,
        lse,
        kernel_buffers.prime_buffer(batch, heads, rows, block_d, like=q, packed=packed),
        kernel_buffers.prime_buffer(kv_batch, kv_heads, kv_rows, block_d, like=q, packed=packed),
    )


@torch.library.custom_op(f"pope::flash_attention_backward_{OPERATOR_CONTRACT}", mutates_args=(), tags=EXACT_STRIDES)
def flash_attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    delta: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    theta: torch.Tensor,
    causal: bool,
    softmax_scale: float,
    q_offset: int,
    magnitude: str,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    q_prime: torch.Tensor | None = None,
    k_prime: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dq, dk, dv, d_delta); d_delta is an empty (0,) tensor when delta is None. q_prime, k_prime: what
    the forward returned (its pre-pass's q', k', or empty tensors: the backward computes them)."""
    dq, dk, dv, d_delta = _backward_kernels(
        do,
        q,
        k,
        v,
        delta,
        out,
        lse,
        theta,
        causal,
        softmax_scale,
        q_offset,
        magnitude,
        _packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
        _saved_primes(q_prime, k_prime),
    )
    if d_delta is None:
        d_delta = torch.empty((0,), dtype=q.dtype, device=q.device)
    return dq, dk, dv, d_delta


@flash_attention_backward.register_fake
def _(
    do,
    q,
    k,
    v,
    delta,
    out,
    lse,
    theta,
    causal,
    softmax_scale,
    q_offset,
    magnitude,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=0,
    max_seqlen_k=0,
    q_prime=None,
    k_prime=None,
):
    d_delta = (
        torch.empty(delta.shape, dtype=delta.dtype, device=delta.device)
        if delta is not None
        else torch.empty((0,), dtype=q.dtype, device=q.device)
    )
    return (*(kernel_buffers.empty_in_layout_of(t) for t in (q, k, v)), d_delta)  # in the inputs' layouts


def _setup_context(ctx, inputs, output):
    q, k, v, delta, theta, causal, softmax_scale, q_offset, magnitude, *varlen = inputs
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = (varlen + [None, None, 0, 0][len(varlen) :])[:4]
    out, lse, q_prime, k_prime = output
    ctx.save_for_backward(q, k, v, delta, out, lse, theta, cu_seqlens_q, cu_seqlens_k, q_prime, k_prime)
    ctx.options = (causal, softmax_scale, q_offset, magnitude)
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.has_delta = delta is not None


def _backward(ctx, grad_out, grad_lse, grad_q_prime, grad_k_prime):
    # lse, q' and k' are internal outputs: nothing downstream differentiates them (pope attention returns `out` only).
    q, k, v, delta, out, lse, theta, cu_seqlens_q, cu_seqlens_k, q_prime, k_prime = ctx.saved_tensors
    dq, dk, dv, d_delta = flash_attention_backward(
        grad_out,
        q,
        k,
        v,
        delta,
        out,
        lse,
        theta,
        *ctx.options,
        cu_seqlens_q,
        cu_seqlens_k,
        *ctx.max_seqlens,
        q_prime,
        k_prime,
    )
    return dq, dk, dv, (d_delta if ctx.has_delta else None), *(None,) * 10


flash_attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _EagerFlashAttention(torch.autograd.Function):
    """The same forward/backward as the operators above, for eager mode, where the operators' autograd path
    costs more host time per call (benchmarks/launch_overhead.py; docs/kernels.md). torch.compile traces
    the operators instead."""

    @staticmethod
    def forward(ctx, q, k, v, delta, theta, causal, softmax_scale, q_offset, magnitude, save_primes, packed=None):
        out, lse, q_prime, k_prime = _forward(
            q, k, v, delta, theta, causal, softmax_scale, q_offset, magnitude, save_primes, eager=True, packed=packed
        )
        ctx.save_for_backward(q, k, v, delta, out, lse, theta, q_prime, k_prime)
        ctx.options = (causal, softmax_scale, q_offset, magnitude, packed)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, delta, out, lse, theta, q_prime, k_prime = ctx.saved_tensors
        dq, dk, dv, d_delta = _backward_kernels(
            grad_out, q, k, v, delta, out, lse, theta, *ctx.options, _saved_primes(q_prime, k_prime)
        )
        return dq, dk, dv, d_delta, *(None,) * 7


def triton_pope_attention(
    q, k, v, delta, *, base, causal, softmax_scale, q_offset, magnitude, rotary_dim, supported: bool = False
):
    """PoPE attention on the fused Triton kernels. Inputs already checked by pope.attention.

    q (B, Hq, Nq, d), k/v (B, Hkv, Nk, d), delta (Hq, d) or None. Returns (B, Hq, Nq, d) in q's dtype.
    supported=True: the caller has just had triton_unsupported_reason return None for this call (pope.attention
    does), so it is not asked again on this per-call path.
    """
    if not supported:
        reason = triton_unsupported_reason(q, k, v, rotary_dim=rotary_dim)
        if reason is not None:
            raise ValueError(f"the Triton PoPE kernels cannot run this call: {reason}")
    q_offset, softmax_scale = resolve_defaults(q, k, q_offset, softmax_scale)
    return _apply(q, k, v, delta, base, bool(causal), softmax_scale, q_offset, magnitude)


def triton_pope_attention_varlen(
    q,
    k,
    v,
    delta,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    base,
    causal,
    softmax_scale,
    magnitude,
):
    """PoPE attention over a packed batch on the fused kernels, one launch per kernel for all its sequences (no host
    read of cu_seqlens). Inputs already checked by pope.attention.pope_attention_varlen (and the kernels asked by
    triton_unsupported_reason): q (total_q, Hq, d), k/v (total_k, Hkv, d), int32 (batch + 1,) cumulative lengths on
    q's device, max_seqlen_* at least every sequence's length, softmax_scale resolved. Returns (total_q, Hq, d)."""
    return _apply(
        q,
        k,
        v,
        delta,
        base,
        bool(causal),
        float(softmax_scale),
        0,
        magnitude,
        (cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k)),
    )


def _apply(q, k, v, delta, base, causal, softmax_scale, q_offset, magnitude, varlen=()):
    """The differentiable kernel call: custom operators in compiled code (or when pope.settings asks), the eager
    autograd.Function otherwise. varlen: () or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    compiling = torch.compiler.is_compiling()
    if compiling:  # the frequencies are computed in the compiled graph itself (module docstring)
        theta = pope_turn_words(q.shape[-1], float(base), device=q.device)
    else:
        theta = _theta(q.shape[-1], base, q.device)
    args = (q, k, v, delta, theta, causal, softmax_scale, q_offset, magnitude)
    # q', k' are worth keeping only for a backward (pope.settings' reuse_prepass).
    save_primes = SETTINGS.reuse_prepass and will_be_differentiated(q, k, v, delta)
    if compiling or not SETTINGS.eager_autograd_function:
        return flash_attention_forward(*args, *(varlen or (None, None, 0, 0)), save_primes)[0]
    return _EagerFlashAttention.apply(*args, save_primes, _packed(*varlen) if varlen else None)


def will_be_differentiated(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd will record a call on these tensors (grad mode on, and one of them requires a gradient)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def triton_unsupported_reason(q, k, v, *, rotary_dim=None, dropout_p=0.0) -> str | None:
    """Why the Triton kernels cannot run a call on these tensors, or None when they can. Asks only what the kernels
    can do (Triton present, device, dtype, head dim, 32-bit sizes, full rotary, no dropout): whether the call is
    valid is pope.attention's question, answered before this one."""
    try:
        interpret = kernels.INTERPRET
    except ImportError as err:
        return f"Triton is not importable ({err}); install it with pip install 'pope-attention[triton]'"
    head_dim = q.shape[-1]
    if q.device.type != "cuda" and not (interpret and q.device.type == "cpu"):
        return f"the Triton kernels need CUDA tensors (got {q.device}; CPU runs only under TRITON_INTERPRET=1)"
    if q.device.type == "cuda" and kernels.cuda_capability(q.device) < (8, 0):
        return "the Triton kernels need an NVIDIA GPU of compute capability 8.0 or newer"
    if q.dtype not in SUPPORTED_DTYPES:
        return f"dtype {q.dtype} is not supported (use float16, bfloat16 or float32)"
    if head_dim > MAX_HEAD_DIM:
        return f"head_dim {head_dim} > {MAX_HEAD_DIM} is not supported"
    if rotary_dim is not None and rotary_dim != head_dim:
        return f"partial rotary (rotary_dim={rotary_dim} < head_dim={head_dim}) is not supported"
    if dropout_p > 0:
        return "attention dropout is not implemented in the Triton kernels"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() >= 2**31:
            return f"{name} has {t.numel()} elements; the kernels index with 32-bit offsets (< 2**31)"
    return None
