"""What a time or money budget (train.budget hours or dollars) buys on each GPU of a plan.

An hours budget runs as long on every GPU and buys tok/s × seconds tokens; a dollars budget buys
dollars / (the GPU's price × devices) hours there, so a cheaper GPU trains longer. The plan's
time and cost columns then show the budget, and two more show the tokens and optimizer steps it
buys (the trainer schedules the end from measured speed: train/budget.py).
"""

from __future__ import annotations

from dataclasses import replace

from littlelm.plan.cost import GpuPlan


def budget_seconds(budget, p: GpuPlan) -> float | None:
    """Seconds `budget` buys on `p`'s GPUs (None for a tokens budget or none)."""
    if budget is None or budget.kind not in ("hours", "dollars"):
        return None
    if budget.kind == "hours":
        return budget.hours * 3600
    return budget.dollars / (p.gpu.price_per_hour * p.devices) * 3600


def apply_budget(p: GpuPlan, budget, batch_tokens: int, cap: int | None = None) -> GpuPlan:
    """`p` with its time, cost, tokens and steps those of the budget (tokens at most `cap`,
    train.max_tokens, which ends the run first when it is reached first)."""
    seconds = budget_seconds(budget, p)
    if seconds is None or p.tok_s is None:  # no time budget, or nothing runs on this GPU
        return p
    tokens = int(p.tok_s * seconds)
    if cap is not None and tokens > cap:
        tokens, seconds = cap, cap / p.tok_s
    return replace(
        p,
        hours=seconds / 3600,
        dollars=seconds / 3600 * p.gpu.price_per_hour * p.devices,
        budget_tokens=tokens,
        budget_steps=tokens // batch_tokens,
    )
