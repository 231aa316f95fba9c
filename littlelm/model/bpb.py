"""Validation loss in nats per token and bits per byte.

Bits per byte divides the summed loss (converted to bits) by the number of UTF-8 bytes the
predicted tokens stand for. A predicted BOS (the start of the next packed document) stands for
no bytes and is left out of both sums; every other trained target counts its loss, including a
special token of no bytes that the loss trains, such as a chat reply's end-of-turn token (an SFT
run's val_bpb is its val_loss's sum over the reply's bytes, so the two rank runs alike). Unlike
loss per token, it compares models with different tokenizers.

`loss_sums` returns the sums themselves, so that the sums of several held-out sets add up to
those of their union (train/validation.py evaluates each source once and combines them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from littlelm.model.kernels import IGNORE


@dataclass
class LossSums:
    nats: float = 0.0  # summed loss over every predicted token
    nats_bytes: float = 0.0  # summed loss over the tokens that stand for bytes
    n_bytes: int = 0
    n_tokens: int = 0

    def __add__(self, other: LossSums) -> LossSums:
        return LossSums(
            self.nats + other.nats,
            self.nats_bytes + other.nats_bytes,
            self.n_bytes + other.n_bytes,
            self.n_tokens + other.n_tokens,
        )

    def metrics(self) -> dict:
        """{'val_loss': nats/token, 'val_bpb': bits/byte, 'val_tokens': count} (NaN: no tokens)."""
        if self.n_tokens == 0:
            return {"val_loss": float("nan"), "val_bpb": float("nan"), "val_tokens": 0}
        return {
            "val_loss": self.nats / self.n_tokens,
            "val_bpb": self.nats_bytes / (math.log(2) * max(1, self.n_bytes)),
            "val_tokens": self.n_tokens,
        }


@torch.no_grad()
def loss_sums(
    model,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    token_bytes: torch.Tensor,
    device,
    autocast,
    bos: int | None = None,
) -> LossSums:
    """The summed loss of `model` over `batches` (in float64), and what it was summed over:
    the trained targets only. A target set to IGNORE (a masked SFT row's prompt, padding) has
    no loss and counts neither as a token nor as bytes, as in training's loss. A target `bos`
    is left out of the bits-per-byte sum (module docstring); None: every target of no bytes."""
    was_training = model.training
    model.eval()
    nats = torch.zeros((), dtype=torch.float64, device=device)
    nats_bytes = torch.zeros((), dtype=torch.float64, device=device)
    n_bytes = torch.zeros((), dtype=torch.int64, device=device)
    n_tokens = torch.zeros((), dtype=torch.int64, device=device)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast:
            loss = model(x, y, reduction="none").double()  # (B, T); 0 at IGNORE targets
        trained = y != IGNORE
        b = token_bytes[y.clamp(min=0)] * trained  # IGNORE (-1) would index the last token
        nats += loss.sum()
        counted = (b > 0) if bos is None else trained & (y != bos)
        nats_bytes += (loss * counted).sum()
        n_bytes += b.sum()
        n_tokens += trained.sum()
    model.train(was_training)
    return LossSums(nats.item(), nats_bytes.item(), int(n_bytes.item()), int(n_tokens.item()))


def evaluate_loss(
    model,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    token_bytes: torch.Tensor,
    device,
    autocast,
) -> dict:
    """{'val_loss': nats/token over the trained targets, 'val_bpb': bits/byte, 'val_tokens':
    how many targets were trained on}."""
    return loss_sums(model, batches, token_bytes, device, autocast).metrics()
