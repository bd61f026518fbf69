"""A Gluon (Triton 3.6's explicit-layout dialect) causal attention forward for PoPE's main pass on Hopper (sm_90a).

Input is what pope's pre-pass materialises: q' (BH, N, 2d) and k' (BH, N, 2d), [cos | sin] halves, and v (BH, N, d),
all bf16 and contiguous; output o (BH, N, d) bf16 and lse (BH, N) fp32, the natural-log log-sum-exp. Scores are
softmax_scale * (q'_i . k'_j) with softmax_scale = 1/sqrt(d) (d, not 2d: q'.k' is PoPE's score), causal (key j visible
to query i iff j <= i; Nq == Nk so top-left and bottom-right agree) or not.

Three forms of the same consumer code (`_consume`):
- "plain": one partition of 8 warps (two warpgroups, 128 query rows, one wgmma layout of warps [8, 1]) issues its own
  TMA loads STAGES - 1 key blocks ahead into a ring of shared-memory stages, an mbarrier per stage, and a CTA barrier
  before a stage is refilled (the shipped Triton forward's schedule, written by hand).
- "ws": FlashAttention-3's split. gl.warp_specialize runs three partitions: the default one (4 warps, query rows
  0..63 of the block) and a worker of 4 warps (rows 64..127) are consumers; a 1-warp worker is the producer that
  issues every TMA load (the two Q halves, then K/V blocks into the STAGES-deep ring). Per stage a "ready" mbarrier
  (completed by the TMA transaction count) and an "empty" mbarrier (one arrival per consumer) hand the buffers back
  and forth, so the two consumer warpgroups never wait on each other (no CTA barrier in the loop) and the producer
  runs ahead as far as the ring allows. Registers are re-allocated per partition (setmaxnreg): producer 24,
  consumers 240 (kernel maxnreg 168: 12 warps x 32 x 168 <= 64K registers).
- "ws-overlap": "ws" plus FlashAttention-3's intra-warpgroup overlap in each consumer (`_overlapped_blocks`): block
  j's S = q'k'^T is issued before block j-1's O += P v, and block j's softmax runs while that P v product does (one
  loop over the key blocks, the mask applied by a runtime branch on the blocks that need it).
Not done (FA3 has them): explicit ping-pong ordering of the two consumers' softmax (named barriers), TMA stores of o,
persistent scheduling.

Per consumer and key block (rows RM = 64 or 128, keys BLOCK_N, QK channels 2d, V channels d):
  S (RM, BLOCK_N) fp32 = wgmma(q' tile in shared memory, k' tile^T in shared memory)
  online softmax in base 2 (scale folded into the exponent), masked blocks only where the causal diagonal or the
  sequence end cuts them (rows past N are computed and never stored; keys past N arrive as TMA zeros and are masked)
  O (RM, d) fp32 += wgmma(P as bf16 registers (dot-operand layout), v tile in shared memory)
"""
from __future__ import annotations

import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

LOG2E = 1.4426950408889634
VARIANTS = ("plain", "ws", "ws-overlap")
BLOCK_M = 128  # query rows per program (both variants)
PRODUCER_REGISTERS = gl.constexpr(24)  # the producer warp holds only scalars: the minimum setmaxnreg allows
CONSUMER_REGISTERS = gl.constexpr(240)
WS_MAXNREG = 168  # 12 warps (two consumer warpgroups + the producer's warpgroup) x 32 threads x 168 <= 65536


@gluon.jit
def _issue_block_load(k_desc, v_desc, k_bufs, v_bufs, ready_bars, bh, block, STAGES: gl.constexpr,
                      BLOCK_N: gl.constexpr, pred):
    """TMA copies of key block `block` (k' then v) into ring stage block % STAGES; its ready barrier completes when
    both have landed (expected byte count)."""
    stage = block % STAGES
    bar = ready_bars.index(stage)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [bh, block * BLOCK_N, 0], bar, k_bufs.index(stage), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [bh, block * BLOCK_N, 0], bar, v_bufs.index(stage), pred=pred)


@gluon.jit
def _key_blocks(row0, seq_len, RM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(blocks needing no mask, blocks this consumer's rows row0..row0+RM see) for keys 0..seq_len."""
    if CAUSAL:
        unmasked = gl.minimum((row0 + 1) // BLOCK_N, seq_len // BLOCK_N)
        visible = gl.cdiv(gl.minimum(row0 + RM, seq_len), BLOCK_N)
    else:
        unmasked = seq_len // BLOCK_N
        visible = gl.cdiv(seq_len, BLOCK_N)
    return unmasked, visible


@gluon.jit
def _probabilities(scores, row_max, row_sum, block, row0, seq_len, qk_scale, masked,
                   s_layout: gl.constexpr, RM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(P, rescale, new row max, new row sum) of one block's scores S (RM, BLOCK_N), base 2; masked: apply the
    causal / sequence-end mask (a constexpr, or a runtime flag in the overlapped loop)."""
    if masked:
        offs_m = row0 + gl.arange(0, RM, layout=gl.SliceLayout(1, s_layout))
        offs_n = block * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        visible = (offs_n < seq_len)[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        scores = gl.where(visible, scores, float("-inf"))
    # qk_scale > 0, so max(S) * scale = max(S * scale): the scale rides in the exponent's FMA.
    new_max = gl.maximum(row_max, gl.max(scores, 1) * qk_scale)
    probs = gl.exp2(scores * qk_scale - new_max[:, None])
    rescale = gl.exp2(row_max - new_max)
    return probs, rescale, new_max, row_sum * rescale + gl.sum(probs, 1)


@gluon.jit
def _scores_async(q_tile, k_bufs, ready_bars, block, s_layout: gl.constexpr, RM: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):
    """Waits for key block `block` to land, issues S = q' k'^T on it (async wgmma; the caller waits)."""
    HEAD_QK: gl.constexpr = k_bufs.type.shape[3]
    stage = block % STAGES
    mbarrier.wait(ready_bars.index(stage), (block // STAGES) & 1)
    k_tile = k_bufs.index(stage).reshape([BLOCK_N, HEAD_QK]).permute((1, 0))  # (2d, BLOCK_N) view
    return warpgroup_mma(q_tile, k_tile, gl.zeros([RM, BLOCK_N], gl.float32, s_layout), use_acc=False,
                         is_async=True)


@gluon.jit
def _pv_async(probs, v_bufs, block, acc, o_layout: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Issues O += P v on key block `block` (async wgmma, P from registers; the caller waits)."""
    HEAD_V: gl.constexpr = v_bufs.type.shape[3]
    v_tile = v_bufs.index(block % STAGES).reshape([BLOCK_N, HEAD_V])
    p_operand = gl.convert_layout(probs.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                                               k_width=2))
    return warpgroup_mma(p_operand, v_tile, acc, is_async=True)


@gluon.jit
def _softmax_step(acc, row_sum, row_max, q_tile, k_bufs, v_bufs, ready_bars, empty_bars, block, row0, seq_len,
                  qk_scale, k_desc, v_desc, bh, n_total,
                  s_layout: gl.constexpr, o_layout: gl.constexpr, RM: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr, ISSUE_LOADS: gl.constexpr):
    """One key block of the online softmax for this consumer's RM rows, each wgmma waited for at once."""
    if ISSUE_LOADS:
        # Refill the stage block - 1 used, STAGES - 1 blocks ahead: every warp has waited for its wgmma on it
        # (warpgroup_mma_wait below), the CTA barrier makes sure all of them have.
        gl.thread_barrier()
        ahead = block + STAGES - 1
        _issue_block_load(k_desc, v_desc, k_bufs, v_bufs, ready_bars, bh, ahead, STAGES, BLOCK_N, ahead < n_total)
    scores = _scores_async(q_tile, k_bufs, ready_bars, block, s_layout, RM, BLOCK_N, STAGES)
    scores = warpgroup_mma_wait(num_outstanding=0, deps=(scores, ))
    probs, rescale, row_max, row_sum = _probabilities(scores, row_max, row_sum, block, row0, seq_len, qk_scale,
                                                      MASKED, s_layout, RM, BLOCK_N, CAUSAL)
    acc = acc * gl.convert_layout(rescale, gl.SliceLayout(1, o_layout))[:, None]
    acc = _pv_async(probs, v_bufs, block, acc, o_layout, BLOCK_N, STAGES)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    if not ISSUE_LOADS:
        mbarrier.arrive(empty_bars.index(block % STAGES))  # this consumer is done with the stage
    return acc, row_sum, row_max


@gluon.jit
def _overlapped_blocks(acc, row_sum, row_max, q_tile, k_bufs, v_bufs, ready_bars, empty_bars, row0, seq_len,
                       qk_scale, unmasked, visible, s_layout: gl.constexpr, o_layout: gl.constexpr, RM: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Key blocks 0..visible-1 with FlashAttention-3's intra-warpgroup overlap: block j's S = q'k'^T and block j-1's
    O += P v are in flight together, and block j's softmax runs while the P v product does (visible >= 1)."""
    scores = _scores_async(q_tile, k_bufs, ready_bars, 0, s_layout, RM, BLOCK_N, STAGES)
    scores = warpgroup_mma_wait(num_outstanding=0, deps=(scores, ))
    probs, rescale, row_max, row_sum = _probabilities(scores, row_max, row_sum, 0, row0, seq_len, qk_scale,
                                                      unmasked == 0, s_layout, RM, BLOCK_N, CAUSAL)
    for block in range(1, visible):
        scores = _scores_async(q_tile, k_bufs, ready_bars, block, s_layout, RM, BLOCK_N, STAGES)
        acc = _pv_async(probs, v_bufs, block - 1, acc, o_layout, BLOCK_N, STAGES)  # O is relative to block-1's max
        scores = warpgroup_mma_wait(num_outstanding=1, deps=(scores, ))  # S done; P v may still run
        probs, rescale, row_max, row_sum = _probabilities(scores, row_max, row_sum, block, row0, seq_len, qk_scale,
                                                          block >= unmasked, s_layout, RM, BLOCK_N, CAUSAL)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty_bars.index((block - 1) % STAGES))  # k' and v of block - 1 are no longer read
        acc = acc * gl.convert_layout(rescale, gl.SliceLayout(1, o_layout))[:, None]
    acc = _pv_async(probs, v_bufs, visible - 1, acc, o_layout, BLOCK_N, STAGES)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty_bars.index((visible - 1) % STAGES))
    return acc, row_sum, row_max


@gluon.jit
def _consume(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready_bars, empty_bars, o_ptr, lse_ptr,
             bh, row0, seq_len, n_total, qk_scale,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, ISSUE_LOADS: gl.constexpr,
             OVERLAP: gl.constexpr):
    """Rows row0..row0+RM of head bh: waits for its q' tile, runs the key blocks, writes o and lse. In the "ws" forms
    it also waits for (and hands back) the blocks its rows do not see, which the other consumer needs."""
    RM: gl.constexpr = q_desc.block_type.shape[1]
    HEAD_QK: gl.constexpr = q_desc.block_type.shape[2]
    HEAD_V: gl.constexpr = v_desc.block_type.shape[2]
    WARPS: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, HEAD_V, 16])
    if ISSUE_LOADS:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bh, row0, 0], q_bar, q_smem)
        for block in gl.static_range(STAGES - 1):
            _issue_block_load(k_desc, v_desc, k_bufs, v_bufs, ready_bars, bh, block, STAGES, BLOCK_N, block < n_total)
    mbarrier.wait(q_bar, 0)
    q_tile = q_smem.reshape([RM, HEAD_QK])

    acc = gl.zeros([RM, HEAD_V], gl.float32, o_layout)
    row_sum = gl.zeros([RM], gl.float32, gl.SliceLayout(1, s_layout))
    row_max = gl.full([RM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    unmasked, visible = _key_blocks(row0, seq_len, RM, BLOCK_N, CAUSAL)
    if OVERLAP:
        acc, row_sum, row_max = _overlapped_blocks(
            acc, row_sum, row_max, q_tile, k_bufs, v_bufs, ready_bars, empty_bars, row0, seq_len, qk_scale,
            unmasked, visible, s_layout, o_layout, RM, BLOCK_N, STAGES, CAUSAL)
    else:
        for block in range(0, unmasked):
            acc, row_sum, row_max = _softmax_step(
                acc, row_sum, row_max, q_tile, k_bufs, v_bufs, ready_bars, empty_bars, block, row0, seq_len,
                qk_scale, k_desc, v_desc, bh, n_total, s_layout, o_layout, RM, BLOCK_N, STAGES, False, CAUSAL,
                ISSUE_LOADS)
        for block in range(unmasked, visible):
            acc, row_sum, row_max = _softmax_step(
                acc, row_sum, row_max, q_tile, k_bufs, v_bufs, ready_bars, empty_bars, block, row0, seq_len,
                qk_scale, k_desc, v_desc, bh, n_total, s_layout, o_layout, RM, BLOCK_N, STAGES, True, CAUSAL,
                ISSUE_LOADS)
    if not ISSUE_LOADS:
        for block in range(visible, n_total):  # blocks only the other consumer's rows see: hand them back
            stage = block % STAGES
            mbarrier.wait(ready_bars.index(stage), (block // STAGES) & 1)
            mbarrier.arrive(empty_bars.index(stage))

    out = acc / gl.convert_layout(row_sum, gl.SliceLayout(1, o_layout))[:, None]
    lse = (row_max + gl.log2(row_sum)) * 0.6931471805599453
    offs_m = row0 + gl.arange(0, RM, layout=gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, HEAD_V, layout=gl.SliceLayout(0, o_layout))
    o_rows = o_ptr + bh.to(gl.int64) * seq_len * HEAD_V + offs_m[:, None] * HEAD_V + offs_d[None, :]
    gl.store(o_rows, out.to(gl.bfloat16), mask=(offs_m < seq_len)[:, None])
    offs_lse = row0 + gl.arange(0, RM, layout=gl.SliceLayout(1, s_layout))
    gl.store(lse_ptr + bh.to(gl.int64) * seq_len + offs_lse, lse, mask=offs_lse < seq_len)


@gluon.jit
def _produce(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, ready_bars, empty_bars, bh, m0, n_total,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The producer warp: both q' halves, then every key block the program needs, as far ahead as the ring allows."""
    RM: gl.constexpr = q_desc.block_type.shape[1]
    for c in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bh, m0 + c * RM, 0], q_bars.index(c), q_bufs.index(c))
    for block in range(0, n_total):
        stage = block % STAGES
        # A fresh mbarrier counts as having completed the phase before phase 0: the first STAGES waits pass.
        mbarrier.wait(empty_bars.index(stage), ((block // STAGES) & 1) ^ 1)
        _issue_block_load(k_desc, v_desc, k_bufs, v_bufs, ready_bars, bh, block, STAGES, BLOCK_N, True)


@gluon.jit
def _second_consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, ready_bars, empty_bars, o_ptr, lse_ptr,
                     bh, m0, seq_len, n_total, qk_scale,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr):
    RM: gl.constexpr = q_desc.block_type.shape[1]
    _consume(q_desc, k_desc, v_desc, q_bufs.index(1), k_bufs, v_bufs, q_bars.index(1), ready_bars, empty_bars, o_ptr,
             lse_ptr, bh, m0 + RM, seq_len, n_total, qk_scale, BLOCK_N, STAGES, CAUSAL, False, OVERLAP)


@gluon.jit
def _attention_fwd_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, seq_len, qk_scale,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                          WARP_SPECIALIZE: gl.constexpr, OVERLAP: gl.constexpr = False):
    """Program (m, bh): query rows of block m (heaviest causal blocks first) of head bh."""
    RM: gl.constexpr = q_desc.block_type.shape[1]  # rows per consumer: 64 ("ws", two consumers) or 128 ("plain")
    CONSUMERS: gl.constexpr = 2 if WARP_SPECIALIZE else 1
    n_m = gl.num_programs(0)
    m0 = (n_m - 1 - gl.program_id(0)) * (RM * CONSUMERS)
    bh = gl.program_id(1)
    if CAUSAL:
        n_total = gl.cdiv(gl.minimum(m0 + RM * CONSUMERS, seq_len), BLOCK_N)
    else:
        n_total = gl.cdiv(seq_len, BLOCK_N)

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(s), count=1)
        mbarrier.init(empty_bars.index(s), count=CONSUMERS)

    if WARP_SPECIALIZE:
        gl.warp_specialize([
            (_consume, (q_desc, k_desc, v_desc, q_bufs.index(0), k_bufs, v_bufs, q_bars.index(0), ready_bars,
                        empty_bars, o_ptr, lse_ptr, bh, m0, seq_len, n_total, qk_scale, BLOCK_N, STAGES, CAUSAL,
                        False, OVERLAP)),
            (_second_consumer, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, ready_bars, empty_bars,
                                o_ptr, lse_ptr, bh, m0, seq_len, n_total, qk_scale, BLOCK_N, STAGES, CAUSAL,
                                OVERLAP)),
            (_produce, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, ready_bars, empty_bars, bh, m0,
                        n_total, BLOCK_N, STAGES, CONSUMERS)),
        ], [4, 1], [CONSUMER_REGISTERS, PRODUCER_REGISTERS])
    else:
        _consume(q_desc, k_desc, v_desc, q_bufs.index(0), k_bufs, v_bufs, q_bars.index(0), ready_bars, empty_bars,
                 o_ptr, lse_ptr, bh, m0, seq_len, n_total, qk_scale, BLOCK_N, STAGES, CAUSAL, True, False)


def launch_options(variant: str, block_n: int, stages: int) -> dict:
    """(rows per consumer, compile options) of a variant."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {VARIANTS}")
    if variant.startswith("ws"):
        return dict(rows=BLOCK_M // 2, num_warps=4, maxnreg=WS_MAXNREG)
    return dict(rows=BLOCK_M, num_warps=8, maxnreg=None)


def shared_layout(block_shape: list):
    """The NVMMA shared layout TMA writes and wgmma reads a bf16 tile in (128-byte swizzle at these widths)."""
    return gl.NVMMASharedLayout.get_default_for(block_shape, gl.bfloat16)


def block_shapes(variant: str, head_qk: int, head_v: int, block_n: int) -> dict:
    rows = launch_options(variant, block_n, 1)["rows"]
    return {"q": [1, rows, head_qk], "k": [1, block_n, head_qk], "v": [1, block_n, head_v]}


def attention_forward(q_prime: torch.Tensor, k_prime: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                      softmax_scale: float | None = None, variant: str = "ws", block_n: int = 64, stages: int = 2):
    """(o (BH, N, d) bf16, lse (BH, N) fp32) of softmax(scale * q' k'^T) v; scale defaults to 1/sqrt(d)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if q_prime.dtype != torch.bfloat16 or k_prime.dtype != torch.bfloat16 or v.dtype != torch.bfloat16:
        raise TypeError("q', k' and v must be bf16")
    if q_prime.dim() != 3 or q_prime.shape != k_prime.shape or v.shape[:2] != q_prime.shape[:2]:
        raise ValueError(f"expected q', k' (BH, N, 2d) and v (BH, N, d) with equal BH and N; got "
                         f"{tuple(q_prime.shape)}, {tuple(k_prime.shape)}, {tuple(v.shape)}")
    q_prime, k_prime, v = q_prime.contiguous(), k_prime.contiguous(), v.contiguous()
    heads, seq_len, head_qk = q_prime.shape
    head_v = v.shape[2]
    scale = 1.0 / math.sqrt(head_v) if softmax_scale is None else softmax_scale
    options = launch_options(variant, block_n, stages)
    shapes = block_shapes(variant, head_qk, head_v, block_n)
    descriptors = [TensorDescriptor.from_tensor(t, shapes[name], shared_layout(shapes[name]))
                   for name, t in (("q", q_prime), ("k", k_prime), ("v", v))]
    o = torch.empty((heads, seq_len, head_v), device=v.device, dtype=torch.bfloat16)
    lse = torch.empty((heads, seq_len), device=v.device, dtype=torch.float32)
    grid = (triton.cdiv(seq_len, BLOCK_M), heads)
    extra = {"maxnreg": options["maxnreg"]} if options["maxnreg"] else {}
    _attention_fwd_kernel[grid](*descriptors, o, lse, seq_len, scale * LOG2E, BLOCK_N=block_n, STAGES=stages,
                                CAUSAL=causal, WARP_SPECIALIZE=variant.startswith("ws"),
                                OVERLAP=variant == "ws-overlap", num_warps=options["num_warps"],
                                **extra)
    return o, lse


def compile_for_hopper(variant: str, *, head_qk: int = 256, head_v: int = 128, block_n: int = 64, stages: int = 2,
                       causal: bool = True):
    """The kernel compiled for sm_90a without a GPU (Triton's CUDA backend only needs ptxas, which it bundles), with
    the argument types and 16-byte alignment a launch on contiguous bf16 tensors specialises."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    options = launch_options(variant, block_n, stages)
    shapes = block_shapes(variant, head_qk, head_v, block_n)
    signature = {f"{name}_desc": f"tensordesc<bf16{shape},{shared_layout(shape)!r}>".replace(" ", "")
                 for name, shape in shapes.items()}
    signature.update(o_ptr="*bf16", lse_ptr="*fp32", seq_len="i32", qk_scale="fp32", BLOCK_N="constexpr",
                     STAGES="constexpr", CAUSAL="constexpr", WARP_SPECIALIZE="constexpr", OVERLAP="constexpr")
    constexprs = {"BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal, "WARP_SPECIALIZE": variant.startswith("ws"),
                  "OVERLAP": variant == "ws-overlap"}
    names = _attention_fwd_kernel.arg_names
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in ("o_ptr", "lse_ptr")}
    source = GluonASTSource(_attention_fwd_kernel, signature, constexprs, attrs)
    compile_options = {"num_warps": options["num_warps"], **({"maxnreg": options["maxnreg"]}
                                                              if options["maxnreg"] else {})}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=compile_options)
