"""littlelm/filehash.py: whole-file sha256, memoised by the stat fields that move on a write."""

from __future__ import annotations

import hashlib
import os

from littlelm import filehash
from littlelm.filehash import HashMemo, sha256_file


def test_the_memo_reads_a_file_once_per_stat_and_again_after_an_edit(tmp_path, monkeypatch):
    path = tmp_path / "shard.bin"
    path.write_bytes(b"a" * 5000)
    reads = []
    real = filehash.sha256_file
    monkeypatch.setattr(filehash, "sha256_file", lambda p: reads.append(p) or real(p))
    memo = HashMemo(tmp_path / "memo")
    first = memo.sha256(path)
    assert first == hashlib.sha256(b"a" * 5000).hexdigest()
    assert memo.sha256(path) == first and len(reads) == 1  # the memo answered
    st = os.stat(path)
    with open(path, "r+b") as f:  # same size, same inode, mtime set back: ctime moves
        f.seek(4000)
        f.write(b"b")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert memo.sha256(path) != first and len(reads) == 2
    assert HashMemo(None).sha256(path) == sha256_file(path) and len(reads) == 3
