"""Learning-rate schedules, in one form: a pure function (step, progress) -> multiplier of the
base lr, where progress in [0, 1] is how far through the run the end of this step is (1: the
last step).

A run bounded by steps knows its progress exactly, (step + 1) / train.max_steps (`step_progress`,
a fraction, so that a cooldown of a whole number of steps starts and ends on step boundaries); a
run with a time or money budget gets it from measured speed (train/budget.py). Both call the same
function, so a budget run follows the curve a step run of the same config does. The warmup counts
steps (both kinds of run know them); the decay phase follows progress and reaches its final value
exactly at progress 1, even inside the warmup.

The config's schedule section picks one by name (`ScheduleChoice`) and sets its options; the
config builds the function (`cfg.build()`):

    schedule: {name: trapezoidal, warmup_steps: 100, cooldown_frac: 0.4, floor: 0.0}

The rest of a step's rates are schedules too: the Muon momentum warmup, and in a grown run the
lr multiplier of each origin tag (`grow.lr_multipliers`, below). `GroupSchedule` holds all three
for a run and sets them on the optimizer's groups each step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Literal

from pydantic import Field

from littlelm.config import Cfg, ComponentConfig, named

# how far through the run: exact for a run of known steps (step_progress), measured under a
# time budget (train/budget.py)
Progress = float | Fraction
Schedule = Callable[[int, Progress], float]  # (step, progress in [0, 1]) -> multiplier


def step_progress(step: int, max_steps: int) -> Fraction:
    """The progress of step `step` (0-based) in a run of `max_steps` steps, exactly."""
    return Fraction(step + 1, max_steps)


def _warmup(step: int, warmup_steps: int) -> float:
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def trapezoidal(
    step: int,
    progress: Progress,
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


def cosine(step: int, progress: Progress, warmup_steps: int = 0, floor: float = 0.0) -> float:
    """Linear warmup, and half a cosine from 1 at progress 0 to `floor` at progress 1 (the
    warmup's steps are inside that span: the curve goes on where the warmup ends)."""
    if step < warmup_steps and progress < 1:
        return _warmup(step, warmup_steps)
    p = min(1.0, float(progress))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def constant(step: int, progress: Progress, warmup_steps: int = 0) -> float:
    """Linear warmup, then 1 (no decay phase: the last step keeps the full lr)."""
    return _warmup(step, warmup_steps)


def momentum_warmup(step: int, start: float, end: float, steps: int) -> float:
    """Muon momentum rising linearly from `start` to `end` over `steps` optimizer steps."""
    if steps <= 0:
        return end
    return start + (end - start) * min(1.0, step / steps)


class ScheduleConfig(ComponentConfig):
    """Base of a schedule's config: its options are the keyword arguments of its function."""

    def build(self) -> Schedule:
        """The schedule with these options: (step, progress) -> multiplier."""
        return functools.partial(self.function(), **self.model_dump(exclude={"name"}))

    def function(self) -> Callable[..., float]:
        raise NotImplementedError(f"{type(self).__name__} names no schedule function")


class TrapezoidalConfig(ScheduleConfig):
    """Linear warmup, hold at 1, then a linear cooldown to `floor` over the last cooldown_frac of
    the run (from progress 1 - cooldown_frac to 1)."""

    name: Literal["trapezoidal"] = named("trapezoidal")
    warmup_steps: int = Field(0, description="Steps of linear warmup from 0.", ge=0)
    cooldown_frac: float = Field(
        0.4, description="Fraction of the run spent cooling down.", ge=0, le=1
    )
    floor: float = Field(
        0.0, description="Multiplier reached at the end of the cooldown.", ge=0, le=1
    )

    def function(self) -> Callable[..., float]:
        return trapezoidal


class CosineConfig(ScheduleConfig):
    """Linear warmup, and half a cosine from 1 at progress 0 to `floor` at progress 1 (the
    warmup's steps are inside that span: the curve goes on where the warmup ends)."""

    name: Literal["cosine"] = named("cosine")
    warmup_steps: int = Field(0, description="Steps of linear warmup from 0.", ge=0)
    floor: float = Field(0.0, description="Multiplier reached at the last step.", ge=0, le=1)

    def function(self) -> Callable[..., float]:
        return cosine


class ConstantConfig(ScheduleConfig):
    """Linear warmup, then 1 (no decay phase: the last step keeps the full lr)."""

    name: Literal["constant"] = named("constant")
    warmup_steps: int = Field(0, description="Steps of linear warmup from 0.", ge=0)

    def function(self) -> Callable[..., float]:
        return constant


ScheduleChoice = Annotated[
    TrapezoidalConfig | CosineConfig | ConstantConfig, Field(discriminator="name")
]


def schedule_warnings(cfg: ScheduleConfig, max_steps: int) -> list[str]:
    """Problems of `cfg` (the schedule section) over a run of `max_steps`, each with its fix,
    for the console to print before the first step: a schedule whose warmup covers the whole
    run, or whose cooldown begins inside the warmup, trains without the cooldown it was
    configured with and says nothing."""
    warmup = getattr(cfg, "warmup_steps", 0)
    after = {"trapezoidal": "cooldown", "cosine": "decay"}.get(cfg.name)
    if warmup >= max_steps > 0 and warmup > 0:
        tail = f" and the run ends without its {after}" if after else ""
        return [
            f"schedule.warmup_steps={warmup} >= train.max_steps={max_steps}: the learning rate "
            f"never reaches its peak{tail}; set schedule.warmup_steps below {max_steps} "
            f"(e.g. {max(1, max_steps // 10)}) or raise train.max_steps"
        ]
    frac = getattr(cfg, "cooldown_frac", 0.0)
    if cfg.name != "trapezoidal" or frac <= 0:
        return []
    # the first step whose progress passes 1 - cooldown_frac, as `trapezoidal` reads it
    start = math.floor(max_steps * (1 - Fraction(repr(frac))))
    if warmup <= start:
        return []
    drop = cfg.build()(warmup, step_progress(warmup, max_steps))
    fit = (max_steps - warmup) / max_steps
    return [
        f"the cooldown (schedule.cooldown_frac={frac}: steps {start}-{max_steps}) starts inside "
        f"the {warmup}-step warmup, so the learning rate climbs to its peak over the warmup "
        f"and then drops at once to {drop:.2f}x of it; set schedule.warmup_steps to at most {start} "
        f"or schedule.cooldown_frac to at most {fit:.2f}"
    ]


# ----------------------------------------------------------------------------------------------
# Per-origin learning-rate multipliers of a grown run: `grow.lr_multipliers` (docs/growth.md).
#
# Right after growth the parent's weights (origin tag `old`) sit where the parent's cooldown left
# them. One learning rate for every parameter re-warms them to the full lr and throws the model
# out of that minimum: the validation loss jumps. Holding them at a small constant multiplier
# avoids the jump but leaves them barely trained for the whole continuation: a worse end. A ramp
# does both: an origin's multiplier starts at `start`, moves to `end` over `ramp_steps` steps of
# the grown run, then stays at `end`; the run's schedule (warmup, hold, cooldown) multiplies it
# at every step, so after the ramp every origin shares the run's cooldown.
#
# The ramp is geometric by default: the multiplier grows by the same factor at every step,
# (end / start) ** (1 / ramp_steps), which is the smallest largest step-to-step rise any ramp
# between the same two values over the same steps can have. A linear ramp from 0.033 to 1 over
# 200 steps raises the lr by 15% in its first step, then by ever smaller fractions, and spends
# most of the ramp near the top; `shape: linear` is there to compare.
#
# The multiplier is a pure function of the step and the config, so a resumed run (its checkpoint
# keeps its config) sets exactly the lrs it would have set without the interruption.


class OriginRamp(Cfg):
    """One origin tag's lr multiplier moving over the grown run's first steps."""

    start: float = Field(..., description="Multiplier at the grown run's step 0.", gt=0)
    end: float = Field(
        1.0, description="Multiplier reached after ramp_steps, then held (1 = the role's lr).", gt=0
    )
    ramp_steps: int = Field(
        ..., description="Steps from start to end (0 = end from the first step).", ge=0
    )
    shape: Literal["geometric", "linear"] = Field(
        "geometric",
        description="geometric: the same factor every step (the smallest largest rise); "
        "linear: the same increment every step.",
    )

    def at(self, step: int) -> float:
        if step >= self.ramp_steps:
            return self.end
        t = step / self.ramp_steps
        if self.shape == "linear":
            return self.start + (self.end - self.start) * t
        return self.start * (self.end / self.start) ** t


# A number: a constant multiplier for that tag; a ramp: a multiplier that moves.
OriginLR = float | OriginRamp

# What a grown run uses when neither grow.lr_multipliers nor optimizer.lr_multipliers is set.
# None yet, i.e. one lr for all: benchmarks/growth.py (4 -> 6 layers, seed 0) found no recipe with
# both a smaller jump and an end at least as good as one lr's; a 200-step ramp from
# {old: 0.033, embedding: 0.17} postpones the rise (+0.045 in the first 200 steps, +0.082 at
# step 230, vs one lr's +0.078) and ends 0.015 higher (docs/growth.md, benchmarks/RESULTS.md).
DEFAULT_LR_MULTIPLIERS: dict[str, OriginLR] = {}


def multiplier(spec: OriginLR, step: int) -> float:
    """The multiplier `spec` gives at `step` of the grown run."""
    return spec.at(step) if isinstance(spec, OriginRamp) else float(spec)


def origin_multipliers(specs: dict[str, OriginLR] | None, step: int) -> dict[str, float]:
    """Each configured origin tag's multiplier at `step` (a tag not listed: 1)."""
    return {tag: multiplier(spec, step) for tag, spec in (specs or {}).items()}


def resolve_lr_multipliers(
    specs: dict[str, OriginLR] | None, constant: dict[str, float], origins: tuple[str, ...]
) -> tuple[dict[str, OriginLR], list[str]]:
    """grow.lr_multipliers resolved against optimizer.lr_multipliers (`constant`): null gives
    DEFAULT_LR_MULTIPLIERS, or nothing when `constant` is set (such a run keeps exactly the lrs
    it had before this setting existed); a tag set in both is refused, since the two would
    multiply. Returns (resolved, problems)."""
    if specs is None:
        return ({} if constant else dict(DEFAULT_LR_MULTIPLIERS)), []
    problems = [
        f"grow.lr_multipliers: unknown tag {tag!r}; tags are {', '.join(origins)}"
        for tag in specs
        if tag not in origins
    ]
    problems += [
        f"optimizer.lr_multipliers.{tag} and grow.lr_multipliers.{tag} would multiply; set the "
        f"{tag} multiplier in grow.lr_multipliers only (a number is a constant multiplier)"
        for tag in specs
        if tag in constant
    ]
    return specs, problems


# ----------------------------------------------------------------------------------------------
# One step's rates on every group


@dataclass(frozen=True)
class GroupSchedule:
    """Everything that sets a step's learning rates and Muon momentum, built once at start-up:
    the lr schedule, `origins` (grow.lr_multipliers; an origin not listed: 1) and `momentum`
    (the Muon groups' momentum per step, OptimizerConfig.momentum_schedule; None: not
    scheduled). Pure functions of the step and progress, so a resumed run sets the same rates."""

    lr: Schedule
    origins: dict[str, OriginLR]
    momentum: Callable[[int], float] | None

    def set(self, optimizer, step: int, progress: Progress) -> float:
        """Set each group's lr (base_lr × the schedule × its origin's factor) and the Muon
        groups' momentum for `step`, `progress` through the run; returns the multiplier."""
        mult = self.lr(step, progress)
        by_origin = origin_multipliers(self.origins, step)
        m = self.momentum(step) if self.momentum is not None else None
        for g in optimizer.param_groups:
            g["lr"] = g["base_lr"] * mult * by_origin.get(g["origin"], 1.0)
            if m is not None and "momentum" in g:  # the groups whose rule has a momentum
                g["momentum"] = m
        return mult
