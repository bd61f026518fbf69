"""Packed training batches of documents (``train.pack=true``): no padding, attention within each document.

``PackedDocumentBatches`` trains on the pieces the padded path trains on (``document_pieces``: documents,
longer ones cut into seq_len + 1-token pieces overlapping by one token), laid end to end instead of padded:

- The stream: epoch e lists the pieces in the padded path's order of epoch e (``epoch_permutation`` with
  the same seed), leaving out 1-token pieces (they have no target on either path); epochs follow each other.
- Steps: the stream is cut greedily into global batches of at most ``batch_size * seq_len`` input tokens
  (the padded global batch's slots); a step takes the next pieces while they fit, so it holds at least
  batch_size of them when the data lasts (a piece has at most seq_len inputs) and no piece is split or skipped.
  The global batch is a pure function of (seed, step), whatever the number of processes or micro-steps.
- Micro-batches: step's pieces are cut, in order, into P = grad_accum * world size contiguous parts of about
  equal token counts (at most about batch_size * seq_len / P + seq_len tokens; every part non-empty); rank r's
  micro-batch m is part m*W + r, as the padded path lays out its rows. A part goes to the model as idx
  (1, total) with cu_seqlens / max_seqlen (``GPT.forward``'s packed layout): each piece is attended to alone;
  with cu_seqlens_host, their host copy, the model checks the lengths without a device sync.

What is equivalent to the padded path (``ExampleBatches`` on the same pieces):
- every piece, with all its L - 1 targets, is trained on once per epoch, in the same order; nothing is dropped;
- a step over a set of pieces has the same loss (the mean cross-entropy over their targets) and, without
  dropout, the same gradients as a padded step over the same pieces (float rounding aside);
- the batch is a pure function of (seed, step) and the state is the step, so resume is exact.
What differs: a packed step holds about batch_size * seq_len scored targets, more than a padded step
whenever pieces are shorter than seq_len, so an epoch takes fewer steps (the schedule counts steps); a
transform (MAESTRO transposition) draws per piece from (seed, step, the piece's stream index).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from pope.train.batches import Shard, check_batch_layout, epoch_permutation


class PackedDocumentBatches:
    def __init__(
        self,
        tokens: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        *,
        seq_len: int,
        global_batch: int,
        micro_steps: int = 1,
        seed: int = 0,
        shard: Shard | None = None,
        device: torch.device | str = "cpu",
        transform: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
    ) -> None:
        """tokens: the split's token array; offsets, lengths (P,): its pieces (``document_pieces``)."""
        shard = Shard() if shard is None else shard
        self.micro_batch = check_batch_layout(global_batch, micro_steps, shard)
        if not (lengths >= 2).any():
            raise ValueError("the training split has no document of 2 or more tokens: nothing to train on")
        self.tokens, self.offsets, self.lengths = tokens, offsets, lengths
        self.global_batch, self.micro_steps, self.seed, self.shard = global_batch, micro_steps, seed, shard
        self.device, self.transform = torch.device(device), transform
        self.num_pieces = len(lengths)
        self.parts = micro_steps * shard.world_size
        self.tokens_per_step = global_batch * seq_len
        self._order = np.zeros(0, dtype=np.int64)  # piece index of each stream position
        self._cumulative = np.zeros(1, dtype=np.int64)  # input tokens before each stream position
        self._epochs = 0
        self._step_starts = [0]  # stream position where each step's pieces start

    def _add_epoch(self) -> None:
        order = epoch_permutation(self.seed, self._epochs, self.num_pieces).numpy()
        order = order[self.lengths[order] >= 2]
        self._order = np.concatenate([self._order, order])
        inputs = self.lengths[order] - 1
        self._cumulative = np.concatenate([self._cumulative, self._cumulative[-1] + np.cumsum(inputs)])
        self._epochs += 1

    def _step_start(self, step: int) -> int:
        """Stream position where step `step`'s pieces start (steps are cut lazily, in order, and cached)."""
        while len(self._step_starts) <= step:
            first = self._step_starts[-1]
            limit = self._cumulative[first] + self.tokens_per_step
            while self._cumulative[-1] <= limit:
                self._add_epoch()
            # the last stream position whose pieces up to it fit: at least first + 1
            self._step_starts.append(int(np.searchsorted(self._cumulative, limit, side="right")) - 1)
        return self._step_starts[step]

    def _part(self, step: int, part: int) -> tuple[int, int]:
        """Stream positions [first, end) of part `part` (0 .. P - 1) of step `step`."""
        first, end = self._step_start(step), self._step_start(step + 1)
        n = end - first
        if n < self.parts:
            raise ValueError(
                f"step {step} packs {n} pieces, fewer than grad_accum x world size ({self.parts}): lower "
                "recipe.grad_accum or the process count, or raise recipe.batch_size"
            )
        before = self._cumulative[first : end + 1] - self._cumulative[first]  # (n + 1,) inputs before each piece
        bounds = [0]
        for k in range(1, self.parts):  # cut where k/P of the tokens lie before, leaving every part a piece
            cut = int(np.searchsorted(before, before[-1] * k / self.parts))
            bounds.append(min(max(cut, bounds[-1] + 1), n - (self.parts - k)))
        bounds.append(n)
        return first + bounds[part], first + bounds[part + 1]

    def scored_tokens(self, step: int) -> int:
        """Scored targets in the whole global batch of `step` (all ranks and micro-steps): its pieces' inputs."""
        first, end = self._step_start(step), self._step_start(step + 1)  # may extend the stream arrays
        return int(self._cumulative[end] - self._cumulative[first])

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(inputs, targets) (1, total) int64 on `device` and the model's packing arguments
        {"cu_seqlens": int32 (n + 1,) on `device`, "max_seqlen": int, "cu_seqlens_host": the same as a numpy
        array, so the model checks it without reading the device copy back} for this rank's part of the step."""
        first, end = self._part(step, micro * self.shard.world_size + self.shard.rank)
        pieces = []
        for position in range(first, end):
            piece = self._order[position]
            tokens = np.asarray(
                self.tokens[self.offsets[piece] : self.offsets[piece] + self.lengths[piece]], dtype=np.int64
            )
            if self.transform is not None:
                tokens = self.transform(tokens, np.random.default_rng([self.seed, step, position])).astype(np.int64)
            pieces.append(tokens)
        inputs = torch.from_numpy(np.concatenate([p[:-1] for p in pieces]))[None]
        targets = torch.from_numpy(np.concatenate([p[1:] for p in pieces]))[None]
        lengths = self.lengths[self._order[first:end]] - 1
        cu_seqlens_host = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)  # (n + 1,)
        cu_seqlens = torch.from_numpy(cu_seqlens_host)
        if self.device.type == "cuda":
            inputs, targets, cu_seqlens = (t.pin_memory() for t in (inputs, targets, cu_seqlens))
        moved = [t.to(self.device, non_blocking=True) for t in (inputs, targets, cu_seqlens)]
        return (
            moved[0],
            moved[1],
            {"cu_seqlens": moved[2], "max_seqlen": int(lengths.max()), "cu_seqlens_host": cu_seqlens_host},
        )

    def state_dict(self, step: int) -> dict:
        return {
            "kind": "packed-documents",
            "seed": self.seed,
            "step": step,
            "global_batch": self.global_batch,
            "num_pieces": self.num_pieces,
            "tokens_per_step": self.tokens_per_step,
        }
