"""Where the project's data live: the cache of downloaded sources and prepared datasets ($POPE_CACHE) and the
directory dataset names resolve under ($POPE_DATA_DIR). Read from the environment at every call."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$POPE_CACHE, default ~/.cache/pope: downloaded sources and prepared datasets live below it."""
    return Path(os.environ.get("POPE_CACHE") or Path.home() / ".cache" / "pope").expanduser()


def data_root() -> Path:
    """Where dataset *names* resolve: $POPE_DATA_DIR, else $POPE_CACHE/data (default ~/.cache/pope/data)."""
    explicit = os.environ.get("POPE_DATA_DIR")
    return Path(explicit).expanduser() if explicit else cache_root() / "data"
