"""What a run minimises: the objective, a component built from the config like the optimizer and
the schedule (docs/post-training.md).

    objective = build_objective(cfg, setting)        # train/build.py: the one config picks it
    loss, trained, loader = objective.forward_backward(step, batches, forward)
    objective.metrics()      # its figures since the last record (metrics.jsonl)
    objective.state_dict()   # what it carries between steps, in each checkpoint (usually {})
    objective.validate()     # its held-out figures (val_*), and validation_line(m) prints them
    objective.warning(m)     # what a record's figures say is going wrong (DPO's collapse), or None

An objective owns one optimizer step's forward and backward (over `grad_accum` micro-batches of
the loader's rows, or over what it makes itself: RL samples its replies), the figures it keeps
for the metrics record, its validation and whatever it holds resident besides the model (a frozen
reference, prompts, a reward function). The trainer calls these four and names none of them:
which objective a run has is the config's choice.

- the language-model loss (pretraining, continued pretraining, SFT with the data's assistant
  mask): `LanguageModelLoss` in train/step.py, what a run without an objective section trains
- DPO (`dpo:`): train/dpo.py
- RL (`rl:`): train/rl.py, its section in train/rl_config.py

A new objective is one file holding its config (an `ObjectiveConfig`, whose `build(setting)`
makes the objective) and its `Objective`, one field of that config's type in
littlelm/schema.py's RunConfig, and a test (tests/test_objective.py adds a toy one in the test
itself). `build_objective` finds the section that is set: a run has at most one.

This module names no run config type: the schema imports the objectives' configs, and an
objective is handed the pieces of the run it reads (`Setting`), the run config among them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from littlelm.config import Cfg
from littlelm.train.validation import validation_line, validation_metrics


@dataclass
class Setting:
    """What the trainer hands an objective when it is built: the run and its resident pieces."""

    # the run's RunConfig; typed Any because the schema imports this module's ObjectiveConfig
    cfg: Any
    model: torch.nn.Module  # the bare model: evaluation and sampling use it (DDP wraps `forward`)
    device: torch.device
    autocast: Any  # the run's autocast context (bf16, or a no-op), reusable
    data: Any  # the run's RunData (data/build.py): tokenizer, held-out data, mask
    parallel: Any  # train/distributed.py's Parallel: no_sync, rank and world
    # the frozen reference: the run's base (sft.base) as a model without gradients, in the
    # training precision; one path for DPO, RL's KL and growth's check (train/growth.py)
    reference: Callable[[], torch.nn.Module]


class StepInterrupted(Exception):
    """A stop signal reached an objective's step before any gradient (RL: while a reward was
    being computed): nothing changed, the step is left out; the message says what stopped."""


class Pass(NamedTuple):
    """What one step's forward and backward hand the trainer."""

    loss: torch.Tensor  # the step's loss (detached, on the device)
    trained: int  # the targets it trained on (this rank's), counted when counts_targets
    loader: Any  # the loader's state after the batches it took (None: it took none)


class Objective(ABC):
    """One run's objective. `counts_targets`: the run's token counter adds the targets the loss
    trained on (a mask, sampled replies) rather than every row token."""

    counts_targets: bool = False

    def __init__(self, setting: Setting):
        self.setting = setting
        self._token_bytes: torch.Tensor | None = None

    @abstractmethod
    def forward_backward(self, step: int, batches, forward) -> Pass:
        """Forward and backward of step `step` (0-based): gradients accumulate in `.grad`.
        `batches` yields the loader's Batch rows, `forward` is the trainer's (wrapped) model."""

    def metrics(self) -> dict[str, float]:
        """The objective's figures since the last call, for the metrics record (none: {})."""
        return {}

    def state_dict(self) -> dict:
        """What the objective carries from one step to the next (JSON's types), saved in each
        checkpoint's state.json: {} (most keep nothing; RL with iterations > 1 its batch)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Back to a checkpoint's `state_dict()` (on resume and rollback)."""
        assert not state, f"{type(self).__name__} keeps no state, yet a checkpoint holds one"

    def validate(self) -> dict:
        """The held-out figures (val_*): by default the language-model loss on every source's
        held-out data and each of eval.sets (train/validation.py)."""
        s = self.setting
        if self._token_bytes is None:  # the bytes of each token (bits per byte), read once
            self._token_bytes = torch.from_numpy(s.data.tokenizer.token_bytes()).to(s.device)
        return validation_metrics(s.model, s.data, s.cfg, self._token_bytes, s.device, s.autocast)

    def validation_line(self, m: dict) -> str:
        """What the console prints for `validate()`'s record."""
        return validation_line(m)

    def warning(self, m: dict) -> ObjectiveWarning | None:
        """What is going wrong by the figures of record `m` (a log step's, or `validate()`'s),
        said to the user as it trains; None when nothing is."""
        return None


class ObjectiveWarning(NamedTuple):
    """An objective's warning: `what` the figures show (short: the progress line carries it) and
    the `advice` (what it means, what to change), said in full once."""

    what: str
    advice: str

    def __str__(self) -> str:
        return f"{self.what}: {self.advice}"


class ObjectiveConfig(Cfg):
    """The base of an objective's config section: setting the section picks the objective."""

    @abstractmethod
    def build(self, setting: Setting) -> Objective:
        """The objective this section configures, for the run `setting` describes."""


def chosen_objective(cfg: Any) -> ObjectiveConfig | None:
    """The objective section `cfg` (a RunConfig) sets, None for the language-model loss."""
    chosen = [
        value
        for name in type(cfg).model_fields
        if isinstance(value := getattr(cfg, name), ObjectiveConfig)
    ]
    assert len(chosen) <= 1, "schema.problems refuses a run with two objectives"
    return chosen[0] if chosen else None
