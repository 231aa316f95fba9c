"""Optimizers and schedules (registered by littlelm.components.register_all)."""

from littlelm.optim.groups import HybridOptimizer, build_optimizer, plan_groups
from littlelm.optim.muon import Muon, orthogonalize
from littlelm.optim.schedule import build_schedule

__all__ = [
    "HybridOptimizer",
    "Muon",
    "build_optimizer",
    "build_schedule",
    "orthogonalize",
    "plan_groups",
]
