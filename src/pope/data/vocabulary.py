"""Whether data fit a model's vocabulary: checked before a model scores or trains on them (pope eval length, the
trainer), so a mismatch is one clear error instead of an index error deep inside the embedding."""

from __future__ import annotations

import numpy as np


def check_vocab_compatible(data_vocab_size: int, model_vocab_size: int, *, data_name: str = "the data") -> None:
    """Refuse to score data with a vocabulary the model was not built for.

    A model whose vocabulary is larger than the data's (e.g. padded to a multiple of 64) can score it;
    a smaller one cannot, and equal sizes are the normal case. The data's maximum token id is checked
    separately by :func:`check_token_range`.
    """
    if int(data_vocab_size) > int(model_vocab_size):
        raise ValueError(
            f"vocabulary mismatch: {data_name} has {data_vocab_size:,} token ids but the model's vocabulary has "
            f"{model_vocab_size:,}; this model was trained on another tokenisation. Evaluate it on data "
            f"prepared with its own tokenizer."
        )


def check_token_range(tokens: np.ndarray, model_vocab_size: int, *, data_name: str = "the data") -> None:
    max_token = int(tokens.max(initial=0)) if tokens.size else 0
    if max_token >= model_vocab_size:
        raise ValueError(
            f"vocabulary mismatch: {data_name} contains token id {max_token:,} but the model only has "
            f"{model_vocab_size:,} ids; evaluate it on data prepared with its own tokenizer."
        )
