"""Per-layer key/value cache for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of the positions seen so far, for one layer.

    `update` appends new (B, Hkv, T, D) keys/values and returns everything cached plus the
    attention mask the new queries need: causal within the new block, open to all earlier ones.
    """

    def __init__(self, batch: int, n_kv: int, max_len: int, head_dim: int, dtype, device):
        self.k = torch.zeros(batch, n_kv, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def update(self, k: torch.Tensor, v: torch.Tensor):
        start, T = self.length, k.size(2)
        if start + T > self.k.size(2):
            raise ValueError(f"KV cache holds {self.k.size(2)} positions; {start + T} requested")
        self.k[:, :, start : start + T] = k
        self.v[:, :, start : start + T] = v
        self.length = start + T
        mask = None
        if T > 1:  # query i (absolute position start+i) sees keys 0..start+i
            q_pos = torch.arange(start, start + T, device=k.device)[:, None]
            mask = torch.arange(start + T, device=k.device)[None, :] <= q_pos  # (T, start+T)
        return self.k[:, :, : self.length], self.v[:, :, : self.length], mask
