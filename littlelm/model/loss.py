"""Cross-entropy from the final hidden states.

The lm_head matmul runs over the padded vocabulary (shapes that are multiples of 64 are fast);
the padding columns are cut off before the softmax, so they are never predicted and never in the
loss. `ignore_index=-1` targets count neither in the loss nor in its mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -1


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return cap * torch.tanh(logits / cap) if cap else logits


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    cap: float | None,
    reduction: str = "mean",
) -> torch.Tensor:
    """x (B, T, C) @ weight (V_padded, C).T -> softcapped logits -> cross-entropy in fp32."""
    logits = F.linear(x, weight)[..., :vocab_size].float()  # (B, T, V)
    logits = softcap(logits, cap)
    loss = F.cross_entropy(
        logits.reshape(-1, vocab_size),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction=reduction,
    )
    return loss.view(targets.shape) if reduction == "none" else loss
