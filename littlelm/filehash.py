"""Whole-file sha256 and the stat fields that say when it must be taken again.

A record of a file is its size, modification time, change time and inode (`FileStat`) and the
sha256 of every byte (`sha256_file`). Comparing a file with its record (`same_content`) costs
one stat() while those four fields are unchanged, and one full read when any of them moved: a
copy, a touch, a rewrite in place with the mtime set back (which moves the change time, which
no user call sets) all re-hash, and only a change of content is a difference. The hashes already
taken are kept under a directory (`HashMemo`), keyed by the path and its stat fields, so a
directory of shards is read in full once per machine, not at every start.

What is not detected without a full verify (`same_content(..., full=True)`): bytes changed
behind the file system's back (a raw block device write, a change of the system clock to set
the change time back). This module sits in the bottom layer so that data (shard files under a
checkpoint) and checkpoints (a LoRA run's base weights) hash files the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CHUNK = 1 << 24  # bytes read at a time


@dataclass(frozen=True)
class FileStat:
    """The fields that change when a file's bytes can have changed."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, path: str | Path) -> FileStat:
        st = os.stat(path)
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> FileStat | None:
        try:
            return cls(int(d["size"]), int(d["mtime_ns"]), int(d["ctime_ns"]), int(d["inode"]))
        except (KeyError, TypeError, ValueError):  # a record without them: always re-hash
            return None


def sha256_file(path: str | Path) -> str:
    """The sha256 of every byte of `path` (hex), read CHUNK bytes at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


class HashMemo:
    """Whole-file hashes taken before, one small JSON file each under `directory`, keyed by the
    file's real path and its FileStat: a hash is read back only while the stat is the same."""

    def __init__(self, directory: str | Path | None):
        self.directory = None if directory is None else Path(directory)

    def _entry(self, path: Path, stat: FileStat) -> Path | None:
        if self.directory is None:
            return None
        ident = json.dumps([os.path.realpath(path), stat.to_json()], sort_keys=True)
        return self.directory / (hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json")

    def sha256(self, path: str | Path, stat: FileStat | None = None) -> str:
        """`path`'s sha256: from the memo when taken at this stat, else read in full (and kept)."""
        path = Path(path)
        stat = stat or FileStat.of(path)
        entry = self._entry(path, stat)
        if entry is not None:
            try:
                return str(json.loads(entry.read_text())["sha256"])
            except (OSError, ValueError, KeyError):  # none yet (or cut short): hash it
                pass
        digest = sha256_file(path)
        if entry is not None and FileStat.of(path) == stat:  # unchanged while it was read
            try:
                entry.parent.mkdir(parents=True, exist_ok=True)
                tmp = entry.with_name(entry.name + f".tmp-{os.getpid()}")
                tmp.write_text(json.dumps({"sha256": digest}))
                os.replace(tmp, entry)  # whole or not at all
            except OSError:  # a read-only cache costs a re-read next time, nothing else
                pass
        return digest


def same_content(
    path: str | Path, stat: FileStat | None, sha256: str, memo: HashMemo, full: bool = False
) -> bool:
    """Whether `path` holds the bytes whose hash is `sha256`: trusted from its stat when that is
    the recorded `stat` (unless `full`), else read in full (or taken from `memo`)."""
    now = FileStat.of(path)
    if now.size != (stat.size if stat is not None else now.size):
        return False  # another size: other bytes, nothing to read
    if not full and stat is not None and now == stat:
        return True
    if full:
        return sha256_file(path) == sha256
    return memo.sha256(path, now) == sha256
