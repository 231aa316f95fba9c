"""Which tokenizers there are: `data.tokenizer`'s choices (`TokenizerChoice`, on its `name`),
and a saved tokenizer loaded by the kind it recorded. This module sits above every tokenizer's
own (data/tokenizer.py, data/tiktoken_tokenizer.py), so that a saved one of any kind loads
(`{name: saved}`, a checkpoint's tokenizer/).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from littlelm.checkpoint_dirs import find_checkpoint
from littlelm.config import named
from littlelm.data.tiktoken_tokenizer import TiktokenConfig
from littlelm.data.tokenizer import (
    META,
    BPEConfig,
    ByteConfig,
    HuggingFaceConfig,
    Tokenizer,
    TokenizerConfig,
    read_meta,
)
from littlelm.errors import DataError


class SavedConfig(TokenizerConfig):
    """A tokenizer saved by littlelm: a prepared dataset's (or a checkpoint's) tokenizer/."""

    name: Literal["saved"] = named("saved")
    path: str = Field(
        ...,
        description="The tokenizer directory, a prepared dataset holding tokenizer/, or a run "
        "or checkpoint directory (its newest checkpoint's tokenizer: fine-tuning a base run).",
    )

    @classmethod
    def tokenizer_class(cls) -> type[Tokenizer]:
        return SavedTokenizer


class SavedTokenizer(Tokenizer):
    """Loads whatever tokenizer littlelm saved in a directory (bpe, tiktoken, ...)."""

    @classmethod
    def from_config(cls, cfg: SavedConfig) -> Tokenizer:
        return load_tokenizer(_saved_dir(cfg))

    @classmethod
    def vocab_size_for(cls, cfg: SavedConfig) -> int:
        return int(read_meta(_saved_dir(cfg))["vocab_size"])

    @classmethod
    def chat_tokens_for(cls, cfg: SavedConfig) -> int:
        return len(load_tokenizer(_saved_dir(cfg)).chat_token_ids())


def _saved_dir(cfg: SavedConfig) -> Path:
    path = Path(cfg.path).expanduser()
    if (path / "checkpoints").is_dir():  # a run directory: its newest checkpoint's tokenizer
        path = find_checkpoint(path)
    return path / "tokenizer" if (path / "tokenizer" / META).is_file() else path


TokenizerChoice = Annotated[
    ByteConfig | BPEConfig | HuggingFaceConfig | SavedConfig | TiktokenConfig,
    Field(discriminator="name"),
]

# the kind a saved tokenizer recorded (Tokenizer.kind) -> its class
KINDS: dict[str, type[Tokenizer]] = {
    c.tokenizer_class().kind: c.tokenizer_class()
    for c in typing.get_args(typing.get_args(TokenizerChoice)[0])
    if c is not SavedConfig
}


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load a tokenizer saved by `Tokenizer.save`, checking its fingerprint."""
    directory = Path(directory)
    meta = read_meta(directory)
    kind = meta.get("kind")
    if kind not in KINDS:
        raise DataError(
            f"{directory / META}: unknown tokenizer kind {kind!r}; known: {', '.join(KINDS)}"
        )
    tok = KINDS[kind].from_dir(directory, meta)
    if meta.get("fingerprint") != tok.fingerprint:
        raise DataError(
            f"{directory}: tokenizer files do not match their recorded fingerprint (edited or corrupt)"
        )
    return tok


def vocab_size_of(cfg: TokenizerConfig) -> int:
    """The vocabulary size a tokenizer config will produce, without building it."""
    return cfg.tokenizer_class().vocab_size_for(cfg)
