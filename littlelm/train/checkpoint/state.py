"""The training state: everything a run carries from one step to the next besides its weights
and its optimizer's state, declared in one object that the Trainer owns and the checkpointer
(save_restore.py) saves and restores.

    step, tokens, train_time      counters (train_time: seconds inside optimizer steps only)
    loader                        the data position just after the last batch trained on
    guard                         the loss guard: its window of recent losses, skip counts and
                                  rollback count (train/guard.py)
    last_checkpoint, saved_step   the newest checkpoint of this run (what a rollback reloads)
                                  and its step (a final save is not repeated for it)
    save_failures                 periodic saves that failed under on_save_error=continue
    objective                     the run's objective (train/objective.py), whose state_dict()
                                  (RL's batch under rl.iterations > 1) each checkpoint keeps

The RNG states (torch, numpy, Python, CUDA) belong to the state too, but they stay in the
process's generators, where every operation draws from them: a copy here would go stale at the
next draw. The checkpointer reads them at each save (rng.pt) and sets them back on resume and
rollback. The weights and the optimizer's moments live in the model and the optimizer.

A checkpoint's state.json holds `format_version` and `step` (train/checkpoint/files.py), then
`tokens`, `train_time`, `loader`, `tokenizer` (fingerprint), `data_files` (each source's
files as [path, bytes, sampled hash, sha256]: what `loader` is a position in;
data/fingerprint.py), `config` (the resolved
config) and `guard`, plus `loader_world_size` and `loader_ranks` (every rank's data position) under torchrun,
and a LoRA run's `lora_base` ({path, fingerprint}: the frozen base its adapters belong to, whose
weights its checkpoints do not copy; save_restore.py), and `objective` (`objective_ranks` under
torchrun) when the objective carries a state between steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from littlelm.data.loader import LoaderSnapshot
from littlelm.train.budget import Steps
from littlelm.train.guard import LossGuard
from littlelm.train.objective import Objective


@dataclass
class TrainState:
    loader: LoaderSnapshot
    guard: LossGuard
    step: int = 0
    tokens: int = 0
    train_time: float = 0.0
    last_checkpoint: Path | None = None
    saved_step: int | None = None
    save_failures: int = 0
    budget: Steps | None = None  # how far the run is (train/budget.py); set at start-up
    objective: Objective | None = None  # set when it is built, after the resume

    def counters(self, stopped_by: str | None = None) -> dict:
        """The counters of the end record: where the run is, what went wrong on the way, and
        the signal that stopped it (if one did)."""
        out = {
            "step": self.step,
            "tokens": self.tokens,
            "train_time": self.train_time,
            "skipped_steps": self.guard.skipped_total,
            "rollbacks": self.guard.rollbacks,
            "save_failures": self.save_failures,
        }
        return {**out, "stopped_by": stopped_by} if stopped_by else out

    def data_figures(self) -> dict:
        """The data realised so far, for metrics records: mixture, crop and split rates."""
        loader = self.loader
        return {
            "mix": loader.proportions(),
            "crop_rate": loader.crop_rate(),
            "split_rate": loader.split_rate(),
        }

    def restore_counters(self, saved: dict, keep_time: bool = False) -> None:
        """step, tokens and (unless `keep_time`: a rollback, where time spent is spent)
        train_time from a checkpoint's state.json."""
        self.step, self.tokens = saved["step"], saved["tokens"]
        if not keep_time:
            self.train_time = saved.get("train_time", 0.0)


@dataclass
class Window:
    """The steps since the last metrics record, which the next record averages over: where
    they started, and the sums (on the device, read once per record) of the losses and gradient
    norms of the updates the guard accepted. Not saved: a resumed run starts a new window."""

    step: int
    tokens: int
    train_time: float
    loss_sum: torch.Tensor
    norm_sum: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.norm_sum = torch.zeros_like(self.loss_sum)

    @classmethod
    def starting_at(cls, state: TrainState, device: torch.device) -> Window:
        return cls(state.step, state.tokens, state.train_time, torch.zeros((), device=device))

    def add(self, loss: torch.Tensor, norm: torch.Tensor) -> None:
        self.loss_sum += loss
        self.norm_sum += norm

    def seconds_per_step(self, state: TrainState) -> float:
        """Training seconds per step over the window's steps."""
        return max(1e-9, state.train_time - self.train_time) / max(1, state.step - self.step)

    def record(
        self, state: TrainState, mean, flops_per_token: int, peak: float, batch_tokens: int
    ) -> dict:
        """The metrics of the window's steps (one host sync; `mean` averages over the ranks),
        then a new window from `state`. `batch_tokens`: the row tokens of one step, for MFU."""
        steps = max(1, state.step - self.step)
        seconds = max(1e-9, state.train_time - self.train_time)
        tok_s = (state.tokens - self.tokens) / seconds  # trained tokens (SFT: the assistant's)
        row_tok_s = steps * batch_tokens / seconds  # MFU: the model computes on every row token
        skipped = state.guard.take_window()
        kept = steps - skipped  # the updates the guard accepted
        loss = mean(self.loss_sum).item() / kept if kept else math.nan  # every rank's batches
        m = {
            "loss": loss,
            "grad_norm": self.norm_sum.item() / kept if kept else math.nan,
            "tok_per_s": tok_s,
            "mfu": row_tok_s * flops_per_token / peak if math.isfinite(peak) else None,
            "train_time": state.train_time,
            **({"skipped": skipped} if skipped else {}),  # present only when there were skips
        }
        self.restart(state)
        return m

    def restart(self, state: TrainState) -> None:
        """A new window from `state` (after a record, or a rollback abandoned the steps)."""
        self.step, self.tokens, self.train_time = state.step, state.tokens, state.train_time
        self.loss_sum.zero_()
        self.norm_sum.zero_()
