"""Learning-rate schedules: pure functions (step, total_steps) -> multiplier of the base lr.

Registered by name; the config's schedule section picks one and sets its options:

    schedule: {name: trapezoidal, warmup_steps: 100, cooldown_frac: 0.4, floor: 0.0}
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from pydantic import Field

from littlelm.config import ComponentConfig
from littlelm.registry import SCHEDULES

Schedule = Callable[[int, int], float]


def _warmup(step: int, warmup_steps: int) -> float:
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def trapezoidal(
    step: int, total: int, warmup_steps: int = 0, cooldown_frac: float = 0.4, floor: float = 0.0
) -> float:
    """Linear warmup, hold at 1, then linear cooldown to `floor` over the last cooldown_frac."""
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    cooldown = max(1, round(cooldown_frac * total)) if cooldown_frac > 0 else 0
    start = total - cooldown
    if step < start or cooldown == 0:
        return 1.0
    progress = min(1.0, (step - start + 1) / cooldown)
    return 1.0 + (floor - 1.0) * progress


def cosine(step: int, total: int, warmup_steps: int = 0, floor: float = 0.0) -> float:
    """Linear warmup, then half a cosine from 1 down to `floor` at the last step."""
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    span = max(1, total - warmup_steps)
    progress = min(1.0, (step - warmup_steps + 1) / span)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def constant(step: int, total: int, warmup_steps: int = 0) -> float:
    """Linear warmup, then 1."""
    return _warmup(step, warmup_steps)


def momentum_warmup(step: int, start: float, end: float, steps: int) -> float:
    """Muon momentum rising linearly from `start` to `end` over `steps` optimizer steps."""
    if steps <= 0:
        return end
    return start + (end - start) * min(1.0, step / steps)


class TrapezoidalConfig(ComponentConfig):
    warmup_steps: int = Field(0, description="Steps of linear warmup from 0.", ge=0)
    cooldown_frac: float = Field(
        0.4, description="Fraction of the run spent cooling down.", ge=0, le=1
    )
    floor: float = Field(
        0.0, description="Multiplier reached at the end of the cooldown.", ge=0, le=1
    )


class CosineConfig(ComponentConfig):
    warmup_steps: int = Field(0, description="Steps of linear warmup from 0.", ge=0)
    floor: float = Field(0.0, description="Multiplier reached at the last step.", ge=0, le=1)


class ConstantConfig(ComponentConfig):
    warmup_steps: int = Field(0, description="Steps of linear warmup from 0.", ge=0)


def build_schedule(cfg: ComponentConfig) -> Schedule:
    fn = SCHEDULES.get(cfg.name)
    options = cfg.model_dump(exclude={"name"})
    return functools.partial(fn, **options)
