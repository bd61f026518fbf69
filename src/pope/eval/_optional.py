"""Optional heavy libraries, imported inside the functions that need them."""
from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or fail with the pip command that installs it (the package extra ``extra``)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            f"{module!r} is needed here but not installed; install it with: pip install 'pope-attention[{extra}]'",
            name=err.name,
        ) from err


def pyplot():
    """matplotlib.pyplot with the non-interactive Agg backend (plots are written to files)."""
    matplotlib = require("matplotlib", "eval")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
