"""Per-origin learning-rate multipliers of a grown run: `grow.lr_multipliers` (docs/growth.md).

Right after growth the parent's weights (origin tag `old`) sit where the parent's cooldown left
them. One learning rate for every parameter re-warms them to the full lr and throws the model
out of that minimum: the validation loss jumps. Holding them at a small constant multiplier
avoids the jump but leaves them barely trained for the whole continuation: a worse end. A ramp
does both: an origin's multiplier starts at `start`, moves to `end` over `ramp_steps` steps of
the grown run, then stays at `end`; the run's schedule (warmup, hold, cooldown) multiplies it
at every step, so after the ramp every origin shares the run's cooldown.

The ramp is geometric by default: the multiplier grows by the same factor at every step,
(end / start) ** (1 / ramp_steps), which is the smallest largest step-to-step rise any ramp
between the same two values over the same steps can have. A linear ramp from 0.033 to 1 over
200 steps raises the lr by 15% in its first step, then by ever smaller fractions, and spends
most of the ramp near the top; `shape: linear` is there to compare.

The multiplier is a pure function of the step and the config, so a resumed run (its checkpoint
keeps its config) sets exactly the lrs it would have set without the interruption.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from littlelm.config import Cfg


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
