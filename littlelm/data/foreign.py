"""Token files written by other tools, trained on as they are: the `tokens` source.

    data:
      tokenizer: {name: tiktoken, encoding: gpt2}     # the tokenizer that made the files
      sources:
        fineweb: {name: tokens, format: nanogpt, path: fineweb10B/, weight: 0.8}
        owt:     {name: tokens, format: array, path: owt/train.bin, dtype: uint16}
        pile:    {name: tokens, format: megatron, path: pile/pile_text_document}
        math:    {name: tokens, format: parquet, path: math/, column: input_ids}

The formats (nanogpt, array, megatron, parquet) and how each is read: data/token_formats.py.

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
from littlelm.data.token_formats import (
    PATTERNS,
    array_layout,
    file_stat,
    first_at_least,
    megatron_files,
    megatron_index,
    nanogpt_layout,
    parquet_to_tokens,
    read_head,
    real_dir,
    refuse_mixed,
    separator_index,
    token_range,
    without_eod,
)
from littlelm.data.token_stream import (
    Layout,
    Stream,
    gap_warning,
    map_tokens,
    numbered_order,
)
from littlelm.errors import DataError

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
            st = file_stat(p)  # a missing, unreadable or empty file: its error, named
            # the directory resolved once for all its files: 528 realpath calls cost 40 ms
            # ctime and inode too: an edit in place that sets the mtime back moves the ctime
            where = os.path.join(real_dir(str(p.parent)), p.name)
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
                refuse_mixed(d, fmt)
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
    _, _, n_seq, _ = struct.unpack("<QBQQ", read_head(f.path, 34)[9:34])
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
