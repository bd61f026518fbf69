"""Training: `pope train` over a Trainer built from components (data, schedule, optimizer, metrics,
checkpoint). See docs/training.md."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RunConfig": "run_config",
    "TrainOptions": "run_config",
    "resolve_run_config": "run_config",
    "WarmupDecaySchedule": "schedule",
    "Trainer": "trainer",
    "run_training": "trainer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    # Names load on first use: the config and trainer import torch, and light tools such as
    # pope.train.sweep.run_finished (which shell scripts call once per run) must not pay for that.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pope.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pope.train.{module}"), name)
