"""Low-precision parameters: stochastic rounding, and an AdamW that uses it.

With bf16 master weights (`train.master_weights: bf16`) an update smaller than half a bf16
step (1/256 of the weight) is lost to round-to-nearest, so long runs at small learning rates
stall. Stochastic rounding (`train.stochastic_rounding: true`) rounds the fp32 result of each
update up or down at random with probabilities that make the rounding unbiased: E[round(x)] = x,
so small updates survive on average.
"""

from __future__ import annotations

import torch


def stochastic_round_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Write fp32 `src` into bf16 `dst`, rounding each element up or down at random.
    `src` is used as scratch space and overwritten.

    A bf16 number is the top 16 bits of an fp32 one: adding uniform noise to the 16 bits that
    are cut off and then cutting them rounds up with probability (cut-off part) / 2^16.
    """
    assert dst.dtype == torch.bfloat16 and src.dtype == torch.float32
    bits = src.view(torch.int32)
    bits.add_(torch.randint_like(bits, 0, 1 << 16)).bitwise_and_(-65536)
    return dst.copy_(src)  # exact: the low 16 bits are zero


def step_count(step: torch.Tensor) -> float:
    """The step counter as a number, for the bias corrections (the planner's fake-tensor trace,
    whose counters hold no number, puts a stand-in here: plan/trace.py)."""
    return step.item()


def stochastic_adamw_(p: torch.Tensor, grad: torch.Tensor, state: dict, group: dict) -> None:
    """One AdamW step of bf16 `p` (torch.optim.AdamW's arithmetic: decoupled weight decay, bias
    correction): moments kept in bf16, the update computed in fp32 and written back with
    stochastic rounding. `state` holds step (a CPU fp32 scalar), exp_avg and exp_avg_sq."""
    (b1, b2), lr = group["betas"], group["lr"]
    state["step"] += 1
    t = step_count(state["step"])
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.lerp_(grad, 1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v.float() / (1 - b2**t)).sqrt_().add_(group["eps"])
    new = p.float().mul_(1 - lr * group["weight_decay"])
    new.addcdiv_(m.float(), denom, value=-lr / (1 - b1**t))
    stochastic_round_(p, new)
