"""Whole-file sha256 and the stat fields that say when it must be taken again.

The sha256 of every byte of a file (`sha256_file`), and the hashes already taken kept under a
directory (`HashMemo`), keyed by the file's path, size, modification time, change time and
inode (`FileStat`): asking again costs one stat() while those are unchanged, and one full read
when any of them moved (a copy, a touch, a rewrite in place with the mtime set back, which
moves the change time, which no user call sets). So a directory of shards is read in full once
per machine, not at every start.

What the memo cannot see: bytes changed behind the file system's back (a raw block device
write, the system clock set back to reset the change time); `HashMemo(None)` reads every time.
This module sits in the bottom layer so that any layer hashes files the same way (data files
under a checkpoint; a LoRA run's base weights could too).
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
