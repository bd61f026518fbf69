"""Learning-rate schedule: linear warmup, then a cosine or linear decay to a minimum learning rate.

    step < warmup:            lr = peak * (step + 1) / warmup        (never 0, reaches peak at warmup-1)
    warmup <= step <= total:  lr = min + (peak - min) * f(progress),
                              progress = (step - warmup) / (total - warmup),
                              f = (1 + cos(pi * progress)) / 2   (decay="cosine")
                              f = 1 - progress                   (decay="linear")
    step > total:             lr = min

``step`` is the index of the optimiser step about to be taken (0-based), so the first update uses
``peak / warmup`` and the last (step ``total - 1``) uses a value just above ``min``. Both shapes have the
same mean learning rate over the decay; the cosine spends more of it early, the line more of it late.

Extending a run (``--resume`` with a larger ``recipe.max_steps``) keeps the schedule it was trained with, stored
in its checkpoints: the decay still ends at the original ``total``, and the added steps run at ``min`` (the
``step > total`` line). Every step already taken, and every step an unextended run would take, keeps its
learning rate, and a finished run continues from where its learning rate ended, without a jump back up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pope.presets import DECAY_SHAPES


@dataclass(frozen=True)
class WarmupDecaySchedule:
    peak_lr: float
    min_lr: float
    warmup_steps: int
    total_steps: int
    decay: str = "cosine"

    def __post_init__(self) -> None:
        if not (self.peak_lr > 0 and 0 <= self.min_lr <= self.peak_lr):
            raise ValueError(
                f"need 0 <= min_lr <= peak_lr and peak_lr > 0, got peak_lr={self.peak_lr}, min_lr={self.min_lr}"
            )
        if not (0 <= self.warmup_steps <= self.total_steps and self.total_steps >= 1):
            raise ValueError(
                f"need 0 <= warmup_steps <= total_steps and total_steps >= 1, got "
                f"warmup_steps={self.warmup_steps}, total_steps={self.total_steps}"
            )
        if self.decay not in DECAY_SHAPES:
            raise ValueError(f"decay must be one of {', '.join(DECAY_SHAPES)}; got {self.decay!r}")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if step >= self.total_steps:
            return self.min_lr
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        remaining = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.decay == "cosine" else 1.0 - progress
        return self.min_lr + (self.peak_lr - self.min_lr) * remaining

    def state_dict(self) -> dict:
        return {
            "peak_lr": self.peak_lr,
            "min_lr": self.min_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
        }


def fit_warmup(warmup_steps: int, max_steps: int, schedule_steps: int, *, what: str) -> tuple[int, str | None]:
    """The warmup for a run of ``max_steps`` steps whose recipe warms up for ``warmup_steps`` of ``schedule_steps``:
    unchanged when it fits, else the same fraction of the run (at least 1 step), with the notice to print (None when
    unchanged). ``what`` names the shortened setting in the notice, e.g. "recipe.max_steps=2". One rule for
    ``pope train --set recipe.max_steps=N`` and ``pope finetune --steps N``."""
    if warmup_steps <= max_steps:
        return warmup_steps, None
    scaled = min(max_steps, max(1, round(warmup_steps * max_steps / max(schedule_steps, 1))))
    notice = (
        f"{what} is shorter than the warmup ({warmup_steps} of {schedule_steps} steps): warmup scaled to "
        f"{scaled} step{'s' if scaled != 1 else ''}, the same fraction of the run; set the warmup to choose another"
    )
    return scaled, notice
