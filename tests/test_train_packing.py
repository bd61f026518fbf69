"""train.pack: packed document batches cover what the padded path trains on, a packed step equals a padded step on
the same documents (loss and gradients), packed runs learn and resume bit for bit, and what cannot pack is refused."""

from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pope.checkpoint import load_checkpoint
from pope.data.prepared import TokenSplit
from pope.data.writer import PreparedWriter
from pope.model import GPT, GPTConfig
from pope.train.batches import Shard, document_pieces, documents_as_examples, epoch_permutation
from pope.train.distributed import DistributedContext
from pope.train.metrics import read_metrics
from pope.train.packing import PackedDocumentBatches
from pope.train.parallel import SingleProcess
from pope.train.run_config import TrainOptions, resolve_run_config
from pope.train.step import EagerStep
from pope.train.trainer import run_training

SEQ_LEN = 8
LENGTHS = [1, 2, 5, 9, 10, 23, 3, 17, 4, 1, 6, 30, 8, 2]  # 1-token documents, and documents past seq_len + 1


def _documents_split(docs) -> TokenSplit:
    return TokenSplit(
        name="train", tokens=np.concatenate(docs), doc_offsets=np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    )


def _split(seed=0, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    return _documents_split([rng.integers(1, 30, n) for n in lengths])


def _packed(split, **kwargs):
    offsets, lengths = document_pieces(split, SEQ_LEN, source="test")
    return PackedDocumentBatches(split.tokens, offsets, lengths, seq_len=SEQ_LEN, **kwargs)


def _pieces_of(inputs, targets, cu_seqlens):
    """The pieces (token tuples) a packed micro-batch holds, each inputs + its last target."""
    bounds = cu_seqlens.tolist()
    return [tuple(inputs[0, a:b].tolist()) + (int(targets[0, b - 1]),) for a, b in zip(bounds, bounds[1:])]


def test_steps_cover_every_piece_once_per_epoch_in_the_padded_order():
    split = _split()
    batches = _packed(split, global_batch=2, seed=4)
    offsets, lengths = document_pieces(split, SEQ_LEN, source="test")
    piece = [tuple(split.tokens[o : o + n].tolist()) for o, n in zip(offsets, lengths)]
    expected = [
        piece[i] for epoch in range(3) for i in epoch_permutation(4, epoch, len(piece)).tolist() if lengths[i] >= 2
    ]  # the padded path's order; 1-token pieces have no target on either path
    seen, step = [], 0
    while len(seen) < len(expected):
        inputs, targets, packing = batches.get(step)
        assert packing["cu_seqlens"].dtype == torch.int32 and inputs.shape == targets.shape == (1, inputs.shape[1])
        step_pieces = _pieces_of(inputs, targets, packing["cu_seqlens"])
        assert packing["max_seqlen"] == max(len(p) - 1 for p in step_pieces)
        assert batches.scored_tokens(step) == inputs.shape[1] <= 2 * SEQ_LEN  # every target scored, within budget
        seen += step_pieces
        step += 1
    assert seen[: len(expected)] == expected
    # greedy: the next piece would not have fitted into the step before it
    fresh = _packed(split, global_batch=2, seed=4)
    for s in range(step - 1):
        nxt = fresh.get(s + 1)
        assert fresh.scored_tokens(s) + int(torch.diff(nxt[2]["cu_seqlens"])[0]) > 2 * SEQ_LEN
    assert torch.equal(_packed(split, global_batch=2, seed=4).get(7)[0], batches.get(7)[0])  # a function of the step


@pytest.mark.parametrize("world,micro", [(1, 2), (2, 1), (2, 2)])
def test_ranks_and_micro_steps_split_the_same_global_batch(world, micro):
    split = _split(1)
    whole = _packed(split, global_batch=4, seed=2)
    shards = [_packed(split, global_batch=4, seed=2, micro_steps=micro, shard=Shard(r, world)) for r in range(world)]
    for step in range(6):
        everything = _pieces_of(*whole.get(step)[:2], whole.get(step)[2]["cu_seqlens"])
        parts = []
        for m in range(micro):
            for shard in shards:
                inputs, targets, packing = shard.get(step, m)
                parts.append(_pieces_of(inputs, targets, packing["cu_seqlens"]))
                assert shard.scored_tokens(step) == whole.scored_tokens(step)
        assert all(parts) and [p for part in parts for p in part] == everything


def _step(model, batches):
    """An EagerStep (one process) whose forward_backward the tests call directly."""
    strategy = SimpleNamespace(context=SimpleNamespace(world_size=1))
    return EagerStep(
        model=model,
        train_model=model,
        strategy=strategy,
        optimizer=None,
        schedule=None,
        batches=batches,
        micro_steps=1,
        grad_clip=0.0,
        device=torch.device("cpu"),
        autocast_dtype=None,
    )


@pytest.mark.parametrize("pe", ["pope", "rope", "alibi", "learned-abs"])
def test_a_packed_step_equals_the_padded_step_on_the_same_documents(pe):
    """The trainer's forward_backward on packed step 0 and on the same pieces padded (ExampleBatches rows): equal
    loss and gradients in float64."""
    split = _split(2)
    packed = _packed(split, global_batch=3, seed=0)
    inputs, targets, packing = packed.get(0)
    pieces = _pieces_of(inputs, targets, packing["cu_seqlens"])
    rows_in, rows_out, _, _ = documents_as_examples(
        _documents_split([np.array(p) for p in pieces]), SEQ_LEN, 0, source="t"
    )
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=30, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=SEQ_LEN, pe=pe)
    ).double()
    results = []
    for batch in ((inputs, targets, packing), (rows_in, rows_out)):
        model.zero_grad(set_to_none=True)
        scored = int((batch[1] != -100).sum())
        loss = _step(model, packed).forward_backward(batch[0], batch[1], 1.0 / scored, *batch[2:]) / scored
        results.append((loss, [p.grad.clone() for p in model.parameters()]))
    assert int((rows_out != -100).sum()) == packed.scored_tokens(0)
    (packed_loss, packed_grads), (padded_loss, padded_grads) = results
    assert rows_in.numel() > inputs.numel()  # the padded step computed padding
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-6, atol=0)  # the loss itself is fp32
    for (name, _), a, b in zip(model.named_parameters(), packed_grads, padded_grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9, msg=name)


def _documents_dataset(path: Path, seed=0) -> Path:
    """A learnable document dataset (pad id 0): each document counts up by one from a random start (mod 29)."""
    rng = np.random.default_rng(seed)
    with PreparedWriter(path, 30) as writer:
        for split, n in (("train", 80), ("valid", 12), ("test", 12)):
            for _ in range(n):
                start, length = int(rng.integers(0, 29)), int(rng.integers(2, 40))
                writer.add_document(split, 1 + (start + np.arange(length)) % 29)
        writer.finish(
            {
                "name": "counting",
                "vocab": {"pad_id": 0},
                "seq_len": 16,
                "request": {"dataset": "counting"},
                "source": {"description": "test"},
                "train_transform": None,
            }
        )
    return path


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    return _documents_dataset(tmp_path_factory.mktemp("docs") / "counting")


def _sets(documents, steps, *extra):
    return [
        f"train.data_dir={documents}",
        "model.vocab_size=30",
        "model.max_seq_len=16",
        "recipe.seq_len=16",
        "model.n_layer=2",
        "model.d_model=32",
        "model.n_head=2",
        "recipe.batch_size=4",
        f"recipe.max_steps={steps}",
        "recipe.warmup_steps=2",
        "recipe.eval_interval=10",
        "recipe.lr=3e-3",
        "train.tensorboard=false",
        "train.progress=false",
        "train.log_interval=1",
        "train.pack=true",
        *extra,
    ]


def _train_losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"}


def _data_state(run_dir):
    return load_checkpoint(Path(run_dir) / "checkpoints" / "last").trainer_state["data"]


def test_packed_training_learns_and_resumes_bit_for_bit(documents, tmp_path):
    sets = _sets(documents, 30, "model.dropout=0.1")  # dropout: the restored RNG state matters too
    config = resolve_run_config("jsb-tiny", "pope", seed=1, overrides=sets)
    summary = run_training(config, tmp_path / "straight")
    losses = _train_losses(tmp_path / "straight")
    assert np.mean([losses[s] for s in (28, 29, 30)]) < np.mean([losses[s] for s in (1, 2, 3)]) - 1.0, losses
    assert summary["final"]["valid_scored_tokens"] > 0
    assert _data_state(tmp_path / "straight")["kind"] == "packed-documents"  # the trainer really packed
    stopped = resolve_run_config("jsb-tiny", "pope", seed=1, overrides=sets + ["train.stop_at_step=13"])
    assert run_training(stopped, tmp_path / "resumed")["step"] == 13
    run_training(config, tmp_path / "resumed", resume=True)
    assert _train_losses(tmp_path / "resumed") == losses  # exact float equality, every step


def test_packed_gradient_accumulation_matches_one_micro_batch(documents, tmp_path):
    one = resolve_run_config("jsb-tiny", "rope", overrides=_sets(documents, 4, "model.dropout=0"))
    two = resolve_run_config(
        "jsb-tiny", "rope", overrides=_sets(documents, 4, "model.dropout=0", "recipe.grad_accum=2")
    )
    run_training(one, tmp_path / "a")
    run_training(two, tmp_path / "b")
    a, b = _train_losses(tmp_path / "a"), _train_losses(tmp_path / "b")
    assert a.keys() == b.keys() == {1, 2, 3, 4}
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6)


def test_what_cannot_pack_is_refused(documents, tmp_path):
    with pytest.raises(ValueError, match="cuda_graph=false"):
        TrainOptions(pack=True, cuda_graph=True)
    with pytest.raises(ValueError, match="indirect-indexing examples.*train.pack=false"):
        run_training(
            resolve_run_config(
                "indirect-indexing-tiny",
                "pope",
                overrides=["train.pack=true", "train.tensorboard=false", "train.progress=false"],
            ),
            tmp_path / "task",
        )
    stream = tmp_path / "stream"
    with PreparedWriter(stream, 23) as writer:
        for split in ("train", "valid", "test"):
            writer.add_document(split, np.arange(200) % 23)
        writer.finish(
            {
                "name": "stream",
                "vocab": {"pad_id": None},
                "seq_len": 8,
                "request": {"dataset": "stream"},
                "source": {"description": "test"},
                "train_transform": None,
            }
        )
    with pytest.raises(ValueError, match="token stream.*train.pack=false"):
        run_training(
            resolve_run_config(
                "genome-tiny",
                "pope",
                overrides=[
                    f"train.data_dir={stream}",
                    "model.vocab_size=23",
                    "train.pack=true",
                    "train.tensorboard=false",
                    "train.progress=false",
                ],
            ),
            tmp_path / "run",
        )


@pytest.mark.data
@pytest.mark.slow
def test_tiny_jsb_preset_learns_packed(tmp_path):
    """jsb-tiny on the prepared chorales with train.pack=true: the loss falls within 30 steps."""
    config = resolve_run_config(
        "jsb-tiny",
        "pope",
        overrides=[
            "train.pack=true",
            "train.tensorboard=false",
            "train.progress=false",
            "train.log_interval=10",
            "recipe.max_steps=30",
            "recipe.eval_interval=30",
            "train.eval_splits=valid",
        ],
    )
    summary = run_training(config, tmp_path / "jsb")
    losses = _train_losses(tmp_path / "jsb")
    assert losses[30] < losses[10] - 0.5, losses
    assert summary["final"]["valid_loss"] < losses[10]
    assert _data_state(tmp_path / "jsb")["kind"] == "packed-documents"


class _DeviceReads(TorchDispatchMode):
    """Records every read of an int32 tensor's values back to the host (.item(), .tolist(), int(), a bool test):
    on CUDA each is a device sync. .tolist() reads the data without dispatching, so it is wrapped too."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (
            func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
            and args[0].dtype == torch.int32
        ):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        original, reads = torch.Tensor.tolist, self.reads

        def tolist(tensor):
            if tensor.dtype == torch.int32:
                reads.append("tolist")
            return original(tensor)

        self._patch = mock.patch.object(torch.Tensor, "tolist", tolist)
        self._patch.start()
        return super().__enter__()

    def __exit__(self, *exc):
        self._patch.stop()
        return super().__exit__(*exc)


@pytest.mark.parametrize("pe", ["rope", "learned-abs"])
def test_a_packed_training_step_reads_no_lengths_back_from_the_device(pe):
    """The trainer's packed batches hand the model a host copy of cu_seqlens, so its checks read no int32 tensor
    back (on CUDA: no device sync per step; PoPE's CUDA kernels check on the device, rope/learned-abs here take
    the generic path). The same forward with only the device cu_seqlens reads it once, and is still checked."""
    packed = _packed(_split(1), global_batch=3, seed=0)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, n_layer=2, n_head=2, d_model=16, max_seq_len=SEQ_LEN, pe=pe))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = EagerStep(
        model=model,
        train_model=model,
        strategy=SingleProcess(DistributedContext()),
        optimizer=optimizer,
        schedule=lambda s: 1e-3,
        batches=packed,
        micro_steps=1,
        grad_clip=1.0,
        device=torch.device("cpu"),
        autocast_dtype=None,
    )
    with _DeviceReads() as probe:
        loss = step(0)
    assert probe.reads == [] and torch.isfinite(loss)
    inputs, _, packing = packed.get(1)
    with _DeviceReads() as probe:
        model(inputs, cu_seqlens=packing["cu_seqlens"], max_seqlen=packing["max_seqlen"])
    assert probe.reads == ["tolist"]  # the probe sees the read the host copy saves
    bad = packing["cu_seqlens"].clone()
    bad[1] = bad[2] + 1
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        model(inputs, cu_seqlens=bad, max_seqlen=packing["max_seqlen"])
    with pytest.raises(ValueError, match="cu_seqlens_host must be the integer host copy"):
        model(inputs, **{**packing, "cu_seqlens_host": packing["cu_seqlens_host"][:-1]})
    with pytest.raises(TypeError, match="numpy array or a list of ints"):
        model(inputs, **{**packing, "cu_seqlens_host": packing["cu_seqlens"]})
    with pytest.raises(ValueError, match="pass cu_seqlens"):
        model(inputs, cu_seqlens_host=packing["cu_seqlens_host"])
