"""Where littlelm caches prepared data, bench results and downloads, and the digest that keys
them (a module of its own so that any data module can use them without importing prepare)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_root(configured: str | None = None) -> Path:
    """data.cache_dir, else $LITTLELM_CACHE, else ~/.cache/littlelm."""
    root = configured or os.environ.get("LITTLELM_CACHE") or "~/.cache/littlelm"
    return Path(root).expanduser()


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


SAMPLES = 16  # blocks hashed per file, evenly spread, besides its first and last
BLOCK = 1 << 12


def content_hash(path: Path) -> str:
    """A cheap fingerprint of a file's content: its size and SAMPLES + 2 blocks of 4 KiB (the
    first, the last and evenly spread ones), so a same-size rewrite with other tokens shows
    without reading the whole file."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for k in range(SAMPLES + 2):
            f.seek(max(0, min(size - BLOCK, (size - BLOCK) * k // (SAMPLES + 1))))
            h.update(f.read(BLOCK))
    return h.hexdigest()[:16]
