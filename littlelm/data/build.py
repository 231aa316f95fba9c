"""The data section of a run, the `shards` source, and what the trainer gets from them.

`prepare_data` is the one implementation behind both `littlelm data prepare` and the automatic
preparation `littlelm train` does: tokenizer first, then each raw source into shards (cached by
content, or into a chosen directory). `build_data` then opens every source's shards, refusing
any made by a different tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field

from littlelm.config import RESUMABLE, SAME_DATA, Cfg, Kind, named
from littlelm.data.cache import cache_root
from littlelm.data.chat import chat_format
from littlelm.data.conversations import ChatConfig
from littlelm.data.fingerprint import record_files
from littlelm.data.foreign import TokenFiles, TokensConfig
from littlelm.data.hub import HFConfig
from littlelm.data.loader import BestFitPacker, DocStream, MixtureLoader, val_batches
from littlelm.data.preference import PairLoader, PreferenceConfig, pairs_of
from littlelm.data.prepare import (
    damaged_shards,
    dataset_dir,
    duplicates_note,
    make_split,
    prepare_source,
    read_manifest,
    resolve_tokenizer,
)
from littlelm.data.records import JSONLConfig, ParquetConfig
from littlelm.data.shards import Shard
from littlelm.data.sources import PythonConfig, Source, SourceConfig, StdlibConfig, TextConfig
from littlelm.data.tokenizer import BPEConfig, Tokenizer
from littlelm.data.tokenizers import TokenizerChoice
from littlelm.errors import DataError


class ShardsConfig(SourceConfig):
    """Token shards made by `littlelm data prepare --out DIR` (one dataset directory)."""

    name: Literal["shards"] = named("shards")
    path: str = Field(..., description="A dataset directory written by `littlelm data prepare`.")

    def build(self, label: str) -> Source:
        return PreparedShards(self, label)  # type: ignore[arg-type]  # not documents: the class narrows cfg


class PreparedShards(Source):
    """Already prepared token shards; used as they are (their own train/val split)."""

    cfg: ShardsConfig  # type: ignore[assignment]  # a SourceConfig, not a DocumentSourceConfig
    prepared = True

    def directory(self) -> Path:
        return Path(self.cfg.path).expanduser()


SourceChoice = Annotated[
    TextConfig
    | PythonConfig
    | StdlibConfig
    | JSONLConfig
    | ParquetConfig
    | HFConfig
    | TokensConfig
    | ChatConfig
    | PreferenceConfig
    | ShardsConfig,
    Field(discriminator="name"),
]


class DataConfig(Cfg):
    """Where tokens come from and how they are packed."""

    tokenizer: Annotated[TokenizerChoice, Kind("tokenizer")] = Field(
        default_factory=BPEConfig,
        description="Tokenizer: byte, bpe, tiktoken, huggingface, saved (littlelm list).",
    )
    sources: Annotated[dict[str, SourceChoice], Kind("dataset")] = Field(
        default_factory=dict, description="Mapping label -> data source (with its weight)."
    )
    val_fraction: float = Field(
        0.01,
        description="Fraction of documents (hash) or pieces (tail) held out for validation.",
        ge=0,
        lt=1,
    )
    val_split: Literal["hash", "tail"] = Field(
        "hash",
        description="Held out: documents by a seeded hash of their text (before max_chars cuts "
        "them), or the last pieces in order (after it: the end of a long file).",
    )
    split_seed: int = Field(0, description="Seed of the hash split (independent of run.seed).")
    buffer_docs: int = Field(1000, description="Documents buffered for best-fit packing.", ge=1)
    on_exhausted: Literal["repeat", "stop"] = Field(
        "repeat",
        description="When a source runs out: start a new epoch, or stop the run.",
        json_schema_extra=RESUMABLE,
    )
    on_changed: Literal["stop", "restart"] = Field(
        "stop",
        description="At resume, when a data file changed, is gone or was inserted among the "
        "others since the checkpoint (its size, sampled blocks or sha256 differ): stop with an "
        "error naming it, or keep the weights and optimizer state and start the data position "
        "over at the beginning of the data.",
        json_schema_extra=RESUMABLE,
    )
    full_verify: bool = Field(
        False,
        description="At start, read every data file in full for its sha256, even one whose "
        "size, mtime, ctime and inode are those it was last hashed at (then its hash is reused).",
        json_schema_extra=RESUMABLE,
    )
    shard_tokens: int = Field(
        100_000_000,
        description="Tokens per shard file when preparing (at most, plus one document).",
        ge=1,
    )
    workers: int | None = Field(
        None,
        description="Processes tokenizing in parallel when preparing; null = one per core, at "
        "most one per 64 MB of input (small sources tokenize in one process, on every core).",
        ge=1,
        json_schema_extra=RESUMABLE,
    )
    cache_dir: str | None = Field(
        None,
        description="Where prepared data is cached; null = $LITTLELM_CACHE or ~/.cache/littlelm.",
        json_schema_extra=SAME_DATA,
    )
    verify_checksums: bool = Field(
        True,
        description="Check every shard's checksum when opening it.",
        json_schema_extra=SAME_DATA,
    )
    prefetch: int = Field(
        2,
        description="Batches built ahead in a background thread.",
        ge=1,
        json_schema_extra=SAME_DATA,
    )


@dataclass
class PreparedSource:
    label: str
    weight: float
    directory: Path
    train: list  # Shard, or TokenDocs (data/foreign.py): what the loader reads
    val: list
    long_docs: str = "split"
    manifest: dict | None = None
    explicit: bool = True  # long_docs named in the config (else a checkpoint's packing wins)
    # conversations (data/chat.py): f(tokens) -> which are the assistant's, the only ones the
    # loss counts; and the source's on_error, which decides about conversations too long to fit
    mask: Callable[[np.ndarray], np.ndarray] | None = None
    on_error: str = "skip"
    pairs: bool = False  # preference pairs (data/preference.py): two documents each, for DPO
    from_raw: bool = True  # prepared from this config's raw source (not a `shards` directory)

    def too_long(self, row_len: int) -> tuple[int, int]:
        """(conversations longer than a row of `row_len` tokens, the longest's length)."""
        lengths = self.doc_lengths()
        return int((lengths > row_len).sum()), int(lengths.max(initial=0))

    def doc_lengths(self) -> np.ndarray:
        """Every training document's length as trained on (a Shard and a TokenDocs alike)."""
        lengths = [s.lengths() for s in self.train]
        return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)

    def files(self) -> list[Path]:
        """Every file the source's documents are read from (a checkpoint fingerprints them)."""
        paths: dict[Path, None] = {}  # ordered, without repeats
        for s in self.train + self.val:
            for p in getattr(s, "files", (s.path,)):
                paths[Path(p)] = None
        return list(paths)

    @property
    def train_tokens(self) -> int:
        return sum(s.n_tokens for s in self.train)

    def cropped_share(self, seq_len: int) -> float:
        """The share of training tokens crop packing drops for certain: what each document
        holds beyond one row of seq_len + 1 (a lower bound: best-fit also crops row tails)."""
        if self.long_docs != "crop" or not self.train_tokens:
            return 0.0
        beyond = int(np.maximum(self.doc_lengths() - (seq_len + 1), 0).sum())
        return beyond / self.train_tokens

    def val_shortage(self, seq_len: int) -> str | None:
        """Why this source adds nothing to the validation loss (its held-out tokens do not
        fill one window of seq_len + 1), or None when it does."""
        tokens = sum(s.n_tokens for s in self.val)
        if tokens > seq_len:
            return None
        m = self.manifest or {}
        docs = m.get("documents")
        held = f"{sum(len(s) for s in self.val):,}" + (
            f" of its {docs:,} documents" if isinstance(docs, int) else " documents"
        )
        fraction = (m.get("split") or {}).get("fraction", "?")
        return (
            f"data.sources.{self.label} holds out {held} for validation (data.val_fraction "
            f"{fraction}), {tokens:,} tokens: fewer than one window of train.seq_len + 1 = "
            f"{seq_len + 1}"
        )


@dataclass
class RunData:
    tokenizer: Tokenizer
    sources: dict[str, PreparedSource]
    # True when some targets are masked (conversations): the trainer counts trained tokens
    masked: bool = field(init=False)

    def __post_init__(self):
        self.masked = any(s.mask is not None for s in self.sources.values())

    def fingerprint(self, cfg: DataConfig) -> dict[str, list[list]]:
        """Per source, [path, bytes, sampled hash, sha256] of each of its files
        (data/fingerprint.py): what a checkpoint's data position is a position in."""
        files = {label: src.files() for label, src in self.sources.items()}
        return record_files(files, cache_root(cfg.cache_dir), cfg.full_verify)

    @property
    def pairs(self) -> PreparedSource | None:
        """The preference source of a DPO run (schema.resolve allows it alone), else None."""
        return next((s for s in self.sources.values() if s.pairs), None)

    def loader(
        self, cfg: DataConfig, batch: int, seq_len: int, seed: int, rank: int = 0, world: int = 1
    ) -> MixtureLoader | PairLoader:
        """Batches of this rank: packed rows, or a DPO run's pairs (`batch` pairs a batch)."""
        if (p := self.pairs) is not None:
            fmt, repeat = chat_format(self.tokenizer), cfg.on_exhausted == "repeat"
            return PairLoader(p.train, p.label, fmt, batch, seq_len, seed, rank, world, repeat)
        packers = {}
        for i, (label, src) in enumerate(self.sources.items()):
            stream = DocStream(
                src.train, seed + 7919 * i, rank, world, cfg.on_exhausted == "repeat", label
            )
            packers[label] = BestFitPacker(
                stream,
                seq_len + 1,
                cfg.buffer_docs,
                src.long_docs,
                self.tokenizer.bos_id,
                src.explicit,
            )
        weights = {k: s.weight for k, s in self.sources.items()}
        masks = {k: s.mask for k, s in self.sources.items()}
        return MixtureLoader(packers, weights, batch, seq_len, masks)

    def duplicate_notes(self) -> list[str]:
        """At start: per source, the exact duplicates its preparation dropped (and the fix)."""
        return [
            note
            for label, src in self.sources.items()
            if src.manifest is not None
            and (note := duplicates_note(label, src.manifest, src.from_raw))
        ]

    def chat_notes(self, seq_len: int) -> list[str]:
        """At start: the conversation sources whose conversations do not fit a row, left out
        (on_error skip) or refused (fail); empty when there are none."""
        notes = []
        for label, src in self.sources.items():
            if src.pairs:  # pairs: said as pairs
                _, n = pairs_of(src.train, label, seq_len + 1)
                if n:
                    notes.append(
                        f"data.sources.{label}: {n:,} preference pair(s) with a sequence longer "
                        f"than a training row (train.seq_len + 1 = {seq_len + 1} tokens) are "
                        "left out"
                    )
                continue
            n, longest = src.too_long(seq_len + 1) if src.mask is not None else (0, 0)
            if not n:
                continue
            what = (
                f"data.sources.{label}: {n:,} conversation(s) longer than a training row "
                f"(train.seq_len + 1 = {seq_len + 1} tokens; the longest has {longest:,})"
            )
            if n == len(lengths := src.doc_lengths()):  # left out, none would be left
                raise DataError(
                    f"{what}: every one of them, so no training row can be made; raise "
                    f"train.seq_len to at least {int(lengths.min()) - 1} (within "
                    "model.max_seq_len), or give this source shorter conversations"
                )
            if src.on_error == "fail":
                raise DataError(
                    f"{what}; raise train.seq_len to {longest - 1} (within model.max_seq_len), "
                    f"shorten them, or set data.sources.{label}.on_error=skip to leave them out"
                )
            notes.append(f"{what} are left out (on_error skip)")
        return notes

    def can_evaluate(self, seq_len: int) -> bool:
        return any(s.val_shortage(seq_len) is None for s in self.sources.values())

    def val_warning(self, seq_len: int) -> str | None:
        """At start, instead of a `val loss nan` later: which sources have too little held out
        to evaluate, why, and what to set (the hash split holds documents out whole, before
        `max_chars` cuts them; the tail split holds out the last pieces)."""
        short = [w for s in self.sources.values() if (w := s.val_shortage(seq_len))]
        if not short:
            return None
        none = len(short) == len(self.sources)
        return (
            "; ".join(short)
            + (
                ". There is no validation loss: evaluation is skipped. "
                if none
                else ". The validation loss leaves "
                + ("it" if len(short) == 1 else "them")
                + " out. "
            )
            + "Raise data.val_fraction, give the source more documents (a text source: "
            "split: paragraph or line; or cut them with max_chars and set data.val_split=tail, "
            "which holds out the last pieces) or lower train.seq_len"
            + ("; or set eval.every=0 and eval.at_end=false to train without one" if none else "")
        )

    def crop_warning(self, seq_len: int) -> str | None:
        """At start: the sources whose crop packing drops most of their tokens (a long text
        file read as one document, say), and what to set."""
        heavy = {
            k: share for k, s in self.sources.items() if (share := s.cropped_share(seq_len)) > 0.5
        }
        if not heavy:
            return None
        parts = ", ".join(f"data.sources.{k} drops {share:.1%}" for k, share in heavy.items())
        first = next(iter(heavy))
        return (
            f"crop packing (long_docs: crop) trains on a small part of the data: {parts} of its "
            f"tokens (documents longer than a row of train.seq_len + 1 = {seq_len + 1} are cut). "
            f"Set data.sources.{first}.long_docs=split to train on every token, or cut the text "
            f"into documents: data.sources.{first}.max_chars=N (pieces of consecutive paragraphs "
            f"of at most N characters), or for a text source split=paragraph or line"
        )

    @property
    def val_shards(self) -> list[Shard]:
        return [sh for s in self.sources.values() for sh in s.val]

    def val_batches(
        self, batch: int, seq_len: int, max_tokens: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each source's validation split in turn; a token cap is shared by weight, so a capped
        evaluation still sees every source in its mixture proportion."""
        for label in self.sources:
            yield from self.source_val_batches(label, batch, seq_len, max_tokens)

    def source_val_batches(
        self, label: str, batch: int, seq_len: int, max_tokens: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One source's part of `val_batches`: its validation split, under its weight's share
        of the token cap (the same windows whether evaluated alone or with the others)."""
        src = self.sources[label]
        total = sum(s.weight for s in self.sources.values())
        cap = None if max_tokens is None else max(seq_len, int(max_tokens * src.weight / total))
        return val_batches(src.val, batch, seq_len, cap, src.mask, self.tokenizer.bos_id)

    def mixture_plan(self, run_tokens: int) -> list[str]:
        """One line per source: weight, training tokens, and the epochs this run will take."""
        total = sum(s.weight for s in self.sources.values())
        lines = []
        for src in self.sources.values():
            share = src.weight / total
            epochs = run_tokens * share / max(1, src.train_tokens)
            lines.append(
                f"  {src.label}: weight {share:.3f}, {src.train_tokens:,} train tokens, "
                f"{epochs:.2f} epoch(s) in this run ({src.directory})"
            )
        return lines


def build_sources(cfg: DataConfig) -> dict[str, Source]:
    if not cfg.sources:
        raise DataError(
            "data.sources is empty: name at least one source, e.g. data.sources.main.name=text"
        )
    return {label: sc.build(label) for label, sc in cfg.sources.items()}


def prepare_data(
    cfg: DataConfig,
    out: Path | None = None,
    only: list[str] | None = None,
    log=print,
    progress=None,
    verify: str = "none",
) -> tuple[Tokenizer, dict[str, tuple[Source, Path, dict]]]:
    """The tokenizer, and for each source its (source, dataset directory, manifest): raw
    sources are prepared into `out/LABEL` (or the cache), prepared ones are read. With `verify`
    ("sizes" or "checksums") existing shards are checked first and damaged ones rebuilt."""
    sources = build_sources(cfg)
    unknown = sorted(set(only or []) - set(sources))
    if unknown:
        raise DataError(f"no source named {', '.join(unknown)}; sources: {', '.join(sources)}")
    raw = {k: s for k, s in sources.items() if not s.prepared}
    splits = {
        k: make_split(s, cfg.val_fraction, cfg.val_split, cfg.split_seed) for k, s in raw.items()
    }
    root = cache_root(cfg.cache_dir)
    foreign = [k for k, s in sources.items() if getattr(s, "foreign", False)]
    if foreign and cfg.tokenizer.tokenizer_class().trainable:
        raise DataError(
            f"data.sources.{foreign[0]} holds token ids another tool made, which mean something "
            f"only under the tokenizer that made them, but data.tokenizer {cfg.tokenizer.name!r} "
            "is trained here; declare that tokenizer: data.tokenizer={name: tiktoken, encoding: "
            "gpt2}, {name: huggingface, path: tokenizer.json} or {name: saved, path: DIR}"
        )
    tok = resolve_tokenizer(cfg.tokenizer, sources, splits, root, log)
    result: dict[str, tuple[Source, Path, dict]] = {}
    for label, src in sources.items():
        if only and label not in only:
            continue
        if isinstance(src, TokenFiles):  # other tools' token files: indexed, checked, opened
            src.opened = src.open(tok, cfg.val_fraction, root, log)
            result[label] = (src, src.directory(), src.opened[2])
            continue
        if src.prepared:
            assert isinstance(src, PreparedShards), "the one other prepared source"
            manifest = read_manifest(src.directory())
            if verify != "none":
                _refuse_damaged(label, src.directory(), manifest, verify)
            result[label] = (src, src.directory(), manifest)
            continue
        directory = out / label if out else dataset_dir(src, tok, splits[label], root)
        manifest = prepare_source(
            src, tok, splits[label], directory, cfg.shard_tokens, cfg.workers, log, progress, verify
        )
        result[label] = (src, directory, manifest)
    return tok, result


def prepared_section(result: dict[str, tuple[Source, Path, dict]]) -> str:
    """The data section of a run file that trains on what `prepare_data(cfg, out)` returned."""
    import json

    ours = [d for src, d, _ in result.values() if not getattr(src, "foreign", False)]
    lines = [
        "train on it with this data section in a run file:",
        "data:",
        f"  tokenizer: {{name: saved, path: {ours[0]}}}"
        if ours
        else "  tokenizer: (this config's: the one that made the token files)",
        "  sources:",
    ]
    for label, (src, directory, _) in result.items():
        if getattr(src, "foreign", False):  # other tools' token files are used where they are
            lines.append(f"    {label}: {json.dumps(src.cfg.model_dump(exclude_defaults=True))}")
            continue
        lines.append(f"    {label}: {{name: shards, path: {directory}, weight: {src.cfg.weight}}}")
    return "\n".join(lines)


def _refuse_damaged(label: str, directory: Path, manifest: dict, level: str) -> None:
    """A `shards` source has no raw input here to rebuild from: name what is damaged."""
    damaged = damaged_shards(directory, manifest, level)
    if damaged:
        what = "; ".join(f"{name}: {problem}" for name, problem in damaged.items())
        raise DataError(
            f"data.sources.{label}: {len(damaged)} damaged shard(s) in {directory} ({what}); "
            f"it is prepared shards, so rebuild it with the `littlelm data prepare ... --out` "
            f"that made it (its source: {manifest.get('source')})"
        )


def build_data(cfg: DataConfig, log=print, progress=None) -> RunData:
    """Prepare (or find) every source's shards and the tokenizer, then open them."""
    tok, prepared = prepare_data(cfg, log=log, progress=progress)
    opened = {}
    for label, (src, directory, manifest) in prepared.items():
        if isinstance(src, TokenFiles):  # token files of another tool (data/foreign.py)
            train, val, summary = src.opened
            opened[label] = PreparedSource(
                label, src.cfg.weight, directory, train, val, manifest=summary
            )
        else:
            opened[label] = open_dataset(
                label, src.cfg.weight, directory, manifest, tok, cfg.verify_checksums
            )
        opened[label].long_docs = src.cfg.long_docs
        opened[label].from_raw = not src.prepared
        opened[label].explicit = "long_docs" in src.cfg.model_fields_set
        if src.conversations or manifest.get("conversations"):
            fmt = chat_format(tok)
            # the loss counts the assistant's tokens, or with train_on_inputs all but the BOS
            inputs = getattr(src.cfg, "train_on_inputs", False)
            opened[label].mask = fmt.every_token if inputs else fmt.mask
            opened[label].long_docs = "pad"  # prepared shards of conversations too
            # too long for a row: the chat source's on_error; prepared shards: left out
            opened[label].on_error = src.cfg.on_error if src.conversations else "skip"
            opened[label].pairs = src.pairs or bool(manifest.get("pairs"))
    return RunData(tok, opened)


def open_dataset(
    label: str, weight: float, directory: Path, manifest: dict, tok: Tokenizer, verify: bool
) -> PreparedSource:
    made_by = manifest.get("tokenizer", {})
    if made_by.get("fingerprint") != tok.fingerprint:
        raise DataError(
            f"data.sources.{label}: the shards in {directory} were made by tokenizer "
            f"{made_by.get('describe', '?')} (fingerprint {str(made_by.get('fingerprint'))[:12]}), "
            f"but this run's tokenizer is {tok.describe()} (fingerprint {tok.fingerprint[:12]}); "
            f"set data.tokenizer={{name: saved, path: {directory}}} to train with the tokenizer "
            "that made them, or prepare the data again with this one"
        )

    def open_split(name: str) -> list[Shard]:
        shards = [Shard(directory / s["file"], verify) for s in manifest["splits"][name]["shards"]]
        for s in shards:
            s.check_tokenizer(tok.fingerprint, f"this run's tokenizer, {tok.describe()}")
        return shards

    return PreparedSource(
        label, weight, directory, open_split("train"), open_split("val"), manifest=manifest
    )
