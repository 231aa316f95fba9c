"""Tokenizing units of a source into shards, on every core.

`tokenize_unit` turns one unit (see sources.py) into its own train and val shards,
`{split}-{unit:05d}-{k:03d}.bin`, each renamed into place when complete, and then records the
unit as done in `units/{unit:05d}.json`. `run_units` runs the units not yet done: in this process
(the tokenizer's own threads use every core) when there is one unit or little input (see
`pool_size`), else in a pool of worker processes, each tokenizer using cores / workers threads. Workers report text bytes and tokens
as they go, for the progress line.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from littlelm.data.chat import chat_format
from littlelm.data.shards import ShardWriter
from littlelm.data.sources import Source, SourceConfig, Unit
from littlelm.data.split import ValSplit
from littlelm.data.tokenizer import Tokenizer
from littlelm.data.tokenizers import load_tokenizer
from littlelm.errors import DataError, LittleLMError

BATCH_BYTES = 1 << 20  # text handed to the tokenizer at once
PROCESS_MIN_BYTES = 64 << 20  # input that pays for starting one more worker process
UNITS = "units"

Report = Callable[[int, int], None]  # (text bytes, tokens) just tokenized


@dataclass(frozen=True)
class UnitJob:
    """Everything a worker needs to tokenize one unit (picklable)."""

    source: SourceConfig
    label: str
    unit: Unit
    uid: int
    first_piece: int  # global number of the unit's first piece (for the tail split)
    split: ValSplit
    out: str
    shard_tokens: int
    duplicates: frozenset[int] = frozenset()  # numbers (in this unit) of documents to drop


def unit_record_path(out: Path, uid: int) -> Path:
    return out / UNITS / f"{uid:05d}.json"


def tokenize_unit(job: UnitJob, tok: Tokenizer, report: Report) -> dict:
    """Tokenize one unit into shards under job.out; returns (and writes) its record."""
    source: Source = job.source.build(job.label)  # the config's class came with the pickle
    out = Path(job.out)
    writers = {s: _SplitWriter(out, s, job.uid, tok, job.shard_tokens) for s in ("train", "val")}
    pending: dict[str, list[str]] = {"train": [], "val": []}
    size = {"train": 0, "val": 0}
    docs = chars = nbytes = 0
    # a conversation (canonical JSON) is rendered with the tokenizer's chat format (data/chat.py)
    fmt = chat_format(tok) if source.conversations else None
    chat = fmt is not None
    try:
        index = job.first_piece
        for i, raw in enumerate(source.unit_documents(job.unit)):
            parts = list(source.pieces(raw))  # a conversation is one piece
            first, index = index, index + len(parts)  # duplicates count: the plan's scan did
            if i in job.duplicates:
                continue
            data = raw.encode("utf-8")
            docs, chars, nbytes = docs + 1, chars + len(raw), nbytes + len(data)
            texts = source.rendered(raw, fmt) if fmt else parts
            sides = job.split.sides(first, data, len(texts))
            for name in ("train", "val"):
                mine = [t for t, held in zip(texts, sides) if held == (name == "val")]
                if not mine:
                    continue
                pending[name].extend(mine)
                whole = len(mine) == len(texts)
                size[name] += len(data) if whole else sum(len(t.encode("utf-8")) for t in mine)
                if size[name] >= BATCH_BYTES:
                    _flush(
                        pending[name],
                        writers[name],
                        tok,
                        lambda t, n=size[name]: report(n, t),
                        chat,
                    )
                    size[name] = 0
        for name, w in writers.items():
            _flush(pending[name], w, tok, lambda t, n=size[name]: report(n, t), chat)
        shards = {name: w.close() for name, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    record = {
        "unit": job.uid,
        "documents": docs,
        "chars": chars,
        "bytes": nbytes,
        "skipped": dict(source.skipped),
        "duplicates": len(job.duplicates),
        "shards": shards,
    }
    path = unit_record_path(out, job.uid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    _io(path, tmp.write_text, json.dumps(record))
    os.replace(tmp, path)
    return record


def _flush(
    texts: list[str], writer: _SplitWriter, tok: Tokenizer, tokens_done, special: bool
) -> None:
    """Encode and write `texts`; `special`: they are chats the format rendered, whose special
    tokens' text becomes those tokens (any other text's is ordinary text: tokenizer.encode)."""
    if texts:
        tokens, lengths = tok.encode_docs(texts, special)
        writer.add(tokens, lengths)
        tokens_done(len(tokens))
        texts.clear()


class _SplitWriter:
    """One split of one unit: rolls over to a new shard every `shard_tokens` tokens."""

    def __init__(self, out: Path, split: str, uid: int, tok: Tokenizer, shard_tokens: int):
        self.out, self.split, self.uid, self.tok = out, split, uid, tok
        self.shard_tokens = shard_tokens
        self.writer: ShardWriter | None = None
        self.done: list[dict] = []

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        while len(lengths):
            if self.writer is None:
                path = self.out / f"{self.split}-{self.uid:05d}-{len(self.done):03d}.bin"
                self.writer = _io(
                    path,
                    ShardWriter,
                    path,
                    self.tok.vocab_size,
                    self.tok.bos_id,
                    self.tok.fingerprint,
                )
            room = self.shard_tokens - self.writer.n_tokens
            ends = np.cumsum(lengths)
            k = max(1, int(np.searchsorted(ends, room, side="left")) + 1)  # docs until full
            k = min(k, len(lengths))
            _io(self.writer.path, self.writer.add_docs, tokens[: ends[k - 1]], lengths[:k])
            tokens, lengths = tokens[ends[k - 1] :], lengths[k:]
            if self.writer.n_tokens >= self.shard_tokens:
                self._finish()

    def _finish(self) -> None:
        assert self.writer is not None, "called when a shard is open"
        h = _io(self.writer.path, self.writer.close)
        self.done.append(
            {
                "file": self.writer.path.name,
                "tokens": h.n_tokens,
                "docs": h.n_docs,
                "sha256": h.checksum,
            }
        )
        self.writer = None

    def close(self) -> list[dict]:
        if self.writer is not None:
            self._finish()
        return self.done

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


def _io(path: Path, fn, *args):
    """Run a write; a full disk or any OSError becomes a DataError naming the file."""
    try:
        return fn(*args)
    except OSError as e:
        raise DataError(
            f"cannot write {path}: {e.strerror or e}; free disk space (or fix permissions) and run "
            "again: finished units are kept and not redone"
        ) from None


# -- running units --------------------------------------------------------------------------------


def pool_size(jobs: list[UnitJob], workers: int | None) -> int:
    """Worker processes for `jobs`: `workers` when set, else one per core, but no more than one
    per PROCESS_MIN_BYTES of input (a process costs about half a second to start and load the
    tokenizer, so a small source is faster in this process, the tokenizer threads on every
    core); never more than there are units."""
    if workers is None:
        size = sum(job.unit.size for job in jobs)
        workers = min(os.cpu_count() or 1, size // PROCESS_MIN_BYTES)
    return max(1, min(workers, len(jobs)))


def run_units(
    jobs: list[UnitJob],
    tok: Tokenizer,
    tok_dir: Path,
    workers: int,
    on_progress: Callable[[int, int], None],
    on_done: Callable[[UnitJob, dict], None],
) -> None:
    """Tokenize every job: in this process with one worker (`pool_size`), else in a pool."""
    if workers == 1:
        for job in jobs:
            on_done(job, tokenize_unit(job, tok, on_progress))
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    ctx = mp.get_context("spawn")  # never fork a process whose tokenizer threads are running
    reports = ctx.Queue()
    pool = ctx.Pool(workers, _init_worker, (str(tok_dir), threads, reports))
    try:
        pending = {i: pool.apply_async(_worker_unit, (job,)) for i, job in enumerate(jobs)}
        while pending:
            _drain(reports, on_progress, wait=0.2)
            for i in [i for i, r in pending.items() if r.ready()]:
                on_done(jobs[i], pending.pop(i).get())  # re-raises a worker's error here
        _drain(reports, on_progress, wait=0)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def _drain(reports, on_progress, wait: float) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            on_progress(*reports.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            return


_WORKER: dict = {}


def _init_worker(tok_dir: str, threads: int, reports) -> None:
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the `tokenizers` thread pool
    tok = load_tokenizer(tok_dir)
    if hasattr(tok, "threads"):
        tok.threads = threads
    _WORKER.update(tok=tok, reports=reports)


def _worker_unit(job: UnitJob) -> dict:
    reports = _WORKER["reports"]
    try:
        return tokenize_unit(job, _WORKER["tok"], lambda b, t: reports.put((b, t)))
    except LittleLMError as e:  # re-created in the parent from its message
        raise DataError(str(e)) from None
