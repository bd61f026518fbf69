"""Configurations of the pope-attention package's Hugging Face models, for ``trust_remote_code=True``.

pope.hf's ``save_pretrained`` writes this file and modeling_pope.py beside config.json, whose ``auto_map`` names
their classes, so that transformers loads the model in any process: ``AutoModelForCausalLM.from_pretrained(path,
trust_remote_code=True)``, ``pipeline``, lm-eval's ``--model hf``. The classes are the installed package's own
(pope.hf); this file holds no copy of them.
"""

try:  # transformers lists a remote file's imports outside try blocks as requirements; this one says its own error
    from pope.hf import PoPEGPTConfig, PoPELlamaConfig
except ModuleNotFoundError as err:
    if err.name != "pope":
        raise
    raise ImportError(
        "this checkpoint's model code is the pope-attention package, which is not installed in this "
        "environment: pip install 'pope-attention[hf]' (from a clone of pope: pip install -e '.[hf]')"
    ) from None

__all__ = ["PoPEGPTConfig", "PoPELlamaConfig"]
