"""The kernels' TF32 error against PyTorch's, on CPU: Triton's interpreter (truncating TF32 operands as the tensor
cores do, pope.kernels.interpreter) against pope.testing.tf32_reference's emulated TF32 matmuls (rounded operands),
both against float64, for out and every gradient. --truncate runs the kernels without their operand rounding
(jit_math._tf32_rounded replaced by the identity), i.e. as the tensor cores would see unrounded fp32.

    PYTHONPATH=src python benchmarks/experiments/2026-12-02-tf32-check/emulate.py [--truncate]
"""
import argparse
import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401  (the interpreter needs it visible to a jit function)

import pope.kernels.jit_math as jit_math  # noqa: E402
from pope.attention import reference_pope_attention  # noqa: E402
from pope.ops import triton_pope_attention  # noqa: E402
from pope.testing import (GRADIENT_NAMES, attention_inputs, check_within_rule, outputs_and_gradients,  # noqa: E402
                          tf32_reference)

SHAPES = [(1, 2, 2, 97, 97, 64, True), (2, 4, 2, 64, 130, 32, True), (1, 2, 1, 80, 80, 128, False)]


@triton.jit
def _unrounded(x):
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--truncate", action="store_true", help="the kernels without their TF32 operand rounding")
    args = parser.parse_args()
    if args.truncate:
        jit_math._tf32_rounded = _unrounded  # the interpreter looks jit functions up in their module at run time
    print("shape | tensor | kernel error | PyTorch TF32 error | ratio | within 2x")
    for shape in SHAPES:
        batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim, causal = shape
        q, k, v, delta, grad_out = attention_inputs(batch, n_q_heads, n_kv_heads, seq_q, seq_k, head_dim,
                                                    generator=torch.Generator().manual_seed(0))
        options = dict(base=10000.0, causal=causal, softmax_scale=head_dim ** -0.5, q_offset=seq_k - seq_q,
                       magnitude="softplus", rotary_dim=None)
        exact = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float64, options)
        torch.set_float32_matmul_precision("high")
        fused = outputs_and_gradients(triton_pope_attention, q, k, v, delta, grad_out, torch.float32, options)
        with tf32_reference():
            reference = outputs_and_gradients(reference_pope_attention, q, k, v, delta, grad_out, torch.float32,
                                              options)
        torch.set_float32_matmul_precision("highest")
        for name, ours, theirs, truth in zip(GRADIENT_NAMES, fused, reference, exact):
            r = check_within_rule(ours, theirs, truth, torch.float32)
            print(f"{shape} | {name} | {r['kernel']:.2e} | {r['reference']:.2e} | {r['kernel'] / r['reference']:.2f} | "
                  f"{r['ok']}")


if __name__ == "__main__":
    main()
