"""Frequencies of every rotary variant on worked values, the registry, and encoding-level checks."""

import math

import pytest
import torch

import pope
from pope.encodings import ALiBi, RoPE, alibi_slopes, build_positional_encoding, parse_pe_spec
from pope.frequencies import (
    linear_interpolation_frequencies,
    ntk_frequencies,
    pope_frequencies,
    rope_frequencies,
    yarn_frequencies,
)


def test_pope_frequencies_and_relation_to_rope():
    theta = pope_frequencies(8, 10000.0)
    expected = torch.tensor([10000 ** (-(c - 1) / 8) for c in range(1, 9)])
    torch.testing.assert_close(theta, expected)
    assert theta.dtype == torch.float32 and theta[0] == 1.0
    # the paper: odd-indexed PoPE frequencies (c = 1, 3, ...) are exactly RoPE's d/2 frequencies
    torch.testing.assert_close(pope_frequencies(64)[0::2], rope_frequencies(64))


def test_rope_linear_ntk_worked_values():
    torch.testing.assert_close(rope_frequencies(8, 10000.0), torch.tensor([1.0, 0.1, 0.01, 0.001]))
    torch.testing.assert_close(
        linear_interpolation_frequencies(8, 10000.0, 4.0), torch.tensor([0.25, 0.025, 0.0025, 0.00025])
    )
    ntk = ntk_frequencies(8, 10000.0, 4.0)
    new_base = 10000.0 * 4.0 ** (8 / 6)  # 63496.04...
    torch.testing.assert_close(ntk, torch.tensor([new_base ** (-2 * i / 8) for i in range(4)], dtype=torch.float32))
    assert ntk[0] == 1.0  # highest frequency kept
    torch.testing.assert_close(ntk[-1], torch.tensor(0.001 / 4))  # lowest stretched by exactly s


def test_yarn_worked_values():
    freqs, factor = yarn_frequencies(8, 10000.0, scale=4.0, original_max_len=1024)
    # theta = 1: wavelength 2π, r = 1024/2π ≈ 163 > beta → gamma = 1, kept
    # theta = 0.1: r ≈ 16.3 → gamma = (16.3 - 1)/31
    # theta = 0.01: r = 1024 * 0.01 / 2π ≈ 1.63 → gamma ≈ 0.0203
    # theta = 0.001: r ≈ 0.163 < alpha → gamma = 0, divided by s
    expected = []
    for theta in (1.0, 0.1, 0.01, 0.001):
        r = 1024 / (2 * math.pi / theta)
        gamma = min(max((r - 1) / 31, 0.0), 1.0)
        expected.append((1 - gamma) * theta / 4 + gamma * theta)
    torch.testing.assert_close(freqs, torch.tensor(expected, dtype=torch.float32))
    assert freqs[0] == 1.0 and math.isclose(freqs[-1].item(), 0.00025, rel_tol=1e-6)
    assert math.isclose(factor, 0.1 * math.log(4) + 1)
    yarn = build_positional_encoding("yarn:scale=4,original_max_len=1024", n_heads=2, head_dim=8)
    assert math.isclose(yarn.softmax_scale, factor**2 / math.sqrt(8))


@pytest.mark.parametrize(
    "bad",
    [
        lambda: rope_frequencies(7),
        lambda: ntk_frequencies(8, 1e4, 0.5),
        lambda: yarn_frequencies(8, 1e4, 2, 0),
        lambda: pope_frequencies(0),
    ],
)
def test_frequency_bad_input(bad):
    with pytest.raises(ValueError):
        bad()


def test_rope_layouts_are_rotations_with_relative_scores():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 6, 8, generator=g)
    for layout in ("half", "interleaved"):
        rope = RoPE(n_heads=1, n_kv_heads=1, head_dim=8, layout=layout)
        rotated = rope.rotate(q, torch.arange(6))
        torch.testing.assert_close(rotated.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps norms
        torch.testing.assert_close(rope.rotate(q, torch.zeros(6, dtype=torch.long)), q)
    # the two layouts agree once channels are permuted: interleaved pairs (2i, 2i+1) = half pairs (i, i+d/2)
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    half = RoPE(n_heads=1, n_kv_heads=1, head_dim=8, layout="half").rotate(q, torch.arange(6))
    inter = RoPE(n_heads=1, n_kv_heads=1, head_dim=8, layout="interleaved").rotate(q[..., perm], torch.arange(6))
    torch.testing.assert_close(inter, half[..., perm])


def test_rope_table_is_one_operator_in_compiled_graphs():
    """Compiled RoPE computes its (N, d/2) cos/sin table once, through pope::cos_sin_table: no cos/sin in the
    traced graph for inductor to fuse into (and recompute for) every rotated element. Fails if rotate goes back
    to pointwise phase.cos() / phase.sin()."""
    from pope.frequencies import angles, cos_sin_table

    positions, frequencies = torch.arange(37), rope_frequencies(16, 10000.0)
    torch.library.opcheck(cos_sin_table, (positions, frequencies))
    cos, sin = cos_sin_table(positions, frequencies)
    torch.testing.assert_close(cos, angles(positions, frequencies).cos(), rtol=0, atol=0)
    torch.testing.assert_close(sin, angles(positions, frequencies).sin(), rtol=0, atol=0)

    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module.graph)
        return graph_module.forward

    rope = RoPE(n_heads=2, n_kv_heads=2, head_dim=16)
    q, k, v = (torch.randn(1, 2, 37, 16) for _ in range(3))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: rope(q, k, v), backend=record, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), rope(q, k, v))
    targets = [
        str(node.target) for graph in graphs for node in graph.nodes if node.op in ("call_function", "call_method")
    ]
    assert any("cos_sin_table" in t for t in targets), targets
    assert not any(t in ("cos", "sin") or t.endswith((".cos", ".sin", "torch.cos", "torch.sin")) for t in targets), (
        targets
    )


def test_rope_half_rotates_only_half_the_channels():
    layer = build_positional_encoding("rope-half", n_heads=2, head_dim=16)
    assert layer.rotary_dim == 8
    x = torch.randn(1, 2, 5, 16)
    torch.testing.assert_close(layer.rotate(x, torch.arange(5))[..., 8:], x[..., 8:])


def test_alibi_slopes_and_half_heads():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2 ** (-h) for h in range(1, 9)], dtype=torch.float32))
    assert len(alibi_slopes(6)) == 6
    half = ALiBi(n_heads=8, n_kv_heads=8, head_dim=4, heads="half")
    assert (half.slopes[4:] == 0).all() and (half.slopes[:4] > 0).all()


def test_registry_names_options_and_errors():
    names = pope.list_positional_encodings()
    for required in (
        "pope",
        "rope",
        "rope-half",
        "yarn",
        "pi",
        "ntk",
        "alibi",
        "alibi-half",
        "learned-abs",
        "sinusoidal-abs",
        "nope",
    ):
        assert required in names
    assert parse_pe_spec("pope:delta_init=zero,magnitude=relu,use_delta=false") == (
        "pope",
        {"delta_init": "zero", "magnitude": "relu", "use_delta": False},
    )
    assert parse_pe_spec("rope:base=500000") == ("rope", {"base": 500000})
    with pytest.raises(ValueError, match="valid names: .*pope"):
        parse_pe_spec("popey")
    with pytest.raises(ValueError, match="no option 'scale'.*valid options"):
        parse_pe_spec("pope:scale=2")
    with pytest.raises(ValueError, match="option=value"):
        parse_pe_spec("rope:base")
    with pytest.raises(ValueError, match="delta_init"):
        build_positional_encoding("pope:delta_init=gauss", n_heads=2, head_dim=8)
    for word in ("no", "false", "off", "0"):  # every false word really removes delta (an ablation is one)
        assert build_positional_encoding(f"pope:use_delta={word}", n_heads=2, head_dim=8).delta is None
    assert build_positional_encoding("pope:use_delta=YES", n_heads=2, head_dim=8).delta is not None
    with pytest.raises(ValueError, match="even"):
        build_positional_encoding("rope", n_heads=2, head_dim=7)
    assert "magnitude" in pope.describe_positional_encoding("pope")


@pytest.mark.parametrize(
    "spec",
    [
        "pope",
        "pope:magnitude=relu,rotary_dim=6",
        "pope:magnitude=identity",
        "rope",
        "yarn:scale=4,original_max_len=8",
        "rope:layout=interleaved,rotary_dim=4",
        "alibi",
    ],
)
def test_cached_keys_give_the_same_attention(spec):
    """What a KV cache stores (cache_keys) and attention over it (attend_cached) equal attention over raw keys;
    PoPE's cache holds the key magnitudes f(k) in RoPE's d channels per key."""
    torch.manual_seed(0)
    pe = build_positional_encoding(spec, n_heads=4, n_kv_heads=2, head_dim=8)
    if getattr(pe, "delta", None) is not None:
        with torch.no_grad():
            pe.delta.uniform_(-6.28, 0)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)
    cached = pe.cache_keys(k, 0)
    assert cached.shape == k.shape and cached.dtype == k.dtype
    torch.testing.assert_close(pe.attend_cached(q, cached, v), pe(q, k, v), atol=1e-6, rtol=1e-5)
    # A cache filled in pieces (a prompt, then one key at a time) holds the same keys (up to the last bit:
    # elementwise kernels may vectorise a long tensor differently from a short one).
    pieces = torch.cat(
        [pe.cache_keys(k[:, :, :7], 0)] + [pe.cache_keys(k[:, :, i : i + 1], i) for i in range(7, 11)], 2
    )
    torch.testing.assert_close(pieces, cached, rtol=1e-6, atol=1e-7)
    if spec == "pope":
        torch.testing.assert_close(cached, torch.nn.functional.softplus(k))
    if spec.startswith("pope:magnitude=relu"):
        assert torch.equal(cached[..., :6], k[..., :6].relu()) and torch.equal(cached[..., 6:], k[..., 6:])
