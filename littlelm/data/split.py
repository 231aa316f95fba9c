"""Which documents are held out for validation.

hash   per raw document, before `max_chars` cuts it into pieces (so the pieces of one
       document never straddle the split): a seeded hash of its text is below `fraction`;
       independent of file order, unit boundaries and worker count, and identical documents
       always land together
tail   the last `fraction` of the pieces in order, counted after `max_chars` cuts the
       documents: a single long file read as one document and cut into pieces of about equal
       size holds out the last `fraction` of its text (nanoGPT's split); only the one document
       at the boundary straddles it
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
        self,
        fraction: float,
        mode: Literal["hash", "tail"],
        seed: int,
        n_pieces: int | None = None,
    ):
        self.fraction, self.mode, self.seed, self.n_pieces = fraction, mode, seed, n_pieces
        assert mode == "hash" or n_pieces is not None, "tail split needs the piece count"

    def is_val(self, index: int, data: bytes) -> bool:
        """Piece number `index` (tail: in source order), of a document with UTF-8 bytes `data`
        (hash)."""
        if self.fraction <= 0:
            return False
        if self.mode == "tail":
            assert self.n_pieces is not None, "checked at construction"
            return index >= round(self.n_pieces * (1 - self.fraction))
        return content_hash(data, self.seed) < self.fraction

    def sides(self, first: int, data: bytes, n: int) -> list[bool]:
        """Whether each of a document's `n` pieces is held out; `first`: the number of its first
        piece in the source, `data`: the document's UTF-8 bytes."""
        if self.mode == "hash":
            return [self.is_val(first, data)] * n  # the document's pieces stay together
        return [self.is_val(first + j, data) for j in range(n)]

    def key(self) -> dict:
        if self.mode == "hash":  # as before tail counted pieces: prepared shards stay valid
            return {"fraction": self.fraction, "mode": "hash", "seed": self.seed, "n_docs": None}
        return dict(vars(self))
