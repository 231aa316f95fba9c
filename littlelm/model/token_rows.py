"""Trained rows of a frozen token matrix: a few tokens' embeddings (and output rows) learned while
the rest of the vocabulary stays frozen (peft's `trainable_token_indices`; model/lora.py uses it
for `lora.trainable_tokens`).

A base model pretrained on plain text never saw its chat control tokens (<|user|>, <|end|>...):
their rows are still at their random init. Adapters on the linears cannot give those tokens a
meaning, so LoRA on a chat task learns far less than full SFT (docs/post-training.md has the
measurement); training just those rows costs a few thousand parameters.

    add_token_rows(model, ids)   # in place: wte (and an untied lm_head) become TokenRows
    merge_token_rows(model)      # in place: back to a plain embedding / linear, rows folded in
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class TokenRows(nn.Module):
    """A frozen (vocabulary × width) matrix with a trained change `delta` of its rows `ids`,
    called as an embedding (`wte`) or read as lm_head's `weight` (the loss reads it as a
    tensor). The change starts at zero, so a model with fresh rows computes what its base
    computes."""

    ids: torch.Tensor  # (n,) the trained rows' token ids, a buffer (it moves with the model)

    def __init__(self, frozen: torch.Tensor, ids: Sequence[int]):
        super().__init__()
        assert isinstance(frozen, nn.Parameter), "the model's own matrix, registered here"
        frozen.requires_grad_(False)
        self.frozen = frozen
        self.register_buffer("ids", torch.tensor(list(ids), dtype=torch.long, device=frozen.device))
        self.delta = nn.Parameter(torch.zeros(len(ids), frozen.shape[1], device=frozen.device))
        self.enabled = True  # off: the frozen matrix alone (adapters_off: the reference)

    @property
    def weight(self) -> torch.Tensor:
        """The matrix as lm_head's weight (the loss reads it whole): a copy of the frozen one
        with the change added to its rows (out of place: the frozen matrix stays the base's;
        peft builds its weight the same way), whose gradient is whole until index_add's
        backward takes the rows'. The planner counts the copy (plan/memory.py)."""
        if not self.enabled:
            return self.frozen
        return self.frozen.index_add(0, self.ids, self.delta.to(self.frozen.dtype))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """The embedding of `idx`: the frozen rows plus the change where `idx` is one of `ids`
        (looked up apart, added once: no copy of the matrix, no gradient the size of it, and
        the same sum `weight` and the merge make)."""
        out = F.embedding(idx, self.frozen)
        if not self.enabled:
            return out
        # each token's slot among ids (0: none), the change behind a zero row for slot 0
        slot = torch.zeros(self.frozen.shape[0], dtype=torch.long, device=idx.device)
        slot[self.ids] = torch.arange(1, len(self.ids) + 1, device=idx.device)
        delta = torch.cat([self.delta.new_zeros(1, self.delta.shape[1]), self.delta])
        return out + F.embedding(slot[idx], delta.to(out.dtype))

    @torch.no_grad()
    def merged(self) -> nn.Parameter:
        """The frozen matrix with the change added to its rows (in place), as a parameter."""
        frozen = self.frozen
        assert isinstance(frozen, nn.Parameter)
        frozen.index_add_(0, self.ids, self.delta.to(frozen.dtype))
        return frozen


def add_token_rows(model: nn.Module, ids: Sequence[int]) -> None:
    """Train rows `ids` of `model`'s token embedding and of its lm_head (one module when they are
    tied, so the rows are trained once), everything else as it was."""
    wte = model.wte  # the seams every model has (LanguageModel)
    head = model.lm_head
    assert isinstance(wte, nn.Embedding) and isinstance(head, nn.Linear)
    tied = head.weight is wte.weight
    rows = TokenRows(wte.weight, ids)
    model.wte = rows
    model.lm_head = rows if tied else TokenRows(head.weight, ids)


def has_token_rows(model: nn.Module) -> bool:
    return isinstance(getattr(model, "wte", None), TokenRows)


def token_ids(model: nn.Module) -> list[int]:
    """The token ids whose rows `model` trains ([] when none)."""
    wte = getattr(model, "wte", None)
    return [int(i) for i in wte.ids] if isinstance(wte, TokenRows) else []


def set_token_rows(model: nn.Module, enabled: bool) -> None:
    """Switch the trained rows on or off (off: the frozen base's matrices)."""
    for m in (getattr(model, "wte", None), getattr(model, "lm_head", None)):
        if isinstance(m, TokenRows):
            m.enabled = enabled


@torch.no_grad()
def merge_token_rows(model: nn.Module) -> None:
    """Back to a plain nn.Embedding and nn.Linear holding the trained rows (tied again when they
    were)."""
    wte, head = getattr(model, "wte", None), getattr(model, "lm_head", None)
    if not isinstance(wte, TokenRows):
        return
    weight = wte.merged()
    embedding = nn.Embedding(weight.shape[0], weight.shape[1], device="meta")
    embedding.weight = weight
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    assert isinstance(head, TokenRows)
    linear.weight = weight if head is wte else head.merged()
    model.wte, model.lm_head = embedding, linear
