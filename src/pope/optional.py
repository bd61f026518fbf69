"""The optional heavy libraries, listed in one place (`OPTIONAL`: what pope imports -> the package extra that
installs it), and the one way pope imports them: `require(module)`, inside the function that needs the library, so
that `import pope`, `pope --help` and `pope data ...` stay light and a missing library fails with the pip command
that installs it.

Two packages exist for one of these libraries and import it at their top: pope.hf (transformers, through `require`
first) and the kernel modules of pope.kernels (triton); pope reaches them only where they are needed (pope.kernels'
lazy names, `require("pope.hf")`). Nothing else in pope imports a listed library directly (the import-linter contract
"Optional libraries only through pope.optional" in pyproject.toml, and tests/test_imports.py, check it).
"""

from __future__ import annotations

import importlib
from types import ModuleType

OPTIONAL = {
    "triton": "triton",  # the fused kernels (pope.kernels); without it the reference backend runs
    "flash_attn": "flash-attn-4",  # backend "flash-attn-4" (flash-attn-4's CuTe DSL kernels, module flash_attn.cute)
    "safetensors": "train",  # checkpoint weights (pope.checkpoint)
    "torch.utils.tensorboard": "train",  # TensorBoard logging (needs the tensorboard package)
    "matplotlib": "eval",  # plots (also in the train extra)
    "music21": "data",  # the JSB chorales builder
    "miditok": "data",  # MAESTRO's REMI tokenisation
    "symusic": "data",  # miditok's MIDI reader
    "tiktoken": "data",  # the GPT-2 BPE
    "datasets": "data",  # Hugging Face dataset streaming (OpenWebText, PG-19, genome sources)
    "lm_eval": "eval",  # lm-evaluation-harness (pope eval downstream)
    "transformers": "hf",  # pope.hf
    "pope.hf": "hf",  # pope.hf needs transformers
    "pytest": "dev",  # pope.testing's kernel-test set-up
}
"""Each optional library pope imports (a top-level package, or a module where only it is optional) and the extra
of pope-attention that installs it: ``pip install 'pope-attention[EXTRA]'``."""


def extra_of(module: str) -> str:
    """The extra that installs ``module`` (a listed name or a submodule of one); KeyError for an unlisted one."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        extra = OPTIONAL.get(".".join(parts[:end]))
        if extra is not None:
            return extra
    raise KeyError(f"{module!r} is not an optional library of pope (pope.optional.OPTIONAL)")


def require(module: str, extra: str | None = None, purpose: str = "") -> ModuleType:
    """Import ``module`` or fail with the pip command that installs it (the package extra ``extra``, by default the
    one `OPTIONAL` lists for it)."""
    extra = extra or extra_of(module)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        needed_for = f" ({purpose})" if purpose else ""
        raise ModuleNotFoundError(
            f"{module!r} is needed here{needed_for} but not installed; install it with: "
            f"pip install 'pope-attention[{extra}]'",
            name=err.name,
        ) from err


def pyplot():
    """matplotlib.pyplot with the non-interactive Agg backend (plots are written to files)."""
    matplotlib = require("matplotlib", purpose="plots")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
