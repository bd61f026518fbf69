"""Fused PoPE attention in Triton: forward, backward and decode kernels with their launchers (no autograd, no input
validation: pope.ops wraps them as operators, pope.attention checks the inputs).

What they compute: for q (B, Hq, Nq, d), k/v (B, Hkv, Nk, d) (Hq % Hkv == 0, Nq <= Nk), delta (Hq, d) or None,
softmax over j of scale * sum_c f(q_ic) f(k_jc) cos((j - t_i) theta_c + delta_c) with t_i = q_offset + i,
bottom-right causal (key j visible iff j <= t_i) or not; f = softplus / relu / identity (pope.magnitudes);
bf16 / fp16 / fp32, head dims up to 128; out in q's dtype, lse fp32; dq, dk, dv, d(delta).
Guarantees (held by the tests through Triton's interpreter and by scripts/gpu_check.py on a GPU): output
and every gradient within 2x the error of the pure-PyTorch reference in the same dtype, against float64; the
backward bitwise deterministic (no atomics); the backward's own buffers at most 5 |q| at MHA for d > 64 (SDPA's),
7 |q| for d <= 64 (SDPA's gradients and the pre-pass's q', k'); a key masked from a query never reaches that query's
output. Packed variable-length batches (flash-attn's varlen layout): `forward` and `backward` take
packed=host.Packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) and run every sequence in one launch per
kernel (a constexpr IS_VARLEN in the same kernels), equal bit for bit to the same kernels run on each sequence alone
(d(delta) up to its summation order).

Modules, one concern each:
    jit_math       shared device functions (sincos, log1p, magnitudes, phases, block coordinates)
    prepass        x -> x' = [f(x) cos | f(x) sin] (transform, transform_queries_and_keys)
    prepass_grad   dq', dk' -> dq, dk, d(delta): the pre-pass's gradient, for a library kernel's backward
    fwd            forward kernel + launcher (forward)
    bwd            the backward's launcher (backward) and its d(delta) sum kernel
    bwd_dq         the dq kernel
    bwd_dkdv       the dk/dv kernel
    bwd_chain_rule the chain rule from q'/k' gradients to q/k gradients, shared by both
    decode         the split-K decode launcher (decode_forward)
    decode_kernels the decode kernels (tensor cores, lanes) and the combine kernel
    phase_tables   the tensor-core decode kernel's key-phase tables (release_phase_tables)
    configs        tile configurations (frozen tables, POPE_KERNEL_CONFIGS override), decode tiles
    direct_launch  Triton's launch path, or the direct path gated to the Triton version it was written for
    host           layouts, plan keys and integer helpers of the launchers
    buffers        the buffers kernels write, outputs and gradients in their inputs' layouts (torch only)
    interpreter    TRITON_INTERPRET=1: INTERPRET and the fixes that make the interpreter compute as the GPU does
    capability     a CUDA device's compute capability, asked once per device, and whether cuDNN attention is on:
                   constants to torch.compile
The design and its measurements: docs/kernels.md. Importing this package does not import Triton; the first use
of a name below does.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "forward": "fwd",
    "backward": "bwd",
    "decode_forward": "decode",
    "decode_tile": "configs",
    "transform": "prepass",
    "transform_queries_and_keys": "prepass",
    "transform_grad": "prepass_grad",
    "release_phase_tables": "phase_tables",
    "frequencies": "host",
    "Packed": "host",
    "cuda_capability": "capability",
    "cudnn_attention_enabled": "capability",
    "INTERPRET": "interpreter",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pope.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)  # a copy loaded under another name too
    globals()[name] = value  # the next lookup is a plain attribute (and a test may replace it)
    return value


def __dir__():
    return __all__
