"""The token-file formats other tools write, read without copying (data/foreign.py builds the
`tokens` source on them):

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

Per format: its layout (where the tokens start, their dtype and count, checked against the
file's size), its document boundaries (a separator's positions, or the index's), and which
format a file or directory holds (`data inspect`).
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

import numpy as np

from littlelm.data.token_stream import CHUNK, Layout
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


# -- one file: reading its header, indexing it once --------------------------------------------


def file_stat(path: Path) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None
    if st.st_size == 0:
        raise DataError(f"{path} is empty (0 bytes); remove it, or write its tokens again")
    return st


def file_size(path: Path) -> int:
    return file_stat(path).st_size


@functools.lru_cache(maxsize=256)
def real_dir(directory: str) -> str:
    return os.path.realpath(directory)


def read_head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None


def checked_layout(path: Path, size: int, layout: Layout, by: str = "its header") -> Layout:
    """`layout`, once the file has the size it promises."""
    want = layout.offset + layout.count * np.dtype(layout.dtype).itemsize
    if size != want:
        raise DataError(
            f"{path} is truncated or damaged: {size:,} bytes, {by} promises {layout.count:,} "
            f"tokens ({want:,} bytes); write it again"
        )
    return layout


def nanogpt_layout(path: Path) -> Layout:
    size = file_size(path)
    if size < NANOGPT_HEADER:
        raise DataError(
            f"{path} is truncated: {size} bytes, less than the 1024-byte header of an llm.c / "
            "nanoGPT .bin; write it again (for a headerless token array use format: array)"
        )
    magic, version, count = (int(v) for v in np.frombuffer(read_head(path, 12), "<i4"))
    dtype = NANOGPT_HEADERS.get((magic, version))
    if dtype is None:
        raise DataError(unknown_header(path, size, magic, version, count))
    return checked_layout(path, size, Layout(NANOGPT_HEADER, count, dtype))


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
    size = file_size(path)
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
        return checked_layout(path, size, Layout(offset, shape[0], dt.type))
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
    size = file_size(idx)
    head = read_head(idx, 34)
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
    layout = checked_layout(
        bin_, file_size(bin_), Layout(0, int(tok_off[-1]), dtype), f"its index {idx.name}"
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
    file_size(path)
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
        if len(raw := read_head(first, 4)) == 4 and np.frombuffer(raw, "<i4")[0] in NANOGPT_MAGICS:
            return "nanogpt"
        if file_size(first) >= 12:
            magic, version, count = (int(v) for v in np.frombuffer(read_head(first, 12), "<i4"))
            raise DataError(unknown_header(first, file_size(first), magic, version, count))
        raise DataError(
            f"{first} has no llm.c / nanoGPT header: for a headerless token array pass "
            "--format array --dtype uint16 (or uint32)"
        )
    raise DataError(
        f"{path}: no token files here (.bin, .npy, .idx, .parquet) and no manifest.json"
    )


def refuse_mixed(directory: Path, fmt: str) -> None:
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
