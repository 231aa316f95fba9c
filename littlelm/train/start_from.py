"""The `grow:` and `sft:` sections: where a run's weights start, when not from random
(docs/growth.md, docs/post-training.md). train/growth.py does what they say.

They are apart from train/growth.py because the schema (littlelm/schema.py) composes them into
the run config while growth.py names that run config's type: with the classes in growth.py the
two modules would import each other (growth.py -> train/build.py -> schema.py -> growth.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from littlelm.config import RESUMABLE, Cfg
from littlelm.optim.schedule import OriginLR


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
