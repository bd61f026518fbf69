"""Accuracy of a trained model on a file of indirect-indexing examples (`pope eval accuracy`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def task_accuracy(run: str, data_file: str, *, batch_size: int = 256, device: str = "auto") -> dict:
    """Final-token accuracy (argmax over the whole vocabulary) and loss of the model in ``run``
    (best checkpoint if present, else last) on every example of ``data_file``."""
    from pope.checkpoint import load_model
    from pope.data import indirect_indexing as task

    from pope.devices import resolve_device

    device = resolve_device(device)
    if batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    examples = task.load_file(data_file)
    model, info = load_model(run, map_location=device)
    if model.config.vocab_size < task.VOCAB_SIZE or model.config.max_seq_len < task.SEQ_LEN:
        raise ValueError(f"the model in {run} (vocab {model.config.vocab_size}, max_seq_len {model.config.max_seq_len}) "
                         f"was not trained on indirect indexing (needs vocab {task.VOCAB_SIZE}, {task.SEQ_LEN} tokens)")
    inputs, targets = torch.from_numpy(examples.inputs), torch.from_numpy(examples.targets)
    correct, loss_sum = 0, 0.0
    for start in range(0, len(inputs), batch_size):
        x = inputs[start:start + batch_size].to(device)
        y = targets[start:start + batch_size].to(device)
        logits, _ = model(x)
        logits, y = logits.float().flatten(0, 1), y.flatten()
        scored = y != -100
        correct += int(((logits.argmax(-1) == y) & scored).sum())
        loss_sum += float(F.cross_entropy(logits, y, ignore_index=-100, reduction="sum"))
    n = len(inputs)
    return {"accuracy": correct / n, "correct": correct, "examples": n, "loss": loss_sum / n,
            "checkpoint": info["path"], "step": info["step"], "data": str(data_file)}
