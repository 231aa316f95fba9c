"""Optimizers and schedules (registered by littlelm.components.register_all)."""

from littlelm.optim.groups import build_optimizer, plan_groups
from littlelm.optim.optimizer import MuonAdamW, orthogonalize
from littlelm.optim.schedule import build_schedule

__all__ = [
    "MuonAdamW",
    "build_optimizer",
    "build_schedule",
    "orthogonalize",
    "plan_groups",
]
