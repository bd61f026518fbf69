"""How a token split is cut into scoring windows of exactly L tokens.

The rule (also written in docs/evaluation.md):

* A split is a flat token array plus document offsets ``doc_offsets`` (len n_docs + 1). A document of
  ``n`` tokens has ``n - 1`` *targets*: every token but its first, which has no context to be predicted
  from. Windows never cross a document boundary.
* A window has exactly ``L`` input tokens ``x = doc[s : s + L]`` and predicts ``y = doc[s + 1 : s + L + 1]``.
  Window positions ``p = 0 .. L-1``: the target at position ``p`` is predicted from ``p + 1`` tokens.
* Full windows start at ``s = 0, L, 2L, ...`` inside the document: consecutive windows share one token
  (the last target of a window is the first input of the next), so the targets do not overlap and
  every target is scored exactly once.
* The tail: ``rem = (n - 1) mod L`` targets are left after the full windows.
  ``tail="context"`` (default) scores them in one more window of exactly ``L`` tokens aligned to the
  document end; its first ``L - rem`` targets were already scored and are used as context only (not
  scored again). The tail targets therefore keep their position in the window. ``tail="drop"`` does
  not score them; they are counted in ``n_targets_excluded``.
* A document with fewer than ``L + 1`` tokens cannot hold one window; it is excluded and counted
  (``n_docs_excluded``, ``n_targets_excluded``). ``min_doc_tokens`` raises that threshold so that every
  length in a sweep scores the same documents (with ``tail="context"`` then exactly the same targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TAIL_MODES = ("context", "drop")


@dataclass(frozen=True)
class WindowPlan:
    """Windows of one length over one split. Arrays are aligned: one entry per window."""

    length: int
    starts: np.ndarray  # (n_windows,) int64: index in the split of the window's first input token
    score_from: np.ndarray  # (n_windows,) int64: first window position whose target is scored
    n_docs_total: int
    n_docs_used: int
    n_docs_excluded: int  # documents too short for one window (or below min_doc_tokens)
    n_targets_scored: int
    n_targets_excluded: int  # targets of excluded documents + dropped tails (tail="drop")
    n_tail_windows: int

    @property
    def n_windows(self) -> int:
        return int(self.starts.shape[0])

    def stats(self) -> dict:
        """JSON-friendly counts for tables and result files."""
        return {
            "length": self.length,
            "n_windows": self.n_windows,
            "n_tail_windows": self.n_tail_windows,
            "n_docs_total": self.n_docs_total,
            "n_docs_used": self.n_docs_used,
            "n_docs_excluded": self.n_docs_excluded,
            "n_targets_scored": self.n_targets_scored,
            "n_targets_excluded": self.n_targets_excluded,
        }


def validate_doc_offsets(doc_offsets: np.ndarray, n_tokens: int) -> np.ndarray:
    """Check that offsets start at 0, end at ``n_tokens`` and never decrease; return them as int64."""
    offsets = np.asarray(doc_offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.shape[0] < 2:
        raise ValueError(f"doc_offsets must be a 1-D array of length n_docs + 1 >= 2, got shape {offsets.shape}")
    if offsets[0] != 0 or offsets[-1] != n_tokens:
        raise ValueError(
            f"doc_offsets must start at 0 and end at the number of tokens ({n_tokens}); "
            f"got {int(offsets[0])} .. {int(offsets[-1])}. Re-prepare the dataset."
        )
    if np.any(np.diff(offsets) < 0):
        raise ValueError("doc_offsets must be non-decreasing; the dataset's .docs.npy is corrupt, re-prepare it")
    return offsets


def describe_split(doc_offsets: np.ndarray) -> str:
    """One phrase giving the split's size, for error messages."""
    doc_lengths = np.diff(np.asarray(doc_offsets, dtype=np.int64))
    return (
        f"{int(doc_lengths.sum()):,} tokens in {doc_lengths.shape[0]:,} document(s), "
        f"the longest has {int(doc_lengths.max(initial=0)):,} tokens"
    )


def plan_windows(
    doc_offsets: np.ndarray,
    length: int,
    *,
    tail: str = "context",
    min_doc_tokens: int | None = None,
) -> WindowPlan:
    """Plan the windows of ``length`` input tokens over the documents given by ``doc_offsets``.

    Raises ValueError when no document is long enough for a single window (the message says how long
    the data is), for a bad ``length`` or an unknown ``tail`` mode.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"window length must be a positive integer, got {length!r}")
    length = int(length)
    if tail not in TAIL_MODES:
        raise ValueError(f"tail must be one of {TAIL_MODES}, got {tail!r}")
    offsets = np.asarray(doc_offsets, dtype=np.int64)
    threshold = max(length + 1, int(min_doc_tokens or 0))

    starts: list[np.ndarray] = []
    score_from: list[np.ndarray] = []
    n_docs_used = n_docs_excluded = n_scored = n_excluded = n_tail = 0
    for doc_start, doc_end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        n_targets = doc_end - doc_start - 1
        if doc_end - doc_start < threshold:
            n_docs_excluded += 1
            n_excluded += max(n_targets, 0)
            continue
        n_docs_used += 1
        n_full, remainder = divmod(n_targets, length)
        starts.append(doc_start + length * np.arange(n_full, dtype=np.int64))
        score_from.append(np.zeros(n_full, dtype=np.int64))
        n_scored += n_full * length
        if remainder:
            if tail == "context":
                # One more window of exactly `length` tokens ending at the document's last token.
                starts.append(np.array([doc_end - 1 - length], dtype=np.int64))
                score_from.append(np.array([length - remainder], dtype=np.int64))
                n_scored += remainder
                n_tail += 1
            else:
                n_excluded += remainder

    if n_docs_used == 0:
        raise ValueError(
            f"no document is long enough for windows of {length:,} tokens (each needs at least "
            f"{threshold:,} tokens: {length:,} inputs + 1 target"
            + (f", min_doc_tokens={min_doc_tokens:,}" if min_doc_tokens else "")
            + f"); the data has {describe_split(offsets)}. Use shorter lengths or longer data."
        )
    return WindowPlan(
        length=length,
        starts=np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64),
        score_from=np.concatenate(score_from) if score_from else np.zeros(0, dtype=np.int64),
        n_docs_total=int(offsets.shape[0] - 1),
        n_docs_used=n_docs_used,
        n_docs_excluded=n_docs_excluded,
        n_targets_scored=n_scored,
        n_targets_excluded=n_excluded,
        n_tail_windows=n_tail,
    )


def scored_target_indices(plan: WindowPlan) -> np.ndarray:
    """Split indices of every scored target, in window order (for tests and audits)."""
    pieces = [
        np.arange(start + 1 + first, start + 1 + plan.length, dtype=np.int64)
        for start, first in zip(plan.starts.tolist(), plan.score_from.tolist())
    ]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
