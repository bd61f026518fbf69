"""Samplers: the global batch does not depend on world size or accumulation; epochs cover every
example once; long documents are cut without losing a prediction."""

import numpy as np
import pytest
import torch

from pope.train.batches import ExampleBatches, Shard, WindowBatches, documents_as_examples, evaluation_batches


def _examples(n=50, t=6):
    inputs = torch.arange(n * t).view(n, t)
    targets = inputs.clone()
    targets[:, :2] = -100
    return inputs, targets


@pytest.mark.parametrize("world, micro", [(1, 1), (2, 1), (2, 2), (4, 2)])
def test_example_batches_shard_the_same_global_batch(world, micro):
    inputs, targets = _examples()
    reference = ExampleBatches(inputs, targets, global_batch=8, seed=5)
    shards = [
        ExampleBatches(inputs, targets, global_batch=8, micro_steps=micro, seed=5, shard=Shard(r, world))
        for r in range(world)
    ]
    for step in (0, 6, 7, 13):  # 50 examples / 8 per step: step 6 straddles two epochs
        whole, _ = reference.get(step)
        pieces = [s.get(step, m)[0] for m in range(micro) for s in shards]
        assert sorted(torch.cat(pieces)[:, 0].tolist()) == sorted(whole[:, 0].tolist())
        assert shards[0].scored_tokens(step) == reference.scored_tokens(step) == 8 * 4


def test_epochs_cover_every_example_once():
    inputs, targets = _examples(n=40)
    batches = ExampleBatches(inputs, targets, global_batch=8, seed=1)
    first_epoch = torch.cat([batches.get(s)[0][:, 0] for s in range(5)]) // 6
    second_epoch = torch.cat([batches.get(s)[0][:, 0] for s in range(5, 10)]) // 6
    assert sorted(first_epoch.tolist()) == sorted(second_epoch.tolist()) == list(range(40))
    assert first_epoch.tolist() != second_epoch.tolist()  # reshuffled
    with pytest.raises(ValueError, match="divisible"):
        ExampleBatches(inputs, targets, global_batch=8, micro_steps=3)


def test_window_batches_are_a_function_of_the_step():
    tokens = np.arange(1000, dtype=np.uint16)
    one = WindowBatches(tokens, 16, global_batch=4, seed=2)
    two = [WindowBatches(tokens, 16, global_batch=4, seed=2, shard=Shard(r, 2)) for r in range(2)]
    x, y = one.get(3)
    assert torch.equal(torch.cat([w.get(3)[0] for w in two]), x)
    assert torch.equal(y[:, :-1], x[:, 1:])  # targets are the next tokens
    assert not torch.equal(one.get(4)[0], x)
    with pytest.raises(ValueError, match="cannot hold"):
        WindowBatches(tokens[:10], 16, global_batch=4)


class _Split:
    def __init__(self, docs):
        self.name = "train"
        self.tokens = np.concatenate(docs)
        self.doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])

    def document_lengths(self):
        return np.diff(self.doc_offsets)


def test_long_documents_are_cut_without_losing_predictions():
    docs = [np.arange(100, 100 + n) for n in (5, 9, 10, 23)]
    inputs, targets, _, lengths = documents_as_examples(_Split(docs), 8, pad_id=0, source="test")
    pairs = {(int(a), int(b)) for row_in, row_out in zip(inputs, targets) for a, b in zip(row_in, row_out) if b != -100}
    expected = {(int(d[i]), int(d[i + 1])) for d in docs for i in range(len(d) - 1)}
    assert pairs == expected
    assert int((targets != -100).sum()) == sum(len(d) - 1 for d in docs)  # each prediction exactly once
    assert lengths.max() <= 9 and inputs.shape[1] == 8


def test_evaluation_batches_split_by_rank():
    inputs, targets = _examples(n=10)
    whole = [
        x
        for x, _ in evaluation_batches(
            batch_size=3, shard=Shard(), device=torch.device("cpu"), examples=(inputs, targets)
        )
    ]
    ranks = [
        x
        for r in range(2)
        for x, _ in evaluation_batches(
            batch_size=3, shard=Shard(r, 2), device=torch.device("cpu"), examples=(inputs, targets)
        )
    ]
    assert sorted(torch.cat(ranks)[:, 0].tolist()) == torch.cat(whole)[:, 0].tolist() == list(range(0, 60, 6))


def test_fresh_batches_are_a_function_of_seed_and_step_and_shard_alike():
    from pope.data.indirect_indexing import TaskOptions
    from pope.train.batches import FreshExampleBatches

    options = TaskOptions(fresh=True, max_len=32)
    whole = FreshExampleBatches(options, global_batch=8, seed=1)
    shards = [FreshExampleBatches(options, global_batch=8, micro_steps=2, seed=1, shard=Shard(r, 2)) for r in range(2)]
    x, y = whole.get(4)
    pieces = [s.get(4, m)[0] for m in range(2) for s in shards]
    assert sorted(map(tuple, torch.cat(pieces).tolist())) == sorted(map(tuple, x.tolist()))
    assert torch.equal(FreshExampleBatches(options, global_batch=8, seed=1).get(4)[0], x)  # (seed, step) decide
    assert not torch.equal(whole.get(5)[0], x) and not torch.equal(
        FreshExampleBatches(options, global_batch=8, seed=2).get(4)[0], x
    )
    assert whole.scored_tokens(4) == int((y != -100).sum()) == 8
    stacked_x, _ = shards[0].get_all_micro(4)
    assert stacked_x.shape == (2, 2, x.shape[1]) and torch.equal(stacked_x[1], shards[0].get(4, 1)[0])
    assert whole.state_dict(4)["kind"] == "fresh-examples"


@pytest.mark.parametrize(
    "spec", ["indirect-indexing:fresh=true,max_len=32", "indirect-indexing:fresh=true,max_len=32,query_first=true"]
)
def test_fresh_task_variant_trains_and_resumes_exactly(tmp_path, spec):
    """recipe.dataset=indirect-indexing:fresh=true,max_len=32 (and with the query first) end to end: its own
    splits, fresh batches, bit-exact resume (the sampler's state is the step)."""
    import json

    from pope.data import indirect_indexing as task
    from pope.train.run_config import resolve_run_config
    from pope.train.trainer import run_training

    splits = task.write_splits(
        tmp_path / "ii", sizes={"train": 64, "valid": 32, "test": 32}, options=task.parse_task_spec(spec)
    )
    sets = [
        "model.n_layer=1",
        "model.d_model=16",
        "model.n_head=2",
        "model.vocab_size=66",
        f"recipe.dataset={spec}",
        "recipe.max_steps=6",
        "recipe.warmup_steps=1",
        "recipe.eval_interval=3",
        "recipe.batch_size=8",
        f"train.data_dir={splits}",
        "train.log_interval=1",
        "train.tensorboard=false",
        "train.progress=false",
        "train.device=cpu",
    ]
    run_training(resolve_run_config("indirect-indexing-tiny", "pope", overrides=sets), tmp_path / "straight")
    run_training(
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=sets + ["train.stop_at_step=4"]),
        tmp_path / "resumed",
    )
    run_training(
        resolve_run_config("indirect-indexing-tiny", "pope", overrides=sets), tmp_path / "resumed", resume=True
    )

    def losses(run):
        return [
            r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"
        ]

    assert len(losses(tmp_path / "straight")) == 6 and losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    paper = ["recipe.dataset=indirect-indexing" if s.startswith("recipe.dataset") else s for s in sets]
    with pytest.raises(ValueError, match="asks for"):  # the variant's splits are not the paper task's
        run_training(resolve_run_config("indirect-indexing-tiny", "pope", overrides=paper), tmp_path / "wrong")


def _prepared_stream(out_dir, n_tokens: dict, vocab_size: int = 23):
    """A prepared token-stream dataset (no pad id): one document per split of n_tokens[split] tokens."""
    from pope.data.writer import PreparedWriter

    rng = np.random.default_rng(0)
    with PreparedWriter(out_dir, vocab_size) as writer:
        for split, n in n_tokens.items():
            writer.add_document(split, rng.integers(0, vocab_size, n))
        return writer.finish(
            {
                "name": "stream",
                "vocab": {"pad_id": None},
                "seq_len": 8,
                "request": {"dataset": "stream"},
                "source": {"description": "test"},
                "train_transform": None,
            }
        )


@pytest.mark.parametrize("n_tokens", [8 * 7 + 1, 8 * 7 + 4])  # exact windows; a partial last window
def test_whole_split_evaluation_scores_every_target_once(tmp_path, n_tokens):
    """Full-split NLL of a token stream == brute force: every target j (1..N-1) of the split, scored by
    one forward pass over a window that ends at or after it, summed once each."""
    from pope.model import GPT, GPTConfig
    from pope.train.evaluate import evaluate_split
    from pope.train.training_data import TrainingData

    dataset = _prepared_stream(tmp_path / "ds", {"train": 40, "valid": 20, "test": n_tokens})
    tokens = np.asarray(dataset.split("test").tokens, dtype=np.int64)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=23, n_layer=1, d_model=16, n_head=2, max_seq_len=8, pe="rope"))
    data = TrainingData(
        name="stream", vocab_size=23, train=None, eval_examples={}, eval_tokens={"test": tokens}, seq_len=8
    )
    whole = evaluate_split(
        model,
        data,
        "test",
        batch_size=3,
        max_batches=None,
        shard=Shard(),
        device=torch.device("cpu"),
        autocast_dtype=None,
    )
    model.eval()
    nll, seen = [], []
    for target in range(1, n_tokens):  # brute force: the window [start, start + 8] holding `target`
        start = min(8 * ((target - 1) // 8), n_tokens - 9)
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(tokens[start : start + 8])[None])
        log_probs = torch.log_softmax(logits[0, target - 1 - start].double(), -1)
        nll.append(-float(log_probs[tokens[target]]))
        seen.append(target)
    assert sorted(seen) == list(range(1, n_tokens))
    assert whole["test_scored_tokens"] == whole["test_split_tokens"] == n_tokens - 1
    assert whole["test_loss"] == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    # two ranks together score the same targets; a capped pass says it scored fewer
    ranks = [
        evaluate_split(
            model,
            data,
            "test",
            batch_size=3,
            max_batches=None,
            shard=Shard(r, 2),
            device=torch.device("cpu"),
            autocast_dtype=None,
        )["test_scored_tokens"]
        for r in range(2)
    ]
    assert sum(ranks) == n_tokens - 1
    capped = evaluate_split(
        model, data, "test", batch_size=3, max_batches=1, shard=Shard(), device=torch.device("cpu"), autocast_dtype=None
    )
    assert capped["test_scored_tokens"] == 24 < capped["test_split_tokens"]


def test_final_evaluation_of_a_token_stream_run_is_the_whole_split(tmp_path):
    """A run on a token stream: periodic evaluations read recipe.eval_batches batches, the final one (in
    summary.json) every test target; `pope report`'s test NLL is the whole-split number."""
    import json

    from pope.eval.report import headline_metric
    from pope.train.run_config import resolve_run_config
    from pope.train.trainer import run_training

    _prepared_stream(tmp_path / "ds", {"train": 400, "valid": 150, "test": 203})
    config = resolve_run_config(
        "genome-tiny",
        "rope",
        overrides=[
            f"train.data_dir={tmp_path / 'ds'}",
            "model.vocab_size=23",
            "model.max_seq_len=8",
            "recipe.seq_len=8",
            "recipe.batch_size=4",
            "recipe.max_steps=4",
            "recipe.warmup_steps=1",
            "recipe.eval_interval=2",
            "recipe.eval_batches=1",
            "train.tensorboard=false",
            "train.progress=false",
            "train.log_interval=2",
        ],
    )
    summary = run_training(config, tmp_path / "run")
    assert summary["final"]["test_scored_tokens"] == summary["final"]["test_split_tokens"] == 202
    assert summary["final"]["valid_scored_tokens"] == 149
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["test_scored_tokens"] for r in evals] == [4 * 8, 202]
    assert headline_metric(evals, "test_nll") == ("test_nll", summary["final"]["test_loss"])
