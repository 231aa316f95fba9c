"""Tokenizers: a byte-level one, and byte-level BPE trained with the `tokenizers` library.

Every tokenizer has a BOS token that starts each document, a fingerprint (sha256 of what defines
it) written into every shard header, and `token_bytes()`: the UTF-8 length of each token, which
turns a loss in nats per token into bits per byte. A tokenizer is saved as a directory holding
`tokenizer_meta.json` plus its own files, and loaded back by `load_tokenizer(dir)`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from pydantic import Field

from littlelm.config import ComponentConfig
from littlelm.errors import DataError
from littlelm.registry import TOKENIZERS

META = "tokenizer_meta.json"
BOS = "<|bos|>"


class Tokenizer:
    """Interface shared by every tokenizer."""

    kind: str
    vocab_size: int
    bos_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def token_bytes(self) -> np.ndarray:
        """(vocab_size,) int32: UTF-8 bytes each token stands for; 0 for special tokens."""
        raise NotImplementedError

    def state(self) -> str:
        """Canonical text that defines the tokenizer; its sha256 is the fingerprint."""
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.state().encode()).hexdigest()

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_files(directory)
        meta = {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "fingerprint": self.fingerprint,
        }
        (directory / META).write_text(json.dumps(meta, indent=2))

    def _save_files(self, directory: Path) -> None:
        pass

    # Class-level hooks, so a new tokenizer plugs in by registering itself.
    trainable = False  # learns from the run's documents (then `train` is called)

    @classmethod
    def from_config(cls, cfg: ComponentConfig) -> Tokenizer:
        """Build a tokenizer that needs no training data."""
        return cls()

    @classmethod
    def train(cls, cfg: ComponentConfig, texts: Iterator[str]) -> Tokenizer:
        raise NotImplementedError(f"{cls.kind} tokenizers are not trained")

    @classmethod
    def from_dir(cls, directory: Path) -> Tokenizer:
        return cls()

    @classmethod
    def vocab_size_for(cls, cfg: ComponentConfig) -> int:
        """The vocabulary size `cfg` will produce, without building the tokenizer."""
        return cls.vocab_size


class ByteConfig(ComponentConfig):
    """Bytes 0-255 are tokens 0-255; BOS is 256."""


@TOKENIZERS.register("byte", config=ByteConfig)
class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte, plus BOS (vocabulary 257)."""

    kind = "byte"
    vocab_size = 257
    bos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        out = np.ones(self.vocab_size, dtype=np.int32)
        out[self.bos_id] = 0
        return out

    def state(self) -> str:
        return "byte-v1"


class BPEConfig(ComponentConfig):
    """Byte-level BPE trained on a sample of the run's training documents."""

    vocab_size: int = Field(8192, description="Vocabulary size, special tokens included.", ge=260)
    train_chars: int = Field(
        50_000_000, description="Characters of training text sampled to learn the merges.", ge=1000
    )
    special_tokens: list[str] = Field(
        default_factory=list, description="Extra special tokens besides <|bos|>."
    )


@TOKENIZERS.register("bpe", config=BPEConfig)
class BPETokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 style pre-tokenisation) from the Hugging Face `tokenizers` library."""

    kind = "bpe"
    trainable = True

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()
        bos = tok.token_to_id(BOS)
        if bos is None:
            raise DataError(f"tokenizer has no {BOS} token; retrain it with littlelm")
        self.bos_id = bos

    @classmethod
    def train(cls, cfg: BPEConfig, texts: Iterator[str]) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=cfg.vocab_size,
            special_tokens=[BOS, *cfg.special_tokens],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(_take_chars(texts, cfg.train_chars), trainer=trainer)
        return cls(tok)

    @classmethod
    def from_dir(cls, directory: Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(directory / "tokenizer.json")))

    @classmethod
    def vocab_size_for(cls, cfg: BPEConfig) -> int:
        return cfg.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.int32)
        special = set(self.tok.get_added_tokens_decoder())
        for i in range(self.vocab_size):
            if i not in special:
                out[i] = len(self.tok.decode([i]).encode("utf-8"))
        return out

    def state(self) -> str:
        return self.tok.to_str()

    def _save_files(self, directory: Path) -> None:
        self.tok.save(str(directory / "tokenizer.json"))


def _take_chars(texts: Iterator[str], limit: int) -> Iterator[str]:
    seen = 0
    for t in texts:
        if seen >= limit:
            return
        yield t
        seen += len(t)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load a tokenizer saved by `Tokenizer.save`, checking its fingerprint."""
    directory = Path(directory)
    meta_path = directory / META
    if not meta_path.is_file():
        raise DataError(
            f"no tokenizer in {directory} ({META} missing); run `littlelm data prepare` again"
        )
    meta = json.loads(meta_path.read_text())
    kind = meta.get("kind")
    if kind not in TOKENIZERS:
        raise DataError(
            f"{meta_path}: unknown tokenizer kind {kind!r}; known: {', '.join(TOKENIZERS.names())}"
        )
    tok = TOKENIZERS.get(kind).from_dir(directory)
    if meta.get("fingerprint") != tok.fingerprint:
        raise DataError(
            f"{directory}: tokenizer files do not match their recorded fingerprint (edited or corrupt)"
        )
    return tok


def vocab_size_of(cfg: ComponentConfig) -> int:
    """The vocabulary size a tokenizer config will produce, without building it."""
    return TOKENIZERS.get(cfg.name).vocab_size_for(cfg)
