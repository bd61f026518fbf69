"""Backend "flash-attn-4" with PoPE's Hopper tiles (pope.ops.flash_attn_4_tiles). flash-attn-4 does not install on a
CPU machine, so a stand-in module flash_attn.cute.interface computes with SDPA's math kernel and records the tiles it
is asked for; the tests hold what is ours: the tiles asked for, flash-attn-4's tile function back as it was after
each backward, results within the rule, and the public call where the private functions are missing. The GPU check
holds the rule with flash-attn-4 itself.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import sys
import types

import pytest
import torch
from kernel_fixtures import (  # before pope's imports: it sets Triton's interpreter up
    assert_library_backend_within_rule,
    delegated,
    kernel_inputs,
    kernels_fixture,  # noqa: F401  (the autouse fixture `kernels`)
    subprocess_results_fixture,  # noqa: F401  (the fixture `subprocess_results`)
)


@dataclasses.dataclass(frozen=True)
class BwdConfig:  # the fields of flash-attn-4's Hopper backward config that matter here
    m_block_size: int = 64
    n_block_size: int = 48


def _math(q, k, v, softmax_scale, causal):
    """(B, N, H, c) inputs -> (out (B, N, Hq, d), lse (B, Hq, N)) by SDPA's math kernel."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    groups = qt.shape[1] // kt.shape[1]
    kt, vt = kt.repeat_interleave(groups, 1), vt.repeat_interleave(groups, 1)
    scores = (qt @ kt.transpose(-1, -2)).float() * softmax_scale
    if causal:
        nq, nk = scores.shape[-2:]
        keep = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = scores.logsumexp(-1)
    out = (scores.softmax(-1).to(vt.dtype) @ vt).transpose(1, 2)
    return out, lse


@pytest.fixture
def fake_interface(monkeypatch):
    """flash_attn.cute with flash_attn_func and an interface module of _flash_attn_fwd, _flash_attn_bwd and
    _tile_size_bwd_sm90; returns the calls' records. Hopper is assumed (pope.ops.flash_attn_4_tiles._hopper)."""
    from pope.ops import flash_attn_4_installed, flash_attn_4_tiles

    calls = []
    package, cute, interface = (types.ModuleType(name) for name in ("flash_attn", "flash_attn.cute", "interface"))
    package.__path__, cute.__path__ = [], []
    cute.__spec__ = importlib.machinery.ModuleSpec("flash_attn.cute", None)
    interface.__spec__ = importlib.machinery.ModuleSpec("flash_attn.cute.interface", None)

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, deterministic=False):
        calls.append(dict(call="flash_attn_func"))
        return _math(q, k, v, softmax_scale, causal)

    def _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False, return_lse=False, tile_mn=None,
                        mma_pv_is_rs=None, intra_wg_overlap=None):  # fmt: skip
        calls.append(dict(call="fwd", tile_mn=tile_mn, rs=mma_pv_is_rs, overlap=intra_wg_overlap, heads=k.shape[2]))
        return (*_math(q, k, v, softmax_scale, causal), None, None, None)

    def _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=None, causal=False, deterministic=False):
        # As flash-attn-4's: a grouped-query backward takes equal query/key and value head dims only.
        assert q.shape[2] == k.shape[2] or q.shape[-1] == v.shape[-1], "GQA backward with d_qk != d_v"
        config = interface._tile_size_bwd_sm90(q.shape[-1], v.shape[-1], causal, False, sparse_block_size_q=None)
        calls.append(dict(call="bwd", config=config, deterministic=deterministic))
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            return torch.autograd.grad(_math(*leaves, softmax_scale, causal)[0], leaves, dout)

    def _tile_size_bwd_sm90(head_dim, head_dim_v, causal, local, sparse_block_size_q=None):
        return BwdConfig()

    interface._flash_attn_fwd, interface._flash_attn_bwd = _flash_attn_fwd, _flash_attn_bwd
    interface._tile_size_bwd_sm90 = _tile_size_bwd_sm90
    cute.flash_attn_func, cute.interface = flash_attn_func, interface
    for name, module in (("flash_attn", package), ("flash_attn.cute", cute), ("flash_attn.cute.interface", interface)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(flash_attn_4_tiles, "_hopper", lambda x: True)
    flash_attn_4_installed.cache_clear(), flash_attn_4_tiles._tunable.cache_clear()
    yield calls, interface, _tile_size_bwd_sm90
    flash_attn_4_installed.cache_clear(), flash_attn_4_tiles._tunable.cache_clear()


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((1, 2, 2, 17, 17, 128), torch.float16), ((1, 4, 2, 20, 20, 64), torch.bfloat16)],
    ids=["mha-d128-fp16", "gqa-d64-bf16"],
)
def test_tuned_call_within_rule_with_pope_tiles(kernels, fake_interface, shape, dtype):
    """Output and every gradient within 2x plain PyTorch's error against float64; the forward asks for PoPE's tiles
    (a grouped-query call's k, v repeated to as many heads as q, as flash-attn-4's GQA backward needs), the backward
    runs with the 64x80 backward tile at (256, 128) and flash-attn-4's own elsewhere, and flash-attn-4's tile
    function is its own again afterwards."""
    if delegated(kernels):
        return
    from pope.ops import flash_attn_4_pope_attention

    calls, interface, library_choice = fake_interface
    assert_library_backend_within_rule(flash_attn_4_pope_attention, shape, dtype, sum(shape))
    forward, backward = (next(c for c in calls if c["call"] == kind) for kind in ("fwd", "bwd"))
    assert forward["heads"] == shape[1]  # k, v repeated where the heads are grouped
    if shape[-1] == 128:
        assert (forward["tile_mn"], forward["rs"], forward["overlap"]) == ((128, 96), True, True)
        assert backward["config"] == BwdConfig(64, 80)
    else:  # (128, 64): the measured forward tile; the backward's head dims are not PoPE's tuned ones
        assert (forward["tile_mn"], forward["rs"], forward["overlap"]) == ((192, 128), True, True)
        assert backward["config"] == BwdConfig(64, 48)
    assert interface._tile_size_bwd_sm90 is library_choice
    assert not any(c["call"] == "flash_attn_func" for c in calls)


def test_grouped_query_call_without_gradients_keeps_its_heads(kernels, fake_interface):
    """Without gradients a grouped-query call goes to flash-attn-4 with its Hkv key/value heads (its GQA forward), no
    repeat and no tuned tile (those were measured with as many query as key heads)."""
    if delegated(kernels):
        return
    from pope.ops import flash_attn_4_pope_attention

    calls, _, _ = fake_interface
    q, k, v, delta, _ = kernel_inputs(1, 4, 2, 9, 9, 64, torch.bfloat16, True, torch.Generator().manual_seed(4))
    options = dict(base=10000.0, causal=True, softmax_scale=64**-0.5, q_offset=0, magnitude="softplus")
    with torch.no_grad():
        flash_attn_4_pope_attention(q, k, v, delta, **options)
    assert [(c["call"], c["heads"], c["tile_mn"]) for c in calls] == [("fwd", 2, None)]


def test_public_call_where_private_functions_are_missing(kernels, fake_interface):
    """A flash-attn-4 without _tile_size_bwd_sm90 (another version) gets its public flash_attn_func: its own tiles."""
    if delegated(kernels):
        return
    from pope.ops import flash_attn_4_pope_attention

    calls, interface, _ = fake_interface
    del interface._tile_size_bwd_sm90
    q, k, v, delta, _ = kernel_inputs(1, 2, 2, 9, 9, 32, torch.bfloat16, True, torch.Generator().manual_seed(3))
    options = dict(base=10000.0, causal=True, softmax_scale=32**-0.5, q_offset=0, magnitude="softplus")
    flash_attn_4_pope_attention(q, k, v, delta, **options)
    assert [c["call"] for c in calls] == ["flash_attn_func"]
