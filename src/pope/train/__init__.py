"""Training: `pope train` over a Trainer built from components (data, schedule, optimizer, metrics,
checkpoint). See docs/training.md."""
from pope.train.config import RunConfig, TrainOptions, resolve_run_config
from pope.train.schedule import WarmupCosineSchedule

__all__ = ["RunConfig", "TrainOptions", "WarmupCosineSchedule", "resolve_run_config", "run_training", "Trainer"]


def __getattr__(name):  # the trainer imports torch-heavy pieces; load it on first use
    if name in ("Trainer", "run_training"):
        from pope.train import trainer
        return getattr(trainer, name)
    raise AttributeError(name)
