"""Which documents are held out for validation.

Decided per raw document (before long documents are cut into pieces, so the pieces of one
document never straddle the split):

    hash   a seeded hash of the document's text is below `fraction`: independent of file order,
           unit boundaries and worker count, and identical documents always land together
    tail   the last `fraction` of the documents in order (like nanoGPT's last 10%)
"""

from __future__ import annotations

import hashlib
from typing import Literal


def content_hash(data: bytes, seed: int) -> float:
    """A fixed pseudo-random number in [0, 1) for a document's bytes."""
    h = hashlib.blake2b(data, digest_size=8, key=str(seed).encode())
    return int.from_bytes(h.digest(), "little") / 2.0**64


class ValSplit:
    def __init__(
        self, fraction: float, mode: Literal["hash", "tail"], seed: int, n_docs: int | None = None
    ):
        self.fraction, self.mode, self.seed, self.n_docs = fraction, mode, seed, n_docs
        assert mode == "hash" or n_docs is not None, "tail split needs the document count"

    def is_val(self, index: int, data: bytes) -> bool:
        """Document number `index` (in source order) with UTF-8 bytes `data`."""
        if self.fraction <= 0:
            return False
        if self.mode == "tail":
            assert self.n_docs is not None, "checked at construction"
            return index >= round(self.n_docs * (1 - self.fraction))
        return content_hash(data, self.seed) < self.fraction

    def key(self) -> dict:
        return dict(vars(self))
