"""flash-attn-4's kernels at PoPE's head dims: query/key head dim 2d, value head dim d.

flash-attn-4 picks its Hopper tiles from the head dims it was tuned for, where the query/key and value head dims are
equal or (192, 128). PoPE's calls have query/key head dim 2d and value head dim d, and there its choice is not the
best that fits: at (256, 128) its backward runs its (256, 256) configuration, 64x48 tiles (that configuration stages
a 256-wide dq in shared memory), where a 64x80 tile fits and takes 0.66x the time (H100, 4x16x4096: 2.80 against 4.21
ms; 2x16x8192: 5.11 against 7.95). Its forward takes explicit tiles; its Hopper backward takes them only from its
tile-size function, so `flash_attn_4_wide` runs the backward with that function answering PoPE's head dims from
`HOPPER_BACKWARD_TILES` for the duration of the call (under a lock), and every other call as flash-attn-4 would.

These are flash-attn-4's private functions (`flash_attn.cute.interface._flash_attn_fwd`, `_flash_attn_bwd`,
`_tile_size_bwd_sm90`). Where a version lacks one of them, `flash_attn_4_wide` calls its public `flash_attn_func` with
flash-attn-4's own tiles: the same results, the measured speed-up lost.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading

import torch

from pope import kernels
from pope.optional import require

# {(query/key head dim, value head dim): fields of flash-attn-4's Hopper backward config to change}. Measured on an
# H100 against its own choice (64x48): 64x64 0.78x its time, 64x80 0.66x; 64x96, and 64x80 with two dO stages, need
# more shared memory than a Hopper SM has. Results within the float64 + 2x rule, bitwise repeatable.
HOPPER_BACKWARD_TILES: dict[tuple[int, int], dict] = {(256, 128): {"n_block_size": 80}}
# {(query/key head dim, value head dim): flash-attn-4 forward tile options} for calls with as many query as key heads.
# Measured on an H100 (kernel alone, 4x16x4096): (256, 128) 128x96 0.663 ms against its 128x80's 0.687 (128x112 and
# up do not fit); (128, 64) 192x128 0.387 ms against its 128x128's 0.415.
HOPPER_FORWARD_TILES: dict[tuple[int, int], dict] = {
    (256, 128): {"tile_mn": (128, 96), "mma_pv_is_rs": True, "intra_wg_overlap": True},
    (128, 64): {"tile_mn": (192, 128), "mma_pv_is_rs": True, "intra_wg_overlap": True},
}
_TILE_FUNCTION_LOCK = threading.Lock()


def _library():
    return require("flash_attn.cute", purpose="backend 'flash-attn-4'")


def _interface():
    """flash-attn-4's module holding the private functions the tuned call goes through."""
    return require("flash_attn.cute.interface", purpose="backend 'flash-attn-4'")


@functools.cache
def _tunable() -> bool:
    """Whether this flash-attn-4 has the private functions the tuned call goes through, with the arguments it passes."""
    interface = _interface()
    needed = {
        "_flash_attn_fwd": {"tile_mn", "mma_pv_is_rs", "intra_wg_overlap", "return_lse"},
        "_flash_attn_bwd": {"deterministic"},
        "_tile_size_bwd_sm90": set(),
    }
    for name, arguments in needed.items():
        function = getattr(interface, name, None)
        if function is None or not arguments <= set(inspect.signature(function).parameters):
            return False
    return True


def _hopper(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and kernels.cuda_capability(x.device)[0] == 9


class _TunedFlashAttention4(torch.autograd.Function):
    """flash-attn-4's forward and backward on (B, N, H, channels) q', k', v with PoPE's Hopper tiles."""

    @staticmethod
    def forward(ctx, q_wide, k_wide, v, softmax_scale, causal, deterministic):
        interface = _interface()
        dims = (q_wide.shape[-1], v.shape[-1])
        tiles = HOPPER_FORWARD_TILES.get(dims, {}) if q_wide.shape[2] == k_wide.shape[2] else {}
        out, lse = interface._flash_attn_fwd(
            q_wide, k_wide, v, softmax_scale=softmax_scale, causal=causal, return_lse=True, **tiles
        )[:2]
        ctx.save_for_backward(q_wide, k_wide, v, out, lse)
        ctx.options = (softmax_scale, causal, deterministic)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        interface = _interface()
        q_wide, k_wide, v, out, lse = ctx.saved_tensors
        softmax_scale, causal, deterministic = ctx.options
        with _TILE_FUNCTION_LOCK:
            library_choice = interface._tile_size_bwd_sm90

            def tile_size_bwd_sm90(head_dim, head_dim_v, *args, **kwargs):
                config = library_choice(head_dim, head_dim_v, *args, **kwargs)
                change = HOPPER_BACKWARD_TILES.get((head_dim, head_dim_v))
                sparse = kwargs.get("sparse_block_size_q") is not None
                return config if sparse or change is None else dataclasses.replace(config, **change)

            interface._tile_size_bwd_sm90 = tile_size_bwd_sm90
            try:
                dq, dk, dv = interface._flash_attn_bwd(
                    q_wide, k_wide, v, out, grad_out, lse, softmax_scale, causal, deterministic=deterministic
                )[:3]
            finally:
                interface._tile_size_bwd_sm90 = library_choice
        return dq, dk, dv, None, None, None


def flash_attn_4_wide(q_wide, k_wide, v, *, softmax_scale: float, causal: bool) -> torch.Tensor:
    """Attention over (B, N, H, 2d) q', k' and (B, N, H, d) v (any 16-byte-aligned strides), as flash-attn-4 computes
    it, with PoPE's Hopper tiles where this flash-attn-4 allows them. Deterministic under
    torch.use_deterministic_algorithms(True) (flash-attn-4's ordered dq sums). Returns (B, N, Hq, d)."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    if _hopper(q_wide) and _tunable():
        return _TunedFlashAttention4.apply(q_wide, k_wide, v, softmax_scale, causal, deterministic)
    out, _ = _library().flash_attn_func(
        q_wide, k_wide, v, softmax_scale=softmax_scale, causal=causal, deterministic=deterministic
    )
    return out
