"""Perplexity versus evaluation length (``pope eval length``).

For each length L the split is cut into windows of exactly L tokens by :func:`pope.eval.windows.plan_windows`
(documents never crossed, every target scored once; see that module or docs/evaluation.md), the model
scores every window in one forward pass, and we report the mean NLL (nats/token), the perplexity and the
mean NLL per bucket of window positions (does the loss rise late in the window, past the training
length?).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from pope.eval.windows import WindowPlan, describe_split, plan_windows, validate_doc_offsets


@dataclass
class LengthResult:
    """Scores of one model at one window length."""

    length: int
    mean_nll: float  # nats per scored target
    n_targets: int
    position_nll_sum: np.ndarray  # (length,) float64: summed NLL per window position
    position_count: np.ndarray  # (length,) int64: scored targets per window position
    plan: dict = field(default_factory=dict)  # WindowPlan.stats()

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll)

    def bucket_nll(self, n_buckets: int) -> tuple[list[int], list[float], list[int]]:
        """Mean NLL per bucket of window positions: (edges (n_buckets+1,), mean NLL, count); NaN if empty."""
        n_buckets = max(1, min(int(n_buckets), self.length))
        edges = np.linspace(0, self.length, n_buckets + 1).round().astype(np.int64)
        means, counts = [], []
        for lo, hi in zip(edges[:-1], edges[1:]):
            count = int(self.position_count[lo:hi].sum())
            total = float(self.position_nll_sum[lo:hi].sum())
            counts.append(count)
            means.append(total / count if count else float("nan"))
        return edges.tolist(), means, counts

    def to_dict(self, n_buckets: int = 8) -> dict:
        edges, means, counts = self.bucket_nll(n_buckets)
        return {
            "length": self.length,
            "mean_nll": self.mean_nll,
            "perplexity": self.perplexity,
            "n_targets": self.n_targets,
            "bucket_edges": edges,
            "bucket_nll": means,
            "bucket_count": counts,
            **{k: v for k, v in self.plan.items() if k != "length"},
        }


def model_logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) from a model following the GPT contract (returns (logits, loss)) or plain logits."""
    out = model(idx)
    return out[0] if isinstance(out, (tuple, list)) else out


def token_nll(logits: torch.Tensor, targets: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Per-token negative log-likelihood in fp32: logits (B, T, V), targets (B, T) -> (B, T).

    Computed ``chunk`` positions at a time so the fp32 temporaries stay small at long T and large V.
    """
    pieces = []
    for start in range(0, logits.shape[1], chunk):
        part = logits[:, start : start + chunk].float()  # (B, c, V)
        target = targets[:, start : start + chunk, None]  # (B, c, 1)
        pieces.append(torch.logsumexp(part, dim=-1) - part.gather(-1, target).squeeze(-1))
    return torch.cat(pieces, dim=1)


@torch.no_grad()
def score_windows(
    model: torch.nn.Module,
    tokens: np.ndarray,
    plan: WindowPlan,
    *,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    autocast_dtype: torch.dtype | None = None,
    progress: bool = True,
    description: str = "",
) -> LengthResult:
    """Score every window of ``plan`` over the flat ``tokens`` array with ``model``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    length = plan.length
    device = torch.device(device)
    position_sum = np.zeros(length, dtype=np.float64)
    position_count = np.zeros(length, dtype=np.int64)
    positions = torch.arange(length, device=device)  # (L,)
    offsets = np.arange(length + 1, dtype=np.int64)  # (L+1,) inputs + the last target
    was_training = model.training
    model.eval()
    try:
        label = description or f"L={length}"
        # A redirected log gets one plain line instead of a bar's carriage-return frames.
        interactive = progress and sys.stderr.isatty()
        if progress and not interactive:
            print(f"{label}: {plan.n_windows} windows", file=sys.stderr, flush=True)
        bar = tqdm(total=plan.n_windows, desc=label, unit="win", disable=not interactive, leave=False)
        for first in range(0, plan.n_windows, batch_size):
            starts = plan.starts[first : first + batch_size]  # (B,)
            chunk = np.asarray(tokens[starts[:, None] + offsets[None, :]], dtype=np.int64)  # (B, L+1)
            chunk = torch.from_numpy(chunk).to(device)
            inputs, targets = chunk[:, :-1], chunk[:, 1:]  # (B, L) each
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model_logits(model, inputs)  # (B, L, V)
            nll = token_nll(logits, targets)  # (B, L) fp32
            score_from = torch.from_numpy(plan.score_from[first : first + batch_size]).to(device)  # (B,)
            scored = positions[None, :] >= score_from[:, None]  # (B, L)
            position_sum += (nll * scored).double().sum(0).cpu().numpy()
            position_count += scored.sum(0).cpu().numpy()
            bar.update(len(starts))
        bar.close()
    finally:
        model.train(was_training)
    n_targets = int(position_count.sum())
    if n_targets != plan.n_targets_scored:  # cannot happen unless the plan was built for other data
        raise RuntimeError(f"scored {n_targets} targets but the window plan promised {plan.n_targets_scored}")
    return LengthResult(
        length=length,
        mean_nll=float(position_sum.sum() / n_targets),
        n_targets=n_targets,
        position_nll_sum=position_sum,
        position_count=position_count,
        plan=plan.stats(),
    )


def evaluate_lengths(
    model: torch.nn.Module,
    tokens: np.ndarray,
    doc_offsets: np.ndarray,
    lengths: list[int],
    *,
    tail: str = "context",
    same_documents: bool = True,
    max_docs: int | None = None,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    autocast_dtype: torch.dtype | None = None,
    progress: bool = True,
    label: str = "",
) -> list[LengthResult]:
    """Score ``model`` at every length in ``lengths`` over one split.

    ``same_documents``: only documents long enough for the longest length are scored, at every length,
    so all lengths see the same documents (with ``tail="context"`` exactly the same targets) and the
    numbers are comparable across lengths; the excluded documents are counted in each result.
    ``max_docs``: score only the first ``max_docs`` documents that qualify (counted, never silent).
    """
    lengths = parse_lengths(lengths)
    check_positive(batch_size=batch_size)
    check_bool(same_documents=same_documents, progress=progress)
    offsets = validate_doc_offsets(doc_offsets, int(tokens.shape[0]))
    longest = max(lengths)
    min_doc_tokens = longest + 1 if same_documents else None
    if max_docs is not None:
        offsets = _first_qualifying_docs(offsets, max_docs, min_doc_tokens or min(lengths) + 1)
    results = []
    for length in lengths:
        try:
            plan = plan_windows(offsets, length, tail=tail, min_doc_tokens=min_doc_tokens)
        except ValueError as err:
            raise ValueError(f"{err} (full split: {describe_split(doc_offsets)})") from None
        result = score_windows(
            model,
            tokens,
            plan,
            batch_size=_batch_for(batch_size, length, longest),
            device=device,
            autocast_dtype=autocast_dtype,
            progress=progress,
            description=f"{label} L={length}".strip(),
        )
        if max_docs is not None:
            result.plan["max_docs"] = int(max_docs)
            n_docs_total = int(np.asarray(doc_offsets).shape[0] - 1)
            result.plan["n_docs_total"] = n_docs_total
            # Documents after the max_docs-th qualifying one are neither scored nor "excluded".
            result.plan["n_docs_not_reached"] = n_docs_total - plan.n_docs_used - plan.n_docs_excluded
        results.append(result)
    return results


def check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_bool(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, bool):  # "no" would be truthy: refuse rather than guess
            raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def _batch_for(batch_size: int, length: int, longest: int) -> int:
    """Keep tokens per batch roughly constant: the batch size is given for the longest length."""
    return max(1, batch_size * max(1, longest // length))


def _first_qualifying_docs(offsets: np.ndarray, max_docs: int, min_tokens: int) -> np.ndarray:
    """Offsets of the documents up to (and including) the ``max_docs``-th one with >= min_tokens tokens.

    Shorter documents before it are kept in the offsets (and so counted as excluded by the plan).
    """
    if max_docs < 1:
        raise ValueError(f"max_docs must be >= 1, got {max_docs}")
    qualifies = np.diff(offsets) >= min_tokens
    cumulative = np.cumsum(qualifies)
    if cumulative[-1] <= max_docs:
        return offsets
    last_doc = int(np.searchsorted(cumulative, max_docs))  # index of the max_docs-th qualifying document
    return offsets[: last_doc + 2]


def parse_lengths(lengths) -> list[int]:
    """Accept "1024,2048" or an iterable of ints; return them sorted (positive, each given once)."""
    if isinstance(lengths, str):
        items = [item.strip() for item in lengths.split(",") if item.strip()]
        try:
            lengths = [int(item) for item in items]
        except ValueError:
            raise ValueError(f"lengths must be comma-separated integers like 1024,2048; got {lengths!r}") from None
    lengths = list(lengths)
    if not lengths:
        raise ValueError("give at least one evaluation length")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"evaluation lengths must be positive integers, got {length!r}")
    repeated = sorted({int(x) for x in lengths if lengths.count(x) > 1})
    if repeated:
        raise ValueError(f"evaluation length(s) {', '.join(map(str, repeated))} given more than once; list each once")
    return sorted(int(length) for length in lengths)
