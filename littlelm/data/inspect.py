"""`littlelm data inspect DIR`: what a prepared dataset holds, and whether it is intact.

Prints the tokenizer, the source, tokens and documents per split, a histogram of document
lengths, decoded sample documents and the result of checking every shard (present, complete,
made by the dataset's tokenizer, payload checksum equal to the header's and the manifest's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from littlelm.data.prepare import MANIFEST, read_manifest
from littlelm.data.shards import Shard
from littlelm.data.tokenizer import Tokenizer
from littlelm.data.tokenizers import load_tokenizer
from littlelm.errors import DataError
from littlelm.progress import human


def inspect_dataset(
    directory: Path,
    samples: int = 1,
    chars: int = 400,
    verify: bool = True,
    seed: int = 0,
    out=print,
    seq_len: int | None = None,
) -> None:
    """Print the report; raise DataError (after printing) when any shard fails its checks."""
    directory = Path(directory)
    if directory.is_file():
        directory = directory.parent
    m = read_manifest(directory)
    tok = _tokenizer(directory, m, out)
    src = m.get("source", {})
    files = src.get("files", [])
    out(f"dataset {directory} (source {m.get('label')!r}, {len(files)} input file(s))")
    out(
        f"input: {m['documents']:,} documents, {m['bytes'] / 1e6:,.1f} MB of text, prepared in "
        f"{m.get('seconds', 0):.1f}s"
        + (f"; skipped: {_skips(m['skipped'])}" if m.get("skipped") else "")
    )
    out(
        f"exact duplicates dropped: {m['duplicates']:,}"
        if "duplicates" in m
        else "exact duplicates: not removed (prepared before dedup existed)"
    )
    out(
        f"{'split':<6} {'shards':>7} {'documents':>12} {'tokens':>14} {'mean':>8} {'median':>8} {'max':>9}"
    )
    lengths = {}
    for name, split in m["splits"].items():
        lengths[name] = _lengths(directory, split["shards"])
        ls = lengths[name]
        stats = (f"{ls.mean():8.1f} {np.median(ls):8.0f} {ls.max():9,}") if len(ls) else ""
        out(
            f"{name:<6} {len(split['shards']):>7,} {split['docs']:>12,} {split['tokens']:>14,} {stats}"
        )
    if m.get("conversations"):
        out(_conversations(lengths, seq_len))
    if len(lengths.get("train", [])):
        out("train document lengths (tokens, BOS included):")
        for line in histogram(lengths["train"]):
            out("  " + line)
    if tok is not None and samples:
        _samples(directory, m, tok, samples, chars, seed, out)
    if verify:
        _verify(directory, m, out)


def inspect_tokens(
    path: Path,
    fmt: str | None = None,
    dtype: str | None = None,
    separator: int | None = None,
    column: str = "input_ids",
    out=print,
    val_fraction: float = 0.01,
) -> None:
    """Describe token files another tool wrote (data/foreign.py) as a run reads them: files,
    tokens, documents (a document that goes on from one file into the next counted once), the
    files held out for validation, gaps in the numbering, the separator found, the range of
    token ids, document lengths. Without --separator a nanogpt v1 file (GPT-2's uint16) is
    split at <|endoftext|> (50256), others not at all; a Megatron or parquet file whose
    documents all end with one token (--append-eod) is read with that token as the BOS."""
    from littlelm.data.cache import cache_root
    from littlelm.data.foreign import TokenFiles, TokensConfig
    from littlelm.data.token_formats import detect_format

    fmt = fmt or detect_format(path)
    cfg = TokensConfig(
        name="tokens",
        format=fmt,
        path=str(path),
        dtype=dtype,
        separator="none" if separator is None else separator,
        column=column,
    )
    # TokenFiles reads a TokensConfig, not the DocumentSourceConfig of Source.__init__ (its cfg)
    src = TokenFiles(cfg, "inspect")  # type: ignore[arg-type]  # TokenFiles.cfg says why
    paths, cache = src.files(), cache_root(None)
    if separator is None and fmt == "nanogpt":
        first = src.open_files(paths[:1], None, -1, cache)[0]
        separator = 50256 if first.meta["dtype"] == "uint16" else None
        if separator is not None:
            src.cfg = cfg.model_copy(update={"separator": separator})
    bos = separator if separator is not None else _common_last_token(src, paths, cache)
    said: list[str] = []
    train, val, s = src.open(_AnyIds(bos), val_fraction, cache, said.append)
    for line in describe_tokens(s):
        out(line)
    for line in said:  # the held-out files, gaps in the numbering: what a run says at start
        out(line)
    if not s["split"].get("val_files"):
        out(
            f"validation: the documents that start in the last {val_fraction:.1%} of each "
            "file's tokens (data.val_fraction), no file named *_val_* to hold out"
        )
    sep = src.separator(bos)
    out(f"{'file':<40} {'tokens':>14} {'doc starts':>11} {'ids':>14} {'separator':>9}")
    shown = [(st, i) for st in src.streams for i in range(len(st.files))]
    for st, i in shown[:20]:
        f = st.files[i]
        ids = f"{f.meta['min_id']}..{f.meta['max_id']}"
        found = "-" if sep is None else f"{f.meta['separators']:,}"
        begun = len(f) - int(i > 0 and -1 in st.drop[i])  # its head goes on from the file before
        out(f"{f.path.name:<40} {f.meta['tokens']:>14,} {begun:>11,} {ids:>14} {found:>9}")
    if len(shown) > 20:
        out(f"... and {len(shown) - 20} more file(s)")
    lengths = np.concatenate([v.lengths() for v in train + val])
    out("document lengths (tokens, BOS included):")
    for line in histogram(lengths):
        out("  " + line)


class _AnyIds:
    """The tokenizer `data inspect` reads token files under: any id, and `bos` (or none)."""

    vocab_size = 2**32

    def __init__(self, bos: int | None):
        self.bos_id = -1 if bos is None else bos

    def describe(self) -> str:
        return "any token id"


def _common_last_token(src, paths: list[Path], cache: Path) -> int | None:
    """The token every indexed document (Megatron, parquet) ends with, when they all end with
    one: the EOD of Megatron's --append-eod."""
    if src.cfg.format not in ("megatron", "parquet"):
        return None
    last = set()
    for f in src.open_files(paths, None, -1, cache):
        ends = np.asarray(f.ends)
        last.update(np.unique(f.tokens[ends[ends > 0] - 1]).tolist())
        if len(last) > 1:
            return None
    return int(last.pop()) if len(last) == 1 else None


def describe_tokens(s: dict) -> list[str]:
    crossing = s.get("continued", 0)
    lines = [
        f"{s['format']} token files: {s['files']:,} file(s), {s['tokens']:,} tokens "
        f"({'/'.join(s['dtype'])}), {s['documents']:,} documents as training reads them"
        + (
            f" (train {s['train_documents']:,}, validation {s['val_documents']:,})"
            if "train_documents" in s
            else ""
        )
        + (f"; {crossing:,} go on from one file into the next" if crossing else ""),
        f"token ids: {s['min_id']:,}..{s['max_id']:,} (a tokenizer needs a vocabulary of at least "
        f"{s['max_id'] + 1:,})",
    ]
    if s["format"] in ("nanogpt", "array"):
        lines.append(
            "separator: none (each file is one document; set --separator ID)"
            if s["separator"] is None
            else f"separator {s['separator']}: found in {s['separator_in']} of {s['files']} file(s)"
        )
    else:
        where = "index (.idx)" if s["format"] == "megatron" else "rows"
        eod = (
            f"; every document ends with EOD (= BOS, {s['eod_ended']} of {s['files']} file(s): "
            "Megatron's --append-eod), which is dropped, so a boundary is one BOS"
            if s.get("eod_ended")
            else ""
        )
        lines.append(f"documents: from the {where}, BOS put before each{eod}")
    return lines


def _conversations(lengths: dict[str, np.ndarray], seq_len: int | None) -> str:
    """What an SFT run on these conversations leaves out as too long for a training row."""
    every = np.concatenate([v for v in lengths.values() if len(v)] or [np.zeros(0, np.int64)])
    longest = int(every.max(initial=0))
    head = f"conversations (SFT: the loss counts the assistant's tokens); the longest has {longest:,} tokens"
    if seq_len is None:
        return f"{head}; --seq-len N counts those a run with train.seq_len N cannot hold"
    n = int((every > seq_len + 1).sum())
    return (
        f"{head}; {n:,} too long for train.seq_len {seq_len} (rows of {seq_len + 1} tokens): "
        "a run leaves them out (on_error skip) or refuses them (fail)"
    )


def _tokenizer(directory: Path, m: dict, out) -> Tokenizer | None:
    info = m["tokenizer"]
    try:
        tok = load_tokenizer(directory / "tokenizer")
    except DataError as e:
        out(f"tokenizer: {info.get('describe', '?')} — cannot load its files: {e}")
        return None
    ok = "" if tok.fingerprint == info["fingerprint"] else " (DIFFERS from the manifest's!)"
    out(f"tokenizer: {tok.describe()}, BOS {tok.bos_id}, fingerprint {tok.fingerprint[:12]}{ok}")
    return tok


def _lengths(directory: Path, shards: list[dict]) -> np.ndarray:
    parts = []
    for s in shards:
        try:
            parts.append(Shard(directory / s["file"], verify=False).lengths())
        except DataError:
            continue  # reported by the checks
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def histogram(lengths: np.ndarray, width: int = 40) -> list[str]:
    """Power-of-two buckets: '   16-31     | ######       |  12.3%  1,234'."""
    buckets = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    counts = np.bincount(buckets)
    total = counts.sum()
    lines = []
    for b, n in enumerate(counts):
        if n == 0:
            continue
        lo, hi = 1 << b, (1 << (b + 1)) - 1
        bar = "#" * max(1, round(width * n / counts.max()))
        lines.append(f"{lo:>9,}-{hi:<9,} {bar:<{width}} {100 * n / total:5.1f}% {n:>12,}")
    return lines


def _samples(directory: Path, m: dict, tok: Tokenizer, n: int, chars: int, seed: int, out) -> None:
    shards = m["splits"]["train"]["shards"] or m["splits"]["val"]["shards"]
    rng = np.random.default_rng(seed)
    for _ in range(n):
        entry = shards[int(rng.integers(len(shards)))]
        try:
            shard = Shard(directory / entry["file"], verify=False)
        except DataError:
            continue
        d = int(rng.integers(len(shard)))
        doc = shard.doc(d)
        text = tok.decode(doc[: max(8, chars)].tolist())[:chars]
        out(f"sample: {entry['file']} document {d} ({len(doc):,} tokens):")
        out("  " + text.replace("\n", "\n  ") + (" …" if len(text) >= chars else ""))


def _verify(directory: Path, m: dict, out) -> None:
    entries = [s for split in m["splits"].values() for s in split["shards"]]
    bad = []
    for entry in entries:
        try:
            shard = Shard(directory / entry["file"], verify=True)
            shard.check_tokenizer(m["tokenizer"]["fingerprint"], "the dataset's tokenizer")
            if shard.header.checksum != entry["sha256"]:
                raise DataError(f"{shard.path}: checksum differs from the one in {MANIFEST}")
        except DataError as e:
            bad.append(str(e))
    if not bad:
        out(f"checks: all {len(entries)} shard(s) complete, checksums match")
        return
    for line in bad:
        out(f"  FAILED {line}")
    raise DataError(
        f"{len(bad)} of {len(entries)} shard(s) in {directory} failed their checks (listed above); "
        "delete the directory and run `littlelm data prepare` again"
    )


def _skips(skipped: dict) -> str:
    return ", ".join(f"{human(n)} {reason}" for reason, n in sorted(skipped.items()))
