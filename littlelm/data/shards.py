"""Token shard files: a fixed header, the tokens, then the document offsets.

    offset 0    header, HEADER_SIZE bytes (little-endian):
                  magic b"LLMSHARD", format version u32, token dtype code u32 (2 = uint16,
                  4 = uint32), token count u64, document count u64, vocab size u32, BOS id u32,
                  tokenizer fingerprint (32 raw bytes of sha256), payload sha256 (32 bytes);
                  zero padded
    offset 256  tokens (count × itemsize), zero padded to a multiple of 8 bytes
    then        document start offsets, u64 × (documents + 1); the last one = token count

Every document starts with the BOS token. The payload checksum covers tokens and offsets. A
writer writes `NAME.tmp` and renames it into place when complete, so a file with the final name
is never partial. A reader memory-maps the file and checks magic, version, exact size and,
unless told not to, the checksum; any mismatch is a DataError naming the file and the fix.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from littlelm.errors import DataError

MAGIC = b"LLMSHARD"
VERSION = 1
HEADER = struct.Struct("<8sIIQQII32s32s")
HEADER_SIZE = 256
DTYPES = {2: np.uint16, 4: np.uint32}


@dataclass(frozen=True)
class ShardHeader:
    version: int
    itemsize: int
    n_tokens: int
    n_docs: int
    vocab_size: int
    bos_id: int
    fingerprint: str  # hex
    checksum: str  # hex

    @property
    def tokens_bytes(self) -> int:
        return _pad8(self.n_tokens * self.itemsize)

    @property
    def file_size(self) -> int:
        return HEADER_SIZE + self.tokens_bytes + 8 * (self.n_docs + 1)


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 2**16 else np.uint32


class ShardWriter:
    """Streams documents into `path` (through `path.tmp`); `close()` makes it appear complete."""

    def __init__(self, path: str | Path, vocab_size: int, bos_id: int, fingerprint: str):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.dtype = token_dtype(vocab_size)
        self.vocab_size, self.bos_id, self.fingerprint = vocab_size, bos_id, fingerprint
        self.offsets = [0]
        self.digest = hashlib.sha256()
        self.file = open(self.tmp, "wb")  # noqa: SIM115  (closed in close/abort)
        self.file.write(b"\0" * HEADER_SIZE)

    @property
    def n_tokens(self) -> int:
        return self.offsets[-1]

    def add(self, doc: np.ndarray) -> None:
        self.add_docs(np.asarray(doc), np.array([len(doc)]))

    def add_docs(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents given flattened: `tokens` (sum(lengths),), each starting with BOS."""
        assert len(tokens) == int(lengths.sum()) and (lengths > 0).all()
        starts = np.cumsum(lengths) - lengths
        assert (tokens[starts] == self.bos_id).all(), "every document starts with BOS"
        assert int(tokens.max(initial=0)) < self.vocab_size, "token id outside the vocabulary"
        data = tokens.astype(self.dtype, copy=False).tobytes()
        self.file.write(data)
        self.digest.update(data)
        self.offsets.extend((self.offsets[-1] + np.cumsum(lengths)).tolist())

    def close(self) -> ShardHeader:
        itemsize = np.dtype(self.dtype).itemsize
        pad = _pad8(self.n_tokens * itemsize) - self.n_tokens * itemsize
        offset_bytes = np.asarray(self.offsets, dtype="<u8").tobytes()
        for chunk in (b"\0" * pad, offset_bytes):
            self.file.write(chunk)
            self.digest.update(chunk)
        header = HEADER.pack(
            MAGIC,
            VERSION,
            itemsize,
            self.n_tokens,
            len(self.offsets) - 1,
            self.vocab_size,
            self.bos_id,
            bytes.fromhex(self.fingerprint),
            self.digest.digest(),
        )
        self.file.seek(0)
        self.file.write(header.ljust(HEADER_SIZE, b"\0"))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return read_header(self.path)

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


def write_shard(
    path: str | Path, docs: list[np.ndarray], vocab_size: int, bos_id: int, fingerprint: str
) -> ShardHeader:
    """Write documents (each a 1-D array starting with BOS) to `path` atomically."""
    writer = ShardWriter(path, vocab_size, bos_id, fingerprint)
    try:
        for d in docs:
            writer.add(d)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def rebuild_hint(path: Path) -> str:
    """How to fix a damaged shard: `littlelm data prepare` checks every shard of a complete
    dataset (the directory holding manifest.json) and rebuilds the damaged ones."""
    for parent in list(Path(path).parents)[:3]:
        if (parent / "manifest.json").is_file():
            return (
                f"run `littlelm data prepare` with the config that prepared {parent} (the run's "
                "own config if `littlelm train` did): it checks every shard and rebuilds the "
                f"damaged ones; or delete {parent} (the prepared dataset that holds it) and "
                "prepare again"
            )
    return "delete it and re-run `littlelm data prepare`"


def read_header(path: str | Path) -> ShardHeader:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
    except OSError as e:
        raise DataError(f"cannot read shard {path}: {e.strerror}") from None
    if len(raw) < HEADER.size or raw[:8] != MAGIC:
        raise DataError(f"{path} is not a littlelm shard (bad magic); {rebuild_hint(path)}")
    _, version, itemsize, n_tok, n_docs, vocab, bos, fp, ck = HEADER.unpack(raw[: HEADER.size])
    if version > VERSION:
        raise DataError(
            f"{path}: shard format v{version} is newer than this littlelm (v{VERSION}); upgrade littlelm"
        )
    if itemsize not in DTYPES:
        raise DataError(f"{path}: corrupt header (token size {itemsize}); {rebuild_hint(path)}")
    return ShardHeader(version, itemsize, n_tok, n_docs, vocab, bos, fp.hex(), ck.hex())


class Shard:
    """A memory-mapped shard: `tokens` (n_tokens,) and `offsets` (n_docs + 1,) arrays."""

    def __init__(self, path: str | Path, verify: bool = True):
        self.path = Path(path)
        self.header = h = read_header(self.path)
        size = self.path.stat().st_size
        if size != h.file_size:
            raise DataError(
                f"{self.path} is truncated or damaged: {size} bytes, its header promises {h.file_size}; "
                f"{rebuild_hint(self.path)}"
            )
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        # Plain ndarrays over the mapping (np.memmap slices are ~10x slower to make).
        self.tokens = np.frombuffer(self._map, DTYPES[h.itemsize], h.n_tokens, HEADER_SIZE)
        self.offsets = np.frombuffer(self._map, "<u8", h.n_docs + 1, HEADER_SIZE + h.tokens_bytes)
        # what the loader reads (data/loader.py): document d is tokens[starts[d]:ends[d]]
        self.starts, self.ends = self.offsets[:-1], self.offsets[1:]
        self.bos, self.n_tokens = h.bos_id, h.n_tokens
        if verify:
            self.verify()
        if int(self.offsets[-1]) != h.n_tokens or (h.n_docs and int(self.offsets[0]) != 0):
            raise DataError(
                f"{self.path}: document offsets are inconsistent; {rebuild_hint(self.path)}"
            )

    def verify(self) -> None:
        """Check the payload checksum (reads the whole file)."""
        digest = hashlib.sha256()
        view = memoryview(self._map)[HEADER_SIZE:]
        for start in range(0, len(view), 1 << 24):
            digest.update(view[start : start + (1 << 24)])
        view.release()
        if digest.hexdigest() != self.header.checksum:
            raise DataError(
                f"{self.path}: checksum mismatch, the file is corrupt; {rebuild_hint(self.path)}"
            )

    def check_tokenizer(self, fingerprint: str, describe: str = "this run's tokenizer") -> None:
        """Refuse a shard made by another tokenizer."""
        if self.header.fingerprint != fingerprint:
            raise DataError(
                f"{self.path} was made by a different tokenizer (fingerprint "
                f"{self.header.fingerprint[:12]}) than {describe} ({fingerprint[:12]}); prepare "
                "the data again with this tokenizer, or train with the one that made it"
            )

    def __len__(self) -> int:
        return self.header.n_docs

    def head(self, limit: int | None) -> np.ndarray:
        """The first `limit` tokens of the documents in order (None: all), BOS included."""
        return self.tokens if limit is None else self.tokens[:limit]

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets).astype(np.int64)
