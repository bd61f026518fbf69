"""What a run trains and evaluates on: the dataset a recipe names (or train.data_dir), loaded as the trainer's
samplers (pope.train.batches, pope.train.packing) and evaluation sets, and prepared first when it is missing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pope.data import indirect_indexing as task
from pope.data.prepared import resolve_dataset
from pope.train.batches import (
    ExampleBatches,
    FreshExampleBatches,
    Shard,
    WindowBatches,
    document_pieces,
    documents_as_examples,
)
from pope.train.distributed import barrier
from pope.train.packing import PackedDocumentBatches

INDIRECT_INDEXING = "indirect-indexing"


@dataclass
class TrainingData:
    """What the trainer needs from a dataset."""

    name: str
    vocab_size: int
    train: ExampleBatches | WindowBatches  # or pope.train.packing.PackedDocumentBatches (train.pack)
    # split -> (examples (inputs, targets) on CPU) or (token stream) for evaluation
    eval_examples: dict[str, tuple[torch.Tensor, torch.Tensor]]
    eval_tokens: dict[str, np.ndarray]
    seq_len: int
    is_task: bool = False  # scored on one token per example (indirect indexing)


def _data_source(recipe: dict, options):
    """(source = train.data_dir or recipe.dataset, the indirect-indexing TaskOptions or None for other data,
    whether the source is an explicit split directory). The task variant is the spec's
    (``indirect-indexing:OPTION=VALUE,...`` in the source or in recipe.dataset); an explicit split
    directory must have been generated for it."""
    source = str(options.data_dir or recipe["dataset"])
    manifest_path = Path(source) / "manifest.json"
    is_task_dir = manifest_path.is_file() and '"indirect-indexing"' in manifest_path.read_text()
    if not (is_task_dir or task.is_task_spec(source)):
        return source, None, False
    spec = source if task.is_task_spec(source) else str(recipe["dataset"])
    wanted = task.parse_task_spec(spec) if task.is_task_spec(spec) else task.PAPER_TASK
    if is_task_dir:
        found = task.split_task_options(json.loads(manifest_path.read_text()))
        if found.split_options() != wanted.split_options():
            raise ValueError(
                f"{source} holds indirect-indexing splits of task {found.split_options()}, but the run "
                f"asks for {wanted.split_options()} ({spec!r}); generate splits for it or drop data_dir"
            )
    return source, wanted, is_task_dir


def prepare_data(recipe: dict, options) -> None:
    """Make the run's data exist on disk (generate the indirect-indexing splits, prepare a dataset);
    called once before processes that share it start (the main rank, or a seed sweep)."""
    source, task_options, is_task_dir = _data_source(recipe, options)
    if is_task_dir:
        return
    if task_options is not None:
        task.ensure_splits(None, seed=options.data_seed, options=task_options)
        return
    resolve_dataset(source, prepare_if_missing=True)


def _held_out_strings(directory: Path) -> frozenset:
    """The letter strings of the valid and test splits (fresh training examples never use them)."""
    strings = set()
    for split in ("valid", "test"):
        path = directory / f"{split}.txt"
        if path.is_file():
            strings.update(task.line_fields(line)[0] for line in path.read_text().splitlines() if line)
    return frozenset(strings)


def load_training_data(
    recipe: dict,
    options,
    *,
    micro_steps: int,
    seed: int,
    shard: Shard,
    device: torch.device,
    seq_len: int,
    is_main: bool,
) -> TrainingData:
    """Build the training sampler and evaluation sets for ``recipe['dataset']`` (or train.data_dir).

    - 'indirect-indexing[:OPTION=VALUE,...]' (or a directory with its manifest): generated splits of
      the task (variant), cached under $POPE_CACHE/data/indirect-indexing-seed{data_seed}[-variant];
      examples live on ``device``; with ``fresh=true`` training examples are drawn per step instead.
    - a prepared dataset (pope.data.prepared) with a pad id: documents, padded;
    - a prepared dataset without one: a token stream, random windows of seq_len + 1 tokens.
    """
    source, task_options, is_task_dir = _data_source(recipe, options)
    if options.pack and task_options is not None:
        raise ValueError(
            f"train.pack=true packs documents of different lengths; indirect-indexing examples all have "
            f"{recipe['seq_len']} tokens and one scored target, nothing to pack: set train.pack=false"
        )
    global_batch = recipe["batch_size"]
    eval_splits = [s.strip() for s in options.eval_splits.split(",") if s.strip()]
    if is_main:
        prepare_data(recipe, options)
    barrier()
    if task_options is not None:
        # an explicit split directory (any sizes, e.g. written by write_splits), else the cached default
        directory = Path(source) if is_task_dir else task.default_data_dir(options.data_seed, task_options)
        if seq_len < task.SEQ_LEN:
            raise ValueError(f"indirect-indexing needs {task.SEQ_LEN} input tokens; recipe.seq_len is {seq_len}")
        if task_options.fresh:
            batches = FreshExampleBatches(
                task_options,
                global_batch=global_batch,
                micro_steps=micro_steps,
                seed=seed,
                shard=shard,
                device=device,
                held_out=_held_out_strings(directory),
            )
        else:
            train = task.load_split(directory, "train")
            batches = ExampleBatches(
                torch.from_numpy(train.inputs),
                torch.from_numpy(train.targets),
                global_batch=global_batch,
                micro_steps=micro_steps,
                seed=seed,
                shard=shard,
                device=device,
            )
        evals = {}
        for split in eval_splits:
            examples = task.load_split(directory, split)
            evals[split] = (torch.from_numpy(examples.inputs), torch.from_numpy(examples.targets))
        return TrainingData(
            name=INDIRECT_INDEXING,
            vocab_size=task.VOCAB_SIZE,
            train=batches,
            eval_examples=evals,
            eval_tokens={},
            seq_len=task.SEQ_LEN,
            is_task=True,
        )

    dataset = resolve_dataset(source)
    transform = dataset.train_transform
    if dataset.pad_id is None and options.pack:
        raise ValueError(
            f"train.pack=true packs documents; {dataset.name} ({dataset.path}) is a token stream (no pad "
            f"id): its training windows are full seq_len + 1-token slices, with no padding to remove. "
            f"Set train.pack=false"
        )
    if dataset.pad_id is not None:  # documents: padded, or packed end to end (train.pack, pope.train.packing)
        if options.pack:
            train_split = dataset.split("train")
            offsets, lengths = document_pieces(train_split, seq_len, source=str(dataset.path))
            batches = PackedDocumentBatches(
                train_split.tokens,
                offsets,
                lengths,
                seq_len=seq_len,
                global_batch=global_batch,
                micro_steps=micro_steps,
                seed=seed,
                shard=shard,
                device=device,
                transform=transform,
            )
        else:
            inputs, targets, sequences, lengths = documents_as_examples(
                dataset.split("train"), seq_len, dataset.pad_id, source=str(dataset.path)
            )
            batches = ExampleBatches(
                inputs,
                targets,
                global_batch=global_batch,
                micro_steps=micro_steps,
                seed=seed,
                shard=shard,
                device=device,
                sequences=sequences,
                lengths=lengths,
                transform=transform,
                pad_id=dataset.pad_id,
            )
        evals = {}
        for split in eval_splits:
            e_in, e_out, _, _ = documents_as_examples(
                dataset.split(split), seq_len, dataset.pad_id, source=str(dataset.path)
            )
            evals[split] = (e_in, e_out)
        return TrainingData(
            name=dataset.name,
            vocab_size=dataset.vocab_size,
            train=batches,
            eval_examples=evals,
            eval_tokens={},
            seq_len=seq_len,
        )
    batches = WindowBatches(
        dataset.split("train").tokens,
        seq_len,
        global_batch=global_batch,
        micro_steps=micro_steps,
        seed=seed,
        shard=shard,
        device=device,
        transform=transform,
        source=str(dataset.path),
    )
    return TrainingData(
        name=dataset.name,
        vocab_size=dataset.vocab_size,
        train=batches,
        eval_examples={},
        eval_tokens={s: dataset.split(s).tokens for s in eval_splits},
        seq_len=seq_len,
    )
