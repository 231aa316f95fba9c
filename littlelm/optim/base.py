"""The contract of an optimizer: its config (`OptimizerConfig`), which answers, for its own
options, what the trainer, the planner, the trace and the schema ask, so that none of them tests
for a concrete class or probes for a field; and its traits (`OptimizerTraits`): the kinds of
parameter group it steps, each a `GroupRule` that says how its groups step, how they shard
across processes and what they keep, read alike by the optimizer (optim/optimizer.py), the
trainer's sharding and the planner's memory, speed and remedies (plan/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from pydantic import Field

from littlelm.config import ComponentConfig

# torch 2.13 renamed all_gather_into_tensor; keep working with the older name on older torch
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# how a rule's state splits across the processes of a run (GroupRule.sharding)
ELEMENTS = "elements"  # state elementwise with its parameter: ZeRO-1 flat slices, FSDP2 shards
MATRICES = "matrices"  # whole matrices per owning rank; the rule exchanges them itself (Muon)
WHOLE = "whole"  # each rank keeps and steps whole tensors: replicated under ddp, no fsdp


class GroupRule:
    """One kind of parameter group (its `kind`): how the optimizer steps those groups, and what
    the planner reads of them. A rule is a frozen dataclass (the planner's Dims hold it); the
    numbers a step reads (lr, betas, momentum, ...) live in the group dicts, which checkpoints
    keep, and `group_options` gives their starting values."""

    kind: ClassVar[str] = ""
    sharding: ClassVar[str] = ELEMENTS
    # state entries that are not per element (AdamW's step counter): never sliced or gathered
    scalar_state: ClassVar[tuple[str, ...]] = ()
    # a MATRICES rule's state entries per matrix, which its owners gather for a checkpoint
    state_keys: ClassVar[tuple[str, ...]] = ()
    # an elementwise rule's lr is AdamW-like: optimizer.scale_lr_by_width applies to it
    scales_lr_by_width: ClassVar[bool] = True

    def group_options(self, fused: bool) -> dict[str, Any]:
        """The options a new group of this kind carries besides lr and weight_decay (`fused`:
        the parameters are on CPU or CUDA, where torch has fused kernels)."""
        return {}

    def on(self, device_type: str) -> GroupRule:
        """This rule with its `auto` choices made for `device_type` (the default: itself)."""
        return self

    def prepare(self, opt: Any, groups: list[dict]) -> Any:
        """Check this kind's groups and make any helper the steps need, once, when the optimizer
        is made; the optimizer keeps what it returns in `opt.helpers[kind]`."""
        return None

    def step_groups(self, opt: Any, groups: list[dict]) -> None:
        """Step every group of this kind (`opt`: the optimizer, for its state and sharding).
        An elementwise rule's default: `update` per group, ZeRO-sliced when sharded."""
        opt.step_elementwise(groups, self.update)

    def update(
        self,
        opt: Any,
        group: dict,
        keys: list[torch.Tensor],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
    ) -> None:
        """One step of `params` (parameters, or this rank's flat slices of them) with `grads`,
        their state kept in `opt.state` under `keys` (the parameters)."""
        raise NotImplementedError(f"{type(self).__name__} has no elementwise update")

    # -- what the planner reads (plan/memory.py, plan/speed.py) ---------------------------------

    def state_bytes(self, numel: int, param_bytes: int) -> tuple[int, ...]:
        """Bytes of each state tensor kept for a parameter of `numel` elements whose parameters
        and gradients take `param_bytes` each (the planner rounds each to the allocator's
        blocks)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what state it keeps")

    def scratch_bytes(
        self, numel: int, param_bytes: int, stochastic_rounding: bool
    ) -> tuple[int, ...]:
        """Bytes of each temporary alive while one tensor of `numel` elements steps (the
        default: none; in-place arithmetic)."""
        return ()

    def traffic(self, param_bytes: int) -> float:
        """Bytes read and written per parameter element in one step (the speed model)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what a step moves")

    # a MATRICES rule also answers for one bucket of same-shaped matrices, `owned` of them
    # stepped on this rank: bucket_scratch(shape, owned, count, param_bytes), bucket_flops(shape,
    # owned) and bucket_work(matrices) (the call bench times); see MuonRule (optim/optimizer.py)


@dataclass(frozen=True)
class OptimizerTraits:
    """What the optimizer built from a config is: its group kinds, which parameters each takes,
    and what the planner offers in its place. Read by build_optimizer, the trainer's sharding and
    the planner alike, so that none of them names an optimizer."""

    name: str  # the config's name (optimizer.name)
    rules: tuple[GroupRule, ...]  # one per kind of group, in the order they step
    matrix: str  # the kind of the 2-D hidden matrices (the "matrix" role)
    other: str  # the kind of every other trained parameter (embeddings, lm_head, scalars, LoRA)
    # what the planner's trace runs in its place, when it cannot run this (8-bit AdamW on CPU)
    stand_in: OptimizerTraits | None = None
    stochastic_rounding: bool = True  # can round updates into bf16 parameters stochastically
    settings: tuple[str, ...] = ()  # start-up summary words (e.g. "8-bit AdamW")
    notes: tuple[str, ...] = ()  # what the plan says about how it planned this optimizer
    # memory remedies, mildest first: (override, why, the traits after it)
    lighter: tuple[tuple[str, str, OptimizerTraits], ...] = ()

    def kind(self, role: str) -> str:
        """The kind of group a trained parameter of `role` goes to."""
        return self.matrix if role == "matrix" else self.other

    def rule(self, role: str) -> GroupRule:
        return self.by_kind[self.kind(role)]

    @property
    def by_kind(self) -> dict[str, GroupRule]:
        return {r.kind: r for r in self.rules}


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
        """The momentum of the groups that have one, per step (Muon's warmup:
        optim/schedule.py), or None: not scheduled."""
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


def chunk_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of rank's slice when n items are cut into chunks of ceil(n / world)."""
    c = -(-n // world)
    start = min(rank * c, n)
    return start, min(start + c, n)
