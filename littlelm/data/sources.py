"""Data sources: where documents come from, streamed a unit at a time.

A source is registered by name and configured in a run's `data.sources` mapping:

    data:
      sources:
        web:    {name: jsonl, path: "raw/web/*.jsonl.zst", field: text, weight: 0.6}
        pubmed: {name: parquet, path: raw/pubmed/, column: abstract, weight: 0.3}
        code:   {name: python, path: ~/src/, weight: 0.1}
        prose:  {name: text, path: books/, split: paragraph}

A source's input is cut into *units* (a group of small files, a byte range of a large text or
JSONL file, a range of Parquet row groups) of about one shard's worth of text. Units are what
`littlelm data prepare` tokenizes in parallel and what makes it resumable. `unit_documents`
streams the documents of one unit, so the corpus is never held in memory. Bad input (an
unreadable file, invalid UTF-8, a record without the text field, an empty document) is counted
in `skipped`, or raises a DataError naming it, per the source's `on_error` / `on_empty`.
"""

from __future__ import annotations

import glob
import json
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from littlelm.config import RESUMABLE, ComponentConfig, named
from littlelm.errors import DataError


class SourceConfig(ComponentConfig):
    weight: float = Field(
        1.0,
        description="Share of training tokens drawn from this source.",
        gt=0,
        json_schema_extra=RESUMABLE,
    )
    long_docs: Literal["crop", "split"] = Field(
        "split",
        description="A document that does not fit the rest of a row: split it into row-sized "
        "pieces that are all trained on, or crop it there (the rest is dropped; the default "
        "before 2026-12-02: a run checkpointed with it resumes cropping unless this is set; "
        "docs/data.md).",
        json_schema_extra=RESUMABLE,
    )

    def build(self, label: str) -> Source:
        """The source this config describes, its documents (or tokens) labelled `label`."""
        raise NotImplementedError(f"{type(self).__name__} builds no source")


LOADER_ONLY = {"weight", "long_docs"}  # options that do not change the prepared shards
# options added after shards were first prepared, with the value that prepares as before: left
# out of the shards' cache key at that value, so datasets prepared before them stay valid
ADDED_KEYS = {"cut": "paragraphs"}


def shard_options(cfg: SourceConfig) -> dict:
    """The options that decide a source's prepared shards (part of their cache key)."""
    old = {k for k, v in ADDED_KEYS.items() if getattr(cfg, k, v) == v}
    return cfg.model_dump(exclude=LOADER_ONLY | old)


class DocumentSourceConfig(SourceConfig):
    """A source of raw text documents, tokenized by `littlelm data prepare` or at train time."""

    max_chars: int | None = Field(
        None,
        description="Cut documents longer than this (characters) into pieces, each a document "
        "with its own BOS; where: `cut`.",
        ge=16,
    )
    cut: Literal["paragraphs", "anywhere"] = Field(
        "paragraphs",
        description="Where max_chars cuts: paragraphs = at blank lines where possible, else at "
        "line ends (pieces of consecutive paragraphs); anywhere = every max_chars characters "
        "(pieces start mid-sentence, as any window of the text does; for one long text read "
        "by a model of short rows: max_chars = seq_len - 1 at the byte level, one piece and "
        "its BOS per row).",
    )
    on_error: Literal["skip", "fail"] = Field(
        "skip",
        description="Unreadable file, invalid UTF-8, bad JSON, missing field: count and skip, "
        "or stop with an error naming it.",
    )
    on_empty: Literal["skip", "fail"] = Field(
        "skip", description="Empty document (file, record or cell): count and skip, or stop."
    )
    dedup: bool = Field(
        True,
        description="Drop exact duplicate documents (same text, by a 64-bit hash) when preparing; "
        "the first copy is kept and the count is in the manifest (`littlelm data inspect`).",
    )

    @model_validator(mode="after")
    def _cut_needs_max_chars(self):
        if self.cut != "paragraphs" and not self.max_chars:
            raise ValueError(f"cut: {self.cut} cuts at max_chars: set max_chars (e.g. 127)")
        return self


@dataclass(frozen=True)
class Unit:
    """A piece of a source's input: whole files, or one file's [start, stop) range (bytes for
    text and JSONL, row groups for Parquet; stop None = to the end)."""

    files: tuple[str, ...]
    start: int = 0
    stop: int | None = None
    size: int = 0  # input bytes, for progress

    def to_dict(self) -> dict:
        return {**asdict(self), "files": list(self.files)}

    @classmethod
    def from_dict(cls, d: dict) -> Unit:
        return cls(tuple(d["files"]), d["start"], d["stop"], d["size"])


class Source:
    """Base class: subclasses implement `files` and `_read_unit`, and may refine `_ranges`."""

    prepared = False  # True for sources that are already token shards
    conversations = False  # True for conversations (data/conversations.py): rendered as chats
    pairs = False  # True for preference pairs (data/preference.py): two documents per row
    patterns: tuple[str, ...] = ("*",)  # file names a directory is searched for
    noun = "input files"

    def __init__(self, cfg: DocumentSourceConfig, label: str):
        self.cfg, self.label = cfg, label
        self.skipped: Counter[str] = Counter()

    # -- input files and units --------------------------------------------------------------------

    def files(self) -> list[Path]:
        # every source that keeps this method has a config with `path` (the others override it)
        path = self.cfg.path  # type: ignore[attr-defined]  # DocumentSourceConfig has none
        return find_files(path, self.patterns, f"data.sources.{self.label}.path", self.noun)

    def units(self, target_bytes: int) -> list[Unit]:
        """Consecutive small files grouped, large files cut into ranges, each ~target_bytes."""
        units: list[Unit] = []
        group: list[str] = []
        group_size = 0
        for f in self.files():
            size = f.stat().st_size
            ranges = self._ranges(f, size, target_bytes) if size > target_bytes else None
            if ranges:
                units += [Unit((str(f),), a, b, n) for a, b, n in ranges]
                continue
            group.append(str(f))
            group_size += size
            if group_size >= target_bytes:
                units.append(Unit(tuple(group), size=group_size))
                group, group_size = [], 0
        if group:
            units.append(Unit(tuple(group), size=group_size))
        return units

    def _ranges(self, path: Path, size: int, target: int) -> list[tuple[int, int | None, int]]:
        """(start, stop, bytes) pieces of a large file, or [] to keep it whole."""
        return []

    def identity(self) -> dict:
        """Config plus (path, size, mtime) of every input file: the cache key of its shards."""
        stats = [(str(f), f.stat().st_size, int(f.stat().st_mtime)) for f in self.files()]
        return {"config": shard_options(self.cfg), "files": stats}

    # -- documents --------------------------------------------------------------------------------

    def unit_documents(self, unit: Unit) -> Iterator[str]:
        """The non-empty raw documents of one unit, in order."""
        for doc in self._read_unit(unit):
            if doc.strip():
                yield doc
            else:
                self.empty(unit.files[0])

    def pieces(self, doc: str) -> Iterator[str]:
        """A document as it is tokenized: whole, or cut (`cut`) when over max_chars."""
        if self.cfg.max_chars and self.cfg.cut == "anywhere":
            yield from cut_every(doc, self.cfg.max_chars)
        elif self.cfg.max_chars:
            yield from split_long(doc, self.cfg.max_chars)
        else:
            yield doc

    def rendered(self, doc: str, fmt) -> list[str]:
        """A conversation source's document (canonical JSON) as the texts it is tokenized as,
        rendered in the chat format `fmt` (data/chat.py's ChatFormat): one conversation."""
        return [fmt.render_json(doc)]

    def words(self, doc: str) -> str:
        """A conversation source's document as the words said (what a tokenizer learns from)."""
        return "\n".join(m["content"] for m in json.loads(doc))

    def documents(self) -> Iterator[str]:
        """Every non-empty raw document, in order (units of up to 1 GB)."""
        for unit in self.units(1 << 30):
            yield from self.unit_documents(unit)

    def _read_unit(self, unit: Unit) -> Iterator[str]:
        raise NotImplementedError

    # -- bad input --------------------------------------------------------------------------------

    def bad(self, reason: str, where: str | Path) -> None:
        """Bad input: counted under `reason`, or an error when on_error is 'fail'."""
        if self.cfg.on_error == "fail":
            raise DataError(
                f"{where}: {reason}; fix or remove it, or set "
                f"data.sources.{self.label}.on_error=skip to count and skip such input"
            )
        self.skipped[reason] += 1

    def empty(self, where: str | Path) -> None:
        if self.cfg.on_empty == "fail":
            raise DataError(
                f"{where}: empty document; remove it, or set data.sources.{self.label}.on_empty=skip"
            )
        self.skipped["empty document"] += 1

    def read_bytes(self, path: str | Path, start: int = 0, stop: int | None = None) -> bytes | None:
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read() if stop is None else f.read(stop - start)
        except OSError as e:
            self.bad(f"unreadable file ({e.strerror or e})", path)
            return None

    def decode(self, data: bytes, where: str | Path) -> str | None:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            self.bad(f"invalid UTF-8 (byte {e.start})", where)
            return None


def find_files(
    spec: str | list[str],
    patterns: tuple[str, ...],
    key: str,
    noun: str = "input files",
    skip_dirs: frozenset = frozenset(),
) -> list[Path]:
    """Files named by a path, a directory (searched recursively for `patterns`, leaving out
    hidden directories and `skip_dirs`), a glob, or a list of these; sorted within each entry,
    duplicates dropped."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    found: dict[Path, None] = {}
    for s in specs:
        p = Path(s).expanduser()
        if p.is_file():
            hits = [p]
        elif p.is_dir():
            hits = sorted({f for pat in patterns for f in p.rglob(pat) if _keep(f, p, skip_dirs)})
        else:
            hits = sorted(Path(m) for m in glob.glob(str(p), recursive=True) if Path(m).is_file())
        if not hits:
            raise DataError(
                f"{key}: no {noun} at {s} (looked for {', '.join(patterns)}); fix the path "
                f"in the config or override it: {key}=PATH"
            )
        found.update(dict.fromkeys(hits))
    return list(found)


def _keep(f: Path, root: Path, skip_dirs: frozenset) -> bool:
    dirs = f.relative_to(root).parts[:-1]
    return f.is_file() and not any(d.startswith(".") or d in skip_dirs for d in dirs)


def cut_points(path: Path, size: int, target: int, sep: bytes) -> list[tuple[int, int | None, int]]:
    """Ranges of about `target` bytes, each ending just after `sep` (or at the end of the file)."""
    out: list[tuple[int, int | None, int]] = []
    start = 0
    with open(path, "rb") as f:
        while size - start > target * 1.5:
            f.seek(start + target)
            cut = _find_after(f, sep)
            if cut is None:
                break
            out.append((start, cut, cut - start))
            start = cut
    out.append((start, None, size - start))
    return out


def _find_after(f, sep: bytes, chunk: int = 1 << 16) -> int | None:
    """Offset just past the next `sep` from the current position of `f`."""
    pos, tail = f.tell(), b""
    while block := f.read(chunk):
        data = tail + block
        i = data.find(sep)
        if i >= 0:
            return pos - len(tail) + i + len(sep)
        tail = data[-(len(sep) - 1) :] if len(sep) > 1 else b""
        pos += len(block)
    return None


def split_long(text: str, max_chars: int) -> Iterator[str]:
    """Pieces of at most max_chars, cut at blank lines where possible, else at line ends."""
    if len(text) <= max_chars:
        yield text
        return
    piece = ""
    for para in _units(text, max_chars):
        if piece and len(piece) + len(para) > max_chars:
            yield piece
            piece = ""
        piece += para
    if piece.strip():
        yield piece


def cut_every(text: str, max_chars: int) -> Iterator[str]:
    """Consecutive pieces of max_chars characters (the last shorter), wherever they fall; a
    piece of only whitespace is left out."""
    for i in range(0, len(text), max_chars):
        if text[i : i + max_chars].strip():
            yield text[i : i + max_chars]


def _units(text: str, max_chars: int) -> Iterator[str]:
    """Paragraphs (with their trailing blank line), broken into lines, then hard cuts, so that no
    unit exceeds max_chars."""
    for para in text.split("\n\n"):
        para += "\n\n"
        if len(para) <= max_chars:
            yield para
            continue
        for line in para.splitlines(keepends=True):
            for i in range(0, len(line), max_chars):
                yield line[i : i + max_chars]


# -- plain text ------------------------------------------------------------------------------------


class TextConfig(DocumentSourceConfig):
    """Plain UTF-8 text files."""

    name: Literal["text"] = named("text")
    path: str | list[str] = Field(
        ..., description="A .txt file, a directory of them, a glob, or a list of these."
    )
    split: Literal["file", "paragraph", "line"] = Field(
        "file",
        description="One document per file, per blank-line-separated paragraph, or per line.",
    )

    def build(self, label: str) -> Source:
        return TextFiles(self, label)


class TextFiles(Source):
    """Plain UTF-8 text files."""

    cfg: TextConfig
    patterns = ("*.txt",)
    noun = "text files"

    @property
    def sep(self) -> bytes:
        return b"\n\n" if self.cfg.split == "paragraph" else b"\n"

    def _ranges(self, path: Path, size: int, target: int) -> list:
        return [] if self.cfg.split == "file" else cut_points(path, size, target, self.sep)

    def _read_unit(self, unit: Unit) -> Iterator[str]:
        for f in unit.files:
            data = self.read_bytes(f, unit.start, unit.stop)
            if data is None:
                continue
            if self.cfg.split == "file":
                text = self.decode(data, f)
                if text is not None:
                    yield text
                continue
            suffix = "\n" if self.cfg.split == "paragraph" else ""
            for part in data.split(self.sep):
                if part.strip():  # blank pieces are separators, not documents
                    text = self.decode(part, f)
                    if text is not None:
                        yield text + suffix


# -- Python source trees ---------------------------------------------------------------------------


class PythonConfig(DocumentSourceConfig):
    """Every .py file of a source tree, one document per file (hidden, cache and site-packages directories skipped)."""

    name: Literal["python"] = named("python")
    path: str | list[str] = Field(
        ..., description="A directory of Python sources (searched recursively), a glob, or files."
    )
    include_tests: bool = Field(True, description="Also take test packages (test/, tests/).")

    def build(self, label: str) -> Source:
        return PythonFiles(self, label)


class PythonFiles(Source):
    """Every .py file of a source tree, one document per file (hidden, cache and site-packages
    directories skipped)."""

    cfg: PythonConfig
    patterns = ("*.py",)
    noun = "Python files"
    SKIP = frozenset({"site-packages", "dist-packages", "__pycache__", "node_modules"})
    TESTS = frozenset({"test", "tests", "idle_test"})

    def files(self) -> list[Path]:
        skip = self.SKIP if self.cfg.include_tests else self.SKIP | self.TESTS
        return find_files(self._spec(), self.patterns, self._key(), self.noun, skip)

    def _spec(self) -> str | list[str]:
        return self.cfg.path

    def _key(self) -> str:
        return f"data.sources.{self.label}.path"

    def _read_unit(self, unit: Unit) -> Iterator[str]:
        for f in unit.files:
            data = self.read_bytes(f)
            text = None if data is None else self.decode(data, f)
            if text is not None:
                yield text


class StdlibConfig(DocumentSourceConfig):
    """Every .py file of the Python standard library (or of `root`), one document per file."""

    name: Literal["python_stdlib"] = named("python_stdlib")
    root: str | None = Field(
        None, description="Directory of Python sources; null = this interpreter's standard library."
    )
    include_tests: bool = Field(False, description="Also take test packages (test/, tests/).")

    def build(self, label: str) -> Source:
        return PythonStdlib(self, label)


class PythonStdlib(PythonFiles):
    """Every .py file of the Python standard library (or of `root`), one document per file."""

    # StdlibConfig is not a PythonConfig: it has `root` where PythonConfig has `path`, and
    # _spec, the only method that reads either, is overridden here
    cfg: StdlibConfig  # type: ignore[assignment]  # root, not path (above)

    def _spec(self) -> str:
        root = Path(self.cfg.root or sysconfig.get_paths()["stdlib"]).expanduser()
        if not root.is_dir():
            raise DataError(f"data.sources.{self.label}.root: not a directory: {root}")
        return str(root)

    def _key(self) -> str:
        return f"data.sources.{self.label}.root"

    def identity(self) -> dict:
        return {**super().identity(), "python": sys.version.split()[0]}
