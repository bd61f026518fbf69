"""Triton's CPU interpreter (TRITON_INTERPRET=1), made to compute what the compiled kernels compute.

INTERPRET says whether this process runs the kernels through the interpreter (decided by TRITON_INTERPRET when
Triton is first imported). In that mode the kernels run on CPU tensors and `_fix_triton_interpreter` (applied on
import, only in that mode) closes the gaps of Triton 3.6's interpreter that these kernels hit, so that the
CPU tests check the arithmetic the GPU does (bf16 products and roundings included). Compiled runs are untouched.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

INTERPRET = triton.knobs.runtime.interpret if hasattr(triton, "knobs") else False


def _fix_triton_interpreter() -> None:
    """Five gaps in Triton 3.6's CPU interpreter that these kernels hit, closed by wrapping its internals:
    * it turns a scalar tensor into an int with int(array([x])), which NumPy >= 2.4 rejects, so loop
      bounds computed from program_id fail: use the single element instead;
    * its tl.dot multiplies bfloat16 operands as their raw uint16 bit patterns: widen them to fp32 first
      (exact, as the tensor cores' bf16 products are);
    * so do its bfloat16 +, -, *, /: compute them in fp32 and round once, as the GPU's bf16x2 instructions do;
    * its fp32 -> bf16 cast truncates, where compiled Triton rounds to nearest even: round like the GPU;
    * its tl.dot ignores input_precision "tf32" and multiplies fp32 operands exactly, where the tensor cores read
      only their top 19 bits (sign, exponent, 10 mantissa bits): drop the other 13 bits like the GPU."""
    # the interpreter's internals, imported in interpreter mode only
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    if getattr(interpreter, "_pope_fixed", False):
        return
    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    def widen(x):  # bf16 bits -> fp32 (exact)
        if x.dtype.scalar == tl.bfloat16:
            data = (x.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)
        return x

    original_dot = interpreter.InterpreterBuilder.create_dot

    def tf32_operand(x):  # fp32 -> the TF32 value a tensor core reads (the low 13 bits dropped)
        if x.dtype.scalar == tl.float32:
            data = (x.data.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)
        return x

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32:
            a, b = tf32_operand(a), tf32_operand(b)
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    original_cast = interpreter.InterpreterBuilder.cast_impl

    def to_bf16(data):  # fp32 -> bf16 bits, rounded to nearest even
        rounded = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(torch.bfloat16)
        return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return to_bf16(src.data)
        return original_cast(self, src, dst_type)

    def bf16_arithmetic(name, op):
        original = getattr(interpreter.InterpreterBuilder, name)

        def create(self, lhs, rhs):
            if lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16:
                return to_bf16(op(widen(lhs).data, widen(rhs).data))
            return original(self, lhs, rhs)

        setattr(interpreter.InterpreterBuilder, name, create)

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.cast_impl = cast_impl
    for name, op in (
        ("create_fadd", np.add),
        ("create_fsub", np.subtract),
        ("create_fmul", np.multiply),
        ("create_fdiv", np.divide),
    ):
        bf16_arithmetic(name, op)
    interpreter._pope_fixed = True


if INTERPRET:
    _fix_triton_interpreter()
