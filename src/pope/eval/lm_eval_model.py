"""An lm-evaluation-harness model named ``pope`` for checkpoints of this project and pope.hf model directories.

    pope eval downstream RUN_OR_HF_DIR --tasks ...  (in-process, the paper's table)
    python -m pope.eval.lm_eval_model --model pope --model_args path=RUN ...   (lm_eval's CLI, model registered)

Importing this module registers the class with lm-eval's registry (lm-eval up to 0.4.13 reads no entry-point group,
so the package declares none). Plain ``lm_eval --model hf`` scores a run once ``pope export hf`` has written it as a
transformers model directory (pope.hf.export).
``path`` is a run or checkpoint directory of this project (``pope train``) or a Hugging Face model directory
(``save_pretrained``: config.json with a model_type, e.g. pope.hf's "pope_llama"); the latter decodes with a
transformers DynamicCache, and ``tokenizer=hf`` takes the tokenizer saved in that directory.

Requests (all scoring is fp32 log-softmax over the model's logits):
* ``loglikelihood(context, continuation)``: the pair is encoded together and split where the context's
  own encoding ends (so word-boundary merges are scored as in the Hugging Face model); an empty context is
  replaced by the prefix token (GPT-2's end-of-text). Input = the last ``max_length`` tokens of
  context + continuation minus its final token; the continuation's log-probs are summed; ``is_greedy`` is
  True when every continuation token is the argmax. A continuation longer than ``max_length`` is refused.
* ``loglikelihood_rolling(text)``: lm-eval's rolling windows with ``context_len=1``: the text (prefixed by
  the prefix token) is cut into disjoint windows of ``max_length`` predicted tokens; every token is
  predicted exactly once, from the tokens of its own window only (no overlap between windows, except
  that the final window is moved left to hold a full ``max_length`` inputs and scores only its new
  tokens). ``max_length`` defaults to the model's training context (``config.max_seq_len``).
* ``generate_until(context, gen_kwargs)``: greedy decoding with the KV cache (sampling arguments are
  refused), stopping at any ``until`` string, at the end-of-text token or after ``max_gen_toks`` tokens;
  the context keeps its last ``max_length - max_gen_toks`` tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pope.eval.runs import load_run_model
from pope.eval.tokenizers import Tokenizer, get_tokenizer
from pope.optional import require
from pope.train.data_match import check_tokenizer, run_config_of

_lm_eval_api_model = require("lm_eval.api.model", "eval")
_lm_eval_registry = require("lm_eval.api.registry", "eval")
_lm_eval_utils = require("lm_eval.utils", "eval")


@_lm_eval_registry.register_model("pope")
class PoPELM(_lm_eval_api_model.LM):
    """lm-eval model over a trained GPT of this project.

    Arguments (``--model_args`` keys): path (run, checkpoint or Hugging Face model directory), tokenizer
    ("gpt2", "bytes", or "hf": the tokenizer saved in a Hugging Face model directory),
    device, batch_size, max_length (context window for scoring; default the training context),
    max_gen_toks (default 256). In-process users may pass ``model=`` (a GPT) and ``tokenizer=`` (a
    pope.eval.tokenizers.Tokenizer) instead of ``path``.
    """

    def __init__(
        self,
        path: str | None = None,
        tokenizer: str | Tokenizer = "gpt2",
        device: str = "cpu",
        batch_size: int | str | None = 1,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        model: torch.nn.Module | None = None,
        **unused,
    ):
        super().__init__()
        unused = {k: v for k, v in unused.items() if k not in ("max_batch_size", "trust_remote_code")}
        if unused:
            raise ValueError(
                f"unknown model_args for the pope model: {sorted(unused)}; valid: path, tokenizer, "
                f"device, batch_size, max_length, max_gen_toks"
            )
        if (path is None) == (model is None):
            raise ValueError("give the pope model exactly one of path=RUN_DIR (model_args) or model= (in-process)")
        self._device = torch.device(device or "cpu")
        if path is not None and isinstance(tokenizer, str) and tokenizer != "hf":
            check_tokenizer(path, run_config_of(path), tokenizer)  # the run's own tokenizer, before loading it
        if model is None:
            model = load_model_for_eval(path, self._device)
        self.model = model.to(self._device).eval()
        if tokenizer == "hf":
            tokenizer = hf_tokenizer(path)
        self.tokenizer = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        model_vocab = self.model.config.vocab_size
        if self.tokenizer.vocab_size > model_vocab:
            raise ValueError(
                f"vocabulary mismatch: tokenizer {self.tokenizer.name!r} has {self.tokenizer.vocab_size:,} "
                f"ids but the model has {model_vocab:,}; use the tokenizer the model was trained with"
            )
        self.max_length = int(max_length or self.model.config.max_seq_len)
        self.max_gen_toks = int(max_gen_toks)
        self.batch_size = _parse_batch_size(batch_size)
        if self.max_length < 2 or self.max_gen_toks < 1:
            raise ValueError(
                f"max_length must be >= 2 and max_gen_toks >= 1; got {self.max_length}, {self.max_gen_toks}"
            )

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def _score(self, pairs: list[tuple[list[int], list[int]]], desc: str = "") -> list[tuple[float, bool]]:
        """Sum of log-probs of each continuation given its context (token lists), and is_greedy.

        Each pair is cut to the last max_length + 1 tokens; sequences are sorted by length (longest
        first) and right-padded in batches — causal attention keeps padding from affecting real positions.
        """
        items = []
        for index, (context, continuation) in enumerate(pairs):
            if not continuation:
                items.append((index, [], 0))
                continue
            if len(continuation) > self.max_length:
                raise ValueError(
                    f"a continuation of {len(continuation)} tokens does not fit the context window of "
                    f"{self.max_length} tokens; raise max_length"
                )
            whole = (list(context) + list(continuation))[-(self.max_length + 1) :]
            items.append((index, whole, len(continuation)))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        order = sorted((item for item in items if item[2]), key=lambda item: -len(item[1]))
        for first in tqdm(
            range(0, len(order), self.batch_size),
            desc=desc or "pope loglikelihood",
            leave=False,
            disable=len(order) <= self.batch_size,
        ):
            batch = order[first : first + self.batch_size]
            width = max(len(whole) - 1 for _, whole, _ in batch)
            inputs = torch.zeros(len(batch), width, dtype=torch.long)  # (B, W) right-padded
            for row, (_, whole, _) in enumerate(batch):
                inputs[row, : len(whole) - 1] = torch.tensor(whole[:-1])
            logits = self.model(inputs.to(self._device))[0]  # (B, W, V)
            for row, (index, whole, n_cont) in enumerate(batch):
                n_inputs = len(whole) - 1
                targets = torch.tensor(whole[-n_cont:], device=self._device)  # (n_cont,)
                # (n_cont, V): the positions that predict the continuation, fp32 log-softmax
                rows = F.log_softmax(logits[row, n_inputs - n_cont : n_inputs].float(), dim=-1)
                total = rows.gather(-1, targets[:, None]).sum().item()
                greedy = bool((rows.argmax(-1) == targets).all())
                results[index] = (total, greedy)
        return results

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if context == "":
            return [self.tokenizer.prefix_token_id], self.tokenizer.encode(continuation)
        spaces = len(context) - len(context.rstrip())
        if spaces:  # word-boundary spaces belong to the continuation (as lm-eval expects)
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        context_ids = self.tokenizer.encode(context)
        return whole[: len(context_ids)], whole[len(context_ids) :]

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = [self._encode_pair(*request.args) for request in requests]
        results = self._score(pairs, desc="pope loglikelihood")
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        totals = []
        for request in requests:
            (text,) = request.args
            windows = [
                _lm_eval_utils.make_disjoint_window(window)
                for window in _lm_eval_utils.get_rolling_token_windows(
                    token_list=self.tokenizer.encode(text),
                    prefix_token=self.tokenizer.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            total = sum(score for score, _ in self._score(windows, desc="pope rolling"))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            totals.append(total)
        return totals

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_until(self, requests) -> list[str]:
        outputs = []
        for request in requests:
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen_toks = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
            if gen_kwargs.pop("do_sample", False) or float(gen_kwargs.pop("temperature", 0.0) or 0.0) > 0:
                raise ValueError("the pope lm-eval model decodes greedily only; remove do_sample/temperature")
            text = self._greedy(context, until, max_gen_toks)
            self.cache_hook.add_partial("generate_until", request.args, text)
            outputs.append(text)
        return outputs

    def _greedy(self, context: str, until: list[str], max_gen_toks: int) -> str:
        max_context = self.max_length - max_gen_toks
        if max_context < 1:
            raise ValueError(f"max_gen_toks ({max_gen_toks}) must be smaller than max_length ({self.max_length})")
        context_ids = (self.tokenizer.encode(context) if context else [self.tokenizer.prefix_token_id])[-max_context:]
        cache = self.model.new_kv_cache(1, len(context_ids) + max_gen_toks, device=self._device)
        logits = self.model(torch.tensor([context_ids], device=self._device), kv_cache=cache)[0]  # (1, T, V)
        generated: list[int] = []
        text = ""
        for _ in range(max_gen_toks):
            token = int(logits[0, -1].float().argmax())
            if token == self.tokenizer.stop_token_id:
                break
            generated.append(token)
            text = self.tokenizer.decode(generated)
            if any(stop in text for stop in until):
                break
            logits = self.model(torch.tensor([[token]], device=self._device), kv_cache=cache)[0]
        for stop in until:
            text = text.split(stop)[0] if stop else text
        return text


def is_hf_model_dir(path) -> bool:
    """True for a Hugging Face model directory (config.json with a model_type), not a pope run/checkpoint."""
    config = Path(path) / "config.json"
    if not config.is_file() or (Path(path) / "model_config.json").is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError):
        return False


def load_model_for_eval(path, device):
    """A pope run/checkpoint's GPT, or a Hugging Face causal LM (pope.hf registered) behind the GPT's interface."""
    if is_hf_model_dir(path):
        require("pope.hf", "hf", "Hugging Face model directories")
        transformers = require("transformers", "hf")
        return HFCausalLM(transformers.AutoModelForCausalLM.from_pretrained(str(path)))
    return load_run_model(path, device)[0]


class HFCausalLM(torch.nn.Module):
    """The interface PoPELM uses from a GPT — ``model(ids, kv_cache=cache) -> (logits (B, T, V), None)``,
    ``new_kv_cache(batch, max_len)``, ``config.vocab_size``, ``config.max_seq_len`` — over a transformers
    causal LM (max_seq_len: its max_position_embeddings); the cache is a transformers DynamicCache."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model
        hf_config = hf_model.config
        self.config = SimpleNamespace(
            vocab_size=hf_config.vocab_size, max_seq_len=getattr(hf_config, "max_position_embeddings", None) or 2048
        )

    def forward(self, ids: torch.Tensor, kv_cache=None):
        if kv_cache is None:
            return self.hf(input_ids=ids, use_cache=False).logits, None
        return self.hf(input_ids=ids, past_key_values=kv_cache, use_cache=True).logits, None

    def new_kv_cache(self, batch_size: int, max_len: int, device=None):
        return require("pope.hf.compat").new_dynamic_cache(self.hf.config)


def hf_tokenizer(path) -> Tokenizer:
    """The tokenizer saved in a Hugging Face model directory (AutoTokenizer), as a pope Tokenizer."""
    if path is None or not is_hf_model_dir(path):
        raise ValueError(
            "tokenizer=hf takes the tokenizer saved in a Hugging Face model directory; give path=DIR "
            "of such a directory, or tokenizer=gpt2 / bytes"
        )
    transformers = require("transformers", "hf")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise ValueError(
            f"no tokenizer could be loaded from {path} ({err}); save one with "
            f"tokenizer.save_pretrained(DIR) or pass tokenizer=gpt2 / bytes"
        ) from None
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if prefix is None:
        raise ValueError(f"the tokenizer in {path} has neither a BOS nor an EOS token to condition the first token on")
    return Tokenizer(
        name=f"hf:{path}",
        vocab_size=len(tok),
        prefix_token_id=prefix,
        stop_token_id=tok.eos_token_id,
        _encode=lambda text: tok.encode(text, add_special_tokens=False),
        _decode=tok.decode,
    )


def _parse_batch_size(batch_size) -> int:
    if batch_size in (None, "", "auto"):
        return 1
    if isinstance(batch_size, str) and batch_size.startswith("auto"):
        return 1
    value = int(batch_size)
    if value < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """lm-eval's own command line with the ``pope`` model registered (lm-eval does not load entry points)."""
    cli_evaluate = require("lm_eval.__main__").cli_evaluate
    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    return cli_evaluate() or 0


if __name__ == "__main__":
    sys.exit(main())
