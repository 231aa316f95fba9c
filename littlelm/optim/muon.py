"""Muon: momentum SGD whose update for each 2-D matrix is replaced by its nearest orthogonal
matrix (computed with a Newton–Schulz iteration), so every direction of the update moves at the
same rate. Used for the hidden matrices of the transformer; embeddings, lm_head and scalars go
to AdamW (see optim.groups). The optimizer that steps both is optim/optimizer.py; this module is
Muon's arithmetic.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

# Quintic Newton–Schulz coefficients chosen to push singular values towards 1 quickly from
# anywhere in (0, 1]; five iterations land them in roughly [0.7, 1.2], which is all an update
# direction needs. `ns_steps` trades accuracy for time.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def orthogonalize(
    g: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Approximate U·Vᵀ of the SVD of g (..., m, n), computed in `dtype` (bf16: the iteration
    only needs singular values near 1, and bf16 runs at the hardware's fastest rate; fp32 where
    bf16 is emulated in software, see littlelm/hardware.py)."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.mT
        poly = b * gram + c * (gram @ gram)
        x = a * x + poly @ x
    return x.mT if tall else x


def shape_scale(shape: torch.Size) -> float:
    """lr multiplier sqrt(max(1, rows/cols)): keeps the update's RMS size independent of aspect."""
    return math.sqrt(max(1.0, shape[-2] / shape[-1]))


def same_shape_buckets(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters grouped by shape, in first-seen order (the same on every rank)."""
    by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        by_shape[tuple(p.shape)].append(p)
    return list(by_shape.values())
