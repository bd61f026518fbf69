"""Checkpoints that stock tools load: pope.hf's save_pretrained writes remote code and an auto_map, so transformers,
its pipeline and lm-eval's own CLI load them in a fresh process with trust_remote_code=True; `pope export hf` writes
a trained run as such a checkpoint with the GPT's logits (float64)."""

import json
import math
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is part of the [hf] extra")

from transformers import AutoModelForCausalLM  # noqa: E402

import pope.hf  # noqa: E402
from pope.checkpoint import save_checkpoint  # noqa: E402
from pope.cli import main  # noqa: E402
from pope.hf.export import build_tokenizer, export_run  # noqa: E402
from pope.hf.remote import REMOTE_CODE_DIR  # noqa: E402
from pope.model import GPT, GPTConfig  # noqa: E402

REMOTE_FILES = ("configuration_pope.py", "modeling_pope.py")
PROMPTS = [("The cat sat on the", " mat"), ("One, two,", " three"), ("abc", "def")]


def fresh_env(tmp_path: Path) -> dict:
    """A subprocess environment: offline, and transformers' module cache under tmp_path."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
        "TRANSFORMERS_VERBOSITY": "error",
    }


def run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=fresh_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )


def tiny_gpt(pe: str = "pope:delta_init=uniform", vocab_size: int = 256, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size, n_layer=2, n_head=4, d_model=32, max_seq_len=32, pe=pe)).eval()


def trained_run(directory: Path, model: GPT) -> Path:
    """A run directory as `pope train` leaves it, as far as export reads it: checkpoints/last."""
    save_checkpoint(
        directory / "checkpoints" / "last",
        model_state=model.state_dict(),
        model_config=model.config.to_dict(),
        trainer_state={"step": 7, "run_config": {"preset": "test", "pe": model.config.pe}},
    )
    return directory


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny PoPELlama over bytes, saved with save_pretrained, with a byte-level tokenizer beside it."""
    torch.manual_seed(0)
    config = pope.hf.PoPELlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pope_delta_init="uniform",
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tokenizer_class="PreTrainedTokenizerFast",  # transformers < 4.5x's pipeline finds a custom model's tokenizer so
    )
    directory = tmp_path_factory.mktemp("llama")
    pope.hf.PoPELlamaForCausalLM(config).eval().save_pretrained(directory)
    build_tokenizer("bytes", vocab_size=256, max_length=64).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    """A tiny GPT run exported with `pope export hf` (byte tokenizer)."""
    root = tmp_path_factory.mktemp("gpt")
    run = trained_run(root / "run", tiny_gpt())
    assert main(["export", "hf", str(run), str(root / "hf"), "--tokenizer", "bytes"]) == 0
    return root / "hf"


# ----------------------------------------------------------------------------------- what is written
@pytest.mark.parametrize("which", ["llama", "gpt"])
def test_save_pretrained_writes_the_remote_code_and_auto_map(which, llama_dir, gpt_dir):
    directory = {"llama": llama_dir, "gpt": gpt_dir}[which]
    for name in REMOTE_FILES:
        assert (directory / name).read_bytes() == (REMOTE_CODE_DIR / name).read_bytes()
    auto_map = json.loads((directory / "config.json").read_text())["auto_map"]
    expected = {
        "llama": {
            "AutoConfig": "configuration_pope.PoPELlamaConfig",
            "AutoModel": "modeling_pope.PoPELlamaModel",
            "AutoModelForCausalLM": "modeling_pope.PoPELlamaForCausalLM",
        },
        "gpt": {
            "AutoConfig": "configuration_pope.PoPEGPTConfig",
            "AutoModelForCausalLM": "modeling_pope.PoPEGPTForCausalLM",
        },
    }[which]
    assert auto_map == expected


def test_a_reloaded_model_saves_the_same_remote_code(llama_dir, tmp_path):
    """transformers registers classes it loads as remote code for their auto class; pope.hf's classes ignore that,
    so a second save writes the remote-code files again and copies no module of the package."""
    model = AutoModelForCausalLM.from_pretrained(llama_dir, trust_remote_code=True)
    model.save_pretrained(tmp_path / "again")
    saved = sorted(p.name for p in (tmp_path / "again").glob("*.py"))
    assert saved == sorted(REMOTE_FILES)
    assert (
        json.loads((tmp_path / "again" / "config.json").read_text())["auto_map"]
        == json.loads((llama_dir / "config.json").read_text())["auto_map"]
    )


# ----------------------------------------------------------------------- a fresh process, stock calls
@pytest.mark.parametrize("which", ["llama", "gpt"])
def test_a_fresh_process_loads_with_trust_remote_code_alone(which, llama_dir, gpt_dir, tmp_path):
    """AutoModelForCausalLM.from_pretrained and pipeline("text-generation") in a process that never imports pope
    itself: the logits and the greedy continuation equal the model's in this process."""
    directory = {"llama": llama_dir, "gpt": gpt_dir}[which]
    ids = torch.tensor([list(b"hello world")])
    out = tmp_path / "out.json"
    completed = run_python(
        f"""
        import json, sys
        import torch
        from transformers import AutoModelForCausalLM, pipeline
        assert "pope" not in sys.modules
        model = AutoModelForCausalLM.from_pretrained({str(directory)!r}, trust_remote_code=True).eval()
        with torch.no_grad():
            logits = model(torch.tensor({ids.tolist()})).logits
        generator = pipeline("text-generation", model={str(directory)!r}, trust_remote_code=True, device="cpu")
        text = generator("hello", max_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
        json.dump({{"class": type(model).__name__, "logits": logits.tolist(), "text": text}}, open({str(out)!r}, "w"))
        """,
        tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(out.read_text())
    model = AutoModelForCausalLM.from_pretrained(directory).eval()  # in this process: pope.hf's registered classes
    assert result["class"] == type(model).__name__
    with torch.no_grad():
        expected = model(ids).logits
        generated = model.generate(torch.tensor([list(b"hello")]), max_new_tokens=6, do_sample=False)[0, 5:]
    assert torch.allclose(torch.tensor(result["logits"]), expected, atol=1e-6, rtol=0)
    assert result["text"] == bytes(generated.tolist()).decode("utf-8", errors="replace")


def test_without_pope_installed_the_load_fails_with_one_line(llama_dir, tmp_path):
    completed = run_python(
        f"""
        import sys

        class NotInstalled:  # as if pope-attention were not installed: importing pope fails as it then would
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "pope":
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, NotInstalled())
        from transformers import AutoModelForCausalLM
        try:
            AutoModelForCausalLM.from_pretrained({str(llama_dir)!r}, trust_remote_code=True)
        except ImportError as err:
            print(str(err))
        """,
        tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    (line,) = completed.stdout.strip().splitlines()
    assert line.startswith("this checkpoint's model code is the pope-attention package, which is not installed")
    assert "pip install 'pope-attention[hf]'" in line


def test_the_byte_tokenizer_maps_every_byte_to_its_value():
    tokenizer = build_tokenizer("bytes", vocab_size=256, max_length=64)
    text = "héllo\n\tworld \x00 ✓"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text and tokenizer.eos_token_id == 0


# ------------------------------------------------------------------------------------ lm-eval's CLI
def _write_task(folder: Path) -> None:
    folder.mkdir()
    data = folder / "pairs.jsonl"
    data.write_text("".join(json.dumps({"context": c, "continuation": x}) + "\n" for c, x in PROMPTS))
    (folder / "pope_stock_ll.yaml").write_text(
        textwrap.dedent(f"""
        task: pope_stock_ll
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {data}
        test_split: test
        output_type: loglikelihood
        doc_to_text: "{{{{context}}}}"
        doc_to_target: "{{{{continuation}}}}"
        metric_list:
          - metric: perplexity
        """)
    )


def _direct_loglikelihood(model, context: str, continuation: str) -> float:
    """log p(continuation | context) over bytes in float64, one forward pass."""
    context_ids, continuation_ids = list(context.encode()), list(continuation.encode())
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).logits.double(), -1)[0]
    start = len(context_ids) - 1
    return sum(logp[start + i, token].item() for i, token in enumerate(continuation_ids))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama", "gpt"])
def test_lm_eval_cli_scores_the_checkpoint_with_model_hf(which, llama_dir, gpt_dir, tmp_path):
    """`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True` with a local task (--include_path),
    offline, in a subprocess: its perplexity is exp(-mean log-likelihood) computed here directly."""
    pytest.importorskip("lm_eval", reason="lm-eval is part of the [eval] extra")
    directory = {"llama": llama_dir, "gpt": gpt_dir}[which]
    _write_task(tmp_path / "tasks")
    executable = Path(sys.executable).with_name("lm_eval")
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "lm_eval"]
    completed = subprocess.run(
        [
            *command,
            "--model",
            "hf",
            "--model_args",
            f"pretrained={directory},trust_remote_code=True",
            "--tasks",
            "pope_stock_ll",
            "--include_path",
            str(tmp_path / "tasks"),
            "--device",
            "cpu",
            "--batch_size",
            "1",
            "--output_path",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        env=fresh_env(tmp_path),
        cwd=tmp_path,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    (results_file,) = (tmp_path / "results").rglob("results_*.json")
    perplexity = json.loads(results_file.read_text())["results"]["pope_stock_ll"]["perplexity,none"]
    model = AutoModelForCausalLM.from_pretrained(directory).double().eval()
    mean = sum(_direct_loglikelihood(model, c, x) for c, x in PROMPTS) / len(PROMPTS)
    assert math.log(perplexity) == pytest.approx(-mean, abs=1e-4)


def test_no_dead_lm_eval_entry_point():
    """lm-eval <= 0.4.13 never reads the `lm_eval.models` entry-point group; the package declares none."""
    assert not [ep for ep in entry_points(group="lm_eval.models") if ep.value.startswith("pope")]


# ------------------------------------------------------------------------------------- pope export hf
@pytest.mark.parametrize("pe", ["pope:delta_init=uniform", "rope", "yarn:scale=2,original_max_len=16", "alibi-half"])
def test_export_gives_the_gpts_logits_in_float64(pe, tmp_path):
    model = tiny_gpt(pe, vocab_size=61)
    run = trained_run(tmp_path / "run", model)
    record = export_run(run, tmp_path / "hf", tokenizer="none")
    assert record["source"]["step"] == 7 and record["pe"] == model.config.pe
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").double().eval()
    assert isinstance(exported, pope.hf.PoPEGPTForCausalLM)
    ids = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = model.double()(ids)
        assert torch.equal(exported(ids).logits, expected)
        # cached greedy decoding through transformers' generate equals the GPT's own
        generated = exported.generate(ids[:1, :6], max_new_tokens=8, do_sample=False)
    assert torch.equal(generated, model.generate(ids[:1, :6], max_new_tokens=8, temperature=0))


def test_export_learned_absolute_positions_and_untied_head(tmp_path):
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=40, n_layer=1, n_head=2, d_model=16, max_seq_len=16, pe="learned-abs", tie_embeddings=False
    )
    model = GPT(config).eval()
    export_run(trained_run(tmp_path / "run", model), tmp_path / "hf", tokenizer="none")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").double().eval()
    assert exported.gpt.lm_head.weight is not exported.gpt.token_embedding.weight
    ids = torch.randint(0, 40, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, model.double()(ids)[0])
        with pytest.raises(ValueError, match="learned absolute position embeddings exist for positions < 16"):
            exported(torch.zeros(1, 17, dtype=torch.long))


def test_export_refuses_what_would_overwrite_or_mismatch(tmp_path, capsys):
    run = trained_run(tmp_path / "run", tiny_gpt(vocab_size=61))
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("keep me")
    assert main(["export", "hf", str(run), str(occupied)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("pope export hf: error: OUT") and "not empty" in error and "\n" not in error
    assert [p.name for p in occupied.iterdir()] == ["mine.txt"]
    assert main(["export", "hf", str(run), str(tmp_path / "hf"), "--tokenizer", "bytes"]) == 1
    error = capsys.readouterr().err.strip()
    assert "the bytes tokenizer has 256 ids but the model's vocabulary has 61" in error and "\n" not in error
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.partial-*"))
    assert main(["export", "hf", str(run), str(tmp_path / "hf")]) == 0  # auto: no tokenizer for 61 ids
    captured = capsys.readouterr()
    assert "no tokenizer written" in captured.out and not (tmp_path / "hf" / "tokenizer.json").exists()
    assert "\r" not in captured.err  # no progress-bar frames in a redirected log
    assert json.loads((tmp_path / "hf" / "pope_export.json").read_text())["tokenizer"] == "none"


def test_the_command_offers_the_exporters_tokenizers():
    from pope.cli.export import EXPORT_TOKENIZERS
    from pope.hf.export import TOKENIZERS

    assert EXPORT_TOKENIZERS == TOKENIZERS


def test_hf_config_validates_through_gpt_config():
    with pytest.raises(ValueError, match="d_model"):
        pope.hf.PoPEGPTConfig(d_model=30, n_head=4)
    config = pope.hf.PoPEGPTConfig(d_model=32, n_head=4, n_layer=3, max_seq_len=128)
    assert (config.hidden_size, config.num_hidden_layers, config.max_position_embeddings) == (32, 3, 128)
    assert config.gpt_config() == GPTConfig(vocab_size=256, n_layer=3, n_head=4, d_model=32, max_seq_len=128)


@pytest.mark.data
def test_gpt2_tokenizer_export_matches_tiktoken():
    from pope.eval.tokenizers import get_tokenizer

    hf = build_tokenizer("gpt2", vocab_size=50257, max_length=1024)
    reference = get_tokenizer("gpt2")
    text = "Hello world! It's 2024, and   spaces\n\nnewlines — unicode ✓ <|endoftext|> too."
    assert hf(text)["input_ids"] == reference.encode(text)
    assert hf.eos_token_id == 50256 and hf.decode(reference.encode(text)) == text
