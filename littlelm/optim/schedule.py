"""Learning-rate schedules: pure functions (step, total_steps) -> multiplier of the base lr.

Registered by name; the config's schedule section picks one and sets its options:

    schedule: {name: trapezoidal, warmup_steps: 100, cooldown_frac: 0.4, floor: 0.0}

A run with a time or money budget (train.budget) does not know its step count in advance, so each
schedule also has a progress form, (step, progress) -> multiplier, where progress in [0, 1] is how
far through the run the end of this step is and 1 means the last step (train/budget.py answers it
from measured speed). Warmup still counts steps; the decay phase follows progress and reaches its
final value exactly at progress 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from pydantic import Field

from littlelm.config import ComponentConfig
from littlelm.registry import SCHEDULES

Schedule = Callable[[int, int], float]
ProgressSchedule = Callable[[int, float], float]  # (step, progress in [0, 1]) -> multiplier


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


def trapezoidal_at(
    step: int,
    progress: float,
    warmup_steps: int = 0,
    cooldown_frac: float = 0.4,
    floor: float = 0.0,
) -> float:
    """trapezoidal driven by progress: the cooldown starts when the run is 1 - cooldown_frac of
    the way through and reaches `floor` at progress 1 (the last step, even inside the warmup)."""
    if progress >= 1.0:
        return floor if cooldown_frac > 0 else 1.0
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    start = 1.0 - cooldown_frac
    if cooldown_frac == 0 or progress < start:
        return 1.0
    return 1.0 + (floor - 1.0) * (progress - start) / cooldown_frac


def cosine_at(step: int, progress: float, warmup_steps: int = 0, floor: float = 0.0) -> float:
    """cosine driven by progress: half a cosine from 1 at progress 0 to `floor` at progress 1
    (the warmup's steps are inside that span, so the curve goes on where the warmup ends)."""
    if progress >= 1.0:
        return floor
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * max(0.0, progress)))


def constant_at(step: int, progress: float, warmup_steps: int = 0) -> float:
    """constant driven by progress (no decay phase: the last step keeps the full lr)."""
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


# The progress form of each registered schedule (a schedule without one cannot follow a budget).
PROGRESS_FORMS: dict[str, ProgressSchedule] = {
    "trapezoidal": trapezoidal_at,
    "cosine": cosine_at,
    "constant": constant_at,
}


def build_schedule(cfg: ComponentConfig) -> Schedule:
    fn = SCHEDULES.get(cfg.name)
    options = cfg.model_dump(exclude={"name"})
    return functools.partial(fn, **options)


def build_progress_schedule(cfg: ComponentConfig) -> ProgressSchedule:
    """The schedule `cfg` names, driven by progress through the run (see the module doc)."""
    fn = PROGRESS_FORMS.get(cfg.name)
    assert fn is not None, f"schedule {cfg.name!r} has no progress form (checked in resolve)"
    return functools.partial(fn, **cfg.model_dump(exclude={"name"}))
