"""pope.hf's PoPELlama: equal to an equivalent computation in float64, cache decode, padding, positions,
generate, save/load and its refusals. Tiny float64 models on the CPU (the reference backend)."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers is part of the [hf] extra")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaConfig  # noqa: E402

from pope.attention import pope_attention  # noqa: E402
from pope.hf import PoPELlamaConfig, PoPELlamaForCausalLM, from_llama_config  # noqa: E402

VOCAB = 61


def tiny_config(**overrides) -> PoPELlamaConfig:
    options = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pope_delta_init="uniform",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return PoPELlamaConfig(**{**options, **overrides})


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return PoPELlamaForCausalLM(tiny_config()).double().eval()


def _cache_of(output):
    return getattr(output, "cache", None) or output.past_key_values


def _tokens(*shape, seed=1):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _rms(x, weight, eps):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _equivalent_logits(model, ids):
    """The same network written out with pope.pope_attention (reference backend) on the model's weights."""
    cfg = model.config
    h, hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    x = model.model.embed_tokens.weight[ids]  # (B, T, C)
    b, t, _ = x.shape
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        y = _rms(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
        q = (y @ attn.q_proj.weight.T).view(b, t, h, hd).transpose(1, 2)
        k = (y @ attn.k_proj.weight.T).view(b, t, hkv, hd).transpose(1, 2)
        v = (y @ attn.v_proj.weight.T).view(b, t, hkv, hd).transpose(1, 2)
        delta = attn.pe.delta.clamp(-2 * math.pi, 0.0)
        o = pope_attention(q, k, v, delta, base=cfg.pope_base, backend="reference").transpose(1, 2).reshape(b, t, -1)
        x = x + o @ attn.o_proj.weight.T
        y = _rms(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
        x = x + (F.silu(y @ mlp.gate_proj.weight.T) * (y @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    return _rms(x, model.model.norm.weight, cfg.rms_norm_eps) @ model.lm_head.weight.T


def test_logits_equal_the_package_pope_attention_in_float64(model):
    ids = _tokens(2, 12)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, _equivalent_logits(model, ids), atol=1e-12, rtol=0)
    assert model.model.layers[0].self_attn.pe.delta.abs().sum() > 0  # uniform delta: the phase bias is exercised


def test_cache_decode_equals_full_forward(model):
    ids = _tokens(2, 13)
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        cache = _cache_of(out)
        pieces = [out.logits]
        for start, stop in ((5, 6), (6, 10), (10, 11), (11, 13)):  # single tokens and chunks
            out = model(ids[:, start:stop], past_key_values=cache, use_cache=True)
            pieces.append(out.logits)
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-12, rtol=0)
    # The cache stores PoPE's key magnitudes softplus(k): d channels per key, nothing negative.
    keys = cache.layers[0].keys if hasattr(cache, "layers") else cache.key_cache[0]
    assert keys.shape == (2, 2, 13, 8) and bool((keys > 0).all())


def test_position_ids_shift_changes_nothing(model):
    ids = _tokens(2, 9)
    positions = torch.arange(9)[None].repeat(2, 1) + torch.tensor([[100], [7]])
    with torch.no_grad():
        assert torch.allclose(model(ids, position_ids=positions).logits, model(ids).logits, atol=1e-12, rtol=0)


def _brute_force_layer(attn, x, positions):
    """One PoPE attention layer, score = sum_c f(q_c) f(k_c) cos((p_s - p_t) theta_c + delta_c) / sqrt(d), causal."""
    b, t, _ = x.shape
    h, hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = F.softplus((x @ attn.q_proj.weight.T).view(b, t, h, hd).transpose(1, 2))
    k = F.softplus((x @ attn.k_proj.weight.T).view(b, t, hkv, hd).transpose(1, 2)).repeat_interleave(h // hkv, 1)
    v = (x @ attn.v_proj.weight.T).view(b, t, hkv, hd).transpose(1, 2).repeat_interleave(h // hkv, 1)
    theta = attn.pe.base ** (-torch.arange(hd, dtype=torch.float64) / hd)
    rel = (positions[:, None, :] - positions[:, :, None]).double()  # (B, t, s): p_s - p_t
    delta = attn.pe.delta.clamp(-2 * math.pi, 0.0)  # (H, d)
    angle = rel[:, None, :, :, None] * theta + delta[None, :, None, None, :]  # (B, H, t, s, d)
    score = (q[:, :, :, None, :] * k[:, :, None, :, :] * angle.cos()).sum(-1) / math.sqrt(hd)
    score = score.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    out = (score.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
    return out @ attn.o_proj.weight.T


def test_explicit_positions_packed_sequences(model):
    """position_ids that restart (packed documents) take the explicit-position path: phases from position_ids."""
    from pope.hf.modeling import plan_attention

    attn = model.model.layers[0].self_attn
    x = torch.randn(2, 8, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 10, 11, 12, 13, 40]])
    plan = plan_attention(None, positions, past_length=0, n=8, batch=2, device=x.device, dtype=x.dtype, has_cache=False)
    assert plan.bias is not None
    with torch.no_grad():
        assert torch.allclose(attn(x, plan, None), _brute_force_layer(attn, x, positions), atol=1e-12, rtol=0)
        index = torch.arange(8)[None].repeat(2, 1)
        plain = plan_attention(
            None, index + 5, past_length=0, n=8, batch=2, device=x.device, dtype=x.dtype, has_cache=False
        )
        assert plain.bias is None  # indices plus a constant: the fused path
        assert torch.allclose(attn(x, plain, None), _brute_force_layer(attn, x, index), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="without a cache"):
        model(_tokens(2, 8), position_ids=positions, use_cache=True)


def test_left_padding_equals_unpadded_rows(model):
    prompts = [_tokens(1, 7, seed=4), _tokens(1, 4, seed=5)]
    width = 7
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - prompt.shape[1] :] = prompt[0]
        mask[row, width - prompt.shape[1] :] = 1
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        for row, prompt in enumerate(prompts):
            alone = model(prompt).logits[0]
            assert torch.allclose(padded[row, width - prompt.shape[1] :], alone, atol=1e-12, rtol=0)
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        for row, prompt in enumerate(prompts):
            alone = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
            assert torch.equal(generated[row, width:], alone[0, prompt.shape[1] :])


def test_generate_greedy_sampling_and_beam_equal_full_forwards(model):
    prompt = _tokens(2, 5, seed=6)
    with torch.no_grad():
        greedy = model.generate(prompt, max_new_tokens=7, do_sample=False, pad_token_id=0)
        ids = prompt
        for _ in range(7):  # full forward passes, no cache
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(greedy, ids)
        for options in (dict(do_sample=True, top_k=0, temperature=1.3), dict(num_beams=3, do_sample=False)):
            runs = []
            for use_cache in (True, False):  # with the cache (reordered by beam search) vs full forwards
                torch.manual_seed(11)
                runs.append(model.generate(prompt, max_new_tokens=6, use_cache=use_cache, pad_token_id=0, **options))
            assert torch.equal(runs[0], runs[1]), options


def test_save_and_load_round_trip(model, tmp_path):
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "pope_llama"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float64).eval()
    assert type(loaded) is PoPELlamaForCausalLM and loaded.config.pope_delta_init == "uniform"
    ids = _tokens(2, 6)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    base = AutoModel.from_pretrained(tmp_path, torch_dtype=torch.float64)
    assert type(base).__name__ == "PoPELlamaModel"
    assert torch.equal(base.layers[1].self_attn.pe.delta, model.model.layers[1].self_attn.pe.delta)
    assert loaded.config.pope_delta_range == "clamp" and loaded.model.layers[0].self_attn.pe.delta_range == "clamp"
    # pope_delta_range="wrap" reaches every layer and survives save/load
    wrapped = PoPELlamaForCausalLM(tiny_config(pope_delta_range="wrap"))
    wrapped.save_pretrained(tmp_path / "wrap")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "wrap")
    assert reloaded.config.pope_delta_range == "wrap"
    assert {layer.self_attn.pe.delta_range for layer in reloaded.model.layers} == {"wrap"}
    assert (
        from_llama_config(
            LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1), delta_range="wrap"
        ).pope_delta_range
        == "wrap"
    )


def test_from_llama_config_makes_a_pope_twin():
    llama = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    )
    twin = from_llama_config(llama, delta_init="uniform", magnitude="relu")
    assert twin.model_type == "pope_llama" and twin.pope_base == 500000.0 and twin.pope_magnitude == "relu"
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_key_value_heads",
        "tie_word_embeddings",
        "rms_norm_eps",
    ):
        assert getattr(twin, field) == getattr(llama, field), field
    model = PoPELlamaForCausalLM(twin)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the Llama config asked
    assert from_llama_config(llama, base=10000.0).pope_base == 10000.0
    scaled = LlamaConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_hidden_layers=1,
        intermediate_size=96,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert from_llama_config(scaled).pope_base == 10000.0
    assert any("dropping RoPE scaling" in str(w.message) for w in caught)
    from transformers import MistralConfig, Qwen2Config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mistral = from_llama_config(
            MistralConfig(
                hidden_size=64, num_attention_heads=8, num_hidden_layers=1, intermediate_size=96, sliding_window=16
            )
        )
    assert any("sliding-window" in str(w.message) for w in caught) and getattr(mistral, "sliding_window", None) is None
    qwen = from_llama_config(
        Qwen2Config(
            hidden_size=64, num_attention_heads=8, num_hidden_layers=2, intermediate_size=96, num_key_value_heads=2
        )
    )
    assert PoPELlamaForCausalLM(qwen).model.layers[0].self_attn.k_proj.out_features == 16
    with pytest.raises(ValueError, match="unknown PoPE options"):
        from_llama_config(llama, theta=3)


def test_bad_options_and_inapplicable_choices_are_refused(model, tmp_path):
    for bad, message in (
        (dict(pope_magnitude="square"), "pope_magnitude"),
        (dict(pope_base=0), "pope_base"),
        (dict(pope_delta_init="normal"), "pope_delta_init"),
        (dict(pope_rotary_dim=9), "rotary_dim"),
        (dict(pope_delta_range="project"), "pope_delta_range must be 'clamp' or 'wrap'"),
        (dict(pope_backend="cuda"), "pope_backend"),
    ):
        with pytest.raises(ValueError, match=message):
            tiny_config(**bad)
    model.save_pretrained(tmp_path)
    for implementation in ("sdpa", "flash_attention_2"):
        with pytest.raises(ValueError, match="does not apply"):
            AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=implementation)
    ids = _tokens(1, 4)
    with pytest.raises(ValueError, match="output_attentions"):
        model(ids, output_attentions=True)
    with pytest.raises(ValueError, match="2-D"):
        model(ids, attention_mask=torch.ones(1, 1, 4, 4))
    with pytest.raises(TypeError, match="unexpected arguments"):
        model(ids, head_mask=None)


def test_rotary_dim_and_hidden_states(model):
    torch.manual_seed(2)
    partial = PoPELlamaForCausalLM(tiny_config(pope_rotary_dim=4, num_key_value_heads=4)).double().eval()
    ids = _tokens(1, 6)
    with torch.no_grad():
        out = partial(ids, output_hidden_states=True, use_cache=True)
        step = partial(ids[:, 3:], past_key_values=None, use_cache=False)  # no cache: its own positions
        first = partial(ids[:, :3], use_cache=True)
        rest = partial(ids[:, 3:], past_key_values=_cache_of(first), use_cache=True)
    assert len(out.hidden_states) == 3 and step.logits.shape == (1, 3, VOCAB)
    assert torch.allclose(rest.logits, out.logits[:, 3:], atol=1e-12, rtol=0)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = PoPELlamaForCausalLM(tiny_config()).double().train()
    ids = _tokens(2, 8)
    grads = []
    for checkpointing in (False, True):
        if checkpointing:  # transformers >= 5.x names it activation checkpointing (the old name warns)
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert model.model.gradient_checkpointing
    for plain, checkpointed in zip(*grads):
        assert torch.allclose(plain, checkpointed, atol=1e-12, rtol=0)


def test_static_cache_is_refused(model):
    # transformers 4.50-4.53 refuse it themselves (the model declares no static-cache support); 4.56 and later
    # build the StaticCache and PoPELlama's forward refuses it.
    with pytest.raises((TypeError, ValueError), match="DynamicCache|does not support `cache_implementation='static'`"):
        model.generate(_tokens(1, 4), max_new_tokens=2, cache_implementation="static", pad_token_id=0)


def test_torch_compile_traces_one_graph():
    """Without a mask the forward and loss trace as one graph (no host sync), and compile gives the same loss."""
    torch.manual_seed(0)
    model = PoPELlamaForCausalLM(tiny_config(num_hidden_layers=1)).train()
    ids = _tokens(2, 8)
    explained = torch._dynamo.explain(model)(input_ids=ids, labels=ids, use_cache=False)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    compiled = torch.compile(model, backend="aot_eager")
    loss = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    assert loss.item() == pytest.approx(model(input_ids=ids, labels=ids, use_cache=False).loss.item(), abs=1e-6)
