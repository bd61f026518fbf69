"""`pope export hf RUN OUT`: a `pope train` run as a transformers model directory that stock tools load.

    pope export hf runs/owt-pope exported/owt-pope
    lm_eval --model hf --model_args pretrained=exported/owt-pope,trust_remote_code=True --tasks lambada_openai

OUT holds a PoPEGPTForCausalLM (pope.hf.gpt: the run's GPT itself, same weights, equal logits), the remote-code
files and auto_map that let ``AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)`` load it in any
process with pope-attention installed (pope.hf.remote), a tokenizer where the run has a text one, and
``pope_export.json`` (the source checkpoint, its step and the provenance). The directory is written under a temporary
name and renamed into place: OUT is either complete or absent, and an existing non-empty OUT is refused, never
overwritten.

Tokenizers (``tokenizer=``):
* ``"gpt2"``: the GPT-2 BPE (OpenWebText and the text presets), built from the offline files `make data` fetches
  (pope.data.offline "gpt2-tokenizer"), byte-identical to tiktoken's; end-of-text (50256) is bos, eos and pad.
* ``"bytes"``: UTF-8 bytes as ids 0..255 (byte-level models); id 0 (NUL) is bos, eos and pad, as the prefix token of
  pope.eval.tokenizers' "bytes".
* ``"none"``: no tokenizer (the music and genome presets' vocabularies are not text); give lm-eval one with its
  ``tokenizer=`` model argument.
* ``"auto"`` (default): gpt2 when the model's vocabulary is GPT-2's 50257 ids, else none.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # a dependency of transformers

from pope.checkpoint import load_model
from pope.data.offline import TIKTOKEN_ENCODER_JSON_NAME, TIKTOKEN_VOCAB_BPE_NAME, source_path
from pope.files import check_output_dir
from pope.hf.compat import transformers
from pope.hf.gpt import PoPEGPTConfig, PoPEGPTForCausalLM
from pope.provenance import portable_path, provenance

TOKENIZERS = ("auto", "gpt2", "bytes", "none")
GPT2_VOCAB_SIZE = 50257
GPT2_END_OF_TEXT = "<|endoftext|>"
EXPORT_RECORD = "pope_export.json"


def export_run(
    run: str | os.PathLike, out: str | os.PathLike, *, tokenizer: str = "auto", progress_bars: bool = True
) -> dict:
    """Write ``run``'s model (a run directory: its best checkpoint if it has one, else its last; or a checkpoint
    directory) to the new directory ``out``; returns the record also written to ``out/pope_export.json``.
    ``progress_bars=False`` silences transformers' progress bars (for a log that is not a terminal)."""
    if not progress_bars:
        transformers.utils.logging.disable_progress_bar()
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZERS)}")
    out = Path(out).expanduser()
    check_output_dir(out, what="OUT")
    if out.is_dir() and any(out.iterdir()):
        raise FileExistsError(f"OUT {out} already exists and is not empty; give a new directory (nothing is replaced)")
    model, info = load_model(run, map_location="cpu")
    vocab_size = model.config.vocab_size
    name = ("gpt2" if vocab_size == GPT2_VOCAB_SIZE else "none") if tokenizer == "auto" else tokenizer
    hf_tokenizer = build_tokenizer(name, vocab_size=vocab_size, max_length=model.config.max_seq_len)
    special = {}
    if hf_tokenizer is not None:  # tokenizer_class: how transformers' pipeline finds the tokenizer of a custom model
        special = {"bos_token_id": hf_tokenizer.bos_token_id, "eos_token_id": hf_tokenizer.eos_token_id}
        special.update(pad_token_id=hf_tokenizer.pad_token_id, tokenizer_class=type(hf_tokenizer).__name__)
    hf_model = PoPEGPTForCausalLM(PoPEGPTConfig.from_gpt_config(model.config, **special))
    hf_model.gpt.load_state_dict(model.state_dict())
    hf_model.eval()
    record = {
        "source": {"run": portable_path(str(run)), "checkpoint": portable_path(info["path"]), "step": info["step"]},
        "tokenizer": name,
        "model_type": PoPEGPTConfig.model_type,
        "pe": model.config.pe,
        **provenance("cpu"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        hf_model.save_pretrained(partial)
        if hf_tokenizer is not None:
            hf_tokenizer.save_pretrained(partial)
        (partial / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if out.is_dir():  # empty (checked above): the rename replaces it
            out.rmdir()
        os.replace(partial, out)
    finally:
        if partial.exists():
            shutil.rmtree(partial)
    return record


def build_tokenizer(name: str, *, vocab_size: int, max_length: int):
    """A transformers tokenizer ``name`` ("gpt2", "bytes" or "none": None) for a model of ``vocab_size`` ids;
    ValueError when the vocabularies differ."""
    if name == "none":
        return None
    needed = {"gpt2": GPT2_VOCAB_SIZE, "bytes": 256}[name]
    if vocab_size != needed:
        raise ValueError(
            f"the {name} tokenizer has {needed} ids but the model's vocabulary has {vocab_size}; choose "
            f"--tokenizer none (and give lm-eval a tokenizer matching the model) or the model's own tokenizer"
        )
    if name == "bytes":
        alphabet = bytes_to_unicode()
        raw = Tokenizer(models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        raw.decoder = decoders.ByteLevel()
        special = alphabet[0]
    else:
        encoder, merges = gpt2_bpe_files()
        raw = Tokenizer(models.BPE.from_file(str(encoder), str(merges)))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        raw.decoder = decoders.ByteLevel()
        special = GPT2_END_OF_TEXT
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=special, eos_token=special, pad_token=special, model_max_length=max_length
    )


def gpt2_bpe_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) of GPT-2 from the offline source `make data` fetches (tiktoken's cache names)."""
    directory = source_path("gpt2-tokenizer")  # FileNotFoundError with the fetch command when absent
    return directory / TIKTOKEN_ENCODER_JSON_NAME, directory / TIKTOKEN_VOCAB_BPE_NAME


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (printable bytes as themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}
