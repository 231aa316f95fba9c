"""What a checkpoint records of the data under it, and what changed since.

Per source, each file its documents are read from, `[path, bytes, sampled hash, sha256]`:

    sampled hash   data/cache.py's content_hash: its size and 18 blocks of 4 KiB (kept so that
                   checkpoints written before the sha256 was recorded still compare)
    sha256         of every byte (littlelm/filehash.py): read in full once per machine and file,
                   and again whenever the file's size, mtime, ctime or inode moved; with
                   data.full_verify every start reads every file in full

Files are compared by name (the path under the directory the source's files share), so a moved
directory of the same files is no change, a deleted or changed file is named exactly, and files
added after the ones the checkpoint was trained on (their names sort after the old ones of the
same numbering) are told apart from files inserted among them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from littlelm.data.cache import content_hash
from littlelm.errors import DataError
from littlelm.filehash import HashMemo

HASH_MEMO = "file-hash"  # under the data cache: sha256 of files already read, by stat


def record_files(files: dict[str, list[Path]], cache: Path | None, full: bool) -> dict:
    """Per source label, the record of each of its `files` (the module's docstring)."""
    memo = HashMemo(None if full or cache is None else cache / HASH_MEMO)
    out = {}
    for label, paths in files.items():
        try:
            out[label] = [
                [str(p), p.stat().st_size, content_hash(p), memo.sha256(p)] for p in paths
            ]
        except OSError as e:
            raise DataError(
                f"data.sources.{label}: cannot read {e.filename}: {e.strerror}"
            ) from None
    return out


@dataclass
class FilesChange:
    """What differs between a checkpoint's record and this run's: `problem` (a file changed,
    gone or inserted: the position cannot apply) or `added` (files appended after the old
    ones: the run may continue), each a sentence, empty when nothing differs."""

    problem: str | None = None
    added: list[str] = field(default_factory=list)


def names(records: list[list]) -> list[str]:
    """Each file's name: its path under the directory the source's files share."""
    paths = [str(r[0]) for r in records]
    if len(paths) == 1:
        return [os.path.basename(paths[0])]
    try:
        common = os.path.commonpath([os.path.dirname(p) for p in paths])
    except ValueError:  # relative and absolute mixed: the paths are the names
        return paths
    return [os.path.relpath(p, common) for p in paths]


def _group(name: str) -> str:
    """A name without the number it ends with (fineweb_train_000003.bin -> fineweb_train_.bin)."""
    stem, ext = os.path.splitext(name)
    return re.sub(r"\d+$", "", stem) + ext


def _describe(r: list) -> str:
    what = f"{r[1]:,} bytes, sampled hash {r[2]}"
    return what + (f", sha256 {str(r[3])[:16]}" if len(r) > 3 else "")


def compare(saved: dict | None, now: dict | None) -> FilesChange:
    """The change between a checkpoint's records (`saved`) and this run's (`now`); nothing for
    a checkpoint written before littlelm recorded them."""
    change = FilesChange()
    if saved is None or now is None:
        return change
    for label in sorted(set(saved) & set(now)):
        old = dict(zip(names(saved[label]), saved[label]))
        new = dict(zip(names(now[label]), now[label]))
        key = f"data.sources.{label}"
        for name, a in old.items():
            b = new.get(name)
            if b is None:
                change.problem = (
                    f"{key}'s file {name} (at {a[0]} when it was written; {_describe(a)}) is gone"
                )
                return change
            same = a[1:3] == b[1:3] and (len(a) < 4 or len(b) < 4 or a[3] == b[3])
            if not same:
                change.problem = (
                    f"{key}'s file {b[0]} changed since it was written (was {_describe(a)}, "
                    f"now {_describe(b)})"
                )
                return change
        for name in new.keys() - old.keys():
            kin = [o for o in old if _group(o) == _group(name)] or list(old)
            if name < max(kin):
                after = min(o for o in kin if o > name)
                change.problem = (
                    f"{key}'s file {new[name][0]} is new and sorts among the files it was "
                    f"written with (before {after}), so the order of its documents changed; "
                    "remove it (files added after the old ones, by name, may continue a run)"
                )
                return change
            change.added.append(f"{key}: {new[name][0]}")
    change.added.sort()
    return change
