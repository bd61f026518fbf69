"""Decode: few queries against a long cache of d channels per key (raw keys, or the magnitudes f(k) the model
caches, magnitude "identity"), split-K over the cache, merged by one combine launch. The launcher `decode_forward`;
its kernels are in pope.kernels.decode_kernels.

Two kernels: `_pope_decode_lanes_kernel` (CUDA cores, one program per query row: fp32 FMAs, one online-softmax lane
per key position, the key phases folded into a per-tile rotation of the query row by angle addition) for up to
pope.settings' decode_lanes_max_rows rows per key head; `_pope_decode_kernel` (tensor cores, one program per key
head, its rows padded to 16) for more (GQA), with k' = f(k) * rows of one (Nk, 2d) key-phase table
(pope.kernels.phase_tables) shared by every batch and head. Guarantees: the cache is read as it is (d channels,
no 2d-channel copy is ever written); keys past the last visible position of a program's rows are never loaded,
and a masked key enters the scores through tl.where(..., -inf), so no value of it reaches a query that cannot see
it; output and lse as the forward's (the combine weights splits by their log-sum-exp; a split that sees no key
has lse = -inf and weight 0).
"""

from __future__ import annotations

import torch

from pope.magnitudes import MAGNITUDES
from pope.settings import SETTINGS

from . import configs, direct_launch, host, phase_tables
from .configs import decode_tile
from .decode_kernels import _pope_decode_combine_kernel, _pope_decode_kernel, _pope_decode_lanes_kernel
from .interpreter import INTERPRET

# The combine kernel holds all of a row's splits in registers.
MAX_DECODE_SPLITS = 128


def decode_forward(
    q,
    k,
    v,
    delta,
    theta,
    *,
    causal: bool,
    softmax_scale: float,
    q_offset: int,
    magnitude: str,
    method: str | None = None,
    block_n: int | None = None,
    num_splits: int | None = None,
    num_warps: int | None = None,
    stages: int | None = None,
    maxnreg: int | None = None,
    keep_phase_table: bool = False,
):
    """Split-K decode over a raw (d-channel) cache. Returns (out, lse) like `forward`.

    Suited to group_size * Nq <= 64 rows per key head; keys are transformed once, in registers.
    method: "lanes" (CUDA cores, one program per query row), "tensor_cores" (one program per key head), or
    None: lanes up to pope.settings' decode_lanes_max_rows rows per key head. maxnreg: a cap on registers per
    thread (Triton's launch option; more programs resident per SM at the price of spills), 0 for none, None for
    the default (lanes: configs.DECODE_LANES_MAXNREG, the compiler's choice unless set; tensor cores: none).
    keep_phase_table: keep the tensor-core kernel's key-phase table for later calls with this theta (one launch
    less per decode step: for callers whose theta lives on, e.g. pope.ops' eager path); False builds it per call.
    """
    batch, n_q_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = k.shape[1], k.shape[2]
    group_size = n_q_heads // n_kv_heads
    rows = group_size * seq_q
    block_d = host.block_d(head_dim)
    if method is None:
        method = "lanes" if rows <= SETTINGS.decode_lanes_max_rows else "tensor_cores"
    elif method not in ("lanes", "tensor_cores"):
        raise ValueError(f"decode method must be 'lanes' or 'tensor_cores'; got {method!r}")
    default_block_n, default_warps, default_stages = decode_tile(head_dim, q.dtype, method, magnitude)
    # Partial results are (splits, B*Hkv, row_stride, d): the tensor-core kernel's rows are padded to block_m.
    block_m = max(16, host.next_power_of_2(rows))
    row_stride = rows if method == "lanes" else block_m
    programs_per_split = batch * n_kv_heads * (rows if method == "lanes" else 1)
    block_n = default_block_n if block_n is None else block_n
    num_warps = default_warps if num_warps is None else num_warps
    stages = default_stages if stages is None else stages
    if INTERPRET:
        block_n = min(block_n, 32)
    if num_splits is None:
        # ~16 programs per SM to hide latency, each with at least two key tiles; at most MAX_DECODE_SPLITS
        # (the combine kernel holds all of a row's splits in registers).
        num_splits = max(
            1,
            min(
                host.cdiv(seq_k, 2 * block_n),
                host.cdiv(16 * host.sm_count(q.device), programs_per_split),
                MAX_DECODE_SPLITS,
            ),
        )
    keys_per_split = host.cdiv(host.cdiv(seq_k, num_splits), block_n) * block_n
    num_splits = host.cdiv(seq_k, keys_per_split)
    partial_out = host.empty(
        (num_splits, batch * n_kv_heads, row_stride, block_d), device=q.device, dtype=torch.float32
    )
    partial_lse = host.empty((num_splits, batch * n_kv_heads, row_stride), device=q.device, dtype=torch.float32)
    args = (
        q,
        k,
        v,
        theta,
        delta if delta is not None else theta,
        partial_out,
        partial_lse,
        *host.strides(q),
        *host.strides(k),
        *host.strides(v),
        n_kv_heads,
        group_size,
        seq_q,
        seq_k,
        q_offset,
        softmax_scale,
        keys_per_split,
    )
    options = dict(
        HEAD_DIM=head_dim,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        HAS_DELTA=delta is not None,
        MAGNITUDE=MAGNITUDES[magnitude].kernel_code,
        STAGES=stages,
        num_warps=num_warps,
        num_stages=stages,
    )
    if maxnreg is None and method == "lanes":
        maxnreg = configs.DECODE_LANES_MAXNREG
    if maxnreg and not INTERPRET:  # 0: no cap
        options["maxnreg"] = maxnreg
    if method == "lanes":
        direct_launch.launch(
            _pope_decode_lanes_kernel,
            (num_splits, programs_per_split),
            direct_launch.specialization_site("decode lanes", args, options),
            args,
            **options,
        )
    else:
        # The key phases' (seq_k, 2 block_d) [cos | sin] table for this call: the pre-pass over ones with
        # magnitude "identity". A cache of magnitudes (identity) gets a table in its own dtype, so that the
        # kernel multiplies k by it in that dtype: 13-16% faster than an fp16 table with fp32 products on the
        # H200, error 1.06-1.19x the reference's in bf16 (cos/sin rounded to 2^-9 before the product's own
        # rounding; decode_packed_ab_bf16_84eb72a.json). Raw keys (softplus, relu: f(k) in fp32): fp16 for 16-bit
        # inputs, its 2^-12 rounding below bf16's 2^-9 rounding of k' and equal to fp16's; an fp32 table made fp16
        # decode 1.1-2.3x slower (fp32_decode_8575259.log). fp32 inputs: an fp32 table.
        table_dtype = q.dtype if q.dtype == torch.float32 or magnitude == "identity" else torch.float16
        table = phase_tables.phase_table(theta, head_dim, seq_k, table_dtype, keep_phase_table)
        table_args = args[:7] + (table,) + args[7:]
        options.update(BLOCK_M=block_m, PRECISION=host.precision(q.dtype, q.device))
        site = direct_launch.specialization_site("decode tensor cores", table_args, options)
        direct_launch.launch(_pope_decode_kernel, (num_splits, batch * n_kv_heads), site, table_args, **options)
    # Combine the splits in one launch: (splits, B*Hkv, rows, d) -> (B, Hq, Nq, d) and the row LSEs.
    out = host.empty((batch, n_q_heads, seq_q, head_dim), device=q.device, dtype=q.dtype)
    lse = host.empty((batch, n_q_heads, seq_q), device=q.device, dtype=torch.float32)
    combine_args = (partial_out, partial_lse, out, lse, num_splits, batch * n_kv_heads, rows, row_stride)
    combine_options = dict(
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, host.next_power_of_2(num_splits)), num_warps=4
    )
    site = direct_launch.specialization_site("decode combine", combine_args, combine_options)
    direct_launch.launch(
        _pope_decode_combine_kernel, (batch * n_kv_heads * rows,), site, combine_args, **combine_options
    )
    return out, lse
