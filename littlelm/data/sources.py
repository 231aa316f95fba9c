"""Data sources: where documents come from, streamed one at a time.

A source is registered by name and configured in a run's `data.sources` mapping:

    data:
      sources:
        stdlib: {name: python_stdlib}
        shakespeare: {name: text, path: data/tinyshakespeare.txt, split: paragraph}

`documents()` yields strings and never holds the corpus in memory. `identity()` says what the
prepared shards depend on, so a changed file or option re-prepares the cache.
"""

from __future__ import annotations

import glob
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import Field

from littlelm.config import ComponentConfig
from littlelm.errors import DataError
from littlelm.registry import DATASETS


class SourceConfig(ComponentConfig):
    weight: float = Field(1.0, description="Share of training tokens drawn from this source.", gt=0)
    max_chars: int | None = Field(
        None, description="Split documents longer than this (characters) at blank lines.", ge=16
    )


class Source:
    """Base class: subclasses implement `_raw_documents` and `files`."""

    def __init__(self, cfg: SourceConfig, label: str):
        self.cfg, self.label = cfg, label
        self.skipped: dict[str, int] = {}

    def documents(self) -> Iterator[str]:
        for doc in self._raw_documents():
            if not doc.strip():
                self._skip("empty document")
                continue
            if self.cfg.max_chars:
                yield from split_long(doc, self.cfg.max_chars)
            else:
                yield doc

    def _raw_documents(self) -> Iterator[str]:
        raise NotImplementedError

    def files(self) -> list[Path]:
        raise NotImplementedError

    def identity(self) -> dict:
        """Config plus (path, size, mtime) of every input file: the cache key of its shards."""
        stats = [(str(f), f.stat().st_size, int(f.stat().st_mtime)) for f in self.files()]
        return {"config": self.cfg.model_dump(exclude={"weight"}), "files": stats}

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            self._skip("invalid UTF-8")
        except OSError:
            self._skip("unreadable file")
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


class StdlibConfig(SourceConfig):
    root: str | None = Field(
        None, description="Directory of Python sources; null = this interpreter's standard library."
    )
    include_tests: bool = Field(False, description="Also take test packages (test/, tests/).")


@DATASETS.register("python_stdlib", config=StdlibConfig)
class PythonStdlib(Source):
    """Every .py file of the Python standard library (or of `root`), one document per file."""

    SKIP = frozenset({"site-packages", "dist-packages", "__pycache__"})
    TESTS = frozenset({"test", "tests", "idle_test"})

    def root(self) -> Path:
        root = Path(self.cfg.root or sysconfig.get_paths()["stdlib"]).expanduser()
        if not root.is_dir():
            raise DataError(f"data.sources.{self.label}.root: not a directory: {root}")
        return root

    def files(self) -> list[Path]:
        root = self.root()
        skip = self.SKIP if self.cfg.include_tests else self.SKIP | self.TESTS
        return sorted(
            f for f in root.rglob("*.py") if not skip.intersection(f.relative_to(root).parts)
        )

    def _raw_documents(self) -> Iterator[str]:
        for f in self.files():
            text = self._read(f)
            if text is not None:
                yield text

    def identity(self) -> dict:
        return {**super().identity(), "python": sys.version.split()[0]}


class TextConfig(SourceConfig):
    path: str = Field(..., description="A .txt file, a directory of them, or a glob.")
    split: Literal["file", "paragraph"] = Field(
        "file", description="One document per file, or per blank-line-separated paragraph."
    )


@DATASETS.register("text", config=TextConfig)
class TextFiles(Source):
    """Plain UTF-8 text files."""

    def files(self) -> list[Path]:
        spec = Path(self.cfg.path).expanduser()
        if spec.is_file():
            return [spec]
        if spec.is_dir():
            found = sorted(p for p in spec.rglob("*.txt") if p.is_file())
        else:
            found = sorted(
                Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file()
            )
        if not found:
            raise DataError(
                f"data.sources.{self.label}.path: no text files at {spec}; "
                f"fix the path in the config or override it: data.sources.{self.label}.path=FILE"
            )
        return found

    def _raw_documents(self) -> Iterator[str]:
        for f in self.files():
            text = self._read(f)
            if text is None:
                continue
            if self.cfg.split == "file":
                yield text
            else:
                yield from (p + "\n" for p in text.split("\n\n"))
