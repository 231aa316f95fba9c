"""Training batches: documents in a seeded order, BOS-aligned best-fit packing, source mixing.

    DocStream      one source's training documents for one data-parallel rank, epoch after epoch
    BestFitPacker  fills rows of seq_len + 1 tokens from a buffer of whole documents
    MixtureLoader  picks each row's source so that realised token shares follow the weights
    Prefetcher     builds batches in a background thread

The packer puts the largest buffered document that fits next; when none fits it fills the row
with the head of the shortest. What happens to the rest is the source's `long_docs` option:

    crop   the rest is dropped and counted (crop rate); every row starts at a document's BOS
    split  (the default) nothing is dropped. A document longer than a row is cut when it
           arrives into pieces of one row each, then the rest (at most a row) joins the buffer; the rest of a
           document that fills the end of a row goes back into the buffer. A piece after the
           first starts on the last token of the piece before it and has no BOS of its own, so
           every token of the document after its BOS is a prediction target exactly once per
           epoch (the row's first token is input only); a row may start mid-document. Whole-row
           pieces are taken at the start of the next rows, in order. The share of row tokens
           that are such continuations is counted (split rate).

    pad    (conversation sources, docs/post-training.md) nothing is cut: when no buffered
           conversation fits the rest of a row, the rest is padding (BOS tokens whose targets
           the loss ignores) and the conversations wait for the next row; one longer than a
           whole row is left out and counted (too long), as data/build.py told at start

Crop and split rows have no padding. A source with a chat mask (data/chat.py) has the targets
of every token outside an assistant reply set to IGNORE (the loss's ignore index), and each
Batch counts the targets left (`trained`), which the trainer counts as its tokens. Each class's
`state_dict()` is plain data (ints and lists) and restores the exact same sequence of batches,
which checkpoints rely on.

Speed: the hot loop touches only Python ints and lists (document starts and lengths are turned
into lists once per shard visit), the buffer is a sorted list of packed int keys, and each
document is one numpy slice copy after its BOS; see benchmarks/data.py.

A shard is anything with `tokens`, `starts` and `ends` (document d is tokens[starts[d]:ends[d]]
with its first token replaced by `bos`) and `len()`: littlelm's own (data/shards.py) or a view
of another tool's token file (data/foreign.py).
"""

from __future__ import annotations

import queue
import threading
import warnings
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from littlelm.data.shards import Shard
from littlelm.errors import DataError

IGNORE = -1  # a target the loss leaves out (model/kernels.py's ignore index)
SEQ_BITS = 40  # a buffer key is length << SEQ_BITS | arrival number
SEQ_MASK = (1 << SEQ_BITS) - 1


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
        self.tokens = [s.tokens for s in shards]
        self.bos = shards[0].bos  # every document's first token in a row
        self.size = sum(len(s) for s in shards) // world + 1  # this rank's documents, at most
        self.epoch, self.shard_pos, self.doc_pos = 0, 0, 0
        self._order: np.ndarray | None = None
        self._visit: tuple[int, list[int], list[int], list[int]] | None = None

    def _shard_order(self) -> np.ndarray:
        if self._order is None:
            rng = np.random.default_rng((self.seed, self.epoch))
            self._order = rng.permutation(len(self.shards))
        return self._order

    def _current(self) -> tuple[int, list[int], list[int], list[int]]:
        """(shard, documents, starts, lengths) of this rank's visit of the current shard."""
        if self._visit is None:
            s = int(self._shard_order()[self.shard_pos])
            rng = np.random.default_rng((self.seed, self.epoch, s))
            docs = rng.permutation(len(self.shards[s]))[self.rank :: self.world]
            shard = self.shards[s]
            starts = shard.starts[docs]
            lengths = shard.ends[docs] - starts
            self._visit = (s, docs.tolist(), starts.tolist(), lengths.tolist())
        return self._visit

    def _advance(self) -> None:
        """Move to the next shard (and epoch) that has documents for this rank."""
        for _ in range(len(self.shards) + 1):
            self.shard_pos, self.doc_pos, self._visit = self.shard_pos + 1, 0, None
            if self.shard_pos == len(self.shards):
                if not self.repeat:
                    raise DataExhausted(
                        f"source {self.label!r} is exhausted after {self.epoch + 1} epoch(s); "
                        "set data.on_exhausted=repeat to start a new epoch, or add data"
                    )
                self.epoch, self.shard_pos, self._order = self.epoch + 1, 0, None
            if self.doc_pos < len(self._current()[1]):
                return
        raise DataError(
            f"source {self.label!r} has no documents for rank {self.rank} of {self.world}"
        )

    def next(self) -> tuple[int, int, int, int]:
        """(shard index, document index, start offset, length) of the next document."""
        visit = self._current()
        if self.doc_pos >= len(visit[1]):
            self._advance()
            visit = self._current()
        i = self.doc_pos
        self.doc_pos = i + 1
        return visit[0], visit[1][i], visit[2][i], visit[3][i]

    def start_of(self, s: int, d: int) -> int:
        return int(self.shards[s].starts[d])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "shard_pos": self.shard_pos, "doc_pos": self.doc_pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.shard_pos, self.doc_pos = (
            state["epoch"],
            state["shard_pos"],
            state["doc_pos"],
        )
        self._order = self._visit = None


class StopWaiting(Exception):
    """A stop signal came while the trainer waited for the loader's next batch."""


@dataclass
class PackStats:
    rows: int = 0
    tokens: int = 0  # tokens placed in rows
    cropped: int = 0  # tokens dropped when a document was cropped to fill a row
    split: int = 0  # row tokens from a piece that does not start at its document's BOS
    padded: int = 0  # pad mode: row tokens that are padding
    too_long: int = 0  # pad mode: times a document longer than a row was left out

    @property
    def crop_rate(self) -> float:
        return self.cropped / max(1, self.tokens + self.cropped)

    @property
    def split_rate(self) -> float:
        return self.split / max(1, self.tokens)


class BestFitPacker:
    """Packs documents into rows of `row_len` tokens, best fit first.

    The buffer is a sorted list of keys `length << SEQ_BITS | seq` (seq = arrival number), so
    `bisect` finds the largest document that fits (the latest arrival among equal lengths) and
    index 0 is the shortest (the earliest among equals); `where[seq]` = (shard, doc, start).
    Split mode adds `offs[seq]`, the offset of `start` in its document when it is not 0, and
    `pieces`, the whole-row pieces of long documents, taken first at the start of a row: one
    entry per document, (seq, shard, doc, start, offset, count) for its `count` pieces that
    start at `offset`, `offset + row_len - 1`, ... (a 50 MB document is one entry, not a
    million: the state, its snapshot and each checkpoint stay the size of the buffer)."""

    def __init__(
        self,
        stream: DocStream,
        row_len: int,
        buffer_docs: int = 1000,
        long_docs: str = "crop",  # a run's sources default to split (data/sources.py)
        pad_id: int = 0,
        explicit: bool = True,
    ):
        assert long_docs in ("crop", "split", "pad"), long_docs
        self.stream, self.row_len, self.buffer_docs = stream, row_len, buffer_docs
        self.pad_id = pad_id
        # explicit: the config names long_docs; if not, a checkpoint's packing wins on resume
        self.explicit = explicit
        self.adopted: str | None = None  # the checkpoint's long_docs, when it was adopted
        self._set_mode(long_docs)
        self.keys: list[int] = []
        self.where: dict[int, tuple[int, int, int]] = {}
        self.offs: dict[int, int] = {}
        self.pieces: deque[tuple[int, int, int, int, int, int]] = deque()
        self.seq = 0
        self.stats = PackStats()

    def _set_mode(self, long_docs: str) -> None:
        self.mode, self.split, self.pad = long_docs, long_docs == "split", long_docs == "pad"

    def _refill(self) -> None:
        keys, where, nxt, split = self.keys, self.where, self.stream.next, self.split
        seq, row_len = self.seq, self.row_len
        skipped = 0  # conversations left out in a row: a whole epoch of them ends the wait
        try:
            while len(keys) < self.buffer_docs:
                s, d, start, n = nxt()
                if split and n > row_len:
                    start, n = self._cut(seq, s, d, start, n)
                elif n > row_len and self.pad:  # a conversation is never cut: left out
                    self.stats.too_long += 1
                    skipped += 1
                    if skipped > self.stream.size and not keys:
                        raise self._nothing_fits()
                    continue
                insort(keys, (n << SEQ_BITS) | seq)
                where[seq] = (s, d, start)
                seq += 1
        finally:  # a source that runs out mid-refill keeps what it read
            self.seq = seq

    def _nothing_fits(self) -> DataError:
        """The error for a source of which not one conversation fits a row (pad mode): it
        could only skip them forever."""
        lengths = np.concatenate([s.lengths() for s in self.stream.shards])
        return DataError(
            f"data.sources.{self.stream.label}: none of its {len(lengths):,} conversations fits "
            f"a training row of {self.row_len} tokens (train.seq_len + 1; the shortest has "
            f"{int(lengths.min()):,} tokens, the longest {int(lengths.max()):,}), so no row can "
            f"be made; raise train.seq_len to at least {int(lengths.min()) - 1} (within "
            "model.max_seq_len), or give this source shorter conversations"
        )

    def _cut(self, seq: int, s: int, d: int, start: int, n: int) -> tuple[int, int]:
        """Queue the whole-row pieces of a long document (each starting on the last token of
        the one before) as one entry; return the start and length of the rest, at most a row."""
        step = self.row_len - 1
        count = (n - 2) // step  # pieces while more than a row is left: n - k·step > row_len
        self.pieces.append((seq, s, d, start, 0, count))
        off = count * step
        self.offs[seq] = off
        return start + off, n - off

    def fill(self, row: np.ndarray) -> None:
        """Fill `row` (row_len,) in place: a whole-row piece if one waits (split), else best
        fit. The rest of a document that fills the end of the row is dropped (crop, pad) or
        kept for later (split); pad pads a row when no buffered document fits its rest."""
        keys, where, tokens, offs = self.keys, self.where, self.stream.tokens, self.offs
        bos, split, pad = self.stream.bos, self.split, self.pad
        pos, row_len, cont, cropped = 0, self.row_len, 0, 0
        if split and len(keys) < self.buffer_docs:
            self._refill()
        if self.pieces:  # a whole-row piece of a long document (split)
            seq, s, d, start, off, count = self.pieces.popleft()
            if count > 1:  # the document's next piece starts on this one's last token
                step = row_len - 1
                self.pieces.appendleft((seq, s, d, start + step, off + step, count - 1))
            if off:
                row[:] = tokens[s][start : start + row_len]
            else:  # the document's first piece: BOS, as below
                row[0] = bos
                row[1:] = tokens[s][start + 1 : start + row_len]
            pos, cont = row_len, row_len if off else 0
        while pos < row_len:
            if len(keys) < self.buffer_docs:
                self._refill()
            room = row_len - pos
            i = bisect_right(keys, ((room + 1) << SEQ_BITS) - 1) - 1
            if i < 0 and pad and pos:  # nothing fits: the rest of the row is padding
                row[pos:] = self.pad_id
                self.stats.padded += room
                break
            key = keys.pop(i if i >= 0 else 0)
            n, seq = key >> SEQ_BITS, key & SEQ_MASK
            s, d, start = where.pop(seq)
            take = n if n <= room else room
            off = offs.pop(seq, 0) if offs else 0  # split: where a rest starts in its document
            if off:
                row[pos : pos + take] = tokens[s][start : start + take]
                cont += take
            else:
                # a document starts with BOS: littlelm's shards hold it there, other tools'
                # files their separator or the token before (data/foreign.py)
                row[pos] = bos
                row[pos + 1 : pos + take] = tokens[s][start + 1 : start + take]
            pos += take
            if take < n and split:  # the rest waits, from the last token placed here
                insort(keys, ((n - take + 1) << SEQ_BITS) | seq)
                where[seq] = (s, d, start + take - 1)
                offs[seq] = off + take - 1
            else:
                cropped += n - take
        st = self.stats
        st.rows, st.tokens = st.rows + 1, st.tokens + row_len
        st.cropped, st.split = st.cropped + cropped, st.split + cont

    def snapshot(self) -> tuple:
        """A cheap copy of the state; `state_from_snapshot` turns it into plain data."""
        st = self.stats
        split = (self.offs.copy(), tuple(self.pieces)) if self.split else None
        return (
            self.stream.state_dict(),
            self.keys.copy(),
            self.where.copy(),
            self.seq,
            (st.rows, st.tokens, st.cropped, st.split, st.padded, st.too_long),
            split,
            self.mode,
        )

    @staticmethod
    def state_from_snapshot(snap: tuple) -> dict:
        """Buffer entries are [length, arrival, shard, doc], plus the offset in the document
        when it is not 0; split mode adds `pieces`, [arrival, shard, doc, offset, count] each
        (`count` whole-row pieces from `offset` on)."""
        stream, keys, where, seq, stats, split, mode = snap
        offs, pieces = split or ({}, None)
        buffer = []
        for k in keys:
            q = k & SEQ_MASK
            off = offs.get(q, 0)
            buffer.append([k >> SEQ_BITS, q, *where[q][:2]] + ([off] if off else []))
        state = {"stream": stream, "buffer": buffer, "seq": seq, "stats": list(stats)}
        state["long_docs"] = mode
        if pieces is not None:
            state["pieces"] = [[q, s, d, off, count] for q, s, d, _, off, count in pieces]
        return state

    def state_dict(self) -> dict:
        return self.state_from_snapshot(self.snapshot())

    def load_state_dict(self, state: dict) -> None:
        """Restore a state_dict. A checkpoint written before littlelm recorded `long_docs`
        there (it packed with split exactly when its state has `pieces`) resumes with its own
        packing, unless the config names another one: then this refuses."""
        mode = self.mode
        saved = state.get("long_docs") or (
            "split" if "pieces" in state else "pad" if self.pad else "crop"
        )
        if saved != mode:
            label = self.stream.label
            if self.explicit or "pad" in (saved, mode):  # pad: conversations, never chosen
                raise DataError(
                    f"the checkpoint's loader state of source {label!r} was saved with "
                    f"long_docs={saved}, this config says {mode}; set data.sources.{label}."
                    f"long_docs={saved} to resume (or start a new run to change the packing)"
                )
            self._set_mode(saved)  # the default changed since: keep the run's own packing
            self.adopted = saved
        self.stream.load_state_dict(state["stream"])
        start_of = self.stream.start_of
        self.keys, self.where, self.offs = [], {}, {}
        for n, seq, s, d, *off in state["buffer"]:
            self.keys.append((n << SEQ_BITS) | seq)
            self.where[seq] = (s, d, start_of(s, d) + sum(off))
            if off:
                self.offs[seq] = off[0]
        self.keys.sort()
        # a state written before pieces were counted holds one entry per piece: a count of 1
        self.pieces = deque(
            (q, s, d, start_of(s, d) + off, off, count)
            for q, s, d, off, count in (
                p if len(p) == 5 else [*p, 1] for p in state.get("pieces", [])
            )
        )
        self.seq = state["seq"]
        self.stats = PackStats(*state["stats"])


@dataclass
class LoaderSnapshot:
    """The loader's state after a batch, copied cheaply; plain data only when asked."""

    rows: list[int]
    packers: dict[str, tuple]
    labels: list[str]
    weights: list[float]

    def state_dict(self) -> dict:
        return {
            "rows": list(self.rows),
            "packers": {k: BestFitPacker.state_from_snapshot(p) for k, p in self.packers.items()},
        }

    def proportions(self) -> dict[str, float]:
        total = max(1, sum(self.rows))
        return {k: n / total for k, n in zip(self.labels, self.rows)}

    def stats(self) -> PackStats:
        """Every source's packing counts, summed."""
        return PackStats(*map(sum, zip(*(p[4] for p in self.packers.values()))))

    def crop_rate(self) -> float:
        return self.stats().crop_rate

    def split_rate(self) -> float:
        """Share of row tokens that continue a document split across rows (split mode)."""
        return self.stats().split_rate

    def report(self) -> str:
        """'web 0.601 (target 0.600), math 0.149 (0.150); 1.20% of document tokens cropped,
        0.00% of row tokens continue a split document' (and, with conversations, the padding
        and the conversations left out as too long)."""
        mix = ", ".join(
            f"{k} {p:.3f} (target {w:.3f})"
            for (k, p), w in zip(self.proportions().items(), self.weights)
        )
        st = self.stats()
        chat = (
            f", {100 * st.padded / max(1, st.tokens):.2f}% of row tokens padding, "
            f"{st.too_long:,} skip(s) of a conversation longer than a row (each epoch counts)"
            if st.padded or st.too_long
            else ""
        )
        return (
            f"{mix}; {100 * self.crop_rate():.2f}% of document tokens cropped, "
            f"{100 * self.split_rate():.2f}% of row tokens continue a split document{chat}"
        )


class MixtureLoader:
    """Batches (x, y) of shape (batch, seq_len) from one or more packers.

    Each row comes from the source whose realised share of rows is furthest below its weight
    (ties: the first source), which keeps the realised token proportions within one row of the
    weights at all times, deterministically.
    """

    def __init__(
        self,
        packers: dict[str, BestFitPacker],
        weights: dict[str, float],
        batch: int,
        seq_len: int,
        masks: dict | None = None,
    ):
        self.packers, self.batch, self.seq_len = packers, batch, seq_len
        # label -> f(row tokens) -> bool per token: which are trained (data/chat.py's mask)
        self.masks = {k: m for k, m in (masks or {}).items() if m is not None}
        total = sum(weights.values())
        self.labels = list(packers)
        self.weights = [weights[k] / total for k in self.labels]
        self.rows = [0] * len(self.labels)
        self._fills = [packers[k].fill for k in self.labels]
        # rows hold any source's tokens (littlelm shards, other tools' uint16/int32 files)
        self.dtype = np.result_type(*(p.stream.tokens[0].dtype for p in packers.values()))

    def _pick(self) -> int:
        rows, total = self.rows, sum(self.rows) + 1
        best, best_deficit = 0, None
        for k, w in enumerate(self.weights):
            deficit = w * total - rows[k]
            if best_deficit is None or deficit > best_deficit:
                best, best_deficit = k, deficit
        return best

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.empty((self.batch, self.seq_len + 1), dtype=self.dtype)
        picked = []
        for r in range(self.batch):
            k = self._pick()
            self._fills[k](rows[r])
            self.rows[k] += 1
            picked.append(k)
        t = torch.from_numpy(rows.astype(np.int64))
        if not self.masks:
            return t[:, :-1], t[:, 1:]
        y = t[:, 1:].clone()  # x shares t's storage
        for r, k in enumerate(picked):
            mask = self.masks.get(self.labels[k])
            if mask is not None:  # every row of a masked source starts at a BOS (pad mode)
                y[r, torch.from_numpy(~mask(rows[r])[1:])] = IGNORE
        return t[:, :-1], y

    def snapshot(self) -> LoaderSnapshot:
        return LoaderSnapshot(
            list(self.rows),
            {k: p.snapshot() for k, p in self.packers.items()},
            self.labels,
            self.weights,
        )

    def proportions(self) -> dict[str, float]:
        return self.snapshot().proportions()

    def crop_rate(self) -> float:
        return self.snapshot().crop_rate()

    def split_rate(self) -> float:
        return self.snapshot().split_rate()

    def state_dict(self) -> dict:
        return self.snapshot().state_dict()

    def load_state_dict(self, state: dict) -> None:
        if set(state["packers"]) != set(self.packers):
            raise DataError(
                f"checkpoint's data sources {sorted(state['packers'])} differ from this run's {sorted(self.packers)}"
            )
        self.rows = [int(n) for n in state["rows"]]
        for k, p in self.packers.items():
            p.load_state_dict(state["packers"][k])
            if p.adopted:
                warnings.warn(
                    f"data.sources.{k}: resuming with long_docs={p.adopted}, the packing this "
                    f"run's checkpoint was trained with (the default is now split; set "
                    f"data.sources.{k}.long_docs to choose explicitly)",
                    stacklevel=2,
                )


@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    state: LoaderSnapshot = field(repr=False)  # loader state right after this batch
    trained: int | None = None  # targets the loss counts, when some are masked (else all)


class Prefetcher:
    """Builds the next batches in a background thread. Each batch carries the loader state just
    after it, so a checkpoint taken after consuming it resumes with the batch that follows."""

    def __init__(self, loader: MixtureLoader, depth: int = 2, stopping=lambda: None):
        self.loader = loader
        self.stopping = stopping  # -> a reason to stop waiting for a batch (a signal's name)
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="littlelm-loader")
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                x, y = self.loader.next_batch()
                trained = int((y != IGNORE).sum()) if self.loader.masks else None
                item: Batch | BaseException = Batch(x, y, self.loader.snapshot(), trained)
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
        while True:  # a stalled loader must not hold off a stop signal: look every 0.2 s
            try:
                item = self.queue.get(timeout=0.2)
                break
            except queue.Empty:
                if reason := self.stopping():
                    raise StopWaiting(reason) from None
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def val_batches(
    shards: list[Shard],
    batch: int,
    seq_len: int,
    max_tokens: int | None = None,
    mask=None,
    pad_id: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A validation split in order, as consecutive windows of seq_len + 1 tokens (stride
    seq_len, so every token after the first is predicted exactly once), reading only the
    shards it needs. The last batch may have fewer rows; the final partial window is dropped.
    With `mask` (conversations) see `_conversation_rows`."""
    if mask is not None:
        yield from _conversation_rows(shards, batch, seq_len, max_tokens, mask, pad_id)
        return
    tokens = _first_tokens(shards, None if max_tokens is None else max_tokens + 1)
    n_rows = (len(tokens) - 1) // seq_len
    for start in range(0, n_rows, batch):
        rows = [
            tokens[r * seq_len : r * seq_len + seq_len + 1]
            for r in range(start, min(start + batch, n_rows))
        ]
        t = torch.from_numpy(np.stack(rows).astype(np.int64))
        yield t[:, :-1], t[:, 1:]


def _conversation_rows(shards, batch, seq_len, max_tokens, mask, pad_id):
    """Held-out conversations packed whole, in order, as training packs them (the next one
    that does not fit starts a new row; the rest is padding), so every reply is scored after
    its own question; targets outside the replies are IGNORE. Conversations longer than a row
    are left out, as in training; `max_tokens` caps the row tokens."""
    row_len, used, total = seq_len + 1, 0, 0
    rows: list[list[np.ndarray]] = []  # each row's conversations
    row: list[np.ndarray] = []
    docs = (s.doc(i) for s in shards for i in range(len(s)))
    for d in docs:
        if len(d) > row_len:
            continue
        if used + len(d) > row_len:
            rows.append(row)
            row, used, total = [], 0, total + row_len
            if max_tokens is not None and total >= max_tokens:
                break
        row.append(d)
        used += len(d)
    else:
        if row:
            rows.append(row)
    for start in range(0, len(rows), batch):
        t = np.full((min(batch, len(rows) - start), row_len), pad_id, dtype=np.int64)
        for r, parts in enumerate(rows[start : start + batch]):
            if parts:
                flat = np.concatenate(parts)
                t[r, : len(flat)] = flat
        keep = np.stack([mask(r)[1:] for r in t])
        y = torch.from_numpy(np.where(keep, t[:, 1:], IGNORE))
        yield torch.from_numpy(t[:, :-1]), y


def _first_tokens(shards: list[Shard], limit: int | None) -> np.ndarray:
    parts, have = [], 0
    for s in shards:
        if limit is not None and have >= limit:
            break
        part = s.head(None if limit is None else limit - have)
        parts.append(part)
        have += len(part)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
