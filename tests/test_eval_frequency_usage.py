"""Frequency-usage analysis: shapes, known answers, delta, plots."""
import math

import numpy as np
import pytest
import torch

from pope.eval.frequency_usage import (
    analyze_frequencies,
    chunk_tokens,
    frequency_magnitudes,
    write_frequency_report,
)
from pope.encodings import build_positional_encoding
from pope.model import GPT, GPTConfig


def _model(pe, n_layer=3, n_head=2, d_model=16, vocab=13):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, n_layer=n_layer, n_head=n_head, d_model=d_model, max_seq_len=32, pe=pe))


@pytest.mark.parametrize("pe, rows", [("pope", 8), ("rope", 4), ("rope-half", 2), ("yarn:scale=4,original_max_len=16", 4)])
def test_shapes(pe, rows):
    model = _model(pe)
    usage = analyze_frequencies(model, chunk_tokens(np.arange(40) % 13, 32), progress=False)
    assert usage.query.shape == usage.key.shape == (3, rows)
    assert usage.frequencies.shape == (rows,)
    expected = (model.blocks[0].attn.pe.frequencies()[0].numpy() if usage.kind == "rope"
                else 10000.0 ** -(np.arange(rows) / rows))  # PoPE: theta_c = base^(-(c-1)/d)
    np.testing.assert_allclose(usage.frequencies, expected, rtol=1e-6)
    assert usage.n_tokens == 40
    assert np.isfinite(usage.query).all() and (usage.query > 0).all()
    if pe == "pope":
        assert usage.kind == "pope" and usage.delta.shape == (3, 2, 8)
    else:
        assert usage.kind == "rope" and usage.delta is None


def test_known_answer_on_hand_made_projection():
    # One token, two heads, head_dim 4. RoPE rotate-half pairs (x0, x2) and (x1, x3).
    x = torch.tensor([[[3.0, 0.0, 4.0, 1.0, 0.0, 6.0, 0.0, 8.0]]])  # (B=1, T=1, 2*4)
    rope = build_positional_encoding("rope", n_heads=2, head_dim=4)
    assert frequency_magnitudes(x, 2, rope)[0, 0].tolist() == [[5.0, 1.0], [0.0, 10.0]]
    interleaved = build_positional_encoding("rope:layout=interleaved", n_heads=2, head_dim=4)
    torch.testing.assert_close(frequency_magnitudes(x, 2, interleaved)[0, 0],
                               torch.tensor([[3.0, math.sqrt(17.0)], [6.0, 8.0]]))
    pope = build_positional_encoding("pope", n_heads=2, head_dim=4)
    expected = torch.nn.functional.softplus(x.view(1, 1, 2, 4))
    torch.testing.assert_close(frequency_magnitudes(x, 2, pope), expected)


def test_known_answer_through_hooks_on_a_model():
    # Zero query/key weights: every PoPE magnitude is softplus(0) = ln 2, every RoPE chunk norm is 0.
    for pe, value in (("pope", math.log(2.0)), ("rope", 0.0)):
        model = _model(pe)
        with torch.no_grad():
            for block in model.blocks:
                block.attn.q_proj.weight.zero_()
                block.attn.k_proj.weight.zero_()
        usage = analyze_frequencies(model, [torch.arange(7)], progress=False)
        np.testing.assert_allclose(usage.query, value, atol=1e-7)
        np.testing.assert_allclose(usage.key, value, atol=1e-7)
    # A key weight that copies the same residual direction into two channels of one RoPE pair:
    # the chunk norm is sqrt(2) x |that coordinate|, averaged over tokens; other pairs stay 0.
    model = _model("rope", n_layer=1)
    with torch.no_grad():
        model.blocks[0].attn.k_proj.weight.zero_()
        model.blocks[0].attn.k_proj.weight[0, 5] = 1.0  # channel 0 of head 0
        model.blocks[0].attn.k_proj.weight[4, 5] = 1.0  # channel 4 = pair partner of channel 0 (half layout)
    captured = []
    handle = model.blocks[0].attn_norm.register_forward_hook(lambda m, i, o: captured.append(o[..., 5].abs()))
    usage = analyze_frequencies(model, [torch.arange(9)], progress=False)
    handle.remove()
    expected_first = math.sqrt(2) * captured[0].mean().item() / 2  # averaged over 2 heads; head 1 is zero
    assert usage.key[0, 0] == pytest.approx(expected_first, rel=1e-5)
    np.testing.assert_allclose(usage.key[0, 1:], 0.0, atol=1e-7)


def test_delta_is_reported_clamped_per_layer_head_frequency():
    model = _model("pope", n_layer=2)
    with torch.no_grad():
        model.blocks[1].attn.pe.delta.fill_(-1.0)
        model.blocks[1].attn.pe.delta[0, 0] = 3.0  # outside [-2π, 0]: used (and reported) as 0
        model.blocks[1].attn.pe.delta[1, 7] = -10.0  # used as -2π
    usage = analyze_frequencies(model, [torch.arange(5)], progress=False)
    assert usage.delta[0].tolist() == np.zeros((2, 8)).tolist()
    assert usage.delta[1, 0, 0] == 0.0 and usage.delta[1, 1, 7] == pytest.approx(-2 * math.pi)
    assert usage.delta[1, 0, 1] == pytest.approx(-1.0)


def test_non_rotary_model_is_refused():
    with pytest.raises(ValueError, match="rotating positional encoding"):
        analyze_frequencies(_model("alibi"), [torch.arange(5)], progress=False)


def test_chunking_keeps_every_token_and_report_files(tmp_path):
    chunks = chunk_tokens(list(range(10)), 4)
    assert [len(c) for c in chunks] == [4, 4, 2] and torch.cat(chunks).tolist() == list(range(10))
    with pytest.raises(ValueError, match="no tokens"):
        chunk_tokens([], 4)
    usage = analyze_frequencies(_model("pope"), chunks, progress=False)
    written = write_frequency_report(usage, tmp_path, title="test")
    assert {p.name for p in written} == {"frequency_usage.json", "frequency_usage.png", "delta.npy", "delta.png"}
    assert all(p.stat().st_size > 0 for p in written)
