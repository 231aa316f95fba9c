"""Validation loss in nats per token and bits per byte.

Bits per byte divides the summed loss (converted to bits) by the number of UTF-8 bytes the
predicted tokens stand for; special tokens (BOS) stand for no bytes and are left out of both
sums. Unlike loss per token, it compares models with different tokenizers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


@torch.no_grad()
def evaluate_loss(
    model,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    token_bytes: torch.Tensor,
    device,
    autocast,
) -> dict:
    """{'val_loss': nats/token over all tokens, 'val_bpb': bits/byte, 'val_tokens': count}."""
    was_training = model.training
    model.eval()
    nats = torch.zeros((), dtype=torch.float64, device=device)
    nats_bytes = torch.zeros((), dtype=torch.float64, device=device)
    n_bytes = torch.zeros((), dtype=torch.int64, device=device)
    n_tokens = 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast:
            loss = model(x, y, reduction="none").double()  # (B, T)
        b = token_bytes[y]
        nats += loss.sum()
        nats_bytes += (loss * (b > 0)).sum()
        n_bytes += b.sum()
        n_tokens += y.numel()
    model.train(was_training)
    if n_tokens == 0:
        return {"val_loss": float("nan"), "val_bpb": float("nan"), "val_tokens": 0}
    return {
        "val_loss": nats.item() / n_tokens,
        "val_bpb": nats_bytes.item() / (math.log(2) * max(1, n_bytes.item())),
        "val_tokens": n_tokens,
    }
