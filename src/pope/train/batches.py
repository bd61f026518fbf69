"""Training batches and evaluation passes over the project's datasets.

Two kinds of data, one rule for distribution: every training step has a GLOBAL batch that is a pure
function of (seed, step); rank r of W takes its share of every micro-batch. The global batch, and so
the loss, does not depend on the number of processes, and the sampler's whole resumable state is the
step counter (``state_dict()`` stores it with the seed so a resume can check it).

- ``ExampleBatches``: a fixed set of examples, ``inputs``/``targets`` (N, T) int64 (targets -100 where
  not scored). Used for the indirect-indexing task and for document datasets (each document, or each
  piece of a document longer than seq_len + 1, padded with pad_id; targets -100 on the padding). Order: a fresh
  permutation per epoch (``torch.randperm`` with a CPU generator seeded by (seed, epoch)); a batch may straddle two
  epochs.
  The examples can live on the GPU (``device``), so a step gathers its batch without a host copy.
- ``FreshExampleBatches``: indirect-indexing examples generated for every step (task option
  ``fresh=true``) from ``np.random.default_rng([seed, step, FRESH_STREAM])``; never a repeat of the
  valid/test strings.
- ``PackedDocumentBatches`` (pope.train.packing, ``train.pack=true``): the same document pieces laid end to
  end without padding, in steps of about batch_size * seq_len tokens.
- ``WindowBatches``: random windows of T+1 tokens from one flat token stream (OpenWebText, genome):
  starts drawn with ``np.random.default_rng([seed, step])``.

Evaluation (``evaluation_batches``) walks a split in a fixed order: every example / document once, or
non-overlapping T+1-token windows (stride T) for token streams (``stream_windows``: the last, partial
window is the split's final T+1 tokens with its already-scored targets masked, so every target of the
split is scored exactly once); rank r takes every W-th batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from pope.data.indirect_indexing import fresh_examples

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    world_size: int = 1


def check_batch_layout(global_batch: int, micro_steps: int, shard: Shard) -> int:
    parts = micro_steps * shard.world_size
    if global_batch % parts:
        raise ValueError(
            f"batch size {global_batch} is not divisible by grad_accum ({micro_steps}) x world size "
            f"({shard.world_size}); choose sizes so every rank gets whole examples"
        )
    return global_batch // parts


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The order of n examples in epoch `epoch`: (n,) int64 on the CPU, from a generator seeded by (seed, epoch)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class ExampleBatches:
    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        global_batch: int,
        micro_steps: int = 1,
        seed: int = 0,
        shard: Shard = Shard(),
        device: torch.device | str = "cpu",
        sequences: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        transform: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
        pad_id: int | None = None,
    ) -> None:
        if inputs.shape != targets.shape or inputs.ndim != 2:
            raise ValueError(
                f"inputs and targets must both be (N, T); got {tuple(inputs.shape)} and {tuple(targets.shape)}"
            )
        self.device = torch.device(device)
        self.micro_batch = check_batch_layout(global_batch, micro_steps, shard)
        self.global_batch, self.micro_steps, self.seed, self.shard = global_batch, micro_steps, seed, shard
        self.num_examples = inputs.shape[0]
        # Document datasets with a train-time transform (MAESTRO transposition) keep the raw padded
        # sequences on the CPU and build each example on the fly; otherwise examples sit on `device`.
        self.transform = transform
        if transform is not None:
            if sequences is None or lengths is None or pad_id is None:
                raise ValueError("a transform needs the raw padded sequences, their lengths and pad_id")
            self.sequences, self.lengths, self.pad_id = sequences, lengths, pad_id
        storage = torch.device("cpu") if transform is not None else self.device
        self.inputs = inputs.to(storage)
        self.targets = targets.to(storage)
        self.scored_per_example = (targets != IGNORE_INDEX).sum(dim=1).cpu().numpy()  # (N,)
        self._epoch_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _permutation(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(CPU permutation, the same on `device`) of epoch `epoch`; the last two epochs are cached."""
        if epoch not in self._epoch_cache:
            order = epoch_permutation(self.seed, epoch, self.num_examples)
            self._epoch_cache = {e: v for e, v in self._epoch_cache.items() if e >= epoch - 1}
            self._epoch_cache[epoch] = (order, order.to(self.device))
        return self._epoch_cache[epoch]

    def _global_indices(self, step: int, on_device: bool) -> torch.Tensor:
        """Example indices of step `step`'s global batch, (global_batch,)."""
        start = step * self.global_batch
        pieces = []
        while start < (step + 1) * self.global_batch:
            epoch, offset = divmod(start, self.num_examples)
            take = min(self.num_examples - offset, (step + 1) * self.global_batch - start)
            pieces.append(self._permutation(epoch)[1 if on_device else 0][offset : offset + take])
            start += take
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _local_slice(self, micro: int) -> slice:
        # micro-batch `micro` of this rank: global positions [micro*W*m + rank*m, ... + m)
        begin = (micro * self.shard.world_size + self.shard.rank) * self.micro_batch
        return slice(begin, begin + self.micro_batch)

    def scored_tokens(self, step: int) -> int:
        """Scored (non -100) targets in the whole global batch of `step` (all ranks and micro-steps)."""
        return int(self.scored_per_example[self._global_indices(step, on_device=False).numpy()].sum())

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (micro_batch, T), on `device`."""
        if self.transform is None:
            index = self._global_indices(step, on_device=True)[self._local_slice(micro)]
            return self.inputs[index], self.targets[index]
        index = self._global_indices(step, on_device=False)[self._local_slice(micro)].numpy()
        rows_in, rows_out = [], []
        first = self._local_slice(micro).start
        for offset, example in enumerate(index):
            rng = np.random.default_rng([self.seed, step, first + offset])  # per global batch position
            length = int(self.lengths[example])
            tokens = self.transform(np.asarray(self.sequences[example, :length]), rng)
            row_in, row_out = _document_row(tokens, self.inputs.shape[1], self.pad_id)
            rows_in.append(row_in)
            rows_out.append(row_out)
        return (
            torch.from_numpy(np.stack(rows_in)).to(self.device, non_blocking=True),
            torch.from_numpy(np.stack(rows_out)).to(self.device, non_blocking=True),
        )

    def get_all_micro(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All micro-batches of this rank for `step`: (micro_steps, micro_batch, T) each (CUDA-graph path)."""
        index = self._global_indices(step, on_device=True)
        rank_rows = (
            torch.cat([index[self._local_slice(m)] for m in range(self.micro_steps)])
            if self.micro_steps > 1
            else index[self._local_slice(0)]
        )
        shape = (self.micro_steps, self.micro_batch, self.inputs.shape[1])
        return self.inputs[rank_rows].view(shape), self.targets[rank_rows].view(shape)

    def state_dict(self, step: int) -> dict:
        return {
            "kind": "examples",
            "seed": self.seed,
            "step": step,
            "global_batch": self.global_batch,
            "num_examples": self.num_examples,
        }


def _document_row(tokens: np.ndarray, seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """One document (L <= seq_len + 1 tokens) -> inputs (seq_len,) padded with pad_id and
    targets (seq_len,) with -100 on the padding."""
    inputs = np.full(seq_len, pad_id, dtype=np.int64)
    targets = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    inputs[: len(tokens) - 1] = tokens[:-1]
    targets[: len(tokens) - 1] = tokens[1:]
    return inputs, targets


def document_pieces(split, seq_len: int, *, source: str) -> tuple[np.ndarray, np.ndarray]:
    """The training pieces of a document split (TokenSplit): (token offset, length), each (P,) int64.

    A document of L <= seq_len + 1 tokens is one piece. A longer one is cut into consecutive pieces of
    seq_len + 1 tokens that overlap by one token (piece k = tokens [k*T, k*T + T + 1)), so every next-token
    prediction of the document is made exactly once (L - 1 of them), with the context reset at each piece
    boundary; nothing is dropped. A 1-token document is a 1-token piece (no prediction)."""
    lengths = split.document_lengths()
    if len(lengths) == 0:
        raise ValueError(f"{source}: split {split.name!r} has no documents")
    offsets, piece_lengths = [], []
    for doc in range(len(lengths)):
        begin, length = int(split.doc_offsets[doc]), int(lengths[doc])
        for first in range(0, max(length - 1, 1), seq_len):
            offsets.append(begin + first)
            piece_lengths.append(min(seq_len + 1, length - first))
    return np.array(offsets, dtype=np.int64), np.array(piece_lengths, dtype=np.int64)


def documents_as_examples(
    split, seq_len: int, pad_id: int, *, source: str
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """A document split (TokenSplit) as padded examples: (inputs, targets, sequences, lengths), one per piece of
    `document_pieces`; rows are padded to the longest piece (inputs with pad_id, targets -100)."""
    offsets, piece_lengths = document_pieces(split, seq_len, source=source)
    width = max(int(piece_lengths.max()), 2)
    sequences = np.full((len(offsets), width), pad_id, dtype=np.int64)
    for row, (begin, length) in enumerate(zip(offsets, piece_lengths)):
        sequences[row, :length] = split.tokens[begin : begin + length]
    rows = [_document_row(sequences[i, : piece_lengths[i]], width - 1, pad_id) for i in range(len(offsets))]
    inputs = torch.from_numpy(np.stack([r[0] for r in rows]))
    targets = torch.from_numpy(np.stack([r[1] for r in rows]))
    return inputs, targets, sequences, piece_lengths


class WindowBatches:
    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        *,
        global_batch: int,
        micro_steps: int = 1,
        seed: int = 0,
        shard: Shard = Shard(),
        device: torch.device | str = "cpu",
        transform: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
        source: str = "tokens",
    ) -> None:
        if len(tokens) < seq_len + 2:
            raise ValueError(
                f"{source}: {len(tokens)} tokens cannot hold one window of {seq_len + 1} tokens; "
                "lower model.max_seq_len or use more data"
            )
        self.tokens, self.seq_len, self.device = tokens, seq_len, torch.device(device)
        self.micro_batch = check_batch_layout(global_batch, micro_steps, shard)
        self.global_batch, self.micro_steps, self.seed, self.shard = global_batch, micro_steps, seed, shard
        self.transform = transform

    def _starts(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.global_batch, endpoint=True)

    def scored_tokens(self, step: int) -> int:
        return self.global_batch * self.seq_len

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        begin = (micro * self.shard.world_size + self.shard.rank) * self.micro_batch
        starts = self._starts(step)[begin : begin + self.micro_batch]
        windows = np.stack([np.asarray(self.tokens[s : s + self.seq_len + 1], dtype=np.int64) for s in starts])
        if self.transform is not None:
            windows = np.stack(
                [self.transform(w, np.random.default_rng([self.seed, step, begin + i])) for i, w in enumerate(windows)]
            ).astype(np.int64)
        batch = torch.from_numpy(windows)
        if self.device.type == "cuda":
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self, step: int) -> dict:
        return {
            "kind": "windows",
            "seed": self.seed,
            "step": step,
            "global_batch": self.global_batch,
            "num_tokens": len(self.tokens),
        }


def stream_windows(n_tokens: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The evaluation windows of a token stream of ``n_tokens`` tokens: (starts, first scored position),
    each (n_windows,). Window w reads tokens [start, start + seq_len + 1) and scores the targets at
    positions >= its first scored position. Full windows sit at stride seq_len from 0; when the
    n_tokens - 1 targets do not fill them exactly, one more window ends at the stream's last token and
    scores only the targets the full windows left (the rest of it is context), so every target is
    scored exactly once and every batch has the same shape."""
    n_targets = n_tokens - 1
    n_full = n_targets // seq_len
    if n_full < 1:
        raise ValueError(f"evaluation split has {n_tokens} tokens, fewer than one window of {seq_len + 1}")
    starts = np.arange(n_full, dtype=np.int64) * seq_len
    first_scored = np.zeros(n_full, dtype=np.int64)
    left = n_targets - n_full * seq_len
    if left:
        starts = np.append(starts, n_tokens - seq_len - 1)
        first_scored = np.append(first_scored, seq_len - left)
    return starts, first_scored


def evaluation_batches(
    *,
    batch_size: int,
    shard: Shard,
    device: torch.device,
    examples: tuple[torch.Tensor, torch.Tensor] | None = None,
    tokens: np.ndarray | None = None,
    seq_len: int | None = None,
    max_batches: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed pass over an evaluation split; rank r yields global batches r, r+W, r+2W, ...
    ``max_batches`` (None = the whole split) caps the global batch count for long token streams."""
    if examples is not None:
        inputs, targets = examples
        total = (len(inputs) + batch_size - 1) // batch_size
    else:
        assert tokens is not None and seq_len is not None
        starts, first_scored = stream_windows(len(tokens), seq_len)
        total = (len(starts) + batch_size - 1) // batch_size
    if max_batches is not None:
        total = min(total, max_batches)
    for batch_index in range(shard.rank, total, shard.world_size):
        rows = slice(batch_index * batch_size, (batch_index + 1) * batch_size)
        if examples is not None:
            yield inputs[rows].to(device, non_blocking=True), targets[rows].to(device, non_blocking=True)
        else:
            windows = np.stack([np.asarray(tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts[rows]])
            batch = torch.from_numpy(windows)
            batch_targets = batch[:, 1:].clone()
            batch_targets[torch.arange(seq_len) < torch.from_numpy(first_scored[rows])[:, None]] = IGNORE_INDEX
            yield batch[:, :-1].to(device, non_blocking=True), batch_targets.to(device, non_blocking=True)


FRESH_STREAM = 0xF2E54  # keeps the fresh-example draws apart from any other use of (seed, step)


class FreshExampleBatches(ExampleBatches):
    """Indirect-indexing training examples drawn anew for every step (task option ``fresh=true``).

    The global batch of step s is ``fresh_examples(global_batch, default_rng([seed, s, FRESH_STREAM]))``,
    a pure function of (seed, step) like every sampler here, with the valid/test strings (``held_out``)
    redrawn. The interface is ExampleBatches' (one scored target per example; ``get_all_micro`` for the
    trainer's CUDA-graph path); the state is the step counter.
    """

    def __init__(
        self,
        task_options,
        *,
        global_batch: int,
        micro_steps: int = 1,
        seed: int = 0,
        shard: Shard = Shard(),
        device: torch.device | str = "cpu",
        held_out: frozenset = frozenset(),
    ) -> None:
        self.device = torch.device(device)
        self.micro_batch = check_batch_layout(global_batch, micro_steps, shard)
        self.global_batch, self.micro_steps, self.seed, self.shard = global_batch, micro_steps, seed, shard
        self.transform = None
        self.task_options, self.held_out = task_options, held_out
        self._cached: tuple[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step `step`'s whole global batch on `device`: inputs, targets (global_batch, T)."""
        if self._cached is None or self._cached[0] != step:
            rng = np.random.default_rng([self.seed, step, FRESH_STREAM])
            examples = fresh_examples(self.global_batch, rng, self.task_options, self.held_out)
            tensors = [torch.from_numpy(a) for a in (examples.inputs, examples.targets)]
            if self.device.type == "cuda":
                tensors = [t.pin_memory() for t in tensors]
            self._cached = (step, tuple(t.to(self.device, non_blocking=True) for t in tensors))
        return self._cached[1]

    @property
    def inputs(self) -> torch.Tensor:
        """Step 0's global batch (global_batch, T) on the CPU, for checks that read the data's token ids
        (every step draws from the same vocabulary)."""
        return self._batch(0)[0].cpu()

    @property
    def targets(self) -> torch.Tensor:
        return self._batch(0)[1].cpu()

    def scored_tokens(self, step: int) -> int:
        return self.global_batch  # one target per example

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self._batch(step)
        rows = self._local_slice(micro)
        return inputs[rows], targets[rows]

    def get_all_micro(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self.get(step, m) for m in range(self.micro_steps)]
        shape = (self.micro_steps, self.micro_batch, parts[0][0].shape[1])
        return torch.cat([p[0] for p in parts]).view(shape), torch.cat([p[1] for p in parts]).view(shape)

    def state_dict(self, step: int) -> dict:
        return {
            "kind": "fresh-examples",
            "seed": self.seed,
            "step": step,
            "global_batch": self.global_batch,
            "task": self.task_options.split_options(),
        }
