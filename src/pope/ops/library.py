"""Backends "cudnn" and "flash-attn-4": PoPE as a library attention kernel on q', k'.

PoPE's score is a real dot product over 2d channels, so any attention kernel that takes d_qk = 2d and d_v = d
computes it: the pre-pass makes q', k' (operator pope::cartesian(q, k, delta, theta, q_offset, magnitude) -> (q', k')),
the library kernel runs on q', k', v, and the pre-pass's gradient (pope::cartesian_backward) takes dq', dk' back to
dq, dk and d(delta). The library kernel is cuDNN's fused attention through SDPA (backend "cudnn"; torch.compile traces
the three as they are) or flash-attn-4's CuTe DSL kernels (backend "flash-attn-4", the optional package flash-attn-4,
eager only). `cudnn_pope_attention` / `flash_attn_4_pope_attention` are what pope.attention dispatches the backends
to; `cudnn_unsupported_reason` / `flash_attn_4_unsupported_reason` say why one cannot run a call.
"""

from __future__ import annotations

import functools
import importlib.util

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from pope import kernels
from pope.frequencies import pope_turn_words
from pope.kernels import buffers as kernel_buffers  # tile widths (torch only: no Triton import)

from .flash_attn_4_tiles import flash_attn_4_wide
from .fused import _last_dim_contiguous, _theta, triton_unsupported_reason, will_be_differentiated

LIBRARY_DTYPES = (torch.float16, torch.bfloat16)
# Where backend "auto" takes "cudnn" over the fused kernels: {head_dim: the shortest key sequence}. Measured on an
# H100 (benchmarks/attention.py, the GPU check's attention rows): at d = 128 and 4K-8K tokens, MHA and GQA, cuDNN's
# fwd+bwd takes 0.81-0.86x the fused kernels' time; at d = 64 the two are even (4K) or within host noise (1K).
CUDNN_PREFERRED: dict[int, int] = {128: 2048}
# Where backend "auto" takes "flash-attn-4" (when installed) over the others: {(head_dim, differentiated,
# grouped-query): the fewest queries}. Measured on an H100 (benchmarks/attention.py and the GPU check, eager): at d = 64
# from 4K tokens its fwd+bwd takes 0.90-0.94x the fused kernels' time (MHA and GQA) and its MHA forward 0.91x (its
# 192x128 tile; at GQA its own forward takes 1.08x the fused kernels' and 1.16x cuDNN's, so those stay); at d = 128
# from 4K its forward alone 0.87x the fused kernels' and 0.93x cuDNN's, and with PoPE's backward tiles
# (flash_attn_4_tiles) its fwd+bwd 0.87x cuDNN's at 4K and 0.83x at 8K (MHA), 0.92x with grouped-query heads
# (2x32x8x4096, keys and values repeated). An eager call spends about 0.5 ms on the host (1K tokens: 0.77 ms forward
# against cuDNN's 0.21), so below 4K tokens it takes 1.2-2.9x the best other backend's time.
FLASH_ATTN_4_PREFERRED: dict[tuple[int, bool, bool], int] = {
    (64, True, False): 4096,
    (64, True, True): 4096,
    (64, False, False): 4096,
    (128, True, False): 4096,
    (128, True, True): 4096,
    (128, False, False): 4096,
    (128, False, True): 4096,
}


def _wide_like(x: torch.Tensor) -> torch.Tensor:
    """An empty x' for x (B, H, N, d): (B, H, N, 2 BLOCK_D), each half padded to a power of two >= 16, as the pre-pass
    writes it."""
    return kernel_buffers.prime_buffer(*x.shape[:3], kernel_buffers.block_d(x.shape[-1]), like=x, packed=False)


@torch.library.custom_op("pope::cartesian", mutates_args=())
def cartesian(
    q: torch.Tensor, k: torch.Tensor, delta: torch.Tensor | None, theta: torch.Tensor, q_offset: int, magnitude: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q', k'): q (B, Hq, Nq, d) -> (B, Hq, Nq, 2 BLOCK_D) with delta, at positions q_offset..; k from 0."""
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    delta = delta.contiguous() if delta is not None else None
    return kernels.transform_queries_and_keys(q, k, theta, delta, q_offset=q_offset, magnitude=magnitude)


@cartesian.register_fake
def _(q, k, delta, theta, q_offset, magnitude):
    return _wide_like(q), _wide_like(k)


@torch.library.custom_op("pope::cartesian_backward", mutates_args=())
def cartesian_backward(
    dq_wide: torch.Tensor,
    dk_wide: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    delta: torch.Tensor | None,
    theta: torch.Tensor,
    q_offset: int,
    magnitude: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, d_delta); d_delta is an empty (0,) tensor when delta is None."""
    dq, dk, d_delta = kernels.transform_grad(
        *(_last_dim_contiguous(t) for t in (dq_wide, dk_wide, q, k)),
        theta,
        delta.contiguous() if delta is not None else None,
        q_offset=q_offset,
        magnitude=magnitude,
    )
    return dq, dk, d_delta if d_delta is not None else q.new_empty((0,))


@cartesian_backward.register_fake
def _(dq_wide, dk_wide, q, k, delta, theta, q_offset, magnitude):
    return (
        q.new_empty(q.shape),  # contiguous, as the kernel writes them (empty_like would keep a view's strides)
        k.new_empty(k.shape),
        (delta.new_empty(delta.shape) if delta is not None else q.new_empty((0,))),
    )


def _cartesian_setup(ctx, inputs, output):
    q, k, delta, theta, q_offset, magnitude = inputs
    ctx.save_for_backward(q, k, delta, theta)
    ctx.options = (q_offset, magnitude)
    ctx.has_delta = delta is not None


def _cartesian_grad(ctx, dq_wide, dk_wide):
    q, k, delta, theta = ctx.saved_tensors
    q_offset, magnitude = ctx.options
    dq_wide = dq_wide if dq_wide is not None else _wide_like(q).zero_()
    dk_wide = dk_wide if dk_wide is not None else _wide_like(k).zero_()
    dq, dk, d_delta = cartesian_backward(dq_wide, dk_wide, q, k, delta, theta, q_offset, magnitude)
    return dq, dk, (d_delta if ctx.has_delta else None), None, None, None


torch.library.register_autograd("pope::cartesian", _cartesian_grad, setup_context=_cartesian_setup)


def _library_backends(device: torch.device) -> list:
    """SDPA's backends the "cudnn" backend allows: cuDNN on CUDA; the math kernel elsewhere (the CPU tests, where the
    pre-pass runs under Triton's interpreter)."""
    return [SDPBackend.CUDNN_ATTENTION if device.type == "cuda" else SDPBackend.MATH]


def cudnn_pope_attention(q, k, v, delta, *, base, causal, softmax_scale, q_offset, magnitude):
    """PoPE attention as cuDNN's fused attention on the pre-pass's q', k' (backend "cudnn"). Inputs already checked
    by pope.attention, and cudnn_unsupported_reason None for them: q (B, Hq, N, d), k/v (B, Hkv, N, d), causal only
    with queries and keys at the same positions (q_offset 0). Returns (B, Hq, N, d) in q's dtype."""
    if torch.compiler.is_compiling():  # the frequencies are computed in the compiled graph itself (module docstring)
        theta = pope_turn_words(q.shape[-1], float(base), device=q.device)
    else:
        theta = _theta(q.shape[-1], base, q.device)
    q_wide, k_wide = cartesian(q, k, delta, theta, int(q_offset), magnitude)
    with sdpa_kernel(_library_backends(q.device)):
        return torch.nn.functional.scaled_dot_product_attention(
            q_wide, k_wide, v, is_causal=causal, scale=softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
        )


@functools.cache
def flash_attn_4_installed() -> bool:
    """Whether flash-attn-4 (module flash_attn.cute) can be imported; asked once, without importing it (its import
    takes seconds: CUTLASS's DSL)."""
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except (ModuleNotFoundError, ValueError):  # no flash_attn package at all, or a module without a spec
        return False


def flash_attn_4_pope_attention(q, k, v, delta, *, base, causal, softmax_scale, q_offset, magnitude):
    """PoPE attention as flash-attn-4's kernel on the pre-pass's q', k' (backend "flash-attn-4"). Inputs already
    checked by pope.attention, and flash_attn_4_unsupported_reason None for them: q (B, Hq, Nq, d), k/v (B, Hkv, Nk,
    d); causal only with the last query at the last key's position (flash-attn's bottom-right alignment). flash-attn
    takes (B, N, H, channels) with any 16-byte-aligned strides, so q', k' (B, H, N, 2d) and v go as transposed views,
    no copy, with PoPE's Hopper tiles (flash_attn_4_tiles). Its grouped-query backward takes d_qk = d_v only, so a
    differentiated grouped-query call repeats k and v to Hq heads first (autograd sums their gradients back): Hq/Hkv
    times their memory. Its backward is deterministic when torch.use_deterministic_algorithms(True) is on (it orders
    the dq sums), else dq' is summed by atomics. Returns (B, Hq, Nq, d) in q's dtype (a transposed view)."""
    if q.shape[1] != k.shape[1] and will_be_differentiated(q, k, v, delta):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    theta = _theta(q.shape[-1], base, q.device)
    q_wide, k_wide = cartesian(q, k, delta, theta, int(q_offset), magnitude)
    out = flash_attn_4_wide(
        q_wide.transpose(1, 2), k_wide.transpose(1, 2), v.transpose(1, 2), softmax_scale=softmax_scale, causal=causal
    )
    return out.transpose(1, 2)


def flash_attn_4_unsupported_reason(q, k, v, *, causal, q_offset, rotary_dim=None, dropout_p=0.0) -> str | None:
    """Why backend "flash-attn-4" cannot run a call, or None when it can: the pre-pass's needs
    (triton_unsupported_reason), fp16 / bf16, the library installed, not inside torch.compile (its launcher is Python
    that dynamo cannot trace), causal masking only where flash-attn's bottom-right alignment is PoPE's
    (q_offset + Nq = Nk), CUDA with compute capability 9.0 or newer."""
    reason = triton_unsupported_reason(q, k, v, rotary_dim=rotary_dim, dropout_p=dropout_p)
    if reason is not None:
        return reason
    if q.dtype not in LIBRARY_DTYPES:
        return f"flash-attn-4 takes float16 and bfloat16 only (got {q.dtype})"
    if not flash_attn_4_installed():
        return "flash-attn-4 is not installed (pip install 'pope-attention[flash-attn-4]')"
    if torch.compiler.is_compiling():
        return "flash-attn-4 does not run inside torch.compile"
    if causal and q_offset + q.shape[2] != k.shape[2]:
        return "causal masking on backend 'flash-attn-4' needs the last query at the last key's position"
    if q.device.type != "cuda":
        return f"flash-attn-4 runs on CUDA tensors only (got device {q.device})"
    if kernels.cuda_capability(q.device) < (9, 0):
        return "backend 'flash-attn-4' needs an NVIDIA GPU of compute capability 9.0 or newer"
    return None


def cudnn_unsupported_reason(q, k, v, *, causal, q_offset, rotary_dim=None, dropout_p=0.0) -> str | None:
    """Why backend "cudnn" cannot run a call, or None when it can: the pre-pass's needs (triton_unsupported_reason),
    cuDNN's fused attention present (compute capability 9.0 or newer), fp16 / bf16, and causal masking only where
    SDPA's top-left alignment is PoPE's bottom-right one (as many queries as keys, q_offset 0)."""
    reason = triton_unsupported_reason(q, k, v, rotary_dim=rotary_dim, dropout_p=dropout_p)
    if reason is not None:
        return reason
    if q.device.type == "cuda":
        if not kernels.cudnn_attention_enabled():
            return "cuDNN's fused attention is not available in this PyTorch build (or is disabled)"
        if kernels.cuda_capability(q.device) < (9, 0):
            return "backend 'cudnn' needs an NVIDIA GPU of compute capability 9.0 or newer"
    if q.dtype not in LIBRARY_DTYPES:
        return f"cuDNN's fused attention takes float16 and bfloat16 only (got {q.dtype})"
    if causal and (q.shape[2] != k.shape[2] or q_offset not in (None, 0)):
        return "causal masking on backend 'cudnn' needs as many queries as keys at the same positions (q_offset 0)"
    return None
