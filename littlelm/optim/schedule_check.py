"""Start-of-run checks of a learning-rate schedule against the run's length.

A schedule whose warmup covers the whole run, or whose cooldown begins inside the warmup, trains
without the cooldown it was configured with and says nothing: these checks name the problem and
the setting that fixes it, for the trainer to print before the first step.
"""

from __future__ import annotations

import math
from fractions import Fraction

from littlelm.config import ComponentConfig
from littlelm.optim.schedule import build_schedule, step_progress


def schedule_warnings(cfg: ComponentConfig, max_steps: int) -> list[str]:
    """Problems of `cfg` (the schedule section) over a run of `max_steps`, each with its fix."""
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
    # the first step whose progress passes 1 - cooldown_frac, as optim.schedule.trapezoidal reads it
    start = math.floor(max_steps * (1 - Fraction(repr(frac))))
    if warmup <= start:
        return []
    drop = build_schedule(cfg)(warmup, step_progress(warmup, max_steps))
    fit = (max_steps - warmup) / max_steps
    return [
        f"the cooldown (schedule.cooldown_frac={frac}: steps {start}-{max_steps}) starts inside "
        f"the {warmup}-step warmup, so the learning rate climbs to its peak over the warmup "
        f"and then drops at once to {drop:.2f}x of it; set schedule.warmup_steps to at most {start} "
        f"or schedule.cooldown_frac to at most {fit:.2f}"
    ]
