"""Result files are written atomically (temporary file + rename), so a crash never leaves half a table."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_json_atomic(path: str | os.PathLike, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, allow_nan=True) + "\n")


def savefig_atomic(fig, path: str | os.PathLike, **kwargs) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    fig.savefig(tmp, **kwargs)
    os.replace(tmp, path)
    return path
