"""`pope_attention`: the functional PoPE attention API (api), its input checks (checks), the reference (reference).

Backends:
  "reference"  pure PyTorch: materialise the 2d-channel q'/k' (fp32 trigonometry, then the input dtype)
               and call scaled_dot_product_attention. Clear, differentiable, any device.
  "triton"     the fused Triton kernels (pope.ops / pope.kernels), CUDA only; deterministic.
  "cudnn"      the Triton pre-pass makes q', k', cuDNN's fused attention (through SDPA, d_qk = 2d, d_v = d) runs
               on them, and a Triton pass takes dq', dk' back to dq, dk, d(delta). CUDA, compute capability 9.0+,
               fp16/bf16, batched calls with queries and keys at the same positions (training). Not
               deterministic: cuDNN's backward sums dq' with atomics (dq and d(delta) differ run to run in the last
               bits). It keeps q', k' for the backward: more memory than "triton" (docs/kernels.md).
  "flash-attn-4"  as "cudnn" with flash-attn-4's kernels (the optional package flash-attn-4) on q', k': CUDA,
               compute capability 9.0+, fp16/bf16, eager (not inside torch.compile), causal with the last query at
               the last key's position; a differentiated grouped-query call repeats k, v to Hq heads (its GQA
               backward needs d_qk = d_v).
               Deterministic under torch.use_deterministic_algorithms(True), else dq' is summed by atomics.
  "auto"       "flash-attn-4" where installed, measured faster (pope.ops.FLASH_ATTN_4_PREFERRED: head dim 64
               but a grouped-query forward, and head dim 128, from 4K queries) and able to run the call; else
               "cudnn" where it measured faster (pope.ops.CUDNN_PREFERRED: head dim 128 from 2K tokens) and can
               run the call; neither under torch.use_deterministic_algorithms(True); else "triton" when the
               inputs are on CUDA, Triton is importable and the kernels can run the call; else "reference".

Score between the query at position t and the key at position s (r = rotary_dim, f = magnitude):
    softmax_scale * ( sum_{c<r} f(q_c) f(k_c) cos((s - t) theta_c + delta_c) + sum_{c>=r} q_c k_c )
which is the real dot product of
    q' = [f(q) cos(t theta - delta), f(q) sin(t theta - delta), q[r:]]
    k' = [f(k) cos(s theta),         f(k) sin(s theta),         k[r:]]
delta sits in the query phase so that k' does not depend on the query head (GQA shares keys).

The inputs are checked here, once, for every backend (the kernels' layer asks only whether it can run a call:
device, dtype, head dim); bad input is a ValueError or TypeError saying what is wrong. Masked keys do not count:
keys past every query's position are not read at all, and a key masked from a query (causal) reaches none of that
query's outputs whatever its values, NaN and inf included (the masks select, they do not add; on backend "cudnn"
this is cuDNN's causal mask, not checked here).
"""

from pope.attention.api import pope_attention, pope_attention_varlen
from pope.attention.checks import BACKENDS, MAX_POSITION, check_cu_seqlens, check_max_seqlen, sequence_lengths
from pope.attention.reference import reference_pope_attention, sdpa
from pope.magnitudes import MAGNITUDES

__all__ = [
    "BACKENDS",
    "MAGNITUDES",
    "MAX_POSITION",
    "check_cu_seqlens",
    "check_max_seqlen",
    "pope_attention",
    "pope_attention_varlen",
    "reference_pope_attention",
    "sdpa",
    "sequence_lengths",
]
