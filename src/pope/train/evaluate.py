"""Evaluation passes: one split during training (``evaluate_split``; the periodic evaluations of a token
stream read ``recipe.eval_batches`` batches, the final one every target), and the accuracy of a trained
model on a file of indirect-indexing examples (``task_accuracy``, `pope eval accuracy`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pope.checkpoint import load_model
from pope.data import indirect_indexing as task
from pope.devices import resolve_device
from pope.train.batches import IGNORE_INDEX, Shard, evaluation_batches, stream_windows
from pope.train.data_match import check_task_file, run_config_of
from pope.train.distributed import all_reduce_sum


@torch.no_grad()
def evaluate_split(
    model,
    data,
    split: str,
    *,
    batch_size: int,
    max_batches: int | None,
    shard: Shard,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    progress=None,
) -> dict:
    """Mean loss and accuracy over the scored tokens of one split of ``data`` (TrainingData), summed
    over ranks. Example and document splits are always scored whole; token streams up to
    ``max_batches`` batches of non-overlapping windows, or every target once with ``max_batches=None``.
    The result says what was scored: ``{split}_scored_tokens`` of the split's ``{split}_split_tokens``
    targets (equal: the whole split). ``progress``: a tqdm bar over this rank's batches (or None).
    Leaves ``model`` in train mode."""
    model.eval()
    if split in data.eval_examples:
        batches = evaluation_batches(
            batch_size=batch_size, shard=shard, device=device, examples=data.eval_examples[split]
        )
    else:
        batches = evaluation_batches(
            batch_size=batch_size,
            shard=shard,
            device=device,
            tokens=data.eval_tokens[split],
            seq_len=data.seq_len,
            max_batches=max_batches,
        )
    totals = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, correct, scored
    for inputs, targets in batches:
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits, _ = model(inputs)
        logits = logits.float().flatten(0, 1)
        flat_targets = targets.flatten()
        scored = flat_targets != IGNORE_INDEX
        totals[0] += F.cross_entropy(logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="sum").double()
        totals[1] += ((logits.argmax(dim=-1) == flat_targets) & scored).sum()
        totals[2] += scored.sum()
        if progress is not None:
            progress.update(1)
    all_reduce_sum(totals)
    loss_sum, correct, count = totals.tolist()
    model.train()
    return {
        f"{split}_loss": loss_sum / max(count, 1),
        f"{split}_accuracy": correct / max(count, 1),
        f"{split}_scored_tokens": int(count),
        f"{split}_split_tokens": split_targets(data, split),
    }


def split_targets(data, split: str) -> int:
    """Scored targets in the whole split: every non-ignored target of its examples, or n_tokens - 1."""
    if split in data.eval_examples:
        return int((data.eval_examples[split][1] != IGNORE_INDEX).sum())
    return len(data.eval_tokens[split]) - 1


def evaluation_batch_count(data, split: str, *, batch_size: int, max_batches: int | None, shard: Shard) -> int:
    """How many batches ``evaluate_split`` reads on this rank (for its progress bar)."""
    if split in data.eval_examples:
        total = -(-len(data.eval_examples[split][0]) // batch_size)
    else:
        total = -(-len(stream_windows(len(data.eval_tokens[split]), data.seq_len)[0]) // batch_size)
        total = total if max_batches is None else min(total, max_batches)
    return len(range(shard.rank, total, shard.world_size))


@torch.no_grad()
def task_accuracy(run: str, data_file: str, *, batch_size: int = 256, device: str = "auto") -> dict:
    """Final-token accuracy (argmax over the whole vocabulary) and loss of the model in ``run``
    (best checkpoint if present, else last) on every example of ``data_file``; ``by_shift`` splits the accuracy
    by the example's signed shift ({"-15": {"examples", "correct", "accuracy"}, ..., "+15": ...}, in shift order):
    which offsets a model has learned to index. ``data_file`` must hold examples of the task ``run`` trained on
    (pope.train.data_match): another kind of run or file is a ValueError naming both, before any work."""
    device = resolve_device(device)
    if batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    check_task_file(run, run_config_of(run), data_file)  # before any model is loaded
    examples = task.load_file(data_file)
    model, info = load_model(run, map_location=device)
    if model.config.vocab_size < task.VOCAB_SIZE or model.config.max_seq_len < task.SEQ_LEN:
        raise ValueError(
            f"the model in {run} (vocab {model.config.vocab_size}, max_seq_len "
            f"{model.config.max_seq_len}) "
            f"was not trained on indirect indexing (needs vocab {task.VOCAB_SIZE}, {task.SEQ_LEN} tokens)"
        )
    inputs, targets = torch.from_numpy(examples.inputs), torch.from_numpy(examples.targets)
    hits, loss_sum = [], 0.0  # hits: (N,) bool, whether each example's target was predicted
    for start in range(0, len(inputs), batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = targets[start : start + batch_size].to(device)
        logits, _ = model(x)  # (b, T, vocab)
        scored = y != -100  # (b, T): one target per example
        hits.append(((logits.float().argmax(-1) == y) & scored).any(dim=1).cpu())
        loss_sum += float(
            F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
        )
    hits = torch.cat(hits)
    n, correct = len(inputs), int(hits.sum())
    shifts = task.shifts_of_file(data_file)  # (N,) signed shifts, in file order as the examples
    if len(shifts) != n:
        raise ValueError(f"{data_file}: {len(shifts)} shifts read for {n} encoded examples (blank lines?)")
    by_shift = {}
    for shift in sorted(set(shifts.tolist())):
        chosen = torch.from_numpy(shifts == shift)
        count, right = int(chosen.sum()), int(hits[chosen].sum())
        by_shift[f"{shift:+d}"] = {"examples": count, "correct": right, "accuracy": right / count}
    return {
        "accuracy": correct / n,
        "correct": correct,
        "examples": n,
        "loss": loss_sum / n,
        "by_shift": by_shift,
        "checkpoint": info["path"],
        "step": info["step"],
        "data": str(data_file),
    }
