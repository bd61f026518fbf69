"""`pope eval accuracy` against the trainer's task accuracy and by shift; `pope report` on torn run records."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from eval_fixtures import _fake_run

from pope.cli import main


def test_eval_accuracy_is_the_trainers_task_accuracy(tmp_path, capsys):
    from pope.checkpoint import save_checkpoint
    from pope.data import indirect_indexing as task
    from pope.model import GPT, GPTConfig
    from pope.train.evaluate import task_accuracy

    lines = task.generate_examples(20, np.random.default_rng(0))
    data = tmp_path / "examples.txt"
    data.write_text("\n".join(lines) + "\n")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=task.VOCAB_SIZE, n_layer=1, n_head=2, d_model=16, max_seq_len=48, pe="pope"))
    checkpoint = save_checkpoint(tmp_path / "ckpt", model_state=model.state_dict(), model_config=model.config.to_dict())
    assert main(["eval", "accuracy", str(checkpoint), "--data", str(data), "--json", "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == task_accuracy(str(checkpoint), str(data), device="cpu") and printed["examples"] == 20


def test_eval_accuracy_by_shift_counts_each_example_under_its_own_shift(tmp_path, capsys, monkeypatch):
    """by_shift holds, per signed shift, the examples with that shift and how many of them the model gets right;
    the totals are the overall numbers; the CLI prints it. The model is a stand-in that always answers one letter,
    so the examples it gets right are exactly those whose target is that letter."""
    import pope.train.evaluate
    from pope.data import indirect_indexing as task
    from pope.model import GPTConfig
    from pope.train.evaluate import task_accuracy

    lines = task.generate_examples(200, np.random.default_rng(1))
    data = tmp_path / "examples.txt"
    data.write_text("\n".join(lines) + "\n")
    parsed = [task.parse_example(line) for line in lines]
    letter = max(set(e.target for e in parsed), key=[e.target for e in parsed].count)
    letter_id = int(task.load_file(data).targets[[e.target for e in parsed].index(letter)].max())

    class AlwaysOneLetter(torch.nn.Module):
        config = GPTConfig(vocab_size=task.VOCAB_SIZE, n_layer=1, n_head=1, d_model=8, max_seq_len=48)

        def forward(self, x):  # (b, T) -> logits (b, T, vocab) with the letter on top everywhere
            return torch.nn.functional.one_hot(torch.full_like(x, letter_id), task.VOCAB_SIZE).float(), None

    monkeypatch.setattr(  # in the module that looks it up
        pope.train.evaluate, "load_model", lambda run, map_location: (AlwaysOneLetter(), {"path": run, "step": 7})
    )
    result = task_accuracy("stand-in", str(data), device="cpu", batch_size=7)
    expected = {}
    for example in parsed:
        row = expected.setdefault(f"{example.shift:+d}", {"examples": 0, "correct": 0})
        row["examples"] += 1
        row["correct"] += example.target == letter
    for row in expected.values():
        row["accuracy"] = row["correct"] / row["examples"]
    assert result["by_shift"] == dict(sorted(expected.items(), key=lambda item: int(item[0])))
    assert result["correct"] == sum(e.target == letter for e in parsed) > 0
    assert main(["eval", "accuracy", "stand-in", "--data", str(data), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    first_shift, first_row = next(iter(result["by_shift"].items()))
    assert printed.startswith(f"by shift (%): {first_shift} {100 * first_row['accuracy']:.1f} "), printed


@pytest.mark.parametrize(
    ("damaged", "fix"),
    [
        ("summary.json", "pope train --resume RUN` rebuilds it"),
        ("config.json", "pope train --resume RUN` rebuilds it"),
        ("sweep.json", "restore or delete it"),
        ("env.json", "restore or delete it"),
        ("eval/length-jsb-test.json", "restore or delete it"),
    ],
)
def test_report_names_a_torn_record_and_the_fix(tmp_path, capsys, damaged, fix):
    """A run record cut by a crash or an edit elsewhere: `pope report` stops with one line naming the file and what
    to do, writes no report, and leaves every file as it was."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"overrides": []}))
    run = Path(_fake_run(sweep / "seed-0", "jsb-tiny", "pope", 0, [1.0, 0.9], length_ppl={256: 3.0}))
    (run / "env.json").write_text(json.dumps({"command": ["pope", "train"]}))
    target = sweep / damaged if damaged == "sweep.json" else run / damaged
    torn = target.read_text()[:7]
    target.write_text(torn)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(target) in err[0] and "is damaged" in err[0] and fix in err[0], err
    assert not (tmp_path / "report" / "report.md").exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "report" not in p.parts} == before


def test_report_leaves_out_a_torn_last_metrics_line_with_a_notice(tmp_path, capsys):
    """The last metrics line cut by a crash mid-write (a run still writing, or killed): left out with a notice, as the
    trainer reads it; the report is written from the complete records."""
    run = Path(_fake_run(tmp_path / "run", "jsb-tiny", "pope", 0, [1.0, 0.9]))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 300, "kind": "ev')
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert "last line is incomplete" in capsys.readouterr().err
    assert (tmp_path / "report" / "report.md").is_file()
