"""The data section of a run, and what the trainer gets from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from littlelm.config import Cfg, Registered
from littlelm.data.loader import BestFitPacker, DocStream, MixtureLoader
from littlelm.data.prepare import (
    cache_root,
    dataset_dir,
    make_split,
    prepare_source,
    resolve_tokenizer,
)
from littlelm.data.shards import Shard
from littlelm.data.sources import Source
from littlelm.data.tokenizer import Tokenizer
from littlelm.errors import DataError
from littlelm.registry import DATASETS, TOKENIZERS


class DataConfig(Cfg):
    """Where tokens come from and how they are packed."""

    tokenizer: Annotated[Any, Registered(TOKENIZERS, default="bpe")] = Field(
        default_factory=lambda: {"name": "bpe"},
        description="Tokenizer: byte, bpe, ... (littlelm list).",
    )
    sources: Annotated[Any, Registered(DATASETS, container="dict")] = Field(
        default_factory=dict, description="Mapping label -> data source (with its weight)."
    )
    val_fraction: float = Field(
        0.01, description="Fraction of documents held out for validation.", ge=0, lt=1
    )
    val_split: Literal["hash", "tail"] = Field(
        "hash", description="Held-out documents: seeded hash of the index, or the last ones."
    )
    split_seed: int = Field(0, description="Seed of the hash split (independent of run.seed).")
    buffer_docs: int = Field(1000, description="Documents buffered for best-fit packing.", ge=1)
    on_exhausted: Literal["repeat", "stop"] = Field(
        "repeat", description="When a source runs out: start a new epoch, or stop the run."
    )
    shard_tokens: int = Field(
        100_000_000, description="Tokens per shard file when preparing.", ge=1
    )
    cache_dir: str | None = Field(
        None,
        description="Where prepared data is cached; null = $LITTLELM_CACHE or ~/.cache/littlelm.",
    )
    verify_checksums: bool = Field(
        True, description="Check every shard's checksum when opening it."
    )
    prefetch: int = Field(2, description="Batches built ahead in a background thread.", ge=1)


@dataclass
class PreparedSource:
    label: str
    weight: float
    directory: Path
    train: list[Shard]
    val: list[Shard]


@dataclass
class RunData:
    tokenizer: Tokenizer
    sources: dict[str, PreparedSource]

    def loader(
        self, cfg: DataConfig, batch: int, seq_len: int, seed: int, rank: int = 0, world: int = 1
    ) -> MixtureLoader:
        packers = {}
        for i, (label, src) in enumerate(self.sources.items()):
            stream = DocStream(
                src.train, seed + 7919 * i, rank, world, cfg.on_exhausted == "repeat", label
            )
            packers[label] = BestFitPacker(stream, seq_len + 1, cfg.buffer_docs)
        weights = {k: s.weight for k, s in self.sources.items()}
        return MixtureLoader(packers, weights, batch, seq_len)

    @property
    def val_shards(self) -> list[Shard]:
        return [sh for s in self.sources.values() for sh in s.val]


def build_sources(cfg: DataConfig) -> dict[str, Source]:
    if not cfg.sources:
        raise DataError(
            "data.sources is empty: name at least one source, e.g. data.sources.main.name=text"
        )
    return {label: DATASETS.get(sc.name)(sc, label) for label, sc in cfg.sources.items()}


def build_data(cfg: DataConfig, log=print) -> RunData:
    """Prepare (or find in the cache) every source's shards and the tokenizer, then open them."""
    sources = build_sources(cfg)
    splits = {
        k: make_split(s, cfg.val_fraction, cfg.val_split, cfg.split_seed)
        for k, s in sources.items()
    }
    root = cache_root(cfg.cache_dir)
    tok = resolve_tokenizer(cfg.tokenizer, sources, splits, root, log)
    prepared = {}
    for label, src in sources.items():
        out = dataset_dir(src, tok, splits[label], root)
        manifest = prepare_source(src, tok, splits[label], out, cfg.shard_tokens, log)
        if manifest["tokenizer"]["fingerprint"] != tok.fingerprint:
            raise DataError(
                f"{out}: shards were made by a different tokenizer; delete the directory to rebuild"
            )
        prepared[label] = PreparedSource(
            label,
            src.cfg.weight,
            out,
            [
                Shard(out / s["file"], cfg.verify_checksums)
                for s in manifest["splits"]["train"]["shards"]
            ],
            [
                Shard(out / s["file"], cfg.verify_checksums)
                for s in manifest["splits"]["val"]["shards"]
            ],
        )
        if src.skipped:
            log(f"{label}: skipped {src.skipped}")
    return RunData(tok, prepared)
