"""PoPE attention as PyTorch operators over the kernels, in two modules:

    fused    the fused Triton kernels as `torch.library.custom_op`s (pope::flash_attention_forward_v3 / _backward_v3)
             with fake (meta) implementations and autograd; an eager autograd.Function over the same launchers;
             `triton_pope_attention`, `triton_pope_attention_varlen`, `triton_unsupported_reason`,
             `will_be_differentiated`
    library  backends "cudnn" and "flash-attn-4": the pre-pass as operators (pope::cartesian,
             pope::cartesian_backward) with a library's attention kernel on q', k' between them (cuDNN's through
             SDPA, or flash-attn-4's); `cudnn_pope_attention`, `flash_attn_4_pope_attention` and their
             `..._unsupported_reason`

pope.attention dispatches to the functions below; the inputs are checked there, once. Switches and caches live in
pope.settings. Importing this package imports torch only; Triton is imported on the first kernel call.
"""

from __future__ import annotations

from .fused import (
    DECODE_MAX_QUERIES,
    DECODE_MAX_ROWS,
    MAX_HEAD_DIM,
    OPERATOR_CONTRACT,
    SUPPORTED_DTYPES,
    flash_attention_backward,
    flash_attention_forward,
    triton_pope_attention,
    triton_pope_attention_varlen,
    triton_unsupported_reason,
    will_be_differentiated,
)
from .library import (
    CUDNN_PREFERRED,
    FLASH_ATTN_4_PREFERRED,
    LIBRARY_DTYPES,
    cartesian,
    cartesian_backward,
    cudnn_pope_attention,
    cudnn_unsupported_reason,
    flash_attn_4_installed,
    flash_attn_4_pope_attention,
    flash_attn_4_unsupported_reason,
)

__all__ = [
    "CUDNN_PREFERRED",
    "DECODE_MAX_QUERIES",
    "DECODE_MAX_ROWS",
    "FLASH_ATTN_4_PREFERRED",
    "LIBRARY_DTYPES",
    "MAX_HEAD_DIM",
    "OPERATOR_CONTRACT",
    "SUPPORTED_DTYPES",
    "cartesian",
    "cartesian_backward",
    "cudnn_pope_attention",
    "cudnn_unsupported_reason",
    "flash_attention_backward",
    "flash_attention_forward",
    "flash_attn_4_installed",
    "flash_attn_4_pope_attention",
    "flash_attn_4_unsupported_reason",
    "triton_pope_attention",
    "triton_pope_attention_varlen",
    "triton_unsupported_reason",
    "will_be_differentiated",
]
