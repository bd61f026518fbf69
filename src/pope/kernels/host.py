"""Host-side helpers of the launchers: buffers, integer arithmetic, layouts, plan keys, device facts.

Guarantees: `empty` and `empty_in_layout_of` are pope.kernels.buffers' (the buffers kernels write, in their
inputs' layouts); `block_d` is a head dim's tile width (padded to a power of two, >= 16); `tma_ready` returns a
tensor a TMA copy can read (the input itself when it already can); `plan` keys every argument Triton specialises on;
`Packed` describes a packed (varlen) batch and `batch_view` shows its (total, H, d) tensors to the kernels as a batch
of one. Integer helpers are plain Python: Triton 3.6's triton.cdiv / triton.next_power_of_2 are constexpr functions
whose host calls cost ~4 us each (argument unwrapping), a dozen times per eager forward+backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pope.frequencies import pope_turn_words
from pope.kernels.buffers import block_d as block_d  # re-exported: the launchers' buffers and tile widths
from pope.kernels.buffers import empty as empty
from pope.kernels.buffers import empty_in_layout_of as empty_in_layout_of
from pope.kernels.buffers import next_power_of_2 as next_power_of_2
from pope.kernels.buffers import prime_buffer as prime_buffer
from pope.kernels.capability import cuda_capability
from pope.settings import SETTINGS


class Packed(NamedTuple):
    """A packed (varlen) batch, flash-attn's layout: sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of the
    (total_q, H, d) queries and cu_seqlens_k[b]:cu_seqlens_k[b + 1] of the (total_k, H, d) keys and values; int32
    (batch + 1,) on the tensors' device (never read on the host); max_seqlen_q / max_seqlen_k bound the lengths
    (the grids cover them)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.shape[0] - 1


def batch_view(x: torch.Tensor, packed: Packed | None) -> torch.Tensor:
    """x as the kernels address it: (B, H, N, .) as it is; packed (total, H, .) as the (1, H, total, .) view (no
    copy: the kernels take any batch, head and row strides)."""
    return x if packed is None else x.transpose(0, 1)[None]


def cu_seqlens(packed: Packed | None) -> tuple:
    """The kernels' (CuSeqlensQ, CuSeqlensK) arguments: None, None (constexprs, the batched kernels) when not packed."""
    return (None, None) if packed is None else (packed.cu_seqlens_q, packed.cu_seqlens_k)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def precision(dtype: torch.dtype, device: torch.device) -> str:
    """tl.dot's input_precision. 16-bit inputs: tensor cores ("tf32" is ignored for them). fp32 inputs follow
    PyTorch's float32 matmul precision, as torch.matmul does: at "high" or "medium"
    (torch.set_float32_matmul_precision) TF32 tensor cores ("tf32": 10-bit mantissa products, fp32 sums); at
    "highest" (the default) fp32-accurate dots: "tf32x3" (each operand split into a TF32 high and low part, three
    tensor-core products, fp32 sums; the low x low product is dropped) where the GPU has TF32 tensor cores (compute
    capability >= 8.0, and the interpreter), exact FMA dots ("ieee") on older GPUs, where "high" gives "ieee" too
    (pope.ops runs the reference there; only direct kernel calls get this far). Either way the results are held to
    the 2x rule against plain PyTorch fp32 (the tests; scripts/gpu_check.py on a GPU)."""
    if dtype != torch.float32:
        return "tf32"
    if device.type == "cuda" and cuda_capability(device) < (8, 0):  # no TF32 tensor cores before Ampere
        return "ieee"
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def strides(t: torch.Tensor):
    return t.stride()[:3]


def plan(*items) -> tuple:
    """A launcher call's plan key: what fixes every argument Triton specialises on for the kernels it launches.
    Tensors give shape, strides, dtype, device and 16-byte alignment (the buffers a launcher allocates itself
    follow from these); other items (flags, offsets, tile configs) are taken as they are."""
    return tuple(
        (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0) if isinstance(x, torch.Tensor) else x
        for x in items
    )


def tma_ready(t: torch.Tensor, block_d: int) -> torch.Tensor:
    """t (..., d) in a layout a TMA copy reads: last dim contiguous, base and other strides 16-byte aligned. The
    usual inputs (contiguous, or (B, N, H, d) transposed to (B, H, N, d)) already are and pass through; others
    are copied, padded with zero channels to block_d when d * element size is not a multiple of 16 bytes."""
    size = t.element_size()
    if (
        t.stride(-1) == 1
        and t.data_ptr() % 16 == 0
        and all(  # (broadcast, stride-0 dims are copied too)
            stride > 0 and (stride * size) % 16 == 0 for stride, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1
        )
    ):
        return t
    if (t.shape[-1] * size) % 16:
        return torch.nn.functional.pad(t, (0, block_d - t.shape[-1]))
    return t.contiguous()


def sm_count(device) -> int:
    """Multiprocessors of a CUDA device (132, an H100/H200's, for the interpreter's CPU tensors)."""
    if device.type != "cuda":
        return 132
    counts = SETTINGS.caches.sm_counts
    if device not in counts:
        counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return counts[device]


def frequencies(head_dim: int, base: float, device) -> torch.Tensor:
    """The kernels' theta: PoPE's head_dim frequencies as fixed-point turns, (2, head_dim) int32 on device, from
    their float64 values (pope.frequencies.pope_turn_words, the project's one frequency function)."""
    return pope_turn_words(head_dim, base, device=device).contiguous()
