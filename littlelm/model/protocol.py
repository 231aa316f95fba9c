"""The contract between a model and the rest of littlelm: what the schema, the trainer, the
planner's trace, growth and evaluation may ask of any model, so that none of them tests for a
concrete class.

    ModelConfig     base class of a model's config section (pydantic)
    LanguageModel   what a built model offers (typing.Protocol; model/gpt.py's GPT is one)

A new model derives its config from ModelConfig, with `name: Literal["its_name"]` and a `build()`
that returns the model, gives its class the members of LanguageModel, and joins the schema's
`model:` field as one more member of its union (littlelm/schema.py; today gpt is the only one).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from littlelm.config import ComponentConfig

# the parameter roles a model assigns (optim/groups.py gives each its own lr and optimizer);
# adapter: a LoRA adapter's A or B (model/lora.py)
ROLES = ("embedding", "value_embedding", "lm_head", "matrix", "scalar", "adapter")


class ModelConfig(ComponentConfig):
    """Base of every model's config. Besides its own fields, a model config has
    `vocab_size: int | None` (null: the schema fills it in from the tokenizer) and
    `max_seq_len: int` (the longest context; train.seq_len defaults to it)."""

    # model/grow.py can grow a trained checkpoint of this model into a larger one
    growable: ClassVar[bool] = False
    # the planner's analytic memory model (plan/memory.py) covers this model
    # (its fake-tensor trace covers any model)
    analytic_plan: ClassVar[bool] = False

    def build(self) -> Any:
        """The model, freshly initialised (from the current RNG state): a LanguageModel."""
        raise NotImplementedError(f"{type(self).__name__} builds no model")

    def check_device(self, device: torch.device) -> None:
        """Raise a ConfigError naming the fix when a configured feature cannot run on `device`
        (called before any data is prepared). The default: every device will do."""

    def loss_rows_per_pass(self) -> int | None:
        """Rows of logits the loss computes in one pass (a chunked loss's chunk), or None when it
        computes a micro-batch at once; the planner bounds its trace by the number of passes.
        The default: at once."""
        return None

    def speed_settings(self, device: torch.device | str = "cpu") -> list[str]:
        """The model's settings that change speed or memory, as short phrases for the start-up
        summary ("chunked loss (256 rows/chunk)"). The default: none."""
        return []


class LanguageModel(Protocol):
    """A built model, as the trainer, the optimizer builders and the planner use it (besides
    being an nn.Module: parameters, to, train/eval, state_dict)."""

    activation_checkpointing: bool  # train.activation_checkpointing: recompute layers in backward
    blocks: nn.ModuleList  # the layers, in order (FSDP units; the trace's backward seam)

    # read-only members, so that a model's own classes match (GPT's cfg is a GPTConfig)
    @property
    def cfg(self) -> ModelConfig: ...

    @property
    def norm_f(self) -> nn.Module:
        """The final norm: its forward starts the loss (the trace's forward seam)."""
        ...

    def role(self, name: str) -> str:
        """The role (one of ROLES) of the parameter called `name`."""
        ...

    def shard_units(self) -> list[nn.Module]:
        """The submodules FSDP shards as units of their own (the rest stays in the root unit)."""
        ...

    def param_counts(self) -> dict[str, int]:
        """total, embedding and non_embedding parameter counts."""
        ...

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token (forward + backward) at `seq_len`."""
        ...

    def named_parameters(self): ...

    def __call__(self, idx: torch.Tensor, targets: torch.Tensor | None = None, **kw): ...
