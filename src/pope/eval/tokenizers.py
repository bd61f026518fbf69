"""Text tokenizers for the text-facing evaluation tools (lm-eval model, frequency analysis on a text file).

``get_tokenizer(name)``:
* ``"gpt2"`` (also ``"r50k_base"``): the GPT-2 BPE through tiktoken (vocabulary 50257, end-of-text 50256),
  the tokenizer of the OpenWebText presets. Offline, pope.data provides the byte-identical files.
* ``"bytes"``: UTF-8 bytes, ids 0..255, for byte-level models (and the tests); no end-of-text token, so
  id 0 (NUL) serves as the start-of-text prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pope.data.text import gpt2_encoding  # tiktoken's, from the offline files when they are there

TOKENIZER_NAMES = ("gpt2", "r50k_base", "bytes")


@dataclass(frozen=True)
class Tokenizer:
    name: str
    vocab_size: int
    prefix_token_id: int  # conditions the first token (end-of-text for GPT-2)
    stop_token_id: int | None  # generation stops here (None: no end-of-text token)
    _encode: Callable[[str], list[int]]
    _decode: Callable[[list[int]], str]

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids: list[int]) -> str:
        return self._decode(list(ids))


def get_tokenizer(name: str) -> Tokenizer:
    if name == "bytes":
        return Tokenizer(
            name="bytes",
            vocab_size=256,
            prefix_token_id=0,
            stop_token_id=None,
            _encode=lambda text: list(text.encode("utf-8")),
            _decode=lambda ids: bytes(ids).decode("utf-8", errors="replace"),
        )
    if name in ("gpt2", "r50k_base"):
        encoding = _gpt2_encoding()
        return Tokenizer(
            name="gpt2",
            vocab_size=encoding.n_vocab,
            prefix_token_id=encoding.eot_token,
            stop_token_id=encoding.eot_token,
            _encode=lambda text: encoding.encode(text, allowed_special="all"),
            _decode=encoding.decode,
        )
    raise ValueError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZER_NAMES)}")


def _gpt2_encoding():
    """tiktoken's GPT-2 encoding, from pope.data's offline copy of the files when it is available."""
    return gpt2_encoding()
