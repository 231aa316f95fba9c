"""Optimizers and schedules: the `optimizer:` and `schedule:` sections' choices, each config
building its component (`cfg.build(...)`)."""

from littlelm.optim.groups import build_optimizer, plan_groups
from littlelm.optim.optimizer import MuonAdamW, orthogonalize

__all__ = [
    "MuonAdamW",
    "build_optimizer",
    "orthogonalize",
    "plan_groups",
]
