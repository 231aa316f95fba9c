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
