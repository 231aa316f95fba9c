"""One optimizer step, shared by the trainer and the planner's trace (plan/trace.py), so the
planner measures exactly the step that trains: `micro_step` per micro-batch, then `grad_norm`
(which clips) and `update`; `apply_update` is those two for callers without a loss guard;
`synchronize` ends a timed step (the trainer's, the benchmarks').
"""

from __future__ import annotations

import random

import numpy as np
import torch


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
