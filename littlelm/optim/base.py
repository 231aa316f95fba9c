"""The contract of an optimizer's config: every optimizer's config derives from
`OptimizerConfig` and answers, for its own options, what the trainer, the planner, the trace
and the schema ask, so that none of them tests for a concrete class or probes for a field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field

from littlelm.config import ComponentConfig


@dataclass(frozen=True)
class OptimizerTraits:
    """What the memory planner and the start-up summary need to know about an optimizer."""

    kind: str  # "muon" (Muon for the hidden matrices, AdamW for the rest) or "adamw" (all AdamW)
    nesterov: bool = False  # Muon's Nesterov momentum (one more buffer-sized temporary)
    adamw_8bit: bool = False  # AdamW's moments in 8 bits (bitsandbytes, CUDA only)
    ns_dtype: str = "bf16"  # Muon's Newton–Schulz iterate: bf16, fp32, or auto (as the device)


class OptimizerConfig(ComponentConfig):
    """Base of every optimizer's config."""

    name: str = Field(
        "",
        description="Which optimizer (littlelm list).",
        # another optimizer has another state layout: a resumed run keeps its optimizer
        json_schema_extra={"resumable": False},
    )

    def traits(self) -> OptimizerTraits:
        raise NotImplementedError

    def build(
        self,
        model: Any,
        stochastic_rounding: bool = False,
        origin: dict[str, str] | None = None,
    ) -> torch.optim.Optimizer:
        """The optimizer over `model`'s parameters with growth's `origin` tags (None: a run
        never grown), rounding each update stochastically into bf16 parameters when asked.
        `model`: an nn.Module with `cfg` and `role` (model/protocol.py's LanguageModel, a type
        optim/ may not import)."""
        raise NotImplementedError(f"{type(self).__name__} builds no optimizer")

    def with_native_bf16(self, native: bool) -> OptimizerConfig:
        """This config with its `auto` dtypes made concrete for a device that does (or does
        not) multiply bf16 in hardware (the default: nothing to make concrete)."""
        return self

    def momentum_schedule(self) -> Callable[[int], float] | None:
        """The momentum of the Muon groups per step (a warmup: optim/schedule.py), or None:
        not scheduled."""
        return None

    def origin_multipliers(self) -> dict[str, float]:
        """The constant lr multiplier per origin tag (old, new, embedding) this optimizer
        applies (the default: none)."""
        return {}

    def traceable(self) -> OptimizerConfig:
        """The config the planner's fake-tensor trace builds in place of this one, when a part
        cannot run on fake CPU tensors (the default: itself)."""
        return self

    def check_world(self, world_size: int) -> list[str]:
        """Problems with running this optimizer in `world_size` processes (the default: none)."""
        return []
