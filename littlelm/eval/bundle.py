"""Fetch the public CORE eval bundle (the one nanochat uses), checked against a pinned sha256.

    littlelm eval-bundle                 # -> $LITTLELM_CACHE/eval_bundle (or ~/.cache/littlelm/)

The archive is downloaded with `requests` into a `.part` file beside the destination (named
after the URL, so parts of different URLs never mix). urllib3's `Retry` retries connection
errors and 429/500/502/503/504 answers with exponential backoff; a transfer cut midway is
resumed from the bytes already on disk with an HTTP Range request, up to `ATTEMPTS` times, and
a failed run keeps the `.part` file so that the next run resumes it. A transfer counts as
complete only when its size equals the size the server announced; then its sha256 is checked
(a mismatch deletes it and stops), it is moved into a temporary directory, unpacked (members
that would land outside it are refused) and renamed into place, so the destination is either
absent or complete.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter
from requests.exceptions import InvalidSchema, InvalidURL, MissingSchema
from urllib3.util import Retry

from littlelm.errors import EvalError

BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
# sha256 of eval_bundle.zip as published (22 tasks, 91,037 items); a different file is refused
BUNDLE_SHA256 = "90a7c19e28ee7a52b4f6e1f87658deb9fde7f63deba2379045bdb1fe9ea5d200"
CHUNK = 1 << 16  # bytes per write; a transfer cut midway loses at most the chunk in flight
RETRY_STATUS = (429, 500, 502, 503, 504)  # answers worth asking again: overload, gateway hiccups
RETRIES = 5  # per request, by urllib3: connection errors and RETRY_STATUS answers
ATTEMPTS = 5  # transfers, each resuming where the last one was cut
BACKOFF = 1.0  # seconds; urllib3 and the resume loop double it at each retry
TIMEOUT = (30, 60)  # seconds to connect, and between two reads of the body


class Cut(Exception):
    """A transfer that stopped before the announced size: resume it."""


def default_bundle_dir() -> Path:
    from littlelm.data.cache import cache_root

    return cache_root() / "eval_bundle"


def part_path(dest: Path, url: str) -> Path:
    """Where the download of `url` for `dest` accumulates until it is complete."""
    tag = hashlib.sha256(url.encode()).hexdigest()[:12]
    return dest.parent / f".{dest.name}-{tag}.zip.part"


def session() -> requests.Session:
    retry = Retry(
        total=RETRIES,
        status_forcelist=RETRY_STATUS,
        allowed_methods=frozenset({"GET"}),
        backoff_factor=BACKOFF,
        raise_on_status=False,  # the last answer comes back, and `transfer` names it
    )
    s = requests.Session()
    s.mount("http://", HTTPAdapter(max_retries=retry))
    s.mount("https://", HTTPAdapter(max_retries=retry))
    return s


def fetch(url: str, part: Path) -> None:
    """Download `url` into `part`, resuming from what `part` already holds.

    Returns when `part` holds the whole file; otherwise raises EvalError naming the URL, what
    is kept and the fix.
    """
    if urllib.parse.urlparse(url).scheme == "file":
        return copy_local(url, part)
    last: Exception | None = None
    with session() as s:
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(BACKOFF * 2 ** (attempt - 1))
            try:
                transfer(s, url, part)
                return
            except (InvalidURL, InvalidSchema, MissingSchema) as e:
                raise EvalError(f"could not download {url}: {e}; check --url") from None
            except (requests.RequestException, OSError, Cut) as e:
                last = e
    raise EvalError(f"could not download {url} after {ATTEMPTS} attempts ({last}); {kept(part)}")


def kept(part: Path) -> str:
    """What a failed download leaves, and the fix."""
    have = part.stat().st_size if part.exists() else 0
    where = f"{have:,} bytes are kept in {part} and the next run resumes them; " if have else ""
    return (
        f"{where}check the network and run the command again, or download the file elsewhere "
        "and pass --url file:///path/to/eval_bundle.zip"
    )


def transfer(s: requests.Session, url: str, part: Path) -> None:
    """One GET of the rest of the file (a Range request when `part` holds a start)."""
    have = part.stat().st_size if part.exists() else 0
    # identity: the bytes on disk must be the file's bytes, so that a Range continues them
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={have}-"} if have else {})}
    with s.get(url, headers=headers, stream=True, timeout=TIMEOUT) as r:
        if r.status_code == 416 and have:  # nothing left to send: complete, or not this file
            if content_range(r)[1] == have:
                return
            part.unlink()
            raise Cut(f"the server refused to resume from byte {have:,}; starting over")
        if r.status_code not in (200, 206):
            raise EvalError(
                f"could not download {url}: HTTP {r.status_code} {r.reason}"
                + (" (after retries)" if r.status_code in RETRY_STATUS else " (check --url)")
                + f"; {kept(part)}"
            )
        if r.status_code == 206:
            start, total = content_range(r)
            if start != have:  # not the continuation asked for: start over on the next attempt
                part.unlink()
                raise Cut(f"asked to resume at byte {have:,}, the server sent byte {start}")
        else:  # 200: the whole file (the server ignores Range, or there was nothing to resume)
            size = r.headers.get("Content-Length")
            have, total = 0, int(size) if size else None
        with open(part, "ab" if have else "wb") as out:
            for chunk in r.iter_content(CHUNK):
                out.write(chunk)
                have += len(chunk)
    if total is not None and have != total:
        raise Cut(f"got {have:,} of {total:,} bytes")


def content_range(r: requests.Response) -> tuple[int | None, int | None]:
    """(first byte, total size) of a Content-Range header: 'bytes 100-199/200', 'bytes */200'."""
    m = re.fullmatch(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)", r.headers.get("Content-Range", ""))
    if not m:
        return None, None
    start, total = m.groups()
    return (int(start) if start else None), (int(total) if total != "*" else None)


def copy_local(url: str, part: Path) -> None:
    """A file:// URL (a bundle fetched elsewhere) is copied."""
    src = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    try:
        shutil.copyfile(src, part)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise EvalError(
            f"could not download {url}: {e}; check the path, or download the file elsewhere "
            "and pass --url file:///path/to/eval_bundle.zip"
        ) from None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
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
    is kept unless `force`. A failed download keeps its `.part` file; the next call resumes it.
    """
    dest = Path(dest) if dest is not None else default_bundle_dir()
    if dest.exists() and not force:
        log(f"{dest} already exists (use --force to fetch it again)")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest, url)
    if part.exists():
        log(f"resuming {url} from {part.stat().st_size:,} bytes ({part})")
    else:
        log(f"downloading {url}")
    fetch(url, part)
    got = sha256_of(part)
    if sha256 is not None and got != sha256.lower():
        part.unlink()  # a wrong file cannot be fixed by resuming it
        raise EvalError(
            f"{url}: sha256 {got} does not match the expected {sha256}; the file is corrupt "
            "or the bundle changed upstream (deleted; run again to download it afresh, or pass "
            "--sha256 HEX to accept a known new one)"
        )
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.tmp-") as tmp:
        archive = Path(tmp) / "eval_bundle.zip"
        part.rename(archive)  # complete and verified: no longer a partial download
        staged = Path(tmp) / "unpacked"
        unpack(archive, staged)
        root = staged / "eval_bundle" if (staged / "eval_bundle").is_dir() else staged
        if dest.exists():
            shutil.rmtree(dest)
        root.rename(dest)
    log(f"eval bundle ready: {dest} (sha256 {got})")
    return dest
