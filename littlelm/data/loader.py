"""Training batches: documents in a seeded order, BOS-aligned best-fit packing, source mixing.

    DocStream      one source's training documents for one data-parallel rank, epoch after epoch
    BestFitPacker  fills rows of seq_len + 1 tokens from a buffer of whole documents
    MixtureLoader  picks each row's source so that realised token shares follow the weights
    Prefetcher     builds batches in a background thread

Every row starts at a document's BOS. The packer puts the largest buffered document that fits
next; when none fits it crops the shortest to fill the row (the cropped tail is dropped and
counted). There is no padding. Each class's `state_dict()` is plain data (ints and lists) and
restores the exact same sequence of batches, which checkpoints rely on.
"""

from __future__ import annotations

import bisect
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from littlelm.data.shards import Shard
from littlelm.errors import DataError


class DataExhausted(DataError):
    """A source ran out of documents and its policy is 'stop'."""


class DocStream:
    """Documents of one source for one rank: each epoch visits the shards in a seeded order and
    each shard's documents in a seeded order; rank r of w takes every w-th document of each
    shard starting at r, so ranks are disjoint and together cover everything."""

    def __init__(
        self,
        shards: list[Shard],
        seed: int,
        rank: int = 0,
        world: int = 1,
        repeat: bool = True,
        label: str = "",
    ):
        if not shards or sum(len(s) for s in shards) == 0:
            raise DataError(f"source {label!r} has no training documents")
        self.shards, self.seed, self.rank, self.world = shards, seed, rank, world
        self.repeat, self.label = repeat, label
        self.epoch, self.shard_pos, self.doc_pos = 0, 0, 0
        self._order: np.ndarray | None = None
        self._docs: np.ndarray | None = None

    def _shard_order(self) -> np.ndarray:
        if self._order is None:
            rng = np.random.default_rng((self.seed, self.epoch))
            self._order = rng.permutation(len(self.shards))
        return self._order

    def _doc_order(self) -> np.ndarray:
        if self._docs is None:
            s = int(self._shard_order()[self.shard_pos])
            rng = np.random.default_rng((self.seed, self.epoch, s))
            self._docs = rng.permutation(len(self.shards[s]))[self.rank :: self.world]
        return self._docs

    def next(self) -> tuple[int, int]:
        """(shard index, document index) of the next document."""
        empty_in_a_row = 0
        while self.doc_pos >= len(self._doc_order()):
            empty_in_a_row += 1
            if empty_in_a_row > len(self.shards) + 1:
                raise DataError(
                    f"source {self.label!r} has no documents for rank {self.rank} of {self.world}"
                )
            self.shard_pos, self.doc_pos, self._docs = self.shard_pos + 1, 0, None
            if self.shard_pos == len(self.shards):
                if not self.repeat:
                    raise DataExhausted(
                        f"source {self.label!r} is exhausted after {self.epoch + 1} epoch(s); "
                        "set data.on_exhausted=repeat to start a new epoch, or add data"
                    )
                self.epoch, self.shard_pos, self._order = self.epoch + 1, 0, None
        s = int(self._shard_order()[self.shard_pos])
        d = int(self._doc_order()[self.doc_pos])
        self.doc_pos += 1
        return s, d

    def doc(self, s: int, d: int) -> np.ndarray:
        return self.shards[s].doc(d)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "shard_pos": self.shard_pos, "doc_pos": self.doc_pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.shard_pos, self.doc_pos = (
            state["epoch"],
            state["shard_pos"],
            state["doc_pos"],
        )
        self._order = self._docs = None


@dataclass
class PackStats:
    rows: int = 0
    tokens: int = 0  # tokens placed in rows
    cropped: int = 0  # tokens dropped when a document was cropped to fill a row

    @property
    def crop_rate(self) -> float:
        return self.cropped / max(1, self.tokens + self.cropped)


class BestFitPacker:
    """Packs whole documents into rows of `row_len` tokens, best fit first."""

    def __init__(self, stream: DocStream, row_len: int, buffer_docs: int = 1000):
        self.stream, self.row_len, self.buffer_docs = stream, row_len, buffer_docs
        self.buffer: list[tuple[int, int, int, int]] = []  # sorted (length, seq, shard, doc)
        self.seq = 0
        self.stats = PackStats()

    def _refill(self) -> None:
        while len(self.buffer) < self.buffer_docs:
            s, d = self.stream.next()
            n = int(self.stream.shards[s].offsets[d + 1] - self.stream.shards[s].offsets[d])
            bisect.insort(self.buffer, (n, self.seq, s, d))
            self.seq += 1

    def fill(self, row: np.ndarray) -> None:
        """Fill `row` (row_len,) in place."""
        pos = 0
        while pos < self.row_len:
            self._refill()
            room = self.row_len - pos
            i = bisect.bisect_right(self.buffer, (room, float("inf"))) - 1
            cropped = i < 0
            n, _, s, d = self.buffer.pop(0 if cropped else i)
            take = min(n, room)
            row[pos : pos + take] = self.stream.doc(s, d)[:take]
            pos += take
            self.stats.cropped += n - take
        self.stats.tokens += self.row_len
        self.stats.rows += 1

    def state_dict(self) -> dict:
        return {
            "stream": self.stream.state_dict(),
            "buffer": [list(b) for b in self.buffer],
            "seq": self.seq,
            "stats": [self.stats.rows, self.stats.tokens, self.stats.cropped],
        }

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.buffer = [tuple(b) for b in state["buffer"]]
        self.seq = state["seq"]
        self.stats = PackStats(*state["stats"])


class MixtureLoader:
    """Batches (x, y) of shape (batch, seq_len) from one or more packers.

    Each row comes from the source whose realised share of rows is furthest below its weight,
    which keeps the realised token proportions within one row of the weights at all times,
    deterministically.
    """

    def __init__(
        self, packers: dict[str, BestFitPacker], weights: dict[str, float], batch: int, seq_len: int
    ):
        self.packers, self.batch, self.seq_len = packers, batch, seq_len
        total = sum(weights.values())
        self.labels = list(packers)
        self.weights = np.array([weights[k] / total for k in self.labels])
        self.rows = np.zeros(len(self.labels), dtype=np.int64)

    def _pick(self) -> int:
        deficit = self.weights * (self.rows.sum() + 1) - self.rows
        return int(np.argmax(deficit))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.empty((self.batch, self.seq_len + 1), dtype=np.int64)
        for r in range(self.batch):
            k = self._pick()
            self.packers[self.labels[k]].fill(rows[r])
            self.rows[k] += 1
        t = torch.from_numpy(rows)
        return t[:, :-1], t[:, 1:]

    def proportions(self) -> dict[str, float]:
        total = max(1, int(self.rows.sum()))
        return {k: int(n) / total for k, n in zip(self.labels, self.rows)}

    def crop_rate(self) -> float:
        cropped = sum(p.stats.cropped for p in self.packers.values())
        tokens = sum(p.stats.tokens for p in self.packers.values())
        return cropped / max(1, tokens + cropped)

    def state_dict(self) -> dict:
        return {
            "rows": self.rows.tolist(),
            "packers": {k: p.state_dict() for k, p in self.packers.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if set(state["packers"]) != set(self.packers):
            raise DataError(
                f"checkpoint's data sources {sorted(state['packers'])} differ from this run's {sorted(self.packers)}"
            )
        self.rows = np.array(state["rows"], dtype=np.int64)
        for k, p in self.packers.items():
            p.load_state_dict(state["packers"][k])


@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    state: dict = field(repr=False)  # loader state right after this batch


class Prefetcher:
    """Builds the next batches in a background thread. Each batch carries the loader state just
    after it, so a checkpoint taken after consuming it resumes with the batch that follows."""

    def __init__(self, loader: MixtureLoader, depth: int = 2):
        self.loader = loader
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="littlelm-loader")
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                x, y = self.loader.next_batch()
                item: Batch | BaseException = Batch(x, y, self.loader.state_dict())
                while not self._stop.is_set():
                    try:
                        self.queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer, raised there
            self.queue.put(e)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def val_batches(
    shards: list[Shard], batch: int, seq_len: int, max_tokens: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole validation split in order, as consecutive windows of seq_len + 1 tokens
    (stride seq_len, so every token after the first is predicted exactly once). The last batch
    may have fewer rows; the final partial window is dropped."""
    tokens = np.concatenate([s.tokens for s in shards]) if shards else np.zeros(0, np.int64)
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    n_rows = (len(tokens) - 1) // seq_len
    for start in range(0, n_rows, batch):
        rows = [
            tokens[r * seq_len : r * seq_len + seq_len + 1]
            for r in range(start, min(start + batch, n_rows))
        ]
        t = torch.from_numpy(np.stack(rows).astype(np.int64))
        yield t[:, :-1], t[:, 1:]
