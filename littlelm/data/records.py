"""Record sources: JSON Lines (plain, gzip or zstd) and Parquet, one document per record.

    web:    {name: jsonl, path: "raw/web/*.jsonl.zst", field: text}
    pubmed: {name: parquet, path: raw/pubmed/, column: abstract}

Compression is recognised by the file's first bytes, whatever its name. Plain JSONL files are
cut into byte ranges at line ends and Parquet files into ranges of row groups, so one large file
is still tokenized on every core; a compressed file is one unit.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import zstandard
from pydantic import Field

from littlelm.config import named
from littlelm.data.sources import DocumentSourceConfig, Source, Unit, cut_points

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class JSONLConfig(DocumentSourceConfig):
    """JSON Lines files (plain, .gz or .zst), the text taken from one field of each record."""

    name: Literal["jsonl"] = named("jsonl")
    path: str | list[str] = Field(
        ...,
        description="A .jsonl[.gz|.zst] file, a directory of them, a glob, or a list of these.",
    )
    field: str = Field(
        "text", description="Key holding each record's text; dots reach nested keys (meta.text)."
    )

    def build(self, label: str) -> Source:
        return JSONLFiles(self, label)


def _compression(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return "zstd" if head == ZSTD_MAGIC else None


def open_lines(path: Path, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
    """Lines of a plain, gzip or zstd file (a byte range of a plain one)."""
    kind = _compression(path)
    with open(path, "rb") as raw:
        if kind == "gzip":
            yield from gzip.GzipFile(fileobj=raw)
        elif kind == "zstd":
            yield from _lines(_zstd_chunks(raw))
        else:
            raw.seek(start)
            pos = start
            for line in raw:
                if stop is not None and pos >= stop:
                    return
                pos += len(line)
                yield line


def _zstd_chunks(raw, size: int = 1 << 20) -> Iterator[bytes]:
    """Decompressed data of every frame; a file that ends inside a frame is an EOFError (the
    library's stream reader would end silently)."""
    dctx = zstandard.ZstdDecompressor()
    obj, fed = dctx.decompressobj(), False
    while chunk := raw.read(size):
        while chunk:
            fed = True
            if out := obj.decompress(chunk):
                yield out
            if not obj.eof:
                break
            chunk, obj, fed = obj.unused_data, dctx.decompressobj(), False
    if fed and not obj.eof:
        raise EOFError("zstd data ends inside a frame (truncated file)")


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    tail = b""
    for chunk in chunks:
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        for line in lines:
            yield line + b"\n"
    if tail:
        yield tail


class JSONLFiles(Source):
    """JSON Lines files (plain, .gz or .zst), the text taken from one field of each record."""

    noun = "JSONL files"
    patterns = ("*.jsonl", "*.jsonl.gz", "*.jsonl.zst", "*.jsonl.zstd", "*.json.gz", "*.json.zst")

    def _ranges(self, path: Path, size: int, target: int) -> list:
        return [] if _compression(path) else cut_points(path, size, target, b"\n")

    def _read_unit(self, unit: Unit) -> Iterator[str]:
        keys = self.cfg.field.split(".")
        for f in unit.files:
            path = Path(f)
            try:
                for n, line in enumerate(open_lines(path, unit.start, unit.stop), 1):
                    if line.strip():
                        text = self._text(line, keys, f"{path} (line {n} of this unit)")
                        if text is not None:
                            yield text
            except (
                OSError,
                EOFError,
                ValueError,
                zstandard.ZstdError,
            ) as e:  # truncated or corrupt
                self.bad(f"unreadable file ({type(e).__name__}: {e})", path)

    def _text(self, line: bytes, keys: list[str], where: str) -> str | None:
        try:
            value = json.loads(line)
        except UnicodeDecodeError:
            return self.bad("invalid UTF-8", where)
        except json.JSONDecodeError:
            return self.bad("malformed JSON", where)
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        if value is None:
            return self.bad(f"missing field {self.cfg.field!r}", where)
        if not isinstance(value, str):
            return self.bad(f"field {self.cfg.field!r} is not a string", where)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escaped in the JSON
            return self.bad("invalid UTF-8", where)
        return value


class ParquetConfig(DocumentSourceConfig):
    """Parquet files (e.g. Hugging Face datasets), the text taken from one string column."""

    name: Literal["parquet"] = named("parquet")
    path: str | list[str] = Field(
        ..., description="A .parquet file, a directory of them, a glob, or a list of these."
    )
    column: str = Field("text", description="Column holding each row's text.")

    def build(self, label: str) -> Source:
        return ParquetFiles(self, label)


class ParquetFiles(Source):
    """Parquet files (e.g. Hugging Face datasets), the text taken from one string column."""

    patterns = ("*.parquet",)
    noun = "Parquet files"
    BATCH_ROWS = 4096

    def _ranges(self, path: Path, size: int, target: int) -> list:
        meta = self._metadata(path)
        if meta is None or meta.num_row_groups < 2:
            return []
        out, start, acc = [], 0, 0
        for i in range(meta.num_row_groups):
            acc += meta.row_group(i).total_byte_size
            if acc >= target and i + 1 < meta.num_row_groups:
                out.append((start, i + 1, acc))
                start, acc = i + 1, 0
        out.append((start, None, acc))
        return out

    def _metadata(self, path: Path):
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata
        except Exception:  # unreadable here is reported (or skipped) when the unit is read
            return None

    @property
    def columns(self) -> list[str]:
        """The columns read of each row."""
        return [self.cfg.column]

    @property
    def text_column(self) -> str | None:
        """The column whose text each row gives, checked to hold text; None: not one column's."""
        return self.cfg.column

    def _read_unit(self, unit: Unit) -> Iterator[str]:
        import pyarrow as pa

        for f in unit.files:
            try:
                yield from self._parquet(Path(f), unit.start, unit.stop)
            except (OSError, pa.ArrowException) as e:
                self.bad(f"unreadable file ({type(e).__name__}: {e})", Path(f))

    def _parquet(self, path: Path, start: int, stop: int | None) -> Iterator[str]:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        if self._usable(pf.schema_arrow, path):
            groups = range(start, pf.metadata.num_row_groups if stop is None else stop)
            for batch in pf.iter_batches(self.BATCH_ROWS, row_groups=groups, columns=self.columns):
                yield from self._batch_texts(batch, path)

    def _usable(self, schema, path: Path) -> bool:
        """Whether a file's Arrow `schema` has the columns read, and text in the text column
        (a file that does not is counted once, or an error)."""
        import pyarrow as pa

        lacking = [c for c in self.columns if c not in schema.names]
        if lacking:
            self.bad(f"missing column {lacking[0]!r} (columns: {', '.join(schema.names)})", path)
            return False
        kind = None if self.text_column is None else schema.field(self.text_column).type
        if kind is None or pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return True
        self.bad(f"column {self.text_column!r} holds {kind}, not text", path)
        return False

    def _batch_texts(self, batch, path: Path) -> Iterator[str]:
        """The values of a batch's text column (bytes, decoded row by row)."""
        import pyarrow as pa

        column = batch.column(0)
        binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        for value in column.cast(binary).to_pylist():  # bytes: decoded here, row by row
            if value is None:
                self.bad(f"missing value in column {self.text_column!r}", path)
                continue
            text = self.decode(value, path)
            if text is not None:
                yield text
