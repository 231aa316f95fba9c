"""The loss guard: skip updates whose loss or gradient is non-finite or spikes, and decide when
a run must roll back to its last checkpoint or stop.

    guard:
      spike_factor: 3.0      # also skip a step whose loss is 3x the recent mean
      max_consecutive: 5     # after 5 skipped steps in a row ...
      on_persistent: rollback   # ... reload the last checkpoint and go on (or: stop)
      max_rollbacks: 3

A skipped step still consumes its batch and counts as a step (the schedule and the data move on
exactly as if it had been taken); only the optimizer update is left out. The guard is pure
bookkeeping: the trainer hands it the step's loss and gradient norm and acts on the verdict.

Why a rollback does not loop forever: the trainer reloads the weights, optimizer, counters, RNG
states and this guard's loss window from the checkpoint but keeps the data loader where it is,
just past the batches that went wrong, so the steps after the rollback see fresh data (the
batches between the checkpoint and the failure are never trained on, as in PaLM's restart-and-
skip recipe). If the trouble comes back anyway, `max_rollbacks` bounds the number of rollbacks
and the run stops with a message. The count of rollbacks survives the rollback itself and is
saved in each checkpoint, so a resumed run replays the same decisions.
"""

from __future__ import annotations

import math
from collections import deque
from enum import Enum
from typing import Literal

from pydantic import Field

from littlelm.config import Cfg


class GuardConfig(Cfg):
    enabled: bool = Field(
        True,
        description="Check each step's loss and gradient norm (one host sync per step); "
        "skip non-finite updates.",
    )
    spike_factor: float | None = Field(
        None,
        description="Also skip a step whose loss exceeds this multiple of the mean loss of the "
        "last spike_window accepted steps; null = off.",
        gt=1,
    )
    spike_window: int = Field(
        50, description="Accepted steps averaged for the spike test (it starts after them).", ge=1
    )
    max_consecutive: int = Field(
        5, description="Skipped steps in a row that trigger on_persistent.", ge=1
    )
    on_persistent: Literal["rollback", "stop"] = Field(
        "rollback",
        description="After max_consecutive skipped steps: reload the last checkpoint and go on "
        "with the next batches, or stop the run.",
    )
    max_rollbacks: int = Field(
        3, description="Rollbacks allowed in one run; one more stops it.", ge=0
    )
    collapse_steps: int = Field(
        20,
        description="Steps in a row with a zero gradient norm and the loss at the uniform level "
        "ln(vocab_size) after which the run counts as collapsed (a dead model, e.g. from a huge "
        "lr) and each such step as bad; 0 = off.",
        ge=0,
    )


class Verdict(Enum):
    OK = "ok"  # apply the update
    SKIP = "skip"  # leave the update out
    ROLLBACK = "rollback"  # leave it out and reload the last checkpoint
    STOP = "stop"  # leave it out and stop the run


class Collapse:
    """A dead model: `steps` steps in a row whose gradient norm is zero and whose loss sits at
    the uniform level ln(V) (every token equally likely), e.g. after lr=1e6. Nothing can train
    it further, so those steps are bad like a spike: skipped, then rolled back or stopped."""

    def __init__(self, vocab_size: int, steps: int):
        self.uniform = math.log(vocab_size)
        self.steps = steps
        self.run = 0  # collapsed steps in a row

    def check(self, loss: float, grad_norm: float | None) -> str | None:
        flat = grad_norm is not None and grad_norm < 1e-6
        self.run = self.run + 1 if flat and abs(loss - self.uniform) < 0.02 * self.uniform else 0
        if self.steps and self.run >= self.steps:
            return (
                f"run collapsed: gradient norm 0 and loss {loss:.4f} at the uniform level "
                f"ln(vocab) = {self.uniform:.4f} for {self.run} steps"
            )
        return None


class LossGuard:
    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.recent: deque[float] = deque(maxlen=cfg.spike_window)  # accepted losses
        self.in_a_row = 0  # skipped steps since the last accepted one
        self.skipped_total = 0
        self.rollbacks = 0
        self.window_skipped = 0  # since the last metrics record
        self.reason = ""  # why the last step was skipped
        self.collapse: Collapse | None = None  # set by the trainer, which knows the vocabulary

    def problem(self, loss: float, grad_norm: float | None) -> str | None:
        """Why a step with this loss and gradient norm must not be applied, or None."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return f"gradient norm is {grad_norm}"
        if self.collapse is not None and (dead := self.collapse.check(loss, grad_norm)):
            return dead
        factor = self.cfg.spike_factor
        if factor and len(self.recent) == self.recent.maxlen:
            mean = sum(self.recent) / len(self.recent)
            if loss > factor * mean:
                return (
                    f"loss {loss:.4f} is {loss / mean:.1f}x the mean of the last "
                    f"{len(self.recent)} steps ({mean:.4f}; guard.spike_factor {factor})"
                )
        return None

    def verdict(self, loss: float, grad_norm: float | None) -> Verdict:
        """Record one step and say what to do with its update."""
        reason = self.problem(loss, grad_norm)
        if reason is None:
            self.recent.append(loss)
            self.in_a_row = 0
            return Verdict.OK
        self.reason = reason
        self.skipped_total += 1
        self.window_skipped += 1
        self.in_a_row += 1
        if self.in_a_row < self.cfg.max_consecutive:
            return Verdict.SKIP
        if self.cfg.on_persistent == "rollback" and self.rollbacks < self.cfg.max_rollbacks:
            return Verdict.ROLLBACK
        return Verdict.STOP

    def stop_message(self, step: int, checkpoint: object | None) -> str:
        """The error that ends a run the guard gave up on, naming the fixes."""
        if checkpoint is None:
            why = "and there is no checkpoint yet to roll back to"
        elif self.cfg.on_persistent == "rollback":
            why = (
                f"after {self.rollbacks} rollback(s) (guard.max_rollbacks {self.cfg.max_rollbacks})"
            )
        else:
            why = "(guard.on_persistent is stop)"
        kept = f"the newest checkpoint is {checkpoint}" if checkpoint else "nothing was saved"
        return (
            f"training stopped at step {step}: {self.in_a_row} updates in a row were skipped "
            f"{why}; the last one because the {self.reason}. No bad update was applied or "
            f"saved; {kept}. Lower the learning rate (optimizer.lr), lengthen the warmup "
            "(schedule.warmup_steps) or clip gradients (train.grad_clip), then run the same "
            "command to resume"
        )

    def skip_note(self, step: int) -> str:
        """The log line of an update the guard left out."""
        return (
            f"step {step}: update skipped, {self.reason} ({self.in_a_row} in a row; "
            f"{self.cfg.on_persistent} after {self.cfg.max_consecutive})"
        )

    def rollback_note(self, info: dict) -> str:
        """The log line of a rollback (`info`: the on_rollback record)."""
        step, failed_at = info["step"], info["failed_at"]
        return (
            f"rolled back to {info['checkpoint']} (step {step}) after "
            f"{self.cfg.max_consecutive} skipped updates up to step {failed_at} "
            f"({info['reason']}); the batches of steps {step + 1}-{failed_at} are skipped "
            f"(rollback {self.rollbacks} of at most {self.cfg.max_rollbacks})"
        )

    def take_window(self) -> int:
        """Skipped steps since the last call (for one metrics record)."""
        n, self.window_skipped = self.window_skipped, 0
        return n

    def state_dict(self) -> dict:
        return {
            "recent": list(self.recent),
            "in_a_row": self.in_a_row,
            "skipped_total": self.skipped_total,
            "rollbacks": self.rollbacks,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a checkpoint's guard (on resume)."""
        self.recent.clear()
        self.recent.extend(state.get("recent", []))
        self.in_a_row = state.get("in_a_row", 0)
        self.skipped_total = state.get("skipped_total", 0)
        self.rollbacks = state.get("rollbacks", 0)

    def rolled_back(self, state: dict) -> None:
        """After a rollback: the loss window comes from the checkpoint, the counts go on."""
        self.recent.clear()
        self.recent.extend(state.get("recent", []))
        self.in_a_row = 0
        self.window_skipped = 0  # the rollback record reports them
        self.rollbacks += 1
