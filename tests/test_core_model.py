"""GPT: config validation, KV-cache decoding equals a full forward pass for every encoding, training step."""

import math
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pope
from pope import GPT, GPTConfig
from pope.frequencies import angles


def small_config(pe: str, **overrides) -> GPTConfig:
    fields = dict(vocab_size=37, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=64, pe=pe)
    return GPTConfig(**{**fields, **overrides})


@pytest.mark.parametrize("pe", pope.list_positional_encodings() + ["pope:rotary_dim=4", "pope:magnitude=identity"])
def test_incremental_decoding_matches_full_forward(pe):
    torch.manual_seed(0)
    model = GPT(small_config(pe)).eval()
    if model.blocks[0].attn.pe.__class__.__name__ == "PoPE" and model.blocks[0].attn.pe.delta is not None:
        with torch.no_grad():  # non-trivial delta so a wrong phase shows
            for block in model.blocks:
                block.attn.pe.delta.uniform_(-6.28, 0)
    idx = torch.randint(0, 37, (3, 23))
    full, _ = model(idx)
    cache = model.new_kv_cache(3, 23)
    pieces = [model(idx[:, :9], kv_cache=cache)[0]]  # a prompt, then one token at a time
    for i in range(9, 23):
        pieces.append(model(idx[:, i : i + 1], kv_cache=cache)[0])
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)


def test_generate_greedy_equals_argmax_of_full_forward():
    torch.manual_seed(1)
    model = GPT(small_config("pope")).eval()
    prompt = torch.randint(0, 37, (2, 5))
    out = model.generate(prompt, max_new_tokens=8, temperature=0)
    assert out.shape == (2, 13) and torch.equal(out[:, :5], prompt)
    logits, _ = model(out[:, :-1])
    torch.testing.assert_close(out[:, 5:], logits[:, 4:].argmax(-1))
    sampled = model.generate(prompt, 4, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (2, 9) and sampled.max() < 37


def test_kv_cache_overflow_and_learned_positions_limit():
    model = GPT(small_config("pope")).eval()
    cache = model.new_kv_cache(1, 4)
    with pytest.raises(ValueError, match="KV cache holds 4"):
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)
    learned = GPT(small_config("learned-abs", max_seq_len=8)).eval()
    with pytest.raises(ValueError, match="cannot extrapolate"):
        learned(torch.zeros(1, 9, dtype=torch.long))


def test_training_step_reduces_loss_and_masks_targets():
    torch.manual_seed(2)
    model = GPT(small_config("pope", n_kv_head=None))
    idx = torch.randint(0, 37, (4, 16))
    targets = idx.roll(-1, dims=1)
    targets[:, -1] = -100  # masked out of the loss
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        _, loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.grad is not None for p in model.parameters())  # delta included


def test_param_and_flop_counts():
    cfg = small_config("pope", n_kv_head=None)
    model = GPT(cfg)
    c, layers, v = cfg.d_model, cfg.n_layer, cfg.vocab_size
    per_layer = 4 * c * c + 8 * c * c + 2 * c + c  # q,k,v,o + MLP + two norms + delta (n_head × head_dim = C)
    assert model.num_params(non_embedding=True) == layers * per_layer + c  # + final norm
    assert model.num_params() == model.num_params(non_embedding=True) + v * c  # tied: counted once
    rope = GPT(small_config("rope", n_kv_head=None))
    t = 64
    diff = model.estimate_flops_per_token(t) - rope.estimate_flops_per_token(t)
    # PoPE's QK^T has 2d channels: 6·T·C more per layer (fwd+bwd), plus its delta parameters
    assert diff == pytest.approx(layers * 6 * t * c + 6 * layers * c)
    gpt2 = GPT(pope.get_preset("owt-124m").model_config(pe="rope"))
    assert 123e6 < gpt2.num_params() < 125e6  # GPT-2 small with tied embeddings


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(d_model=30), "divisible by n_head"),
        (dict(n_kv_head=3), "multiple of n_kv_head"),
        (dict(dropout=1.5), "dropout"),
        (dict(pe="ropez"), "unknown positional encoding"),
        (dict(n_layer=0), "n_layer"),
    ],
)
def test_config_validation(bad, message):
    with pytest.raises(ValueError, match=message):
        small_config(**{"pe": "pope", **bad})


def test_config_round_trip_and_presets():
    cfg = small_config("yarn:scale=4")
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown GPTConfig fields"):
        GPTConfig.from_dict({**cfg.to_dict(), "n_layers": 3})
    for name in ("indirect-indexing", "jsb", "maestro", "genome", "owt-124m", "owt-253m", "owt-774m"):
        assert name in pope.list_presets()
    assert pope.get_preset("owt-124m").model_config().pe == "pope:delta_init=zero"
    assert pope.get_preset("jsb").model_config().pe == "pope:delta_init=uniform"
    big = pope.get_preset("owt-774m").model_config(pe="rope")
    assert (big.n_layer, big.d_model, big.n_head, big.head_dim) == (36, 1280, 20, 64)
    with pytest.raises(ValueError, match="valid presets"):
        pope.get_preset("gpt5")
    with pytest.raises(ValueError, match="vocab_size"):
        pope.get_preset("indirect-indexing").model_config()


@pytest.mark.parametrize("tie", [True, False])
def test_weight_initialisations(tie):
    """init="gpt2": weights N(0, 0.02), residual output projections 0.02 / sqrt(2 n_layer); "fan-in": every linear
    weight N(0, sqrt(2 / (n_layer * fan_in))), embeddings N(0, 1 / sqrt(d_model)), a tied head left as the embedding.
    Both leave PoPE's delta as its encoding drew it (the same seed gives the same delta)."""
    shape = dict(
        vocab_size=4096,
        n_layer=4,
        n_head=4,
        d_model=256,
        max_seq_len=16,
        pe="pope:delta_init=uniform",
        tie_embeddings=tie,
    )
    stds = {}
    for init in ("gpt2", "fan-in"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**shape, init=init))
        stds[init] = {name: float(p.detach().std()) for name, p in model.named_parameters() if p.ndim == 2}
        stds[init]["delta"] = model.blocks[0].attn.pe.delta.detach().clone()
        if tie:
            assert model.lm_head.weight is model.token_embedding.weight
    gpt2, fan_in = stds["gpt2"], stds["fan-in"]
    assert gpt2["blocks.0.attn.q_proj.weight"] == pytest.approx(0.02, rel=0.02)
    assert gpt2["blocks.0.attn.o_proj.weight"] == pytest.approx(0.02 / math.sqrt(8), rel=0.02)
    assert gpt2["token_embedding.weight"] == pytest.approx(0.02, rel=0.02)
    assert fan_in["blocks.0.attn.q_proj.weight"] == pytest.approx(math.sqrt(2 / (4 * 256)), rel=0.02)
    assert fan_in["blocks.3.attn.o_proj.weight"] == pytest.approx(math.sqrt(2 / (4 * 256)), rel=0.02)
    assert fan_in["blocks.0.mlp.down.weight"] == pytest.approx(math.sqrt(2 / (4 * 1024)), rel=0.02)
    assert fan_in["token_embedding.weight"] == pytest.approx(1 / 16, rel=0.02)
    if not tie:
        assert fan_in["lm_head.weight"] == pytest.approx(math.sqrt(2 / (4 * 256)), rel=0.02)
    assert torch.equal(gpt2["delta"], fan_in["delta"])
    with pytest.raises(ValueError, match="init"):
        GPTConfig(**shape, init="xavier")


def test_bad_token_input():
    model = GPT(small_config("pope"))
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(2, 3))


def test_provenance_commit_from_environment_wins(monkeypatch):
    """A tree copied to another machine may carry a stale .git: POPE_GIT_COMMIT, when set, names the commit."""
    from pope import provenance

    monkeypatch.setenv("POPE_GIT_COMMIT", "abc1234def")
    assert provenance.git_commit() == {"commit": "abc1234def", "dirty": None, "source": "POPE_GIT_COMMIT"}
    assert provenance.commit_label() == "abc1234"
    monkeypatch.delenv("POPE_GIT_COMMIT")
    assert provenance.git_commit()["source"] in ("git", None)


def test_portable_path_writes_paths_below_the_working_directory_relative(tmp_path, monkeypatch):
    """Results committed to the repository name no machine's own directories."""
    from pope.provenance import portable_argv, portable_path

    monkeypatch.chdir(tmp_path)
    here = Path.cwd()
    assert portable_path(here / "data" / "genome") == "data/genome"
    assert portable_path(str(here)) == "."
    assert portable_path("/elsewhere/genome") == "/elsewhere/genome" and portable_path("rel/x") == "rel/x"
    assert portable_argv(["pope", str(here / "runs"), "--lr", "1e-3"]) == ["pope", "runs", "--lr", "1e-3"]


def test_device_names_resolve_one_way():
    from pope.devices import resolve_device

    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_generate_refuses_bad_prompts_and_says_what_to_pass():
    model = GPT(small_config("pope")).eval()
    with pytest.raises(TypeError, match=r"\(batch, seq\) integer tensor.*got \(5,\).*idx\[None\]"):
        model.generate(torch.randint(0, 37, (5,)), 2)
    with pytest.raises(TypeError, match="integer tensor"):
        model.generate(torch.zeros(1, 3), 2)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 37\).*from 0 to 37"):
        model.generate(torch.tensor([[0, 37]]), 2)
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(torch.zeros(2, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2.5)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, top_k=0)


class _HostTraffic(TorchDispatchMode):
    """Records the ops that CUDA graph capture forbids: a tensor made from host data (lift_fresh: a host-to-device
    copy on CUDA) and reading a tensor's value on the host (_local_scalar_dense: a device sync)."""

    FORBIDDEN = ("aten.lift_fresh", "aten._local_scalar_dense")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.FORBIDDEN):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("pe", pope.list_positional_encodings())
def test_training_step_is_capturable_in_a_cuda_graph(pe):
    """The trainer captures forward + backward in one CUDA graph (train.cuda_graph): no encoding may copy a host
    constant to the device or read a value back during the step. Checked on CPU by the ops such code dispatches."""
    model = GPT(small_config(pe))
    idx = torch.randint(0, 37, (2, 16))
    with _HostTraffic() as traffic:
        _, loss = model(idx, idx)
        loss.backward()
        # pope::cos_sin_table (RoPE's tables) is an operator, opaque to the mode: its body is angles().
        for positions in (torch.arange(16), torch.arange(16, dtype=torch.float32) + 0.5):
            angles(positions, pope.frequencies.rope_frequencies(8))
    assert traffic.seen == []


def _documents(lengths, seed=0):
    """Token ids and next-token targets of documents of the given lengths ((n,) each, last target -100), packed."""
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, 37, (n,), generator=g) for n in lengths]
    targets = [torch.cat([d[1:], torch.tensor([-100])]) for d in docs]
    cu_seqlens = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    return docs, targets, cu_seqlens


def _with_nontrivial_delta(model):
    for block in model.blocks:
        if getattr(block.attn.pe, "delta", None) is not None:
            with torch.no_grad():
                block.attn.pe.delta.uniform_(-6.28, 0)
    return model


@pytest.mark.parametrize("pe", pope.list_positional_encodings() + ["pope:rotary_dim=4"])
def test_packed_forward_equals_each_document_alone(pe):
    """float64: logits, loss and every gradient of a packed forward over documents of lengths 5, 1, 12, 3 (one as
    long as max_seq_len) equal those of each document run alone, the loss being the mean over all targets."""
    torch.manual_seed(0)
    model = _with_nontrivial_delta(GPT(small_config(pe, max_seq_len=12)).double())
    docs, targets, cu_seqlens = _documents([5, 1, 12, 3])
    logits, model_loss = model(torch.cat(docs), torch.cat(targets), cu_seqlens=cu_seqlens, max_seqlen=12)
    assert logits.shape == (21, 37)
    # the model's loss is fp32 (logits.float()); the float64 comparison takes the same mean in float64
    loss = torch.nn.functional.cross_entropy(logits, torch.cat(targets), ignore_index=-100)
    torch.testing.assert_close(model_loss, loss.float())
    packed_grads = torch.autograd.grad(loss, list(model.parameters()))

    alone = [model(d[None])[0][0] for d in docs]
    loss_sum = sum(
        torch.nn.functional.cross_entropy(a, t, ignore_index=-100, reduction="sum") for a, t in zip(alone, targets)
    )
    reference = loss_sum / sum(int((t != -100).sum()) for t in targets)
    reference_grads = torch.autograd.grad(reference, list(model.parameters()))
    torch.testing.assert_close(logits, torch.cat(alone), rtol=0, atol=1e-12)
    torch.testing.assert_close(loss, reference, rtol=0, atol=1e-12)
    for (name, _), got, want in zip(model.named_parameters(), packed_grads, reference_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)
    two_d, _ = model(torch.cat(docs)[None], cu_seqlens=cu_seqlens, max_seqlen=12)  # (1, total) layout too
    torch.testing.assert_close(two_d[0], logits, rtol=0, atol=0)


def test_packed_forward_refuses_what_it_cannot_run():
    docs, _, cu_seqlens = _documents([4, 6])
    idx = torch.cat(docs)
    model = GPT(small_config("pope"))
    with pytest.raises(TypeError, match="int32"):
        model(idx, cu_seqlens=cu_seqlens.long(), max_seqlen=6)
    with pytest.raises(ValueError, match="cu_seqlens ends at 9 but the packed tensor has 10 tokens"):
        model(idx, cu_seqlens=torch.tensor([0, 4, 9], dtype=torch.int32), max_seqlen=6)
    with pytest.raises(ValueError, match="max_seqlen=5 is smaller than sequence 1's length 6"):
        model(idx, cu_seqlens=cu_seqlens, max_seqlen=5)
    with pytest.raises(TypeError, match="max_seqlen must be a positive int"):
        model(idx, cu_seqlens=cu_seqlens, max_seqlen=None)
    with pytest.raises(ValueError, match=r"\(total,\) or \(1, total\)"):
        model(idx.view(2, 5), cu_seqlens=cu_seqlens, max_seqlen=6)
    with pytest.raises(ValueError, match="no KV cache"):
        model(idx[None], cu_seqlens=cu_seqlens, max_seqlen=6, kv_cache=model.new_kv_cache(1, 10))
    learned = GPT(small_config("learned-abs", max_seq_len=5))  # positions restart per document, but 6 > 5
    with pytest.raises(ValueError, match="cannot extrapolate"):
        learned(idx, cu_seqlens=cu_seqlens, max_seqlen=6)
