"""Evaluation results land where the user asked, even when the run directory cannot be written; bad --out
paths and modified data files are one clear line before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pope.checkpoint import save_checkpoint
from pope.cli import main
from pope.data.writer import PreparedWriter
from pope.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A toy prepared dataset (vocab 90) and an untrained 1-layer PoPE run saved as checkpoints/last."""
    root = tmp_path_factory.mktemp("eval_outputs")
    rng = np.random.default_rng(0)
    with PreparedWriter(root / "data", 90) as writer:
        for split, lengths in (("train", (40,)), ("valid", (40,)), ("test", (70, 50))):
            for n in lengths:
                writer.add_document(split, rng.integers(0, 88, size=n))
        writer.finish({"name": "toy", "vocab": {"pad_id": None}})
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=90, n_layer=1, n_head=2, d_model=16, max_seq_len=16, pe="pope")
    save_checkpoint(
        root / "run" / "checkpoints" / "last",
        model_state=GPT(config).state_dict(),
        model_config=config.to_dict(),
        trainer_state={"step": 0},
    )
    return root


def _length(workspace, run, out, data=None) -> int:
    return main(
        [
            "eval",
            "length",
            str(run),
            "--data",
            str(data or workspace / "data"),
            "--lengths",
            "8,16",
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )


def test_length_writes_out_first_and_warns_when_the_run_dir_cannot_be_written(workspace, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(workspace / "run", run, ignore=shutil.ignore_patterns("eval"))
    (run / "eval").write_text("a file where RUN/eval/ would go: the run directory cannot take results")
    out = tmp_path / "results"
    assert _length(workspace, run, out) == 0
    captured = capsys.readouterr()
    assert {p.name for p in out.iterdir()} >= {"length.csv", "length.md", "length.json", "length.png"}
    assert len(json.loads((out / "length.json").read_text())["runs"][0]["results"]) == 2
    assert f"warning: could not write {run / 'eval' / 'length-toy-test-8-16.json'}" in captured.err
    assert f"the results are in {out}" in captured.err and "Traceback" not in captured.err
    assert (run / "eval").read_text().startswith("a file where")  # nothing of the user's was replaced
    # a writable run directory gets its per-run record too
    assert _length(workspace, workspace / "run", tmp_path / "again") == 0
    assert json.loads((workspace / "run" / "eval" / "length-toy-test-8-16.json").read_text())["step"] == 0


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_bad_out_fails_before_any_model_is_loaded(workspace, tmp_path, capsys, monkeypatch, where):
    import pope.eval.length_runs
    import pope.eval.runs

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    for module in (pope.eval.runs, pope.eval.length_runs):  # each module that looks the name up
        monkeypatch.setattr(module, "load_run_model", must_not_load)
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" if where == "file" else tmp_path / "afile" / "sub"
    assert _length(workspace, workspace / "run", out) == 1
    err = capsys.readouterr().err
    assert err.startswith("pope eval length: error: --out ") and err.count("\n") == 1
    assert ("is an existing file" if where == "file" else "lies under") in err
    assert main(["report", str(workspace / "run"), "--out", str(out)]) == 1
    assert "pope report: error: --out" in capsys.readouterr().err
    assert (
        main(["analyze", "frequencies", str(workspace / "run"), "--data", str(workspace / "data"), "--out", str(out)])
        == 1
    )
    assert "pope analyze frequencies: error: --out" in capsys.readouterr().err


def test_a_tampered_bin_is_reported_as_modified_not_as_another_tokenisation(workspace, tmp_path, capsys):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(workspace / "data", data)
    raw = bytearray((data / "test.bin").read_bytes())
    raw[0:2] = (60000).to_bytes(2, "little")  # an id far beyond both vocabularies
    (data / "test.bin").write_bytes(bytes(raw))
    assert _length(workspace, workspace / "run", tmp_path / "out", data=data) == 1
    err = capsys.readouterr().err
    assert "test.bin was modified or corrupted: checksum mismatch" in err
    assert f"pope data prepare toy --out {data} --force" in err and "tokenisation" not in err
    assert not (tmp_path / "out").exists()
    # a change that keeps every id inside the vocabulary is caught too (it would silently change the scores)
    raw[0:2] = (5).to_bytes(2, "little")
    (data / "test.bin").write_bytes(bytes(raw))
    assert (
        main(["analyze", "frequencies", str(workspace / "run"), "--data", str(data), "--out", str(tmp_path / "freq")])
        == 1
    )
    assert "test.bin was modified or corrupted" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "DATA", "--tokenizer", "bytes"], "--tokenizer applies to --text only"),
        (["--text", "DATA/manifest.json", "--split", "valid"], "--split applies to --data only"),
        (["--text", "DATA/manifest.json", "--max-tokens", "5"], "--max-tokens applies to --data only"),
    ],
)
def test_analyze_options_that_would_be_ignored_are_errors(workspace, tmp_path, capsys, args, message):
    args = [a.replace("DATA", str(workspace / "data")) for a in args]
    assert main(["analyze", "frequencies", str(workspace / "run"), *args, "--out", str(tmp_path / "f")]) == 1
    assert message in capsys.readouterr().err and not (tmp_path / "f").exists()


def test_eval_integer_options_and_repeated_lengths(workspace, tmp_path, capsys):
    base = ["eval", "length", str(workspace / "run"), "--data", str(workspace / "data"), "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        main([*base, "--lengths", "8", "--batch-size", "0"])
    assert info.value.code == 2 and "argument --batch-size: must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main([*base, "--lengths", "8,16,8"]) == 1
    assert "evaluation length(s) 8 given more than once" in capsys.readouterr().err


def test_downstream_checks_the_run_eval_dir_before_starting_lm_eval(workspace, tmp_path, capsys, monkeypatch):
    import shutil

    import pope.eval.downstream

    def must_not_run(*args, **kwargs):
        raise AssertionError("lm-eval was started before RUN/eval/ was checked")

    monkeypatch.setattr(pope.eval.downstream, "run_downstream", must_not_run)
    run = tmp_path / "run"
    shutil.copytree(workspace / "run", run, ignore=shutil.ignore_patterns("eval"))
    (run / "eval").write_text("not a directory")
    assert main(["eval", "downstream", str(run), "--limit", "1"]) == 1
    err = capsys.readouterr().err
    assert "the run's eval directory" in err and "is an existing file, not a directory" in err


def test_length_eval_flags_take_real_booleans(workspace):
    from pope.eval.length_runs import run_length_eval

    with pytest.raises(TypeError, match="same_documents must be True or False, got 'no'"):
        run_length_eval([str(workspace / "run")], str(workspace / "data"), lengths=[8], same_documents="no")


def test_length_keeps_each_finished_run_when_a_later_run_fails(workspace, tmp_path, capsys):
    """Results are written after every run: a call that stops at its third run (here: a corrupted checkpoint;
    on a cluster, the job's time limit) leaves the first two in --out and beside each run, and labels that a later
    run made ambiguous are renamed in what was written."""
    import shutil

    first, second, broken = tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "c" / "run"
    for run in (first, second, broken):
        shutil.copytree(workspace / "run", run, ignore=shutil.ignore_patterns("eval"))
    (broken / "checkpoints" / "last" / "model.safetensors").write_bytes(b"not a checkpoint")
    out = tmp_path / "results"
    code = main(
        [
            "eval",
            "length",
            str(first),
            str(second),
            str(broken),
            "--data",
            str(workspace / "data"),
            "--lengths",
            "8,16",
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    captured = capsys.readouterr()
    assert code != 0 and "Traceback" not in captured.err
    written = json.loads((out / "length.json").read_text())
    assert [r["label"] for r in written["runs"]] == ["a/run", "b/run"]
    assert written["provenance"]["runs_done"] == 2 and written["provenance"]["runs_requested"] == 3
    assert "Partial: 2 of the 3 runs" in (out / "length.md").read_text()
    for run in (first, second):
        assert len(json.loads((run / "eval" / "length-toy-test-8-16.json").read_text())["results"]) == 2
    assert not (broken / "eval").exists()
