"""One optimizer step, shared by the trainer and the planner's trace (plan/trace.py), so the
planner measures exactly the step that trains: `micro_step` per micro-batch, then `grad_norm`
(which clips) and `update`; `apply_update` is those two for callers without a loss guard;
`synchronize` ends a timed step (the trainer's, the benchmarks').

`LanguageModelLoss` is the objective (train/objective.py) of a run without an objective section:
pretraining, continued pretraining and SFT (the data's mask leaves all but the assistant's
tokens out of the loss). It is here, beside `micro_step`, because it is the step: its
micro-batches are `micro_step`s, and DPO's are too (train/dpo.py changes only the loss).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from littlelm.train.objective import Objective, Pass, Setting


def grad_norm(params, clip: float | None) -> torch.Tensor:
    """The global L2 norm of the gradients before clipping; clips them to `clip` when set."""
    if clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, clip).detach()
    else:
        grads = [p.grad.detach() for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    # FSDP: the norm of sharded gradients is a (replicated) DTensor
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def micro_step(forward, x: torch.Tensor, y: torch.Tensor, accum: int, autocast) -> torch.Tensor:
    """Forward and backward of one micro-batch; gradients accumulate in `.grad` (scaled by
    1/accum). Returns the detached loss. The planner's trace runs this same function."""
    with autocast:
        loss = forward(x, y)
    (loss / accum).backward()
    return loss.detach()


class LanguageModelLoss(Objective):
    """The mean next-token loss over a step's `grad_accum` micro-batches of the loader's rows
    (a conversation's masked targets count nothing: SFT)."""

    def __init__(self, setting: Setting):
        super().__init__(setting)
        self.counts_targets = setting.data.masked  # conversations: the assistant's tokens only

    def loss_of(self, forward):
        """The `(x, y) -> loss` of a micro-batch: the model's own loss (DPO's is of pairs)."""
        return forward

    def forward_backward(self, step: int, batches, forward) -> Pass:
        s = self.setting
        t = s.cfg.train
        accum, seq_len = t.grad_accum, t.seq_len
        assert accum and seq_len, "load_run derives them"
        loss = self.loss_of(forward)
        total = torch.zeros((), device=s.device)
        trained = 0
        for i in range(accum):
            batch = next(batches)
            trained += t.micro_batch_size * seq_len if batch.trained is None else batch.trained
            x, y = (b.to(s.device, non_blocking=True) for b in (batch.x, batch.y))
            with s.parallel.no_sync(skip=i < accum - 1):  # DDP: all-reduce on the last
                total += micro_step(loss, x, y, accum, s.autocast)
        return Pass(total / accum, trained, batch.state)


def update(optimizer, apply: bool = True) -> None:
    """Step the optimizer (unless `apply` is False: the loss guard left this update out) and
    free the gradients either way."""
    if apply:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def apply_update(model: torch.nn.Module, optimizer, grad_clip: float | None) -> torch.Tensor:
    """Measure (and clip) the gradients, step, free them: the end of an optimizer step without
    a loss guard (the planner's trace and benchmarks/throughput.py). The Trainer runs the same
    two calls with the guard's verdict between them. Returns the gradient norm before clipping."""
    norm = grad_norm(model.parameters(), grad_clip)
    update(optimizer)
    return norm


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a step's time is its own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
