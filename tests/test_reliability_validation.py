"""Validation where the mistake is made: every public module and config refuses, when it is built, what no call
could use; every tensor entry point refuses, when it is called, ids, dtypes, devices and layouts it cannot take. Each
error is a ValueError or TypeError (one line through the CLI) naming the problem and the fix."""

import pytest
import torch

import pope
from pope.axial import AxialPoPE, AxialPoPEAttention, axial_pope_attention, grid_positions
from pope.model import GPT, GPTConfig, KVCache

SMALL = dict(vocab_size=50, n_layer=1, n_head=4, d_model=32, max_seq_len=64)


def _raises(build, kind, *fragments):
    with pytest.raises(kind) as caught:
        build()
    message = str(caught.value)
    assert "\n" not in message and all(fragment in message for fragment in fragments), message


# ----------------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize("spec", ["pope", "rope", "alibi", "nope", "learned-abs", "yarn:scale=2"])
def test_a_head_layout_no_call_can_use_is_refused_when_built(spec):
    _raises(
        lambda: pope.build_positional_encoding(spec, n_heads=8, n_kv_heads=3, head_dim=64),
        ValueError,
        "n_heads (8) must be a multiple of n_kv_heads (3)",
        "use n_kv_heads in [1, 2, 4, 8]",
    )


@pytest.mark.parametrize(
    "sizes, kind, fragment",
    [
        (dict(n_heads=8, n_kv_heads=0, head_dim=64), ValueError, "n_kv_heads must be a positive int; got 0"),
        (dict(n_heads=0, head_dim=64), ValueError, "n_heads must be a positive int; got 0"),
        (dict(n_heads=8, head_dim=0), ValueError, "head_dim must be a positive int; got 0"),
        (dict(n_heads=8.0, head_dim=64), TypeError, "n_heads must be an int; got 8.0"),
        (dict(n_heads=True, head_dim=64), TypeError, "n_heads must be an int; got True"),
    ],
)
def test_bad_sizes_are_refused_when_built(sizes, kind, fragment):
    _raises(lambda: pope.build_positional_encoding("pope", **sizes), kind, fragment)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        (
            "pope:backend=cuda",
            "unknown PoPE backend 'cuda'; choose one of auto, cudnn, flash-attn-4, reference, triton",
        ),
        ("pope:base=0", "PoPE base must be a positive finite number"),
        ("pope:rotary_dim=100", "rotary_dim must be in [1, head_dim=64]"),
        ("rope:base=0", "RoPE base must be a positive finite number"),
        ("rope:rotary_dim=3", "rotary_dim must be even"),
        ("yarn:scale=0.5", "scale must be >= 1"),
        ("pope:magnitude=tanh", "unknown PoPE magnitude 'tanh'; choose one of"),
        ("alibi:heads=some", "ALiBi heads must be 'all' or 'half'"),
    ],
)
def test_bad_encoding_options_are_refused_when_built(spec, fragment):
    _raises(lambda: pope.build_positional_encoding(spec, n_heads=8, n_kv_heads=2, head_dim=64), ValueError, fragment)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        (dict(pe="pope:backend=gpu"), "unknown PoPE backend 'gpu'"),
        (dict(pe="rope:rotary_dim=3"), "rotary_dim must be even"),
        (dict(pe="rope", d_model=20, n_head=4), "rotary_dim must be even and in [2, 5]"),  # head_dim 5
        (dict(n_kv_head=3), "must be a multiple of n_kv_head (3)"),
        (dict(vocab_size=0), "GPTConfig.vocab_size must be a positive int"),
        (dict(pe="rotary"), "unknown positional encoding 'rotary'; valid names"),
    ],
)
def test_gpt_config_refuses_what_its_model_could_not_build(fields, fragment):
    _raises(lambda: GPTConfig(**{**SMALL, **fields}), ValueError, fragment)


@pytest.mark.parametrize(
    "build, kind, fragment",
    [
        (lambda: AxialPoPE(n_heads=4, head_dim=16, n_kv_heads=3), ValueError, "n_heads (4) must be a multiple"),
        (lambda: AxialPoPE(n_heads=4, head_dim=16, n_kv_heads=0), ValueError, "n_kv_heads must be a positive int"),
        (lambda: AxialPoPE(n_heads=4, head_dim=16, n_axes=2.5), TypeError, "n_axes must be an int"),
        (lambda: AxialPoPE(n_heads=4, head_dim=16, n_axes=0), ValueError, "cannot split head_dim=16 over 0 axes"),
        (lambda: AxialPoPE(n_heads=4, head_dim=16, axis_dims=(8.0, 8.0)), ValueError, "must be positive ints"),
        (lambda: AxialPoPE(n_heads=4, head_dim=16, axis_dims=(12, 12)), ValueError, "sum to at most head_dim=16"),
        (lambda: AxialPoPE(n_heads=4, head_dim=16, backend="fast"), TypeError, "backend"),
        (lambda: AxialPoPEAttention(16, 0), ValueError, "n_heads must be a positive int; got 0"),
        (lambda: AxialPoPEAttention(0, 4), ValueError, "dim must be a positive int; got 0"),
        (lambda: AxialPoPEAttention(16, 3), ValueError, "dim (16) must be divisible by n_heads (3)"),
        (lambda: AxialPoPEAttention(16, 4, dropout=1.5), ValueError, "dropout must be in [0, 1)"),
        (lambda: KVCache(GPTConfig(**SMALL), -1, 8), ValueError, "KVCache batch_size must be a positive int"),
        (lambda: GPT(GPTConfig(**SMALL)).new_kv_cache(2, 0), ValueError, "KVCache max_len must be a positive int"),
    ],
)
def test_axial_modules_and_caches_refuse_bad_construction(build, kind, fragment):
    _raises(build, kind, fragment)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        (dict(num_key_value_heads=3), "num_attention_heads (8) must be a multiple of num_key_value_heads (3)"),
        (dict(num_attention_heads=0), "num_attention_heads must be a positive int; got 0"),
        (dict(num_key_value_heads=0), "num_key_value_heads must be a positive int; got 0"),
        (dict(hidden_size=60), "hidden_size (60) must be a multiple of num_attention_heads (8)"),
        (dict(vocab_size=0), "vocab_size must be a positive int"),
        (dict(pope_backend="fast"), "pope_backend must be one of"),
        (dict(pope_rotary_dim=100), "pope_rotary_dim must be None or an int in [1, head_dim=8]"),
    ],
)
def test_the_hugging_face_config_refuses_bad_sizes_when_built(fields, fragment):
    pytest.importorskip("transformers")
    from pope.hf import PoPELlamaConfig

    base = dict(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    _raises(lambda: PoPELlamaConfig(**{**base, **fields}), ValueError, fragment)


# ----------------------------------------------------------------------------------------------------- calls
@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(**SMALL)).eval()


def _ids(*shape, high=50):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "call, kind, fragments",
    [
        (lambda m: m(torch.tensor([[1, 2, 50, 3]])), ValueError, ["idx holds 50 at position (0, 2)", "[0, 50)"]),
        (lambda m: m(torch.tensor([[1, -1]])), ValueError, ["idx holds -1 at position (0, 1)", "tokenizer"]),
        (lambda m: m(_ids(2, 4), targets=torch.full((2, 4), 77)), ValueError, ["targets hold", "or -100"]),
        (lambda m: m(_ids(2, 4), targets=_ids(2, 4).int()), TypeError, ["targets must be int64", "targets.long()"]),
        (lambda m: m(_ids(2, 4), targets=_ids(2, 3)), ValueError, ["targets must have the shape of idx (2, 4)"]),
        (lambda m: m(_ids(2, 4).float()), TypeError, ["idx must be a (batch, seq) integer tensor"]),
        (lambda m: m(_ids(4)), TypeError, ["idx must be a (batch, seq) integer tensor", "(4,)"]),
        (lambda m: m(_ids(2, 0)), ValueError, ["idx has no tokens", "at least one token"]),
        (lambda m: m(_ids(2, 4).to("meta")), ValueError, ["idx is on meta but the model is on cpu", "idx.to('cpu')"]),
        (lambda m: m.generate(torch.tensor([[60]]), 2), ValueError, ["prompt token ids must lie in [0, 50)"]),
        (lambda m: m(_ids(2, 4), kv_cache={}), TypeError, ["kv_cache must be a KVCache"]),
        (
            lambda m: m(_ids(2, 4), kv_cache=m.new_kv_cache(3, 8)),
            ValueError,
            ["kv_cache was made for (layers, batch, kv heads, head_dim) = (1, 3, 4, 8)", "needs (1, 2, 4, 8)"],
        ),
        (
            lambda m: m(_ids(2, 4), kv_cache=GPT(GPTConfig(**{**SMALL, "n_layer": 2})).new_kv_cache(2, 8)),
            ValueError,
            ["= (2, 2, 4, 8), this call needs (1, 2, 4, 8)", "new_kv_cache(2, max_len)"],
        ),
        (lambda m: GPT(dict(SMALL)), TypeError, ["GPT takes a GPTConfig; got dict", "GPTConfig.from_dict(d)"]),
    ],
)
def test_gpt_calls_are_checked_where_they_are_made(model, call, kind, fragments):
    _raises(lambda: call(model), kind, *fragments)


def test_valid_ids_and_ignored_targets_still_run(model):
    logits, loss = model(_ids(2, 4), targets=torch.tensor([[1, -100, 3, -100], [-100, -100, -100, 49]]))
    assert logits.shape == (2, 4, 50) and torch.isfinite(loss)


def test_the_id_check_reads_nothing_back_under_torch_compile():
    """The range check is for eager CPU calls: compiled, it is skipped, so the training step stays one graph (the
    full check of that is tests/test_compile_graphs.py)."""
    torch.manual_seed(0)
    compiled = torch.compile(GPT(GPTConfig(**SMALL)), backend="eager", fullgraph=True)
    logits, _ = compiled(_ids(2, 4))
    assert logits.shape == (2, 4, 50)


def test_attention_in_flash_attn_layout_says_so():
    q, k, v = torch.randn(2, 128, 8, 16), torch.randn(2, 128, 2, 16), torch.randn(2, 128, 2, 16)
    _raises(
        lambda: pope.pope_attention(q, k, v, torch.zeros(8, 16)),
        ValueError,
        "q has 8 positions but k/v only 2",
        "look like (batch, seq, heads, head_dim), flash-attn's layout",
        "pass q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)",
    )
    layer = pope.build_positional_encoding("pope", n_heads=8, n_kv_heads=2, head_dim=16)
    _raises(lambda: layer(q, k, v), ValueError, "built for 8 query heads", "flash-attn's layout", "transpose(1, 2)")
    out = layer(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    assert out.shape == (2, 8, 128, 16)


@pytest.mark.parametrize(
    "call, kind, fragment",
    [
        (lambda q, k, v: pope.pope_attention(q.long(), k.long(), v.long(), None), TypeError, "q must be float16"),
        (lambda q, k, v: pope.pope_attention(q, k.double(), v, None), TypeError, "q, k, v must share one dtype"),
        (lambda q, k, v: pope.pope_attention(q, k.to("meta"), v, None), ValueError, "q, k, v must be on one device"),
        (
            lambda q, k, v: pope.pope_attention(q, k, v, torch.zeros(3, 16)),
            ValueError,
            "delta must have shape (query_heads, rotary_dim) = (4, 16)",
        ),
        (lambda q, k, v: pope.pope_attention(q, k, v, None, backend="gpu"), ValueError, "unknown backend 'gpu'"),
        (lambda q, k, v: pope.pope_attention(q[0], k[0], v[0], None), ValueError, "must have 4 dims"),
    ],
)
def test_attention_calls_refuse_dtypes_devices_and_shapes(call, kind, fragment):
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    _raises(lambda: call(q, k, v), kind, fragment)


@pytest.mark.parametrize(
    "positions, kind, fragment",
    [
        (lambda p: p.bool(), TypeError, "positions_q must hold integer or float coordinates"),
        (lambda p: p.to("meta"), ValueError, "positions_q is on meta but q is on cpu"),
        (lambda p: p.tolist(), TypeError, "positions_q must be a tensor of coordinates"),
        (lambda p: p[:5], ValueError, "positions_q must have shape (12, n_axes)"),
        (lambda p: grid_positions((3, 2, 2)), ValueError, "positions have 3 axes but axis_dims (8, 8) name 2"),
    ],
)
def test_axial_calls_refuse_bad_positions(positions, kind, fragment):
    layer = AxialPoPE(n_heads=4, head_dim=16)
    q = torch.randn(2, 4, 12, 16)
    _raises(lambda: layer(q, q, q, positions(grid_positions((3, 4)))), kind, fragment)


def test_axial_calls_refuse_bad_tensors():
    q = torch.randn(2, 4, 12, 16)
    positions = grid_positions((3, 4))
    _raises(lambda: axial_pope_attention(q.long(), q.long(), q.long(), positions), TypeError, "q must be float16")
    _raises(lambda: AxialPoPEAttention(16, 4)(torch.randn(2, 12, 8), positions), ValueError, "(batch, tokens, 16)")
    layer = AxialPoPE(n_heads=4, head_dim=16)
    _raises(lambda: layer(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), positions), ValueError, "flash")


def test_the_hugging_face_model_refuses_ids_outside_its_vocabulary():
    pytest.importorskip("transformers")
    from pope.hf import PoPELlamaConfig, PoPELlamaForCausalLM

    config = PoPELlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
    )
    model = PoPELlamaForCausalLM(config)
    _raises(lambda: model(torch.tensor([[5, 100]])), ValueError, "input_ids holds 100 at position (0, 1)", "[0, 100)")
    assert model(torch.tensor([[5, 99]])).logits.shape == (1, 2, 100)


def test_the_hugging_face_model_refuses_ids_that_are_not_integers():
    pytest.importorskip("transformers")
    from pope.hf import PoPELlamaConfig, PoPELlamaForCausalLM

    config = PoPELlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
    )
    model = PoPELlamaForCausalLM(config)
    _raises(lambda: model(torch.zeros(1, 4)), TypeError, "input_ids must hold integer token ids", "input_ids.long()")
