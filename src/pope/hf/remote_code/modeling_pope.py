"""Models of the pope-attention package for transformers' ``trust_remote_code=True`` (see configuration_pope.py).

pope.hf's ``save_pretrained`` writes this file beside config.json; the classes are the installed package's own.
"""

try:  # transformers lists a remote file's imports outside try blocks as requirements; this one says its own error
    from pope.hf import PoPEGPTForCausalLM, PoPELlamaForCausalLM, PoPELlamaModel
except ModuleNotFoundError as err:
    if err.name != "pope":
        raise
    raise ImportError(
        "this checkpoint's model code is the pope-attention package, which is not installed in this "
        "environment: pip install 'pope-attention[hf]' (from a clone of pope: pip install -e '.[hf]')"
    ) from None

__all__ = ["PoPEGPTForCausalLM", "PoPELlamaForCausalLM", "PoPELlamaModel"]
