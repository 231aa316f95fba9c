"""Learning-rate schedules, in one form: a pure function (step, progress) -> multiplier of the
base lr, where progress in [0, 1] is how far through the run the end of this step is (1: the
last step).

A run bounded by steps knows its progress exactly, (step + 1) / train.max_steps (`step_progress`,
a fraction, so that a cooldown of a whole number of steps starts and ends on step boundaries); a
run with a time or money budget gets it from measured speed (train/budget.py). Both call the same
function, so a budget run follows the curve a step run of the same config does. The warmup counts
steps (both kinds of run know them); the decay phase follows progress and reaches its final value
exactly at progress 1, even inside the warmup.

Registered by name; the config's schedule section picks one and sets its options:

    schedule: {name: trapezoidal, warmup_steps: 100, cooldown_frac: 0.4, floor: 0.0}
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

from pydantic import Field

from littlelm.config import ComponentConfig
from littlelm.registry import SCHEDULES

Schedule = Callable[[int, float], float]  # (step, progress in [0, 1]) -> multiplier


def step_progress(step: int, max_steps: int) -> Fraction:
    """The progress of step `step` (0-based) in a run of `max_steps` steps, exactly."""
    return Fraction(step + 1, max_steps)


def _warmup(step: int, warmup_steps: int) -> float:
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def trapezoidal(
    step: int,
    progress: float,
    warmup_steps: int = 0,
    cooldown_frac: float = 0.4,
    floor: float = 0.0,
) -> float:
    """Linear warmup, hold at 1, then a linear cooldown to `floor` over the last cooldown_frac of
    the run (from progress 1 - cooldown_frac to 1)."""
    if step < warmup_steps and progress < 1:
        return _warmup(step, warmup_steps)
    frac = Fraction(repr(cooldown_frac))  # the decimal it names (0.4 = 2/5): 64 of 160 steps
    if frac == 0 or progress <= 1 - frac:
        return 1.0
    done = min(1.0, float((progress - (1 - frac)) / frac))  # share of the cooldown behind us
    return 1.0 + (floor - 1.0) * done


def cosine(step: int, progress: float, warmup_steps: int = 0, floor: float = 0.0) -> float:
    """Linear warmup, and half a cosine from 1 at progress 0 to `floor` at progress 1 (the
    warmup's steps are inside that span: the curve goes on where the warmup ends)."""
    if step < warmup_steps and progress < 1:
        return _warmup(step, warmup_steps)
    p = min(1.0, float(progress))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def constant(step: int, progress: float, warmup_steps: int = 0) -> float:
    """Linear warmup, then 1 (no decay phase: the last step keeps the full lr)."""
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
    """The schedule `cfg` names, with its options: (step, progress) -> multiplier."""
    fn = SCHEDULES.get(cfg.name)
    return functools.partial(fn, **cfg.model_dump(exclude={"name"}))
