"""Frequency-usage analysis: shapes, known answers, delta, the position-only score, plots."""

import json
import math

import numpy as np
import pytest
import torch

from pope.encodings import build_positional_encoding
from pope.eval.frequency_usage import (
    FrequencyUsage,
    analyze_frequencies,
    chunk_tokens,
    delta_movement,
    delta_phase,
    format_delta_movement,
    frequency_magnitudes,
    position_bias,
    position_bias_summary,
    write_frequency_report,
)
from pope.model import GPT, GPTConfig


def _model(pe, n_layer=3, n_head=2, d_model=16, vocab=13):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, n_layer=n_layer, n_head=n_head, d_model=d_model, max_seq_len=32, pe=pe))


@pytest.mark.parametrize(
    "pe, rows", [("pope", 8), ("rope", 4), ("rope-half", 2), ("yarn:scale=4,original_max_len=16", 4)]
)
def test_shapes(pe, rows):
    model = _model(pe)
    usage = analyze_frequencies(model, chunk_tokens(np.arange(40) % 13, 32), progress=False)
    assert usage.query.shape == usage.key.shape == (3, rows)
    assert usage.frequencies.shape == (rows,)
    expected = (
        model.blocks[0].attn.pe.frequencies()[0].numpy()
        if usage.kind == "rope"
        else 10000.0 ** -(np.arange(rows) / rows)
    )  # PoPE: theta_c = base^(-(c-1)/d)
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
    torch.testing.assert_close(
        frequency_magnitudes(x, 2, interleaved)[0, 0], torch.tensor([[3.0, math.sqrt(17.0)], [6.0, 8.0]])
    )
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


def _usage(delta, frequencies=(1.0, 0.1, 0.01), n_layer=2):
    """A PoPE FrequencyUsage with magnitudes 1, 2, 3 per frequency in every layer and the given delta."""
    frequencies = np.asarray(frequencies, dtype=np.float64)
    magnitudes = np.tile(np.arange(1.0, len(frequencies) + 1), (n_layer, 1))
    return FrequencyUsage(
        kind="pope",
        frequencies=frequencies,
        query=magnitudes,
        key=magnitudes,
        delta=None if delta is None else np.asarray(delta, dtype=np.float64),
        n_tokens=10,
    )


def test_position_bias_is_the_normalised_position_only_score():
    rng = np.random.default_rng(0)
    delta = rng.uniform(-2 * math.pi, 0, size=(2, 3, 3))
    usage = _usage(delta)
    distances = np.array([0, 1, 7, 250, 10**6])
    bias = position_bias(usage, distances)
    assert bias.shape == (2, 3, 5)
    weights = np.array([1.0, 4.0, 9.0])  # |q| |k| per frequency
    for layer, head, i in [(0, 0, 0), (1, 2, 3), (0, 1, 4)]:
        expected = (
            sum(
                w * math.cos(distances[i] * f + delta[layer, head, c])
                for c, (w, f) in enumerate(zip(weights, usage.frequencies))
            )
            / weights.sum()
        )
        assert bias[layer, head, i] == pytest.approx(expected, abs=1e-12)
    zero = position_bias(_usage(None), np.arange(100))  # no delta: every channel in phase at distance 0
    assert zero.shape == (2, 1, 100) and zero[..., 0] == pytest.approx(1.0) and (zero <= 1 + 1e-12).all()
    with pytest.raises(ValueError, match="defined for PoPE, not 'rope'"):
        position_bias(FrequencyUsage("rope", np.ones(2), np.ones((1, 2)), np.ones((1, 2)), None, 1), np.arange(3))


def test_position_bias_summary_tells_recency_from_a_far_peak():
    recency = position_bias_summary(_usage(np.zeros((2, 2, 3))), 10, 200)
    assert recency == {
        "train_length": 10,
        "max_distance": 200,
        "n_heads": 4,
        "heads_peaking_at_distance_0": 4,
        "heads_rising_past_training": 0,
        "median_excess_past_training": recency["median_excess_past_training"],
    }
    assert recency["median_excess_past_training"] < 0
    # one slow frequency with delta = -pi/2: the score is sin(0.01 d), rising until d = 157, past training length 10
    far = position_bias_summary(_usage(np.full((1, 2, 1), -math.pi / 2), frequencies=(0.01,), n_layer=1), 10, 200)
    assert far["heads_rising_past_training"] == 2 and far["heads_peaking_at_distance_0"] == 0
    assert far["median_excess_past_training"] == pytest.approx(1 - math.sin(0.1), abs=1e-4)
    with pytest.raises(ValueError, match="0 < train_length < max_distance"):
        position_bias_summary(_usage(None), 10, 10)


def test_report_writes_position_bias_and_reads_back(tmp_path):
    usage = _usage(np.zeros((2, 2, 3)))
    written = write_frequency_report(usage, tmp_path, title="t", position_bias=position_bias_summary(usage, 8, 160))
    assert (tmp_path / "position_bias.png") in written
    data = json.loads((tmp_path / "frequency_usage.json").read_text())
    assert data["position_bias"]["max_distance"] == 160 and data["position_bias"]["n_heads"] == 4
    back = FrequencyUsage.from_dict(data)
    assert np.array_equal(back.query, usage.query) and np.array_equal(back.delta, usage.delta)
    with pytest.raises(ValueError, match="not a frequency_usage.json"):
        FrequencyUsage.from_dict({"kind": "pope"})
    rope = FrequencyUsage("rope", np.ones(2), np.ones((1, 2)), np.ones((1, 2)), None, 1)
    assert (tmp_path / "rope" / "position_bias.png") not in write_frequency_report(rope, tmp_path / "rope")


def test_delta_phase_reads_a_wrapped_delta_as_the_phase_it_is():
    two_pi = 2 * math.pi
    delta = np.array([0.0, -0.05, -two_pi + 0.03, -math.pi, -math.pi - 0.1, -two_pi, 1.0])
    expected = np.array([0.0, -0.05, 0.03, math.pi, math.pi - 0.1, 0.0, 1.0])
    phase = delta_phase(delta)
    np.testing.assert_allclose(phase, expected, atol=1e-12)
    assert ((phase > -math.pi) & (phase <= math.pi)).all()
    rng = np.random.default_rng(1)  # any delta: the same cosine, the phase inside (-π, π]
    delta = rng.uniform(-20, 20, size=1000)
    np.testing.assert_allclose(np.cos(delta_phase(delta)), np.cos(delta), atol=1e-12)
    np.testing.assert_allclose(np.sin(delta_phase(delta)), np.sin(delta), atol=1e-12)


def test_delta_movement_counts_phase_distance_by_frequency_quarter():
    two_pi = 2 * math.pi
    delta = np.zeros((1, 2, 8))  # 8 frequencies: quarters of 2, highest first
    delta[0, 0, 0] = -two_pi + 0.2  # wrapped just above 0: moved 0.2, positive (the clamp could not do this)
    delta[0, 1, 5] = -0.05  # moved, but less than the threshold
    delta[0, 1, 7] = -0.3  # moved past the threshold, negative
    summary = delta_movement(delta)
    assert summary["entries"] == 16 and summary["moved_threshold"] == 0.1
    assert summary["exactly_zero"] == pytest.approx(13 / 16, abs=1e-4)
    assert summary["moved"] == pytest.approx(2 / 16, abs=1e-4)
    assert summary["positive"] == pytest.approx(1 / 16, abs=1e-4)
    assert summary["max_distance"] == pytest.approx(0.3, abs=1e-4) and summary["median_distance"] == 0.0
    quarters = summary["by_frequency_quarter"]
    assert [q["moved"] for q in quarters] == [0.25, 0.0, 0.0, 0.25]
    assert [q["positive"] for q in quarters] == [0.25, 0.0, 0.0, 0.0]
    assert quarters[2]["mean_distance"] == pytest.approx(0.05 / 4, abs=1e-4)
    line = format_delta_movement(summary)
    assert (
        "81.2 % exactly 0" in line
        and "12.5 % moved more than 0.1 rad" in line
        and "25.0 %, 0.0 %, 0.0 %, 25.0 %" in line
    )
    assert len(delta_movement(np.zeros((1, 1, 3)))["by_frequency_quarter"]) == 3  # fewer frequencies than quarters


def test_report_json_holds_the_delta_movement(tmp_path):
    delta = np.zeros((2, 2, 3))
    delta[1, 0, 2] = -2 * math.pi + 0.5
    write_frequency_report(_usage(delta), tmp_path)
    data = json.loads((tmp_path / "frequency_usage.json").read_text())
    assert data["delta_movement"] == delta_movement(delta) and data["delta_movement"]["positive"] > 0
    assert (tmp_path / "delta.png").stat().st_size > 0
    write_frequency_report(_usage(None), tmp_path / "none")
    assert "delta_movement" not in json.loads((tmp_path / "none" / "frequency_usage.json").read_text())
