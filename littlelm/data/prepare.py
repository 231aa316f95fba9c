"""Raw documents -> tokenizer -> token shards, cached by what they depend on.

A prepared dataset is a directory:

    manifest.json            written last: its presence means the directory is complete
    tokenizer/               the tokenizer the shards were made with
    train_00000.bin ...      shards (see shards.py)
    val_00000.bin ...

`prepare_source` builds one for a source; `resolve_tokenizer` trains (or loads from the cache) the
tokenizer a run asks for. Both work in a temporary directory renamed into place when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np

from littlelm.config import ComponentConfig
from littlelm.data.shards import ShardWriter
from littlelm.data.sources import Source
from littlelm.data.tokenizer import META, Tokenizer, load_tokenizer
from littlelm.errors import DataError
from littlelm.registry import TOKENIZERS

MANIFEST = "manifest.json"
MASK64 = (1 << 64) - 1


def cache_root(configured: str | None = None) -> Path:
    """data.cache_dir, else $LITTLELM_CACHE, else ~/.cache/littlelm."""
    root = configured or os.environ.get("LITTLELM_CACHE") or "~/.cache/littlelm"
    return Path(root).expanduser()


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def unit_hash(i: int, seed: int) -> float:
    """A fixed pseudo-random number in [0, 1) for document i (splitmix64)."""
    x = (i * 0x9E3779B97F4A7C15 + seed * 0xD1B54A32D192ED03 + 1) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) / 2.0**64


class ValSplit:
    """Which documents are held out: a seeded hash of the index ('hash'), or the last fraction of
    the documents in order ('tail', like nanoGPT's last 10%)."""

    def __init__(
        self, fraction: float, mode: Literal["hash", "tail"], seed: int, n_docs: int | None = None
    ):
        self.fraction, self.mode, self.seed, self.n_docs = fraction, mode, seed, n_docs
        assert mode == "hash" or n_docs is not None, "tail split needs the document count"

    def is_val(self, i: int) -> bool:
        if self.mode == "tail":
            return i >= round(self.n_docs * (1 - self.fraction))
        return unit_hash(i, self.seed) < self.fraction


def make_split(source: Source, fraction: float, mode: str, seed: int) -> ValSplit:
    n = sum(1 for _ in source.documents()) if mode == "tail" else None
    return ValSplit(fraction, mode, seed, n)


def train_documents(source: Source, split: ValSplit) -> Iterator[str]:
    for i, doc in enumerate(source.documents()):
        if not split.is_val(i):
            yield doc


def resolve_tokenizer(
    cfg: ComponentConfig,
    sources: dict[str, Source],
    splits: dict[str, ValSplit],
    root: Path,
    log=print,
) -> Tokenizer:
    """The run's tokenizer: built directly, or trained on the sources' training documents (in
    proportion to their weights) and cached under root/tokenizers."""
    cls = TOKENIZERS.get(cfg.name)
    if not cls.trainable:
        return cls.from_config(cfg)
    key = digest(
        {
            "tokenizer": cfg.model_dump(),
            "sources": {k: s.identity() for k, s in sources.items()},
            "splits": {k: vars(v) for k, v in splits.items()},
        }
    )
    target = root / "tokenizers" / f"{cfg.name}-{key}"
    if (target / META).is_file():
        return load_tokenizer(target)
    log(f"training a {cfg.name} tokenizer ({cls.vocab_size_for(cfg)} tokens) -> {target}")
    t0 = time.time()
    tok = cls.train(cfg, _weighted_texts(sources, splits, cfg))
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save(tmp)
    _rename_into_place(tmp, target)
    log(f"tokenizer trained in {time.time() - t0:.1f}s")
    return tok


def _weighted_texts(sources: dict[str, Source], splits: dict[str, ValSplit], cfg) -> Iterator[str]:
    total = sum(s.cfg.weight for s in sources.values())
    budget = getattr(cfg, "train_chars", None) or 10**12
    for label, src in sources.items():
        share, seen = budget * src.cfg.weight / total, 0
        for doc in train_documents(src, splits[label]):
            if seen >= share:
                break
            seen += len(doc)
            yield doc


def dataset_dir(source: Source, tok: Tokenizer, split: ValSplit, root: Path) -> Path:
    key = digest({"source": source.identity(), "tokenizer": tok.fingerprint, "split": vars(split)})
    return root / "datasets" / f"{source.label}-{key}"


def prepare_source(
    source: Source,
    tok: Tokenizer,
    split: ValSplit,
    out: Path,
    shard_tokens: int = 100_000_000,
    log=print,
) -> dict:
    """Tokenize `source` into shards under `out` (skipped when a complete copy is there)."""
    if (out / MANIFEST).is_file():
        return json.loads((out / MANIFEST).read_text())
    log(f"preparing {source.label!r} -> {out}")
    t0 = time.time()
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok.save(tmp / "tokenizer")
    splits = {
        "train": _SplitWriter(tmp, "train", tok, shard_tokens),
        "val": _SplitWriter(tmp, "val", tok, shard_tokens),
    }
    chars = 0
    try:
        for batch_start, texts in _batches(source.documents(), 256):
            for j, ids in enumerate(tok.encode_batch(texts)):
                name = "val" if split.is_val(batch_start + j) else "train"
                splits[name].add(np.asarray([tok.bos_id, *ids], dtype=np.int64))
                chars += len(texts[j])
        manifest = {
            "format": 1,
            "source": source.identity(),
            "label": source.label,
            "tokenizer": {
                "fingerprint": tok.fingerprint,
                "vocab_size": tok.vocab_size,
                "bos_id": tok.bos_id,
            },
            "split": vars(split),
            "chars": chars,
            "skipped": source.skipped,
            "splits": {k: w.close() for k, w in splits.items()},
        }
    except BaseException:
        for w in splits.values():
            w.abort()
        raise
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    _rename_into_place(tmp, out)
    n = manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"]
    log(f"prepared {n:,} tokens from {chars / 1e6:.1f}M chars in {time.time() - t0:.1f}s")
    return manifest


def _batches(docs: Iterator[str], size: int) -> Iterator[tuple[int, list[str]]]:
    batch: list[str] = []
    start = 0
    for doc in docs:
        batch.append(doc)
        if len(batch) == size:
            yield start, batch
            start, batch = start + size, []
    if batch:
        yield start, batch


class _SplitWriter:
    """Rolls over to a new shard every `shard_tokens` tokens."""

    def __init__(self, directory: Path, split: str, tok: Tokenizer, shard_tokens: int):
        self.directory, self.split, self.tok, self.shard_tokens = (
            directory,
            split,
            tok,
            shard_tokens,
        )
        self.writer: ShardWriter | None = None
        self.done: list[dict] = []

    def add(self, doc: np.ndarray) -> None:
        if self.writer is None:
            path = self.directory / f"{self.split}_{len(self.done):05d}.bin"
            self.writer = ShardWriter(
                path, self.tok.vocab_size, self.tok.bos_id, self.tok.fingerprint
            )
        self.writer.add(doc)
        if self.writer.n_tokens >= self.shard_tokens:
            self._finish()

    def _finish(self) -> None:
        h = self.writer.close()
        self.done.append(
            {
                "file": self.writer.path.name,
                "tokens": h.n_tokens,
                "docs": h.n_docs,
                "sha256": h.checksum,
            }
        )
        self.writer = None

    def close(self) -> dict:
        if self.writer is not None:
            self._finish()
        return {
            "shards": self.done,
            "tokens": sum(s["tokens"] for s in self.done),
            "docs": sum(s["docs"] for s in self.done),
        }

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


def _rename_into_place(tmp: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, target)
    except OSError:
        if (target / MANIFEST).is_file() or (target / META).is_file():  # another process won
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        raise DataError(
            f"{directory} is not a prepared dataset ({MANIFEST} missing); run `littlelm data prepare`"
        )
    return json.loads(path.read_text())
