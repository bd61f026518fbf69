"""pope_attention against the paper's formula, computed directly in float64."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

import pope
from pope.attention import reference_pope_attention
from pope.encodings import PoPE, RoPE, build_positional_encoding
from pope.frequencies import angles, pope_frequencies
from pope.testing import formula_attention

direct_pope_attention = formula_attention  # the paper's score in float64 (pope.testing)


CASES = [
    dict(b=2, hq=4, hkv=4, nq=9, nk=9, d=16, causal=True),
    dict(b=1, hq=4, hkv=2, nq=7, nk=7, d=8, causal=True),  # GQA
    dict(b=2, hq=6, hkv=2, nq=3, nk=11, d=8, causal=True),  # GQA + Nq < Nk (decode-like)
    dict(b=1, hq=2, hkv=1, nq=5, nk=13, d=12, causal=False),
    dict(b=2, hq=2, hkv=2, nq=6, nk=10, d=16, causal=True, rotary_dim=6),  # partial rotary
    dict(b=1, hq=2, hkv=2, nq=4, nk=8, d=8, causal=True, q_offset=2),  # explicit query positions
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("magnitude", ["softplus", "relu", "identity"])
def test_matches_direct_formula_float64(case, magnitude):
    g = torch.Generator().manual_seed(hash((tuple(case.items()), magnitude)) % 2**31)
    b, hq, hkv, nq, nk, d = (case[x] for x in ("b", "hq", "hkv", "nq", "nk", "d"))
    r = case.get("rotary_dim") or d
    q = torch.randn(b, hq, nq, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, hkv, nk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, hkv, nk, d, generator=g, dtype=torch.float64)
    delta = -2 * math.pi * torch.rand(hq, r, generator=g, dtype=torch.float64)
    kwargs = dict(causal=case["causal"], q_offset=case.get("q_offset"), rotary_dim=case.get("rotary_dim"))
    expected = direct_pope_attention(q, k, v, delta, magnitude=pope.attention.MAGNITUDES[magnitude], **kwargs)
    for backend in ("reference", "auto"):
        got = pope.pope_attention(q, k, v, delta, magnitude=magnitude, backend=backend, **kwargs)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_float32_and_low_precision_close_to_float64():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 33, 16, generator=g) for _ in range(3))
    delta = -2 * math.pi * torch.rand(4, 16, generator=g)
    expected = direct_pope_attention(q, k, v, delta)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        got = pope.pope_attention(q.to(dtype), k.to(dtype), v.to(dtype), delta).double()
        assert ((got - expected).norm() / expected.norm()).item() < tol


def test_shift_invariance_pope_and_rope():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    delta = -2 * math.pi * torch.rand(2, 8, generator=g, dtype=torch.float64)
    opts = dict(base=10000.0, causal=True, softmax_scale=0.3, q_offset=0, magnitude="softplus", rotary_dim=None)
    base_out = reference_pope_attention(q, k, v, delta, **opts)
    shifted = reference_pope_attention(q, k, v, delta, position_shift=12345, **opts)
    torch.testing.assert_close(shifted, base_out, rtol=1e-9, atol=1e-9)

    rope = RoPE(n_heads=2, n_kv_heads=2, head_dim=8)
    pos = torch.arange(12)
    scores = rope.rotate(q, pos) @ rope.rotate(k, pos).transpose(-1, -2)
    scores_shifted = rope.rotate(q, pos + 1000) @ rope.rotate(k, pos + 1000).transpose(-1, -2)
    # RoPE's angles are float32 by design: at position ~1e3 they carry ~1e-4 rad of rounding
    torch.testing.assert_close(scores_shifted, scores, rtol=1e-3, atol=1e-3)


def _rope_scores(rope, q, k):
    return rope.rotate(q, torch.arange(q.shape[2])) @ rope.rotate(k, torch.arange(k.shape[2])).transpose(-1, -2)


def test_what_where_confound_numerically():
    """A content change that keeps RoPE's magnitudes moves RoPE's scores; PoPE's positional profile
    (the score per channel divided by its magnitudes) is the same for every content."""
    g = torch.Generator().manual_seed(3)
    d, n = 8, 16
    q, k = (
        torch.randn(1, 1, n, d, generator=g, dtype=torch.float64),
        torch.randn(1, 1, n, d, generator=g, dtype=torch.float64),
    )
    # RoPE (rotate-half pairs channel i with i + d/2): rotate every pair of the query by a content angle.
    rope = RoPE(n_heads=1, n_kv_heads=1, head_dim=d)
    angle = torch.rand(d // 2, generator=g, dtype=torch.float64) * 2 + 0.5
    x1, x2 = q[..., : d // 2], q[..., d // 2 :]
    q_rot = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], dim=-1)
    pair_norm = lambda x: (x[..., : d // 2] ** 2 + x[..., d // 2 :] ** 2).sqrt()
    torch.testing.assert_close(pair_norm(q_rot), pair_norm(q))  # same magnitudes
    assert (_rope_scores(rope, q_rot, k) - _rope_scores(rope, q, k)).abs().max() > 0.1  # scores moved

    # PoPE: per channel, score / (f(q) f(k)) = cos((s - t) theta + delta) whatever the content.
    theta = pope_frequencies(d).double()
    delta = -torch.rand(d, generator=g, dtype=torch.float64)
    t = torch.arange(n, dtype=torch.float64)
    profiles = []
    for content in (q, q_rot, torch.randn_like(q) * 3):
        mq, mk = F.softplus(content[0, 0]), F.softplus(k[0, 0])  # (n, d)
        qp = torch.stack([mq * torch.cos(t[:, None] * theta - delta), mq * torch.sin(t[:, None] * theta - delta)])
        kp = torch.stack([mk * torch.cos(t[:, None] * theta), mk * torch.sin(t[:, None] * theta)])
        per_channel = (qp[:, :, None, :] * kp[:, None, :, :]).sum(0)  # (n, n, d)
        profiles.append(per_channel / (mq[:, None, :] * mk[None, :, :]))
    for other in profiles[1:]:
        torch.testing.assert_close(other, profiles[0], rtol=1e-12, atol=1e-12)


def test_gradcheck_reference_float64():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    delta = (-2 * math.pi * torch.rand(4, 6, generator=g, dtype=torch.float64)).requires_grad_()
    fn = lambda q, k, v, delta: pope.pope_attention(q, k, v, delta, backend="reference")
    assert torch.autograd.gradcheck(fn, (q, k, v, delta))


def test_delta_clamp_at_bounds():
    layer = PoPE(n_heads=1, n_kv_heads=1, head_dim=4)
    with torch.no_grad():
        layer.delta.copy_(torch.tensor([[1.0, -7.0, -1.0, 0.0]]))
    clamped = layer.bounded_delta()
    torch.testing.assert_close(clamped, torch.tensor([[0.0, -2 * math.pi, -1.0, 0.0]]))
    clamped.sum().backward()
    # no gradient pushes a value further out of [-2π, 0]; inside the interval the gradient flows
    assert layer.delta.grad[0, 0] == 0 and layer.delta.grad[0, 1] == 0 and layer.delta.grad[0, 2] == 1
    uniform = PoPE(n_heads=8, n_kv_heads=8, head_dim=64, delta_init="uniform").delta
    assert uniform.min() >= -2 * math.pi and uniform.max() <= 0 and uniform.std() > 1
    assert PoPE(n_heads=2, n_kv_heads=2, head_dim=8, use_delta=False).delta is None


def test_delta_wrap_keeps_the_scores_and_the_gradient():
    """delta_range="wrap": inside [-2π, 0] delta passes unchanged (so a run equals "clamp" until an entry steps
    out); outside, the scores are those of the unconstrained delta (cos is 2π-periodic) and the gradient is 1,
    where "clamp" would cut it."""
    g = torch.Generator().manual_seed(7)
    inside = -2 * math.pi * torch.rand(2, 8, generator=g, dtype=torch.float64)
    wrap = PoPE(n_heads=2, n_kv_heads=2, head_dim=8, delta_range="wrap").double()
    clamp = PoPE(n_heads=2, n_kv_heads=2, head_dim=8).double()
    with torch.no_grad():
        wrap.delta.copy_(inside)
    assert torch.equal(wrap.bounded_delta(), inside)
    outside = torch.tensor([[0.3, 7.0, -6.5, -20.0, 0.0, -2 * math.pi, 2 * math.pi, -1.0]] * 2, dtype=torch.float64)
    with torch.no_grad():
        wrap.delta.copy_(outside)
        clamp.delta.copy_(outside)
    bounded = wrap.bounded_delta()
    assert bounded.min() >= -2 * math.pi and bounded.max() <= 0
    torch.testing.assert_close(torch.cos(bounded), torch.cos(outside), rtol=0, atol=1e-12)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    free = pope.pope_attention(q, k, v, outside, backend="reference")  # delta unconstrained
    torch.testing.assert_close(wrap(q, k, v), free, rtol=0, atol=1e-12)
    wrap(q, k, v).sum().backward()
    clamp(q, k, v).sum().backward()
    assert (clamp.delta.grad[:, :4] == 0).all()  # 0.3, 7, -6.5, -20: outside, cut by the clamp
    free_delta = outside.clone().requires_grad_()
    pope.pope_attention(q, k, v, free_delta, backend="reference").sum().backward()
    torch.testing.assert_close(wrap.delta.grad, free_delta.grad, rtol=0, atol=1e-12)  # the unconstrained gradient
    assert (wrap.delta.grad[:, :4] != 0).all()
    with pytest.raises(ValueError, match="unknown PoPE delta_range 'mod'; choose one of clamp, wrap, project"):
        PoPE(n_heads=1, n_kv_heads=1, head_dim=4, delta_range="mod")


def test_delta_project_clamps_the_parameter_in_place_and_scores_as_the_clamp():
    """delta_range="project": the forward pass is the clamp's; project_deltas_ puts the parameter of every
    "project" layer (and only those) back into [-2π, 0], in place."""
    from pope.encodings import project_deltas_, projected_deltas

    model = torch.nn.ModuleList(
        [
            PoPE(n_heads=2, n_kv_heads=2, head_dim=8, delta_range=bound).double()
            for bound in ("project", "clamp", "project", "wrap")
        ]
    )
    outside = torch.tensor([[0.3, 7.0, -6.5, -20.0, 0.0, -2 * math.pi, -1.0, -3.0]] * 2, dtype=torch.float64)
    with torch.no_grad():
        for layer in model:
            layer.delta.copy_(outside)
    assert torch.equal(model[0].bounded_delta(), model[1].bounded_delta())  # the clamp's forward
    deltas = projected_deltas(model)
    assert len(deltas) == 2 and deltas[0] is model[0].delta and deltas[1] is model[2].delta
    parameter = model[0].delta
    project_deltas_(model)
    assert model[0].delta is parameter  # in place: the same tensor (a CUDA graph replays it)
    expected = outside.clamp(-2 * math.pi, 0.0)
    assert torch.equal(model[0].delta, expected) and torch.equal(model[2].delta, expected)
    assert torch.equal(model[1].delta, outside) and torch.equal(model[3].delta, outside)  # other ranges untouched
    with torch.no_grad():
        model[0].delta.copy_(outside)
    project_deltas_([model[0].delta])  # or the parameters themselves
    assert torch.equal(model[0].delta, expected)


def test_pope_softmax_scale_option():
    """softmax_scale=None is 1/sqrt(head_dim), bitwise as pope_attention's default; a given scale reaches the op."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    default = PoPE(n_heads=2, n_kv_heads=2, head_dim=8, delta_init="uniform")
    assert default.softmax_scale == 1 / math.sqrt(8)
    assert torch.equal(default(q, k, v), pope.pope_attention(q, k, v, default.bounded_delta(), backend="reference"))
    wide = build_positional_encoding("pope:softmax_scale=0.25", n_heads=2, head_dim=8)
    wide.load_state_dict(default.state_dict())
    torch.testing.assert_close(
        wide(q, k, v),
        pope.pope_attention(q, k, v, default.bounded_delta(), softmax_scale=0.25, backend="reference"),
        rtol=0,
        atol=0,
    )
    assert not torch.allclose(wide(q, k, v), default(q, k, v))
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="PoPE softmax_scale must be a positive number"):
            PoPE(n_heads=1, n_kv_heads=1, head_dim=4, softmax_scale=bad)


def test_angles_are_float32_under_autocast():
    positions = torch.arange(4096)
    theta = pope_frequencies(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        phase = angles(positions, theta)
    assert phase.dtype == torch.float32
    exact = positions.double()[:, None] * theta.double()[None, :]
    assert (phase.double().cos() - exact.cos()).abs().max() < 1e-3


def test_triton_backend_refuses_cpu_and_auto_falls_back():
    q = k = v = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="CUDA"):
        pope.pope_attention(q, k, v, None, backend="triton")
    torch.testing.assert_close(
        pope.pope_attention(q, k, v, None), pope.pope_attention(q, k, v, None, backend="reference")
    )


def _qkv(b=1, hq=2, hkv=2, nq=4, nk=4, d=8, dtype=torch.float32):
    return (
        torch.randn(b, hq, nq, d, dtype=dtype),
        torch.randn(b, hkv, nk, d, dtype=dtype),
        torch.randn(b, hkv, nk, d, dtype=dtype),
    )


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: (*_qkv(nq=5, nk=4), None), ValueError, "only 4"),
        (lambda: (*_qkv(hq=3, hkv=2), None), ValueError, "multiple of key/value heads"),
        (lambda: (_qkv()[0], _qkv(b=2)[1], _qkv(b=2)[2], None), ValueError, "batch"),
        (lambda: (_qkv()[0], _qkv(d=6)[1], _qkv(d=6)[2], None), ValueError, "head_dim"),
        (lambda: (_qkv()[0].long(), _qkv()[1], _qkv()[2], None), TypeError, "float16, bfloat16"),
        (lambda: (_qkv()[0], _qkv()[1].double(), _qkv()[2], None), TypeError, "share one dtype"),
        (lambda: (_qkv()[0][0], _qkv()[1], _qkv()[2], None), ValueError, "4 dims"),
        (lambda: (*_qkv(), torch.zeros(3, 8)), ValueError, r"delta must have shape"),
        (lambda: (*_qkv(), torch.zeros(2, 8, dtype=torch.long)), TypeError, "delta must be a floating"),
        (lambda: (_qkv()[0], _qkv()[1], _qkv(nk=5)[2], None), ValueError, "same shape"),
        (lambda: ([1.0], _qkv()[1], _qkv()[2], None), TypeError, "torch.Tensor"),
    ],
)
def test_bad_input(make, error, message):
    with pytest.raises(error, match=message):
        pope.pope_attention(*make())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(magnitude="sigmoid"), "unknown magnitude"),
        (dict(backend="cuda"), "unknown backend"),
        (dict(rotary_dim=9), "rotary_dim"),
        (dict(q_offset=-1), "q_offset"),
        (dict(softmax_scale=0.0), "softmax_scale"),
        (dict(base=-1.0), "base"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pope.pope_attention(*_qkv(), None, **kwargs)


def test_tensors_on_different_devices():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="one device"):
        pope.pope_attention(q, k.to("meta"), v, None)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(causal="no"), TypeError, "causal must be True or False"),
        (dict(causal=1), TypeError, "causal must be True or False"),
        (dict(q_offset=True), TypeError, "q_offset must be an int"),
        (dict(q_offset=1.0), TypeError, "q_offset must be an int"),
        (dict(q_offset=10**30), ValueError, "positions must stay below"),
        (dict(softmax_scale="0.1"), TypeError, "softmax_scale must be a number"),
        (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
        (dict(base=True), TypeError, "base must be a number"),
        (dict(base=float("inf")), ValueError, "base must be a positive finite"),
        (dict(magnitude=["relu"]), ValueError, "unknown magnitude"),
        (dict(rotary_dim=True), ValueError, "rotary_dim"),
        (dict(dropout_p="0"), TypeError, "dropout_p must be a number"),
    ],
)
def test_bad_option_types(kwargs, error, message):
    with pytest.raises(error, match=message):
        pope.pope_attention(*_qkv(), None, **kwargs)


def test_head_dim_zero_is_a_clear_error():
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        pope.pope_attention(*_qkv(d=0), None)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("nq, nk, q_offset", [(6, 6, None), (3, 9, 2), (4, 12, None), (1, 7, 3)])
def test_masked_keys_do_not_reach_any_output(value, nq, nk, q_offset):
    """A non-finite key (k) masked from a query changes none of that query's output; keys past every query (k and v:
    a preallocated cache's garbage) change nothing at all."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for n in (nq, nk, nk))
    delta = -torch.rand(2, 8, generator=g, dtype=torch.float64)
    offset = nk - nq if q_offset is None else q_offset
    expected = formula_attention(q, k, v, delta, q_offset=offset)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        clean = pope.pope_attention(q.to(dtype), k.to(dtype), v.to(dtype), delta, q_offset=q_offset)
        for position in range(offset + 1, nk):  # masked from query 0 at least
            dirty_k, dirty_v = k.to(dtype).clone(), v.to(dtype).clone()
            dirty_k[0, 1, position, 3] = value
            if position >= offset + nq:  # past every query: its value too
                dirty_v[0, 1, position, 5] = value
            out = pope.pope_attention(q.to(dtype), dirty_k, dirty_v, delta, q_offset=q_offset)
            unseen = min(position - offset, nq)  # queries 0 .. unseen-1 cannot see it
            assert torch.equal(out[:, :, :unseen], clean[:, :, :unseen]), (dtype, position)
            if dtype == torch.float64:
                torch.testing.assert_close(out[:, :, :unseen], expected[:, :, :unseen], rtol=1e-10, atol=1e-10)


def _property_case(rng: random.Random, g: torch.Generator):
    """One random pope_attention call: (args, kwargs, how to check it). Most are valid (shapes, dtypes, offsets,
    views, masked non-finite keys); some carry one bad argument and must raise ValueError / TypeError."""
    dtype = rng.choice([torch.float64, torch.float32, torch.bfloat16, torch.float16])
    b, hkv, group = rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([1, 2, 3])
    hq, d = hkv * group, rng.choice([1, 2, 3, 4, 8, 16])
    nq = rng.randint(1, 7)
    nk = nq + rng.randint(0, 8)
    causal = rng.random() < 0.75
    q_offset = None if rng.random() < 0.5 else rng.randint(0, nk - nq + 3)
    rotary_dim = None if rng.random() < 0.7 else rng.randint(1, d)
    r = rotary_dim or d

    def make(heads, n):  # sometimes a non-contiguous view: (B, N, H, d) transposed, or every other channel
        layout = rng.choice(["contiguous", "transposed", "strided"])
        if layout == "transposed":
            return torch.randn(b, n, heads, d, generator=g, dtype=torch.float64).to(dtype).transpose(1, 2)
        if layout == "strided":
            return torch.randn(b, heads, n, 2 * d, generator=g, dtype=torch.float64).to(dtype)[..., ::2]
        return torch.randn(b, heads, n, d, generator=g, dtype=torch.float64).to(dtype)

    q, k, v = make(hq, nq), make(hkv, nk), make(hkv, nk)
    delta = None if rng.random() < 0.3 else -6.28 * torch.rand(hq, r, generator=g, dtype=torch.float64)
    kwargs = dict(
        causal=causal,
        q_offset=q_offset,
        rotary_dim=rotary_dim,
        backend=rng.choice(["auto", "reference"]),
        magnitude=rng.choice(list(pope.attention.MAGNITUDES)),
        base=rng.choice([10000.0, 500, 1e6]),
        softmax_scale=rng.choice([None, 0.3, 1.7]),
    )
    clean = (q.clone(), k.clone(), v.clone())
    offset = nk - nq if q_offset is None else q_offset
    unseen = nq  # query rows whose output must match the formula
    if causal and offset + 1 < nk and rng.random() < 0.5:  # a non-finite value in a masked key
        position = rng.randint(offset + 1, nk - 1)
        value = rng.choice([float("nan"), float("inf"), -float("inf")])
        k[rng.randrange(b), rng.randrange(hkv), position, rng.randrange(d)] = value
        if position >= offset + nq:
            v[rng.randrange(b), rng.randrange(hkv), position, rng.randrange(d)] = value
        unseen = min(position - offset, nq)
    bad = None
    if rng.random() < 0.3:
        bad = rng.choice(
            [
                ("causal", "no"),
                ("causal", None),
                ("q_offset", True),
                ("q_offset", -1),
                ("q_offset", 10**30),
                ("q_offset", 2.0),
                ("softmax_scale", 0.0),
                ("softmax_scale", "1"),
                ("softmax_scale", float("inf")),
                ("base", 0),
                ("base", "1e4"),
                ("base", float("nan")),
                ("magnitude", "exp"),
                ("magnitude", None),
                ("backend", "cuda"),
                ("backend", "triton"),
                ("rotary_dim", 0),
                ("rotary_dim", d + 1),
                ("rotary_dim", 2.0),
                ("dropout_p", 1.5),
                ("dropout_p", "0"),
                ("delta", torch.zeros(hq + 1, r)),
                ("delta", [0.0]),
                ("delta", torch.zeros(hq, r, dtype=torch.int64)),
                ("q", q.long()),
                ("q", q.tolist()),
                ("k", k.double() if dtype != torch.float64 else k.float()),
                ("k", k[:, :, :0]),
                ("v", v[..., :0]),
                ("q", q[..., :0]),
                ("q", make(hq, nk + 1)),
                ("q", q[0]),
                ("k", make(hkv + 1, nk) if hq % (hkv + 1) else make(hkv, nk)[:1].expand(b + 1, -1, -1, -1)),
            ]
        )
        if bad[0] in ("q", "k", "v", "delta"):
            q, k, v, delta = (
                bad[1] if bad[0] == name else value for name, value in zip(("q", "k", "v", "delta"), (q, k, v, delta))
            )
        else:
            kwargs[bad[0]] = bad[1]
    return (q, k, v, delta), kwargs, clean, unseen, bad


def test_property_every_call_matches_the_formula_or_raises_a_clear_error():
    """300 random calls: each either equals the float64 formula (rows that see no masked non-finite key) within its
    dtype's rounding, or raises ValueError / TypeError when one argument is bad; never another exception, never a
    bad argument accepted."""
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    tolerance = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1.5e-1}
    counts = {"matched": 0, "refused": 0}
    for trial in range(300):
        args, kwargs, clean, unseen, bad = _property_case(rng, g)
        try:
            out = pope.pope_attention(*args, **kwargs)
        except (ValueError, TypeError) as error:
            assert bad is not None, f"trial {trial}: a valid call raised {error!r} ({kwargs})"
            assert str(error), trial
            counts["refused"] += 1
            continue
        assert bad is None, f"trial {trial}: bad argument {bad[0]}={bad[1]!r} was accepted"
        q, k, v = clean
        options = {key: kwargs[key] for key in ("causal", "q_offset", "rotary_dim", "base", "softmax_scale")}
        expected = formula_attention(
            q, k, v, args[3], magnitude=pope.attention.MAGNITUDES[kwargs["magnitude"]], **options
        )
        assert out.dtype == q.dtype and out.shape == q.shape, trial
        error = (out[:, :, :unseen].double() - expected[:, :, :unseen]).abs().max().item()
        assert error <= tolerance[q.dtype], f"trial {trial}: error {error:.2e} ({q.dtype}, {kwargs})"
        counts["matched"] += 1
    assert counts["matched"] > 150 and counts["refused"] > 50, counts
