"""Everything in pope.hf that depends on the transformers version, in one place.

Supported: transformers >= 4.50 (4.x) and 5.x. ``check_version`` raises ImportError with one line naming the
supported versions for anything older; the differences handled here:

* the outputs' cache field and forward argument: ``past_key_values``, renamed ``cache`` in 5.24;
* ``DynamicCache(config=...)`` from 4.56 on, ``DynamicCache()`` before;
* ``_tied_weights_keys``: a list of names in 4.x, a {target: source} dict in 5.x;
* the hook that picks ``attn_implementation``: ``_check_and_adjust_attn_implementation`` (4.54+),
  ``_autoset_attn_implementation`` (4.50-4.53).
"""

from __future__ import annotations

import re

from pope.optional import require

MINIMUM = (4, 50)
SUPPORTED = "transformers >= 4.50 (4.x) or 5.x"


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "4.50.3", "5.0.0rc1" or "4.57.0.dev0"."""
    match = re.match(r"(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise ImportError(f"pope.hf cannot read the transformers version {version!r}; it needs {SUPPORTED}")
    return int(match[1]), int(match[2] or 0)


def check_version(version: str) -> tuple[int, int]:
    """(major, minor) of a supported transformers ``version``; ImportError naming the supported ones otherwise."""
    parsed = parse_version(version)
    if parsed < MINIMUM:
        raise ImportError(
            f"pope.hf needs {SUPPORTED}; found transformers {version}. Upgrade with: "
            f"pip install -U 'pope-attention[hf]'"
        )
    return parsed


transformers = require("transformers", "hf", "pope.hf")
VERSION = check_version(transformers.__version__)

from transformers.cache_utils import DynamicCache  # noqa: E402  (after the version check)
from transformers.modeling_outputs import BaseModelOutputWithPast  # noqa: E402

# transformers 5.24 renamed the outputs' past_key_values field (and the forward argument) to `cache`.
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def new_dynamic_cache(config) -> DynamicCache:
    """An empty DynamicCache for ``config``'s model."""
    return DynamicCache(config=config) if VERSION >= (4, 56) else DynamicCache()


def tied_weights_keys(target: str, source: str):
    """``_tied_weights_keys`` saying ``target`` is tied to ``source``."""
    return {target: source} if VERSION >= (5, 0) else [target]


class EagerAttentionOnly:
    """Mixin for a PreTrainedModel whose attention is its own: an ``attn_implementation`` other than "eager" is
    refused by ``refuse_attn_implementation(requested)`` (the class supplies it; requested None: the default).
    transformers asks through a different hook in each version range; each one here sees the user's request."""

    def _check_and_adjust_attn_implementation(self, attn_implementation, is_init_check: bool = False, **kwargs):
        """transformers >= 4.54 (4.55 maps the default None to "sdpa" before get_correct_attn_implementation)."""
        return self.refuse_attn_implementation(attn_implementation)

    def get_correct_attn_implementation(self, requested_attention, is_init_check: bool = False) -> str:
        """transformers >= 4.56, when called other than through the hook above."""
        return self.refuse_attn_implementation(requested_attention)

    @classmethod
    def _autoset_attn_implementation(cls, config, *args, **kwargs):
        """transformers < 4.54 (later versions never call it)."""
        cls.refuse_attn_implementation(getattr(config, "_attn_implementation_internal", None))
        config._attn_implementation = "eager"
        return config
