"""Documents of token files read as one stream (data/foreign.py's `tokens` source): the views
the loader reads (`TokenDocs`), documents that go on from one file into the next (`Stream`),
and the numbers in shard names (their order, and gaps where files are missing)."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from littlelm.errors import DataError


class TokenFile(Protocol):
    """What a stream reads of one file (data/foreign.py's TokenFile, indexed and mapped)."""

    path: Path
    bos: int
    key: str
    meta: dict
    tokens: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int: ...

    def source_files(self) -> tuple[Path, ...]: ...


CHUNK = 1 << 24  # tokens scanned (or copied) at a time


@dataclass
class Layout:
    """Where a file's tokens are: `offset` bytes in, `count` tokens of `dtype`."""

    offset: int
    count: int
    dtype: type


def map_tokens(path: Path, layout: Layout) -> np.ndarray:
    """The file's tokens as an array over a read-only memory map (nothing is read yet)."""
    if layout.count == 0:
        return np.zeros(0, layout.dtype)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, layout.dtype, layout.count, layout.offset)


class TokenDocs:
    """Some documents of a token file, as the loader reads a shard (`tokens`, `starts`, `ends`,
    `bos`, len(); data/loader.py)."""

    def __init__(self, path: Path, bos: int, tokens: np.ndarray, starts, ends, files=None):
        self.path, self.bos, self.tokens = path, bos, tokens
        self.starts, self.ends = np.asarray(starts), np.asarray(ends)
        self.files = files or (path,)  # the files its tokens come from (checkpoints hash them)

    @classmethod
    def of(cls, file: TokenFile, keep: np.ndarray | None = None) -> TokenDocs:
        """The documents of `file` where `keep` (all without it)."""
        starts, ends = file.starts, file.ends
        if keep is not None:
            starts, ends = starts[keep], ends[keep]
        return cls(file.path, file.bos, file.tokens, starts, ends, file.source_files())

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def n_tokens(self) -> int:
        """Tokens as trained on (each document's BOS included)."""
        return int((self.ends - self.starts).sum())

    def lengths(self) -> np.ndarray:
        return (self.ends - self.starts).astype(np.int64)

    def doc(self, i: int) -> np.ndarray:
        """Document i as it is trained on: BOS, then its tokens."""
        a, b = int(self.starts[i]), int(self.ends[i])
        return np.concatenate([[self.bos], self.tokens[a + 1 : b]]).astype(self.tokens.dtype)

    def head(self, limit: int | None) -> np.ndarray:
        """The documents in order, as trained on, `limit` tokens at most (None: all)."""
        parts, have = [], 0
        for i in range(len(self)):
            if limit is not None and have >= limit:
                break
            d = self.doc(i)
            parts.append(d)
            have += len(d)
        out = np.concatenate(parts) if parts else np.zeros(0, self.tokens.dtype)
        return out if limit is None else out[:limit]


class Stream:
    """The documents of files read as one stream, in their order: with a separator, a file that
    does not begin with one continues the document open at the end of the file before (llm.c's
    fineweb shards are filled to a fixed size, cutting documents). Such a document, in pieces
    in two or more files, is copied once, whole, into the cache (CACHE/token-index/KEY.joined)
    and left out of its files' own documents; every other document stays where it is."""

    def __init__(self, files: Sequence[TokenFile], sep: int | None, bos: int, cache: Path):
        self.files, self.bos = list(files), bos
        self.separators = sum(f.meta["separators"] for f in files)
        self.drop: list[set[int]] = [set() for _ in files]  # starts now in a joined document
        self.pieces: list[list[tuple[int, int, int]]] = []  # (file, start, end) per document
        self.tokens: np.ndarray | None = None
        # (file before, file after, tokens at the head of the after one) where the numbering
        # of the names skips: missing shards, so nothing is continued across them
        self.gaps: list[tuple[Path, Path, int]] = []
        if sep is not None and self.separators and len(files) > 1:
            self._join()
        self.joined = len(self.pieces)
        if self.pieces:
            self._copy(cache)

    def _join(self) -> None:
        open_doc: list[tuple[int, int, int]] | None = None  # the document open at a file's end
        for i, f in enumerate(self.files):
            n, first, last = f.meta["tokens"], f.meta["first_sep"], f.meta["last_sep"]
            head = n if first is None else first  # tokens before the file's first separator
            if i and numbering_gap(self.files[i - 1].path.name, f.path.name):
                self.gaps.append((self.files[i - 1].path, f.path, head))
                self._close(open_doc)  # its end is in the missing files: it ends here
                open_doc = None
            if open_doc is None:  # the stream's first tokens: a document with BOS put before
                open_doc = [(i, -1, head)] if head else None
            elif head:
                open_doc.append((i, 0, head))
            if first is None:  # no separator: the whole file continues the open document
                continue
            self._close(open_doc)
            open_doc = [(i, last, n)]
        self._close(open_doc)

    def _close(self, doc: list[tuple[int, int, int]] | None) -> None:
        if doc is None or len(doc) < 2:  # within one file: its own index has it
            return
        self.pieces.append(doc)
        self.drop[doc[0][0]].add(doc[0][1])  # its start in the first file
        for j, _, _ in doc[1:]:  # and each later file's head, a document from -1 there
            self.drop[j].add(-1)

    def _copy(self, cache: Path) -> None:
        dtype = np.result_type(*(f.tokens.dtype for f in self.files))
        ident = [f.key for f in self.files] + [self.bos]
        path = cache / (hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24] + ".joined")
        lengths = [sum(b - a for _, a, b in doc) for doc in self.pieces]
        total = sum(lengths)
        if not (path.is_file() and path.stat().st_size == total * dtype.itemsize):
            tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
            try:
                cache.mkdir(parents=True, exist_ok=True)
                with open(tmp, "wb") as out:
                    for doc in self.pieces:
                        for j, a, b in doc:
                            if a < 0:  # the stream's first document: BOS before it
                                out.write(np.array([self.bos], dtype).tobytes())
                                a = 0
                            for c in range(a, b, CHUNK):
                                part = self.files[j].tokens[c : min(b, c + CHUNK)]
                                out.write(part.astype(dtype).tobytes())
                os.replace(tmp, path)
            except OSError as e:
                raise DataError(
                    f"cannot write the joined documents to {path}: {e.strerror}; set "
                    "data.cache_dir to a writable directory"
                ) from None
        self.tokens = map_tokens(path, Layout(0, total, dtype.type))
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.ends = self.starts + np.array(lengths, np.int64)

    def views(
        self, cuts: list[int | None] | None, part: str = "train", held: list[bool] | None = None
    ) -> list[TokenDocs]:
        """The documents as the loader reads them, one view a file (and one of the joined
        documents); with `cuts`, those of `part`: train, the documents that start before
        each file's cut (at least one), or val, the rest; with `held`, whole files: those held
        out (True) are val, the others train. A joined document goes with its start."""
        out, joined = [], np.zeros(len(self.pieces), bool)
        starting: dict[int, list[int]] = {}  # file -> the joined documents that start in it
        for d, doc in enumerate(self.pieces):
            starting.setdefault(doc[0][0], []).append(d)
        for i, f in enumerate(self.files):
            keep = np.ones(len(f), bool)
            for start in self.drop[i]:  # at most two: the file's head and its last document
                keep &= f.starts != start
            if held is not None:
                mine = held[i] == (part == "val")
                for d in starting.get(i, ()):
                    joined[d] = mine
                if not mine:
                    continue
            elif cuts is not None and (cut := cuts[i]) is not None:
                k = max(1, int(np.searchsorted(f.starts, cut, "left")))
                train = np.arange(len(f)) < k
                keep &= train if part == "train" else ~train
                for d in starting.get(i, ()):  # a joined document goes with its start
                    at = int(np.searchsorted(f.starts, self.pieces[d][0][1], "left"))
                    joined[d] = (at < k) == (part == "train")
            elif part == "train":  # no cut: every document trains
                joined[:] = True
            else:
                continue
            if keep.any():
                out.append(TokenDocs.of(f, keep))
        if joined.any():
            assert self.tokens is not None, "joined documents are copied at construction (_copy)"
            first = self.files[self.pieces[int(np.flatnonzero(joined)[0])][0][0]]
            files = {
                self.files[j].path: None
                for d in np.flatnonzero(joined)
                for j, _, _ in self.pieces[d]
            }
            out.append(
                TokenDocs(
                    first.path,
                    self.bos,
                    self.tokens,
                    self.starts[joined],
                    self.ends[joined],
                    tuple(files),
                )
            )
        return out


def _digit_runs(name: str) -> tuple[str, list[int]]:
    """A file name's pattern (digits as #) and its numbers: fineweb_train_000003.bin ->
    ("fineweb_train_#.bin", [3])."""
    return re.sub(r"\d+", "#", name), [int(x) for x in re.findall(r"\d+", name)]


def numbering_gap(before: str, after: str) -> bool:
    """Whether shard `after` is numbered more than one past `before` (same name pattern, one
    number differs): the shards between are missing."""
    (pa, a), (pb, b) = _digit_runs(before), _digit_runs(after)
    if pa != pb or len(a) != len(b):
        return False
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    return len(differ) == 1 and differ[0][1] - differ[0][0] > 1


def numbered_order(paths: list[Path]) -> list[Path] | None:
    """`paths` in the order of the numbers in their names (llm.c: fineweb_val_000000.bin,
    then fineweb_train_000001.bin ...), or None when that order is not defined (a name without
    a number, or two names with the same numbers)."""
    keys = [tuple(_digit_runs(p.name)[1]) for p in paths]
    if not all(keys) or len(set(keys)) != len(keys):
        return None
    return [p for _, p in sorted(zip(keys, paths))]


def gap_warning(label: str, before: Path, after: Path, head: int) -> str:
    what = (
        f"its first {head:,} token(s), before its first separator, are trained as a document "
        "of their own (the start of theirs is in the missing files)"
        if head
        else "it begins with a separator, so no document is cut there"
    )
    return (
        f"warning: data.sources.{label}: the file numbering skips from {before.name} to "
        f"{after.name} (the files between are missing), so no document is continued from one "
        f"into the other: {what}; put the missing files back to train on them"
    )
