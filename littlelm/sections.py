"""Config sections whose components live in the train layer (the loss guard, distributed
training, the budget, growth). Their classes sit here, below train/, so that the schema can compose them into
RunConfig without importing the trainer's modules; train/guard.py, train/distributed.py and
train/growth.py import them from here. (`grow:` is read by model/grow.py, which copies the
tensors, and optim/schedule.py, which ramps each origin's lr, too.)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from littlelm.config import RESUMABLE, Cfg
from littlelm.optim.schedule import OriginLR


class GuardConfig(Cfg):
    enabled: bool = Field(
        True,
        description="Check each step's loss and gradient norm (one host sync per step); "
        "skip non-finite updates.",
    )
    spike_factor: float | None = Field(
        None,
        description="Also skip a step whose loss exceeds this multiple of the mean loss of the "
        "last spike_window accepted steps; null = off.",
        gt=1,
    )
    spike_window: int = Field(
        50, description="Accepted steps averaged for the spike test (it starts after them).", ge=1
    )
    max_consecutive: int = Field(
        5, description="Skipped steps in a row that trigger on_persistent.", ge=1
    )
    on_persistent: Literal["rollback", "stop"] = Field(
        "rollback",
        description="After max_consecutive skipped steps: reload the last checkpoint and go on "
        "with the next batches, or stop the run.",
    )
    max_rollbacks: int = Field(
        3, description="Rollbacks allowed in one run; one more stops it.", ge=0
    )
    collapse_steps: int = Field(
        20,
        description="Steps in a row with a zero gradient norm and the loss at the uniform level "
        "ln(vocab_size) after which the run counts as collapsed (a dead model, e.g. from a huge "
        "lr) and each such step as bad; 0 = off.",
        ge=0,
    )


class DistributedConfig(Cfg):
    """How several processes share a run (ignored by a single process)."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model; fsdp: parameters, gradients and "
        "optimizer state are split across ranks (FSDP2).",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="Collective backend; auto = nccl on CUDA, gloo on the CPU."
    )
    shard_muon: bool = Field(
        True,
        description="Each rank orthogonalises only the Muon matrices it owns and the updates are "
        "gathered; false = every rank repeats every update (ddp only).",
    )
    shard_adamw: bool = Field(
        False,
        description="ddp: split AdamW's moments across ranks (ZeRO-1); fsdp always splits them.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="fsdp: free gathered parameters after forward (ZeRO-3); false keeps them "
        "until backward (ZeRO-2: less communication, more memory).",
    )
    bucket_cap_mb: int = Field(25, description="ddp: gradient all-reduce bucket size in MiB.", ge=1)
    timeout_s: int = Field(
        1800,
        description="Seconds a collective (or joining the group) may wait before the run fails.",
        ge=1,
    )
    world_size: int | None = Field(
        None,
        description="Processes in the run: derived from torchrun's WORLD_SIZE; do not set.",
        ge=1,
    )

    @model_validator(mode="after")
    def _check(self) -> DistributedConfig:
        if self.strategy == "fsdp" and not self.shard_muon:
            raise ValueError(
                "shard_muon=false is ddp-only: under fsdp every rank holds a slice of each "
                "matrix, so Muon always runs on the rank that owns the whole matrix"
            )
        return self


class BudgetConfig(Cfg):
    tokens: int | None = Field(
        None, description="Train on this many tokens (sets train.max_steps).", ge=1
    )
    hours: float | None = Field(
        None,
        description="Train for this many hours of wall-clock (evaluations and saves included); "
        "the schedule's decay ends with the budget.",
        gt=0,
    )
    dollars: float | None = Field(
        None,
        description="Spend this many dollars: hours = dollars / (price_per_gpu_hour × gpus).",
        gt=0,
    )
    price_per_gpu_hour: float | None = Field(
        None, description="Dollars per GPU-hour (needed by a dollars budget).", gt=0
    )
    gpus: int | None = Field(
        None, description="GPUs paid for; null = the run's processes (world size).", ge=1
    )

    @property
    def kind(self) -> str | None:
        set_ = [k for k in ("tokens", "hours", "dollars") if getattr(self, k) is not None]
        return set_[0] if len(set_) == 1 else None

    def seconds(self, world: int = 1) -> float | None:
        """The budget in seconds of wall-clock; None for a tokens budget."""
        if self.hours is not None:
            return self.hours * 3600
        if self.dollars is not None and self.price_per_gpu_hour:
            return self.dollars / (self.price_per_gpu_hour * (self.gpus or world)) * 3600
        return None

    def dollars_for(self, seconds: float, world: int = 1) -> float | None:
        """What `seconds` of the run cost (None without a price)."""
        if not self.price_per_gpu_hour:
            return None
        return seconds / 3600 * self.price_per_gpu_hour * (self.gpus or world)


class GrowConfig(Cfg):
    """Start a run from a smaller trained checkpoint instead of random weights (docs/growth.md).
    The run's `model` section is the grown shape."""

    parent: str = Field(
        ..., description="Checkpoint directory, or run directory (its newest checkpoint)."
    )
    placement: Literal["interleave", "end", "start"] | list[int | None] = Field(
        "interleave",
        description="Where parent blocks go: interleave (new blocks spread between them), end, "
        "start, or a list giving each layer's parent block (null = new); resolved to the list.",
    )
    widened: Literal["old", "new"] = Field(
        "old",
        description="Origin tag of tensors only partly copied (widened matrices, per-layer "
        "scalar vectors).",
    )
    continue_data: bool = Field(
        True,
        description="Continue the parent's data stream where it stopped (needs the parent's "
        "data section and run.seed); false = start the data from the beginning.",
    )
    verify_tokens: int = Field(
        64,
        description="Tokens of a probe on which the grown model's logits must match the "
        "parent's at the start (fp32); 0 = skip.",
        ge=0,
    )
    lr_multipliers: dict[str, OriginLR] | None = Field(
        None,
        description="lr multiplier per origin tag (old, new, embedding) over the grown run's "
        "steps: a number (constant) or {start, end, ramp_steps, shape} (a ramp, then the run's "
        "schedule); null = the measured default (none yet: one lr for all; docs/growth.md), "
        "or none when optimizer.lr_multipliers is set. Resolved to what the run uses.",
        # a learning-rate setting like optimizer.lr: a pure function of the step, so a resumed
        # run may change it (the new value applies from the resumed step on)
        json_schema_extra=RESUMABLE,
    )


class SFTConfig(Cfg):
    """Supervised fine-tuning: start from a trained base model's weights, with a fresh optimizer
    (docs/post-training.md). The run's `model` section is the base's shape. The loss counts the
    assistant's tokens of each conversation (a `chat` source's mask) and the conversations are
    rendered in the base tokenizer's chat format (littlelm's chat tokens, or an imported model's
    chat_template): both belong to the data and the tokenizer, which chat, serve and export read
    too, so they are not set here."""

    base: str = Field(
        ...,
        description="The base model: a checkpoint directory, or a run directory (its newest "
        "checkpoint). Its weights are copied in and checked to reproduce its logits.",
    )
    continue_data: bool = Field(
        False,
        description="Continue the base's data stream where it stopped (needs the base's data "
        "section and run.seed); false = start this run's data from its beginning.",
    )
    verify_tokens: int = Field(
        64,
        description="Tokens of a probe on which the copied model's logits must match the "
        "base's at the start (fp32); 0 = skip.",
        ge=0,
    )

    def as_grow(self, n_layer: int) -> GrowConfig:
        """The same-shape growth that starts the run (train/growth.py copies and checks): every
        layer from the base's block of the same index."""
        return GrowConfig(
            parent=self.base,
            placement=list(range(n_layer)),
            continue_data=self.continue_data,
            verify_tokens=self.verify_tokens,
        )
