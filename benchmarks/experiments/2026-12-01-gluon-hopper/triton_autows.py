"""Does Triton 3.6's automatic warp specialisation for Hopper (tl.range(warp_specialize=True), lowered on sm_90 by
the "hopper warpspec" pass) engage, compile-only for sm_90a? Prints, per kernel and num_warps, whether the TTGIR has a
ttg.warp_specialize op, the warps the kernel ends with and the setmaxnreg count in the PTX.

Probes: a TMA matmul loop (the pass's textbook case), and `_autows_fwd_kernel`, a complete causal main pass written
the way the shipped Triton forward writes it (q' tile by TMA, k'/v blocks by TMA, S = q'k'^T, online softmax,
O += P v) with its key loop tagged tl.range(warp_specialize=True), compiled as one loop masking every block or as
the shipped unmasked + masked pair; gpu_check.py times the one-loop form as "triton-autows" (launcher
`attention_forward`, the Gluon module's interface).
Unlike Gluon it runs in the interpreter, where warp_specialize is ignored: tests check its numbers on CPU.

    PYTHONPATH=src python benchmarks/experiments/2026-12-01-gluon-hopper/triton_autows.py
"""
from __future__ import annotations

import itertools

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from compile_report import ptxas_info
from pope.kernels.jit_math import _key_ranges


@triton.jit
def _matmul_loop(a_desc, b_desc, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=True):
        acc = tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([pid_n * BN, k]).T, acc)
    offs_m, offs_n = pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + offs_m[:, None] * BN + offs_n[None, :], acc)


@triton.jit
def _autows_inner(acc, row_sum, row_max, q, k_desc, v_desc, bh, offs_m, seq_len, lo, hi, qk_scale,
                  BN: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr, MASKED: tl.constexpr,
                  CAUSAL: tl.constexpr, STAGES: tl.constexpr, TAGGED: tl.constexpr):
    """Online softmax over key blocks [lo, hi); TAGGED: the loop is tagged for the automatic warp specialisation."""
    for start in tl.range(lo, hi, BN, warp_specialize=TAGGED, num_stages=STAGES):
        k = k_desc.load([bh, start, 0]).reshape(BN, HEAD_QK)
        v = v_desc.load([bh, start, 0]).reshape(BN, HEAD_V)
        scores = tl.dot(q, k.T)
        if MASKED:
            offs_n = start + tl.arange(0, BN)
            visible = (offs_n < seq_len)[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
        probs = tl.math.exp2(scores * qk_scale - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None])
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _autows_fwd_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, seq_len, qk_scale, BM: tl.constexpr,
                       BN: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr, CAUSAL: tl.constexpr,
                       STAGES: tl.constexpr, SPLIT: tl.constexpr = True):
    """The main pass of gluon_attention (same inputs, outputs and masking), in plain Triton. SPLIT: an unmasked loop
    (tagged for warp specialisation) then the masked blocks (untagged: Triton 3.6's pass fails on two tagged
    loops); else one tagged loop masking every block."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest causal blocks first
    bh = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    q = q_desc.load([bh, pid_m * BM, 0]).reshape(BM, HEAD_QK)
    acc = tl.zeros([BM, HEAD_V], tl.float32)
    row_sum = tl.zeros([BM], tl.float32)
    row_max = tl.full([BM], float("-inf"), tl.float32)
    unmasked_end, last_visible = _key_ranges(pid_m, 0, seq_len, BM, BN, CAUSAL)
    if SPLIT:
        acc, row_sum, row_max = _autows_inner(acc, row_sum, row_max, q, k_desc, v_desc, bh, offs_m, seq_len, 0,
                                              unmasked_end, qk_scale, BN, HEAD_QK, HEAD_V, False, CAUSAL, STAGES, True)
        acc, row_sum, row_max = _autows_inner(acc, row_sum, row_max, q, k_desc, v_desc, bh, offs_m, seq_len,
                                              unmasked_end, last_visible, qk_scale, BN, HEAD_QK, HEAD_V, True, CAUSAL,
                                              STAGES, False)
    else:
        acc, row_sum, row_max = _autows_inner(acc, row_sum, row_max, q, k_desc, v_desc, bh, offs_m, seq_len, 0,
                                              last_visible, qk_scale, BN, HEAD_QK, HEAD_V, True, CAUSAL, STAGES, True)
    rows = bh.to(tl.int64) * seq_len + offs_m
    offs_d = tl.arange(0, HEAD_V)
    tl.store(o_ptr + rows[:, None] * HEAD_V + offs_d[None, :], (acc / row_sum[:, None]).to(o_ptr.dtype.element_ty),
             mask=(offs_m < seq_len)[:, None])
    tl.store(lse_ptr + rows, (row_max + tl.math.log2(row_sum)) * 0.6931471805599453, mask=offs_m < seq_len)


AUTOWS_TILE = (128, 64, 4, 2)  # (BLOCK_M, BLOCK_N, num_warps, stages): 4 warps, where the pass engages
AUTOWS_SPLIT = False  # one tagged loop: with two loops in the kernel Triton 3.6's pass fails (compile error)


def attention_forward(q_prime, k_prime, v, *, causal: bool = True, softmax_scale: float | None = None,
                      tile: tuple = AUTOWS_TILE, split: bool = AUTOWS_SPLIT):
    """(o (BH, N, d), lse (BH, N) fp32) of softmax(scale q'k'^T) v, scale 1/sqrt(d) by default; contiguous inputs."""
    import math

    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    block_m, block_n, num_warps, stages = tile
    heads, seq_len, head_qk = q_prime.shape
    head_v = v.shape[2]
    scale = 1.0 / math.sqrt(head_v) if softmax_scale is None else softmax_scale
    o = torch.empty_like(v)
    lse = torch.empty((heads, seq_len), device=v.device, dtype=torch.float32)
    descriptors = [TensorDescriptor.from_tensor(t, [1, rows, t.shape[2]])
                   for t, rows in ((q_prime, block_m), (k_prime, block_n), (v, block_n))]
    _autows_fwd_kernel[(triton.cdiv(seq_len, block_m), heads)](
        *descriptors, o, lse, seq_len, scale * 1.4426950408889634, BM=block_m, BN=block_n, HEAD_QK=head_qk,
        HEAD_V=head_v, CAUSAL=causal, STAGES=stages, SPLIT=split, num_warps=num_warps)
    return o, lse


def engaged(kernel, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 2) -> dict:
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    return {"warp_specialize_op": "ttg.warp_specialize(" in compiled.asm["ttgir"],
            "warps": compiled.metadata.num_warps, "setmaxnreg": compiled.asm["ptx"].count("setmaxnreg"),
            "shared_B": compiled.metadata.shared, **ptxas_info(compiled.asm["ptx"]),
            "wgmma": compiled.asm["ptx"].count("wgmma.mma_async"),
            "requested_registers": _requested(compiled.asm["ttgir"])}


def _requested(ttgir: str):
    import re

    found = re.search(r"requestedRegisters = array<i32: ([0-9, ]+)>", ttgir)
    return [int(x) for x in found.group(1).split(",")] if found else None


def main() -> None:
    matmul = ({"a_desc": "tensordesc<bf16[128,64]>", "b_desc": "tensordesc<bf16[128,64]>", "c_ptr": "*fp32",
               "K": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}, {"BM": 128, "BN": 128, "BK": 64})
    for warps in (4, 8):
        print(f"matmul loop (128x128x64, bf16) num_warps {warps}: {engaged(_matmul_loop, *matmul, warps)}", flush=True)
    for (bm, bn, warps, stages), split in itertools.product((AUTOWS_TILE, (128, 64, 8, 2), (64, 64, 4, 2),
                                                              (128, 64, 4, 3)), (True, False)):
        full = ({"q_desc": f"tensordesc<bf16[1,{bm},256]>", "k_desc": f"tensordesc<bf16[1,{bn},256]>",
                 "v_desc": f"tensordesc<bf16[1,{bn},128]>", "o_ptr": "*bf16", "lse_ptr": "*fp32", "seq_len": "i32",
                 "qk_scale": "fp32", "BM": "constexpr", "BN": "constexpr", "HEAD_QK": "constexpr",
                 "HEAD_V": "constexpr", "CAUSAL": "constexpr", "STAGES": "constexpr"},
                {"BM": bm, "BN": bn, "HEAD_QK": 256, "HEAD_V": 128, "CAUSAL": True, "STAGES": stages, "SPLIT": split})
        full[0]["SPLIT"] = "constexpr"
        try:
            result = engaged(_autows_fwd_kernel, *full, warps)
        except Exception as error:
            result = f"does not compile: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
        loops = "unmasked loop tagged + masked loop" if split else "one tagged loop, every block masked"
        print(f"full causal main pass tile ({bm}, {bn}, {warps}, {stages}), {loops}: {result}", flush=True)


if __name__ == "__main__":
    main()
