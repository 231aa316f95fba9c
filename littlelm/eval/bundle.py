"""Fetch the public CORE eval bundle (the one nanochat uses), checked against a pinned sha256.

    littlelm eval-bundle                 # -> $LITTLELM_CACHE/eval_bundle (or ~/.cache/littlelm/)

The archive is streamed to a temporary file beside the destination while its sha256 is
computed; a mismatch deletes it and stops. It is unpacked into a temporary directory (members
that would land outside it are refused) and renamed into place, so the destination is either
absent or complete.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

from littlelm.errors import EvalError

BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
# sha256 of eval_bundle.zip as published (22 tasks, 91,037 items); a different file is refused
BUNDLE_SHA256 = "90a7c19e28ee7a52b4f6e1f87658deb9fde7f63deba2379045bdb1fe9ea5d200"
CHUNK = 1 << 20


def default_bundle_dir() -> Path:
    from littlelm.data.cache import cache_root

    return cache_root() / "eval_bundle"


def fetch(url: str, dest: Path, progress: Callable[[int], None] | None = None) -> str:
    """Stream `url` into `dest`; return the sha256 of what was written."""
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as out:
            done = 0
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                h.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise EvalError(
            f"could not download {url}: {e}; check the network, or download the file elsewhere "
            "and pass --url file:///path/to/eval_bundle.zip"
        ) from None
    return h.hexdigest()


def unpack(archive: Path, into: Path) -> None:
    """Extract a zip into `into`, refusing members that would land outside it."""
    root = into.resolve()
    try:
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if not (root / name).resolve().is_relative_to(root):
                    raise EvalError(f"{archive}: refusing member {name!r} outside the bundle")
            zf.extractall(root)
    except zipfile.BadZipFile as e:
        raise EvalError(f"{archive}: not a valid zip file ({e})") from None


def download_bundle(
    dest: Path | None = None,
    url: str = BUNDLE_URL,
    sha256: str | None = BUNDLE_SHA256,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Download, verify and unpack the bundle into `dest` (a directory); return `dest`.

    `sha256=None` skips the check (for a bundle you built yourself). An existing complete `dest`
    is kept unless `force`.
    """
    dest = Path(dest) if dest is not None else default_bundle_dir()
    if dest.exists() and not force:
        log(f"{dest} already exists (use --force to fetch it again)")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.tmp-") as tmp:
        archive = Path(tmp) / "eval_bundle.zip"
        log(f"downloading {url}")
        got = fetch(url, archive)
        if sha256 is not None and got != sha256.lower():
            raise EvalError(
                f"{url}: sha256 {got} does not match the expected {sha256}; the file is corrupt "
                "or the bundle changed upstream (pass --sha256 HEX to accept a known new one)"
            )
        staged = Path(tmp) / "unpacked"
        unpack(archive, staged)
        root = staged / "eval_bundle" if (staged / "eval_bundle").is_dir() else staged
        if dest.exists():
            shutil.rmtree(dest)
        root.rename(dest)
    log(f"eval bundle ready: {dest} (sha256 {got})")
    return dest
