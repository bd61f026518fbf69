"""Windowing for length evaluation: every target scored once, hand-computed NLL on a toy model."""

import math

import numpy as np
import pytest
import torch

from pope.eval.length import evaluate_lengths, parse_lengths, score_windows
from pope.eval.windows import plan_windows, scored_target_indices


def _all_targets(offsets, min_tokens):
    """Split indices of every predictable token (all but each document's first) of long-enough documents."""
    out = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        if b - a >= min_tokens:
            out.extend(range(a + 1, b))
    return np.array(out, dtype=np.int64)


@pytest.mark.parametrize("length", [1, 3, 4, 7, 10])
def test_every_target_scored_exactly_once_with_tail_context(length):
    doc_lengths = [1, 2, 5, 11, 12, 4, 30]
    offsets = np.concatenate([[0], np.cumsum(doc_lengths)])
    plan = plan_windows(offsets, length, tail="context")
    scored = scored_target_indices(plan)
    expected = _all_targets(offsets, length + 1)
    assert len(scored) == len(np.unique(scored)) == plan.n_targets_scored  # nothing twice
    np.testing.assert_array_equal(np.sort(scored), expected)  # nothing missing
    # Every window has exactly `length` inputs inside one document.
    for start in plan.starts:
        doc = np.searchsorted(offsets, start, side="right") - 1
        assert offsets[doc] <= start and start + length + 1 <= offsets[doc + 1]
    # Excluded targets are those of short documents, and the counts add up.
    total_targets = sum(n - 1 for n in doc_lengths)
    assert plan.n_targets_scored + plan.n_targets_excluded == total_targets
    assert plan.n_docs_used + plan.n_docs_excluded == len(doc_lengths)


def test_tail_drop_counts_what_it_leaves_out():
    offsets = np.array([0, 12, 20])  # documents of 12 and 8 tokens: 11 and 7 targets
    plan = plan_windows(offsets, 4, tail="drop")
    # 11 targets -> 2 full windows (8) + 3 dropped; 7 targets -> 1 window (4) + 3 dropped.
    assert plan.n_windows == 3 and plan.n_tail_windows == 0
    assert plan.n_targets_scored == 12 and plan.n_targets_excluded == 6
    assert (plan.score_from == 0).all()


def test_tail_window_is_aligned_to_the_document_end():
    plan = plan_windows(np.array([0, 12]), 4, tail="context")  # 11 targets: windows at 0, 4, tail
    assert plan.starts.tolist() == [0, 4, 7]
    assert plan.score_from.tolist() == [0, 0, 1]  # the tail window re-reads 1 scored target as context


def test_min_doc_tokens_gives_the_same_targets_at_every_length():
    offsets = np.concatenate([[0], np.cumsum([40, 9, 33, 17])])
    sets = [set(scored_target_indices(plan_windows(offsets, L, min_doc_tokens=33)).tolist()) for L in (2, 5, 16, 32)]
    assert all(s == sets[0] for s in sets)
    assert sets[0] == set(_all_targets(offsets, 33).tolist())


def test_too_long_length_says_how_long_the_data_is():
    with pytest.raises(ValueError, match=r"longest has 12 tokens"):
        plan_windows(np.array([0, 5, 17]), 16)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_length_is_refused(bad):
    with pytest.raises(ValueError, match="positive integer"):
        plan_windows(np.array([0, 10]), bad)


def test_parse_lengths():
    assert parse_lengths("64, 16,32") == [16, 32, 64]
    with pytest.raises(ValueError, match="length.s. 64 given more than once"):  # not silently deduplicated
        parse_lengths("64, 16,64,32")
    with pytest.raises(ValueError, match="comma-separated"):
        parse_lengths("16,abc")


class BigramModel(torch.nn.Module):
    """Toy model: logits depend on the current token only (plus a position term, to expose windowing)."""

    def __init__(self, vocab, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g))
        self.position_scale = 0.1

    def forward(self, idx, targets=None):  # idx (B, T) -> logits (B, T, V)
        positions = torch.arange(idx.shape[1], dtype=torch.float32)[None, :, None]
        logits = self.table[idx] + self.position_scale * positions * torch.linspace(-1, 1, self.table.shape[1])
        return logits, None


def _hand_nll(model, tokens, offsets, length):
    """Direct loop over documents and positions with log_softmax, the windowing written out by hand."""
    total, count = 0.0, 0
    for a, b in zip(offsets[:-1], offsets[1:]):
        n = b - a
        if n < length + 1:
            continue
        doc = tokens[a:b]
        t = 1  # next target index inside the document
        while t < n:
            if t + length - 1 <= n - 1:  # a full window: inputs doc[t-1 : t-1+L]
                window_start, first_scored = t - 1, 0
            else:  # the tail window, aligned to the end
                window_start = n - 1 - length
                first_scored = t - 1 - window_start
            inputs = torch.tensor(doc[window_start : window_start + length].astype(np.int64))[None]
            logp = torch.log_softmax(model(inputs)[0][0].double(), -1)
            for p in range(first_scored, length):
                total -= logp[p, doc[window_start + p + 1]].item()
                count += 1
            t = window_start + length + 1
    return total / count, count


def test_nll_matches_a_hand_computation_on_a_toy_model():
    rng = np.random.default_rng(0)
    vocab = 11
    offsets = np.concatenate([[0], np.cumsum([23, 3, 17, 40])])
    tokens = rng.integers(0, vocab, size=offsets[-1]).astype(np.uint16)
    model = BigramModel(vocab)
    for length, batch in [(4, 3), (7, 1), (16, 5)]:
        plan = plan_windows(offsets, length)
        result = score_windows(model, tokens, plan, batch_size=batch, progress=False)
        expected, count = _hand_nll(model, tokens, offsets, length)
        assert result.n_targets == count
        assert result.mean_nll == pytest.approx(expected, rel=1e-5)
        assert result.perplexity == pytest.approx(math.exp(expected), rel=1e-5)
        edges, means, counts = result.bucket_nll(2)
        assert sum(counts) == count and edges[0] == 0 and edges[-1] == length


def test_evaluate_lengths_same_documents_and_max_docs():
    rng = np.random.default_rng(1)
    offsets = np.concatenate([[0], np.cumsum([10, 40, 5, 50, 45])])
    tokens = rng.integers(0, 7, size=offsets[-1])
    model = BigramModel(7)
    results = evaluate_lengths(model, tokens, offsets, [8, 32], batch_size=2, progress=False)
    assert [r.n_targets for r in results] == [39 + 49 + 44] * 2
    assert results[0].plan["n_docs_excluded"] == 2
    limited = evaluate_lengths(model, tokens, offsets, "8,32", max_docs=2, progress=False)
    assert limited[0].n_targets == 39 + 49
    assert limited[0].plan["n_docs_not_reached"] == 1 and limited[0].plan["max_docs"] == 2
    with pytest.raises(ValueError, match="longest has 50 tokens"):
        evaluate_lengths(model, tokens, offsets, [64], progress=False)


def test_progress_into_a_redirected_log_is_one_plain_line_per_length(capsys):
    """progress=True with stderr not a terminal (a log file, `make demo > log`): one line per length, no bar frames."""
    rng = np.random.default_rng(2)
    offsets = np.concatenate([[0], np.cumsum([40, 50])])
    tokens = rng.integers(0, 7, size=offsets[-1])
    evaluate_lengths(BigramModel(7), tokens, offsets, [8, 16], progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "win/s" not in err, err
    assert [line.split(":")[0] for line in err.splitlines()] == ["L=8", "L=16"], err
