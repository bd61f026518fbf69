"""What pope.hf's ``save_pretrained`` writes so that transformers loads the model in any process.

A directory saved by a pope.hf model holds, beside its weights, ``configuration_pope.py`` and ``modeling_pope.py``
(copied from ``pope/hf/remote_code/``), and its config.json an ``auto_map`` naming their classes. transformers'
remote-code loading (``trust_remote_code=True``) then finds the model without ``import pope.hf`` first:
``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``, ``pipeline("text-generation", path,
trust_remote_code=True)``, and lm-eval's ``--model hf --model_args pretrained=PATH,trust_remote_code=True``.

The two files import the installed pope-attention package and hold no copy of it: the model's attention is
``pope.pope_attention`` (the fused Triton kernels on CUDA) and every positional encoding of pope.encodings, which a
standalone copy would have to duplicate and keep equal. So loading needs pope-attention installed where the
checkpoint is used; without it the import fails with one line saying what to install.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REMOTE_CODE_DIR = Path(__file__).with_name("remote_code")
CONFIGURATION_FILE = "configuration_pope.py"
MODELING_FILE = "modeling_pope.py"


def auto_map(config_class: str, model_classes: dict[str, str]) -> dict[str, str]:
    """config.json's ``auto_map``: AutoConfig -> the configuration file's class, each Auto model class -> the
    modeling file's class of that name."""
    return {
        "AutoConfig": f"{Path(CONFIGURATION_FILE).stem}.{config_class}",
        **{auto: f"{Path(MODELING_FILE).stem}.{name}" for auto, name in model_classes.items()},
    }


def write_remote_code(directory: str | os.PathLike) -> list[Path]:
    """Copy the two remote-code files into ``directory`` (created if missing); returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in (CONFIGURATION_FILE, MODELING_FILE):
        shutil.copyfile(REMOTE_CODE_DIR / name, directory / name)
        written.append(directory / name)
    return written


class RemoteCodeConfig:
    """Mixin for a pope.hf config class (listed before the transformers config class).

    The class names its importable config class (``remote_config``) and its model classes by Auto class
    (``remote_models``); ``set_auto_map()`` (called at the end of ``__init__``) records them in ``auto_map``, and
    ``save_pretrained`` writes the remote-code files beside config.json."""

    remote_config = ""
    remote_models: dict[str, str] = {}

    def set_auto_map(self) -> None:
        self.auto_map = auto_map(self.remote_config, self.remote_models)

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """transformers' save_pretrained, with configuration_pope.py and modeling_pope.py written first (so a push
        to the hub uploads them too)."""
        write_remote_code(save_directory)
        return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoConfig") -> None:
        """A no-op: transformers calls it on classes it loads as remote code, and a class registered so would
        make the next save copy its defining module (a file of this package) into the directory instead of
        the remote-code files; the ``auto_map`` is already set."""


class RemoteCodeModel:
    """Mixin for a pope.hf model class: see RemoteCodeConfig.register_for_auto_class."""

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModel") -> None:
        """A no-op (see RemoteCodeConfig.register_for_auto_class)."""
