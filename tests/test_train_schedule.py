"""Learning-rate schedule and optimizer parameter groups."""

import math

import pytest
import torch

from pope.train.schedule import WarmupDecaySchedule


def test_warmup_peak_and_end_values():
    schedule = WarmupDecaySchedule(peak_lr=2e-4, min_lr=2e-5, warmup_steps=4000, total_steps=100_000)
    assert schedule(0) == pytest.approx(2e-4 / 4000)  # first update: never lr 0
    assert schedule(1999) == pytest.approx(1e-4)  # linear half-way
    assert schedule(3999) == pytest.approx(2e-4)  # last warmup step reaches the peak
    assert schedule(4000) == pytest.approx(2e-4)  # cosine starts at the peak
    assert schedule(52_000) == pytest.approx((2e-4 + 2e-5) / 2)  # cosine mid-point
    assert schedule(99_999) == pytest.approx(2e-5, rel=1e-6)  # just above the minimum
    assert schedule(100_000) == schedule(150_000) == 2e-5
    values = [schedule(s) for s in range(4000, 100_000, 500)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay


def test_no_warmup_and_bad_arguments():
    schedule = WarmupDecaySchedule(peak_lr=1.0, min_lr=0.1, warmup_steps=0, total_steps=10)
    assert schedule(0) == 1.0
    assert schedule(5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(ValueError, match="min_lr"):
        WarmupDecaySchedule(peak_lr=1.0, min_lr=2.0, warmup_steps=0, total_steps=10)
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupDecaySchedule(peak_lr=1.0, min_lr=0.1, warmup_steps=11, total_steps=10)
    with pytest.raises(ValueError, match="decay must be one of cosine, linear; got 'step'"):
        WarmupDecaySchedule(peak_lr=1.0, min_lr=0.1, warmup_steps=0, total_steps=10, decay="step")


def test_linear_decay_has_the_cosines_ends_and_mean_and_more_of_it_late():
    linear = WarmupDecaySchedule(peak_lr=2e-4, min_lr=2e-5, warmup_steps=4000, total_steps=100_000, decay="linear")
    cosine = WarmupDecaySchedule(peak_lr=2e-4, min_lr=2e-5, warmup_steps=4000, total_steps=100_000)
    for step in (0, 1999, 3999, 4000, 52_000, 100_000, 150_000):  # warmup, peak, mid-point and end agree
        assert linear(step) == pytest.approx(cosine(step))
    assert linear(28_000) == pytest.approx(2e-4 - 0.25 * 1.8e-4)  # a straight line from peak to min
    assert linear(80_800) == pytest.approx(2e-4 - 0.8 * 1.8e-4)
    assert linear(28_000) < cosine(28_000) and linear(80_000) > cosine(80_000)
    decay = range(4000, 100_000)
    assert sum(map(linear, decay)) == pytest.approx(sum(map(cosine, decay)), rel=1e-4)
    assert linear.state_dict()["decay"] == "linear"


def test_weight_decay_groups():
    from pope.model import GPT, GPTConfig
    from pope.train.optimizer import build_optimizer, split_decay_groups

    for pe in ("pope", "learned-abs"):
        model = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, max_seq_len=16, pe=pe))
        decay, no_decay = split_decay_groups(model)
        assert "token_embedding.weight" in decay and "blocks.0.attn.q_proj.weight" in decay
        assert all("norm" in n or "delta" in n or "position_embedding" in n for n in no_decay)
        assert any("norm" in n for n in no_decay)
        if pe == "pope":
            assert "blocks.1.attn.pe.delta" in no_decay
        else:
            assert "position_embedding.weight" in no_decay
        counted = sum(p.numel() for p in model.parameters())  # tied weights once
        optimizer = build_optimizer(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
        assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == counted
        assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


def test_weight_decay_on_all_parameters_includes_delta_and_norm_gains():
    from pope.model import GPT, GPTConfig
    from pope.train.optimizer import build_optimizer, split_decay_groups

    model = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, max_seq_len=16, pe="pope"))
    decay, no_decay = split_decay_groups(model, "all")
    assert no_decay == [] and decay == [name for name, _ in model.named_parameters()]
    assert "blocks.1.attn.pe.delta" in decay and any("norm" in n for n in decay)
    optimizer = build_optimizer(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, decay_params="all")
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1]
    assert sum(p.numel() for p in optimizer.param_groups[0]["params"]) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="decay_params must be one of matrices, all; got 'none'"):
        split_decay_groups(model, "none")


def test_decay_of_all_parameters_brings_a_delta_entry_the_clamp_froze_back_inside():
    """With the forward clamp an entry below -2π has no gradient; decoupled decay on δ (decay_params="all")
    moves it towards 0, back inside, where its gradient returns. Without decay on δ it stays frozen."""
    from pope.encodings import TWO_PI
    from pope.model import GPT, GPTConfig
    from pope.train.optimizer import build_optimizer

    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    for decay_params in ("matrices", "all"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, d_model=32, max_seq_len=16, pe="pope"))
        delta = model.blocks[0].attn.pe.delta
        with torch.no_grad():
            delta[0, 0] = -TWO_PI - 0.01
        optimizer = build_optimizer(model, lr=0.01, betas=(0.9, 0.99), weight_decay=1.0, decay_params=decay_params)
        gradients = []
        for _ in range(40):  # each step multiplies the entry by 1 - lr * weight_decay = 0.99: inside after ~1
            optimizer.zero_grad()
            model(tokens, tokens)[1].backward()
            gradients.append(float(delta.grad[0, 0]))
            optimizer.step()
        entry = float(delta.detach()[0, 0])
        if decay_params == "matrices":
            assert entry == pytest.approx(-TWO_PI - 0.01) and not any(gradients)
        else:
            assert entry > -TWO_PI and gradients[0] == 0 and gradients[-1] != 0
