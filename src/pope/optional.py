"""Optional heavy libraries (music21, miditok, tiktoken, datasets, safetensors, lm_eval, matplotlib...),
imported inside the functions that need them so that `import pope` stays light."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or fail with the pip command that installs it (the package extra ``extra``)."""
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
    matplotlib = require("matplotlib", "eval", "plots")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
