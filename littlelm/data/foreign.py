"""Token files written by other tools, trained on as they are: the `tokens` source.

    data:
      tokenizer: {name: tiktoken, encoding: gpt2}     # the tokenizer that made the files
      sources:
        fineweb: {name: tokens, format: nanogpt, path: fineweb10B/, weight: 0.8}
        owt:     {name: tokens, format: array, path: owt/train.bin, dtype: uint16}
        pile:    {name: tokens, format: megatron, path: pile/pile_text_document}
        math:    {name: tokens, format: parquet, path: math/, column: input_ids}

    nanogpt   llm.c / modded-nanogpt `.bin`: a header of 256 little-endian int32 (magic,
              version, token count), then the tokens. llm.c's dev/data/data_common.py writes
              magic 20240520 version 1 for uint16 tokens (its "gpt-2" files) and magic 20240801
              version 7 for uint32 tokens ("llama-3")
    array     a headerless `.bin` of `dtype` tokens, or a 1-D `.npy` of uint16 / uint32
    megatron  Megatron-LM / NeMo indexed dataset, PREFIX.bin (the tokens) + PREFIX.idx: magic
              b"MMIDIDX\\0\\0", u64 version 1, u8 dtype code (8 uint16, 4 int32), u64 sequence
              count S, u64 document count D; then S int32 sequence lengths, S int64 byte
              pointers into .bin, D int64 document indices (the first sequence of each document,
              the last entry = S)
    parquet   a column of token-id lists, one document a row (what `datasets` map(tokenize)
              writes); copied once, a row group at a time, into the cache as a flat token file

Documents. In nanogpt and array files the `separator` (default: the tokenizer's BOS, which for
tiktoken gpt2 is <|endoftext|>, 50256) starts each document and becomes its BOS; tokens before
a file's first separator are a document too, and a separator with nothing after it is dropped.
In megatron and parquet files each indexed document (row) is one, with BOS put before it unless
its first token is BOS already. So every document reaches the packer as BOS + its tokens, like
littlelm's own shards: an index entry (start, end) covers tokens[start:end] of the file, and
the packer writes BOS over tokens[start] (the separator, the last token of the document before,
or, at the start of the file, start = -1 and nothing).

Each file's index (document starts and ends, the token range) is built by one pass over the file
and cached under CACHE/token-index, keyed by the file's path, size, mtime, ctime and inode and
the options that change it: a second open reads only the index. The tokens stay in the file, memory-mapped.
Validation: the files of `val_path` whole or, without it, the documents that start in the last
`data.val_fraction` of each file's tokens.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from littlelm.config import named
from littlelm.data.sources import Source, SourceConfig, find_files
from littlelm.data.token_stream import (
    CHUNK,
    Layout,
    Stream,
    gap_warning,
    map_tokens,
    numbered_order,
)
from littlelm.errors import DataError

NANOGPT_HEADER = 256 * 4
# (magic, version) -> token dtype, as llm.c's write_datafile writes them (gpt-2, llama-3)
NANOGPT_HEADERS = {(20240520, 1): np.uint16, (20240801, 7): np.uint32}
NANOGPT_MAGICS = {magic for magic, _ in NANOGPT_HEADERS}
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {8: np.uint16, 4: np.int32}  # Megatron's DType codes that hold token ids
PATTERNS = {  # what a directory is searched for, per format
    "nanogpt": ("*.bin",),
    "array": ("*.bin", "*.npy"),
    "megatron": ("*.idx",),
    "parquet": ("*.parquet",),
}
TOKEN_FILES = ("*.bin", "*.npy", "*.idx", "*.parquet")  # any of these: a mixed directory
INDEX_VERSION = 5  # 2: the first and last separator of each file; 3: the index raw; 4: one
# file; 5: documents that end with EOD (Megatron --append-eod) lose it
VAL_NAME = "*_val_*"  # shard names that mark validation (llm.c: fineweb_val_000000.bin)


class TokensConfig(SourceConfig):
    """Token files written by another tool (nanoGPT / llm.c, plain arrays, Megatron, parquet)."""

    name: Literal["tokens"] = named("tokens")
    format: Literal["nanogpt", "array", "megatron", "parquet"] = Field(
        ...,
        description="nanogpt (llm.c .bin with its 256-int32 header), array (headerless .bin or "
        ".npy), megatron (PREFIX.bin + PREFIX.idx) or parquet (a column of token-id lists).",
    )
    path: str | list[str] = Field(
        ...,
        description="A file, a directory (searched for the format's files), a glob, or a list; "
        "megatron: a PREFIX, its .idx or .bin, or a directory of them.",
    )
    dtype: Literal["uint16", "uint32"] | None = Field(
        None,
        description="Token type of a headerless array .bin (required there; others have it in "
        "their header).",
    )
    separator: Annotated[int, Field(ge=0)] | Literal["none"] | None = Field(
        None,
        description="nanogpt / array: the token id that starts (or ends) each document; null = "
        "the tokenizer's BOS (tiktoken gpt2: <|endoftext|>, 50256); none = each file is one "
        "document.",
    )
    column: str = Field("input_ids", description="parquet: the column of token-id lists.")
    val_path: str | list[str] | None = Field(
        None,
        description="Validation files (same format), used whole; null = hold out the last "
        "data.val_fraction of each file's tokens (whole documents).",
    )

    def build(self, label: str) -> Source:
        return TokenFiles(self, label)  # type: ignore[arg-type]  # token ids: the class narrows cfg


# -- one file: reading its header, indexing it once --------------------------------------------


def _stat(path: Path) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None
    if st.st_size == 0:
        raise DataError(f"{path} is empty (0 bytes); remove it, or write its tokens again")
    return st


def _size(path: Path) -> int:
    return _stat(path).st_size


@functools.lru_cache(maxsize=256)
def _real_dir(directory: str) -> str:
    return os.path.realpath(directory)


def _read(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None


def _checked(path: Path, size: int, layout: Layout, by: str = "its header") -> Layout:
    """`layout`, once the file has the size it promises."""
    want = layout.offset + layout.count * np.dtype(layout.dtype).itemsize
    if size != want:
        raise DataError(
            f"{path} is truncated or damaged: {size:,} bytes, {by} promises {layout.count:,} "
            f"tokens ({want:,} bytes); write it again"
        )
    return layout


def nanogpt_layout(path: Path) -> Layout:
    size = _size(path)
    if size < NANOGPT_HEADER:
        raise DataError(
            f"{path} is truncated: {size} bytes, less than the 1024-byte header of an llm.c / "
            "nanoGPT .bin; write it again (for a headerless token array use format: array)"
        )
    magic, version, count = (int(v) for v in np.frombuffer(_read(path, 12), "<i4"))
    dtype = NANOGPT_HEADERS.get((magic, version))
    if dtype is None:
        raise DataError(unknown_header(path, size, magic, version, count))
    return _checked(path, size, Layout(NANOGPT_HEADER, count, dtype))


def unknown_header(path: Path, size: int, magic: int, version: int, count: int) -> str:
    """What to say of a .bin whose header llm.c does not write: the values, and the fix that
    fits the file's size (a 1024-byte header and `count` tokens of 2 or 4 bytes, or no header)."""
    known = "; ".join(f"magic {m} version {v} for {np.dtype(d).name}"
                      for (m, v), d in NANOGPT_HEADERS.items())  # fmt: skip
    head = (
        f"{path}: header magic {magic}, version {version}, token count {count}, which is not "
        f"one llm.c writes ({known})"
    )
    for item, (m, v) in ((2, (20240520, 1)), (4, (20240801, 7))):
        if count > 0 and size == NANOGPT_HEADER + count * item:  # llm.c's layout, other values
            return (
                f"{head}. Its size fits a 1024-byte header and {count:,} tokens of {item} bytes: "
                f"if that is what it holds, set llm.c's header for them with `python -c \"import "
                f"numpy as np; h = np.memmap('{path}', dtype='<i4', mode='r+', shape=(2,)); "
                f'h[:] = ({m}, {v}); h.flush()"`'
            )
    return (
        f"{head}, and its size ({size:,} bytes) fits no header of llm.c's layout: a headerless "
        "token array: give the source format: array and its dtype, uint16 or uint32 (data "
        "inspect: --format array --dtype D)"
    )


def array_layout(path: Path, dtype: str | None) -> Layout:
    size = _size(path)
    if path.suffix == ".npy":
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dt = read(f)
                offset = f.tell()
        except (ValueError, OSError) as e:
            raise DataError(f"{path} is not a readable .npy file ({e}); write it again") from None
        if len(shape) != 1 or dt.newbyteorder("<") not in (np.dtype("<u2"), np.dtype("<u4")):
            raise DataError(
                f"{path}: a .npy of shape {shape} and dtype {dt}; token arrays must be 1-D "
                "uint16 or uint32"
            )
        if dt.byteorder == ">":
            raise DataError(f"{path}: big-endian {dt}; save it little-endian")
        return _checked(path, size, Layout(offset, shape[0], dt.type))
    if dtype is None:
        raise DataError(
            f"{path}: a headerless token array needs its dtype; set dtype: uint16 or uint32 on "
            "the source (or use format: nanogpt if it has llm.c's header)"
        )
    item = np.dtype(dtype).itemsize
    if size % item:
        raise DataError(
            f"{path}: {size:,} bytes is not a whole number of {dtype} tokens ({item} bytes "
            "each): truncated, or another dtype; fix dtype or write the file again"
        )
    return Layout(0, size // item, np.dtype(dtype).type)


def megatron_files(path: Path) -> tuple[Path, Path]:
    stem = path.with_suffix("") if path.suffix in (".idx", ".bin") else path
    idx, bin_ = stem.with_name(stem.name + ".idx"), stem.with_name(stem.name + ".bin")
    for p in (idx, bin_):
        if not p.is_file():
            raise DataError(
                f"{p} is missing: a Megatron indexed dataset is PREFIX.bin with PREFIX.idx"
            )
    return idx, bin_


def megatron_index(idx: Path, bin_: Path) -> tuple[Layout, np.ndarray, np.ndarray]:
    """The .bin's layout and each document's [start, end) in tokens, from the .idx."""
    size = _size(idx)
    head = _read(idx, 34)
    if len(head) < 34 or head[:9] != MEGATRON_MAGIC:
        raise DataError(
            f"{idx}: wrong magic, not a Megatron index (it starts with {MEGATRON_MAGIC!r}); "
            "write it again with Megatron's preprocess_data.py"
        )
    version, code, n_seq, n_doc = struct.unpack("<QBQQ", head[9:34])
    if version != 1:
        raise DataError(f"{idx}: Megatron index version {version} is not known (1)")
    if code not in MEGATRON_DTYPES:
        raise DataError(f"{idx}: token dtype code {code} is not uint16 (8) or int32 (4)")
    need = 34 + 4 * n_seq + 8 * n_seq + 8 * n_doc
    if size < need:
        raise DataError(
            f"{idx} is truncated: {size:,} bytes, its header promises {n_seq:,} sequences and "
            f"{n_doc:,} document indices ({need:,} bytes); write it again"
        )
    raw = np.memmap(idx, np.uint8, "r", 34, need - 34)
    lengths = raw[: 4 * n_seq].view("<i4").astype(np.int64)
    pointers = raw[4 * n_seq : 12 * n_seq].view("<i8")
    doc_idx = raw[12 * n_seq : need - 34].view("<i8").astype(np.int64)
    dtype = MEGATRON_DTYPES[code]
    item = np.dtype(dtype).itemsize
    tok_off = np.concatenate([[0], np.cumsum(lengths)])
    if n_seq and not np.array_equal(pointers, tok_off[:-1] * item):
        raise DataError(f"{idx}: sequences are not stored back to back in {bin_}; not supported")
    if n_doc < 1 or doc_idx[0] != 0 or doc_idx[-1] != n_seq or np.any(np.diff(doc_idx) < 0):
        raise DataError(f"{idx}: its document indices are inconsistent; write it again")
    layout = _checked(
        bin_, _size(bin_), Layout(0, int(tok_off[-1]), dtype), f"its index {idx.name}"
    )
    return layout, tok_off[doc_idx[:-1]], tok_off[doc_idx[1:]]


def separator_index(
    tokens: np.ndarray, sep: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, separator offsets): a document starts at each separator, and at -1 (a
    BOS before the file) when the file does not begin with one; a lone separator is dropped."""
    found = [np.zeros(0, np.int64)]
    if sep is not None:
        for a in range(0, len(tokens), CHUNK):
            found.append(np.flatnonzero(tokens[a : a + CHUNK] == sep).astype(np.int64) + a)
    seps = np.concatenate(found)
    starts = seps if len(seps) and seps[0] == 0 else np.concatenate([[-1], seps])
    ends = np.concatenate([starts[1:], [len(tokens)]])
    keep = ends - starts > 1  # BOS and at least one token
    return starts[keep], ends[keep], seps


def without_eod(
    tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, eod: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(starts, ends, True) without each document's last token when every non-empty document
    ends with `eod`; else the index unchanged and False."""
    full = ends > starts
    if not len(starts) or not full.any():
        return starts, ends, False
    last = tokens[np.maximum(ends[full] - 1, 0)]
    if not (last == eod).all():
        return starts, ends, False
    return starts, np.where(full, ends - 1, ends), True


def token_range(tokens: np.ndarray) -> tuple[int, int]:
    lo, hi = None, None
    for a in range(0, len(tokens), CHUNK):
        part = tokens[a : a + CHUNK]
        lo = int(part.min()) if lo is None else min(lo, int(part.min()))
        hi = int(part.max()) if hi is None else max(hi, int(part.max()))
    return (lo or 0, hi or 0) if lo is not None else (0, -1)


def first_at_least(tokens: np.ndarray, limit: int) -> int:
    """Offset of the first token >= limit (or < 0, for signed dtypes)."""
    for a in range(0, len(tokens), CHUNK):
        part = tokens[a : a + CHUNK]
        bad = np.flatnonzero((part >= limit) | (part < 0))
        if len(bad):
            return a + int(bad[0])
    return -1


class TokenFile:
    """One token file, memory-mapped, with its document index (cached)."""

    def __init__(self, path: Path, cfg: TokensConfig, sep: int | None, bos: int, cache: Path):
        self.path, self.fmt, self.sep, self.bos = path, cfg.format, sep, bos
        self.data_path = path  # the file the tokens are in
        if cfg.format == "megatron":
            idx, self.data_path = megatron_files(path)
        # an index cached for this path and stat: the header was read when it was made
        self.key = key = self._key(cfg, cache)
        meta, index = self._load(cache, key)
        layout = None
        if meta is not None:
            if cfg.format == "parquet":
                self.data_path = Path(meta["data"])
            self.starts, self.ends = index[0], index[1]
            layout = Layout(meta["offset"], meta["tokens"], np.dtype(meta["dtype"]).type)
        else:
            if cfg.format == "nanogpt":
                layout = nanogpt_layout(path)
            elif cfg.format == "array":
                layout = array_layout(path, cfg.dtype)
            elif cfg.format == "megatron":
                layout, starts, ends = megatron_index(idx, self.data_path)
            elif cfg.format == "parquet":
                layout, starts, ends = parquet_to_tokens(path, cfg.column, cache / f"{key}.tokens")
                self.data_path = cache / f"{key}.tokens"
            tokens = map_tokens(self.data_path, layout)
            seps = np.zeros(0, np.int64)
            eod_ended = False
            if cfg.format in ("nanogpt", "array"):
                starts, ends, seps = separator_index(tokens, sep)
            else:  # indexed documents: BOS before each, unless it is there
                # Megatron's preprocess_data.py --append-eod ends every document with the
                # EOD token, which is BOS here (gpt2's <|endoftext|>): that one is dropped, as
                # the BOS before the next document is the boundary already
                starts, ends, eod_ended = without_eod(tokens, starts, ends, bos)
                if len(starts):
                    first = tokens[np.minimum(starts, max(0, len(tokens) - 1))]
                    starts = np.where((ends > starts) & (first == bos), starts, starts - 1)
                keep = ends - starts > 1
                starts, ends = starts[keep], ends[keep]
            lo, hi = token_range(tokens)
            meta = {
                "tokens": layout.count,
                "offset": layout.offset,
                "dtype": np.dtype(layout.dtype).name,
                "min_id": lo,
                "max_id": hi,
                "separators": len(seps),
                # where the file's first and last document start: the stream's joints
                "first_sep": int(seps[0]) if len(seps) else None,
                "last_sep": int(seps[-1]) if len(seps) else None,
                "data": str(self.data_path),
                "eod_ended": eod_ended,
            }
            self._save(cache, key, np.stack([starts, ends]).astype(np.int64), meta)
            self.starts, self.ends = starts, ends
        self.meta = meta
        self.layout = layout
        self.tokens = map_tokens(self.data_path, layout)

    def _key(self, cfg: TokensConfig, cache: Path) -> str:
        stats = []
        for p in dict.fromkeys([self.path, self.data_path]):
            st = _stat(p)  # a missing, unreadable or empty file: its error, named
            # the directory resolved once for all its files: 528 realpath calls cost 40 ms
            # ctime and inode too: an edit in place that sets the mtime back moves the ctime
            where = os.path.join(_real_dir(str(p.parent)), p.name)
            stats.append((where, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        ident = {
            "v": INDEX_VERSION,
            "files": stats,
            "format": cfg.format,
            "dtype": cfg.dtype,
            "sep": self.sep,
            "bos": self.bos,
            "column": cfg.column if cfg.format == "parquet" else None,
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]

    # A cached index is one file, KEY.index: a line of JSON (the file's figures), then the
    # document starts and ends as raw little-endian int64 (2 x documents). One open a file, no
    # .npy header to parse: a directory of 528 llm.c shards opens in a tenth of a second.

    @staticmethod
    def _load(cache: Path, key: str) -> tuple[dict | None, np.ndarray]:
        try:
            with open(os.path.join(cache, key + ".index"), "rb") as f:
                raw = f.read()
            line = raw.index(b"\n")
            meta = json.loads(raw[:line])
            index = np.frombuffer(raw, "<i8", offset=line + 1).reshape(2, -1).astype(np.int64)
        except (OSError, ValueError):  # none yet, or cut short: build it again
            return None, np.zeros((2, 0), np.int64)
        return meta, index

    @staticmethod
    def _save(cache: Path, key: str, index: np.ndarray, meta: dict) -> None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            tmp = cache / f"{key}.index.tmp-{os.getpid()}"
            body = json.dumps(meta).encode() + b"\n" + index.astype("<i8").tobytes()
            tmp.write_bytes(body)
            os.replace(tmp, cache / f"{key}.index")  # whole or not at all
        except OSError as e:
            raise DataError(
                f"cannot write the token index to {cache}: {e.strerror}; set data.cache_dir "
                "to a writable directory"
            ) from None

    def __len__(self) -> int:
        return len(self.starts)

    def source_files(self) -> tuple[Path, ...]:
        """The files another tool wrote that this one reads (a Megatron .idx and its .bin)."""
        return (
            (self.path,)
            if self.fmt == "parquet"
            else tuple(dict.fromkeys([self.path, self.data_path]))
        )

    def check(self, vocab: int, describe: str) -> None:
        """A token id outside the vocabulary is an error naming the file and the offset."""
        if self.meta["max_id"] >= vocab or self.meta["min_id"] < 0:
            off = first_at_least(self.tokens, vocab)
            byte = self.layout.offset + off * np.dtype(self.layout.dtype).itemsize
            where = (
                f"{self.path}"
                if self.data_path == self.path
                else f"{self.path} (as {self.data_path})"
            )
            raise DataError(
                f"{where}: token id {int(self.tokens[off])} at token offset {off:,} (byte "
                f"{byte:,}) is outside the vocabulary of {describe} ({vocab:,} ids); declare the "
                "tokenizer that made these files in data.tokenizer, or fix the file"
            )


def parquet_to_tokens(path: Path, column: str, out: Path) -> tuple[Layout, np.ndarray, np.ndarray]:
    """Copy a parquet column of token-id lists into a flat uint32 file (a row group at a
    time); the rows' [start, end) in it."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        from littlelm.errors import DependencyError

        raise DependencyError(
            "format: parquet needs pyarrow: pip install -e '.[data]' in a clone of littlelm, "
            "or pip install pyarrow"
        ) from None
    _size(path)
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path} is not a readable parquet file ({e}); write it again") from None
    if column not in pf.schema_arrow.names:
        raise DataError(
            f"{path}: no column {column!r} (columns: {', '.join(pf.schema_arrow.names)}); set "
            "data.sources.LABEL.column"
        )
    kind = pf.schema_arrow.field(column).type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
        kind.value_type
    ):
        raise DataError(f"{path}: column {column!r} is {kind}, not a list of token ids")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    starts, ends, n = [], [], 0
    with open(tmp, "wb") as f:
        for g in range(pf.num_row_groups):
            col = pf.read_row_group(g, columns=[column]).column(0).combine_chunks()
            offsets = col.offsets.to_numpy().astype(np.int64)
            values = col.values.to_numpy(zero_copy_only=False)
            values = values[offsets[0] : offsets[-1]]
            if len(values) and (values.min() < 0 or values.max() >= 2**32):
                bad = int(np.flatnonzero((values < 0) | (values >= 2**32))[0])
                raise DataError(
                    f"{path}: token id {int(values[bad])} at token offset {n + bad:,} of column "
                    f"{column!r} is not a token id"
                )
            f.write(values.astype("<u4").tobytes())
            starts.append(n + offsets[:-1] - offsets[0])
            ends.append(n + offsets[1:] - offsets[0])
            n += len(values)
    os.replace(tmp, out)
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
    return Layout(0, n, np.uint32), cat(starts), cat(ends)


# -- the source and its views ------------------------------------------------------------------


class TokenFiles(Source):
    """Token files another tool wrote, used as they are (memory-mapped)."""

    # TokensConfig is a SourceConfig, not a DocumentSourceConfig (token ids, not documents);
    # this class overrides the methods that read a document source's fields
    cfg: TokensConfig  # type: ignore[assignment]  # token ids, not documents (above)
    prepared = True  # no tokenizing
    foreign = True
    opened: tuple[list, list, dict]  # set by data/build.py's prepare_data: what open returned
    streams: list[Stream]  # set by open: the training stream (and the validation files')

    def files(self, spec=None, key: str = "path") -> list[Path]:
        spec = self.cfg.path if spec is None else spec
        fmt = self.cfg.format
        specs = [spec] if isinstance(spec, str) else list(spec)
        if fmt == "megatron":  # a PREFIX names PREFIX.idx
            specs = [
                s + ".idx"
                if not Path(s).expanduser().exists() and Path(s + ".idx").expanduser().is_file()
                else s
                for s in specs
            ]
        where = f"data.sources.{self.label}.{key}"
        found = find_files(specs, PATTERNS[fmt], where, f"{fmt} token files")
        for s in specs:  # a directory holds one format only
            d = Path(s).expanduser()
            if d.is_dir():
                _refuse_mixed(d, fmt)
        if fmt == "megatron":
            found = list(dict.fromkeys(p.with_suffix(".idx") for p in found))
        return found

    def directory(self) -> Path:
        return self.files()[0].parent

    def open(self, tok, val_fraction: float, cache: Path, log=print) -> tuple[list, list, dict]:
        """(train views, val views, summary) of every file, checked against `tok`. The files
        of a source are one stream in their order (sorted names): a document may continue from
        one file into the next, as llm.c's fineweb shards, filled to a fixed size, have it."""
        sep = self.separator(tok.bos_id)
        describe = f"this run's tokenizer, {tok.describe()}"

        def opened(paths: list[Path]) -> list[TokenFile]:
            files = self.open_files(paths, sep, tok.bos_id, cache)
            for f in files:
                f.check(tok.vocab_size, describe)
            return files

        paths, val_paths = self.split_val(log)
        # llm.c's val shard (number 0) is filled to a fixed size like the others, so its last
        # document goes on into the first training shard: the held-out files and the training
        # files are one stream in shard-number order, and each document goes with its start
        order = (
            numbered_order(val_paths + paths) if val_paths and self.cfg.val_path is None else None
        )
        if order is not None:
            every, val_set = opened(order), set(val_paths or ())
            held = [f.path in val_set for f in every]
            stream = Stream(every, sep, tok.bos_id, cache / "token-index")
            train_files, all_files = [f for f, h in zip(every, held) if not h], every
            train, val = stream.views(None, "train", held), stream.views(None, "val", held)
        else:
            train_files = all_files = opened(paths)
            stream = Stream(train_files, sep, tok.bos_id, cache / "token-index")
        if self.cfg.format in ("nanogpt", "array") and sep is not None and not stream.separators:
            tokens = sum(f.meta["tokens"] for f in train_files)
            log(
                f"warning: data.sources.{self.label}: the separator {sep} never occurs in its "
                f"{len(train_files)} file(s) ({tokens:,} tokens; first {train_files[0].path}), so "
                f"each file is one document; set data.sources.{self.label}.separator to the id "
                "between its documents (or none)"
            )
        for a, b, head in stream.gaps:
            log(gap_warning(self.label, a, b, head))
        self.streams = [stream]  # what `data inspect` lists, file by file
        if order is None and val_paths is not None:
            train = stream.views(None)
            val_files = opened(val_paths)
            all_files = train_files + val_files
            self.streams.append(Stream(val_files, sep, tok.bos_id, cache / "token-index"))
            val = self.streams[-1].views(None)
        elif order is None:
            cuts = [
                f.meta["tokens"] - round(val_fraction * f.meta["tokens"]) if val_fraction else None
                for f in train_files
            ]
            train, val = stream.views(cuts, "train"), stream.views(cuts, "val")
        if not train:
            raise DataError(f"data.sources.{self.label}: no training documents in its files")
        for f in train_files:
            if note := megatron_note(f, self.label):
                log(note)
        summary = summarise(all_files, sep) | {
            "documents": sum(len(v) for v in train + val),
            "train_documents": sum(len(v) for v in train),
            "val_documents": sum(len(v) for v in val),
            "continued": stream.joined,
            "gaps": [[a.name, b.name] for a, b, _ in stream.gaps],
            "split": {
                "fraction": "val_path" if val_paths is not None else val_fraction,
                **({"val_files": [str(p) for p in val_paths]} if val_paths else {}),
            },
        }
        return train, val, summary

    def split_val(self, log) -> tuple[list[Path], list[Path] | None]:
        """(training files, validation files or None). Files named like a validation shard
        (*_val_*, llm.c's fineweb_val_000000.bin) in a directory given as path are not trained
        on; without val_path they are the validation files, and this says so."""
        paths = self.files()
        dirs = [Path(s).expanduser() for s in _listed(self.cfg.path)]
        dirs = [d for d in dirs if d.is_dir()]
        marked = [p for p in paths if fnmatch.fnmatch(p.name, VAL_NAME) and
                  any(d in p.parents for d in dirs)]  # fmt: skip
        key = f"data.sources.{self.label}"
        given = None if self.cfg.val_path is None else self.files(self.cfg.val_path, "val_path")
        if not marked:
            return paths, given
        train = [p for p in paths if p not in marked]
        if not train:
            raise DataError(
                f"{key}.path: every file in it is named as validation ({VAL_NAME}: "
                f"{marked[0]}); give the training files as a glob or a list in path"
            )
        names = ", ".join(p.name for p in marked[:3]) + (" ..." if len(marked) > 3 else "")
        if given is None:
            log(
                f"data.sources.{self.label}: {len(marked)} validation file(s) in its directory "
                f"({names}) are held out and used as its val_path (set {key}.val_path to "
                "choose others; list files in path to train on them)"
            )
            return train, marked
        log(
            f"data.sources.{self.label}: {len(marked)} file(s) named as validation ({names}) "
            f"are not trained on; its val_path is {self.cfg.val_path}"
        )
        return train, given

    def open_files(self, paths: list[Path], sep: int | None, bos: int, cache: Path) -> list:
        files = []
        for p in paths:
            f = TokenFile(p, self.cfg, sep, bos, cache / "token-index")
            if not len(f):
                raise DataError(f"{p} holds no documents (only separators); remove it")
            files.append(f)
        return files

    def separator(self, bos: int | None) -> int | None:
        if self.cfg.format not in ("nanogpt", "array") or self.cfg.separator == "none":
            return None
        return bos if self.cfg.separator is None else int(self.cfg.separator)


def megatron_note(f: TokenFile, label: str) -> str | None:
    """What to say at start of a Megatron index that marks one document over many sequences
    (an index built without end_document() per document): it trains as one document."""
    if f.fmt != "megatron" or len(f) != 1:
        return None
    _, _, n_seq, _ = struct.unpack("<QBQQ", _read(f.path, 34)[9:34])
    if n_seq < 2:
        return None
    tokens = f.meta["tokens"]
    return (
        f"note: data.sources.{label}: {f.path} marks 1 document over its {n_seq:,} sequences "
        f"({tokens:,} tokens, {tokens / n_seq:,.0f} a sequence on average), so it trains as one "
        f"document of {tokens:,} tokens cut into rows, and val_fraction holds none of it out; "
        "if each sequence is a document, build the index again with end_document() after "
        "each (Megatron's preprocess_data.py does), and give val_path for validation"
    )


def _listed(spec: str | list[str]) -> list[str]:
    return [spec] if isinstance(spec, str) else list(spec)


def detect_format(path: Path) -> str:
    """The format of a token file or directory, for `data inspect` (a headerless .bin is an
    array only when told: --format array --dtype D)."""
    p = Path(path).expanduser()
    files = [p] if p.is_file() else sorted(f for pat in TOKEN_FILES for f in p.rglob(pat))
    if not files and Path(str(p) + ".idx").is_file():
        return "megatron"
    suffixes = {f.suffix for f in files}
    for suffix, fmt in ((".idx", "megatron"), (".parquet", "parquet"), (".npy", "array")):
        if suffix in suffixes:
            return fmt
    if ".bin" in suffixes:
        first = next(f for f in files if f.suffix == ".bin")
        if len(raw := _read(first, 4)) == 4 and np.frombuffer(raw, "<i4")[0] in NANOGPT_MAGICS:
            return "nanogpt"
        if _size(first) >= 12:
            magic, version, count = (int(v) for v in np.frombuffer(_read(first, 12), "<i4"))
            raise DataError(unknown_header(first, _size(first), magic, version, count))
        raise DataError(
            f"{first} has no llm.c / nanoGPT header: for a headerless token array pass "
            "--format array --dtype uint16 (or uint32)"
        )
    raise DataError(
        f"{path}: no token files here (.bin, .npy, .idx, .parquet) and no manifest.json"
    )


def _refuse_mixed(directory: Path, fmt: str) -> None:
    allowed = {p.lstrip("*") for p in PATTERNS[fmt]} | ({".bin"} if fmt == "megatron" else set())
    kinds: dict[str, Path] = {}  # suffix -> the first such file
    suffixes = {p.lstrip("*") for p in TOKEN_FILES}
    for root, dirs, names in os.walk(directory):  # one walk, not one rglob a suffix
        dirs.sort()
        for name in sorted(names):
            if (suffix := os.path.splitext(name)[1]) in suffixes:
                kinds.setdefault(suffix, Path(root) / name)
    other = {s: f for s, f in kinds.items() if s not in allowed}
    if fmt == "array" and {".bin", ".npy"} <= set(kinds):
        other[".npy"] = kinds[".npy"]
    if other:
        found = ", ".join(f"{s} ({f})" for s, f in sorted(other.items()))
        raise DataError(
            f"{directory} holds token files of mixed formats: {found} beside the {fmt} files; "
            "one source reads one format: move them apart, or give path a glob or a list"
        )


def summarise(files: list[TokenFile], sep: int | None) -> dict:
    tokens = sum(f.meta["tokens"] for f in files)
    return {
        "format": files[0].fmt if files else "?",
        "files": len(files),
        "tokens": tokens,
        "documents": sum(len(f) for f in files),
        "separator": sep,
        "separator_in": sum(1 for f in files if f.meta["separators"]),
        "eod_ended": sum(1 for f in files if f.meta.get("eod_ended")),
        "min_id": min((f.meta["min_id"] for f in files), default=0),
        "max_id": max((f.meta["max_id"] for f in files), default=-1),
        "dtype": sorted({f.meta["dtype"] for f in files}),
    }
