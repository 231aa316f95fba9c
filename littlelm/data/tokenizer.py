"""Tokenizers: byte-level, BPE trained by littlelm, a Hugging Face tokenizer.json, a saved one.

(tiktoken encodings live in `tiktoken_tokenizer.py`.) Every tokenizer has a BOS token that starts
each document, a fingerprint (sha256 of what defines it) written into every shard header, and
`token_bytes()`: the UTF-8 length of each token, which turns a loss in nats per token into bits
per byte. A tokenizer is saved as a directory holding `tokenizer_meta.json` plus its own files,
and loaded back by `load_tokenizer(dir)`; `{name: saved, path: DIR}` makes a run use one.

Chat (data/chat.py): a BPE tokenizer littlelm trains reserves the chat format's special tokens
(`chat_tokens`, on by default; a tokenizer trained before keeps its fingerprint and cache entry
with `chat_tokens: false`). A Hugging Face tokenizer keeps its tokenizer_config.json
`chat_template` and the special-token strings the template uses, in tokenizer_meta.json: they do
not change any token id, so they are not part of the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Generic, Literal, TypeVar

import numpy as np
from pydantic import Field

from littlelm.config import ComponentConfig, named
from littlelm.data.chat import CHAT_TOKENS
from littlelm.errors import DataError

META = "tokenizer_meta.json"
BOS = "<|bos|>"


# the config a tokenizer class is built from (its registered config class)
TokCfg = TypeVar("TokCfg", bound=ComponentConfig)


class Tokenizer(Generic[TokCfg]):
    """Interface shared by every tokenizer."""

    kind: str
    vocab_size: int
    bos_id: int
    notes: tuple[str, ...] = ()  # what training bounded, for the log (BPE: Sample.notes)
    bos_token: str = BOS  # its text (the chat template's bos_token)
    chat_template: str | None = None  # a Jinja chat template of its own (imported models)
    _template_tokens: dict[str, str] = {}  # noqa: RUF012  (replaced, never mutated)
    # an imported tokenizer's own rules, which export writes back: {"eos_token": its text or
    # None, "adds_bos": whether encoding a text puts BOS first}; {} = littlelm's (eos = BOS,
    # BOS first), as for every tokenizer littlelm trains or names
    rules: dict = {}  # noqa: RUF012  (replaced, never mutated)

    def special_id(self, token: str) -> int | None:
        """The id of special token `token`, or None when the tokenizer has no such token."""
        return None

    def template_tokens(self) -> dict[str, str]:
        """Special-token strings a chat template may use (eos_token, ...), besides bos_token."""
        return dict(self._template_tokens)

    def with_special_tokens(self, tokens: Iterable[str]) -> Tokenizer:
        """A new tokenizer: this one plus `tokens` as special tokens after its last id."""
        raise NotImplementedError

    def encode(self, text: str, special: bool = False) -> list[int]:
        """Token ids of `text`. Special-token text in it (`<|bos|>`, `<|end|>`, ...) is ordinary
        text, as in tiktoken's encode_ordinary: data, prompts and completions never make control
        tokens. `special=True` is for text a chat format rendered (data/chat.py): there the
        special tokens' text becomes those tokens, where the format put them."""
        raise NotImplementedError

    def encode_batch(self, texts: list[str], special: bool = False) -> list[list[int]]:
        return [self.encode(t, special) for t in texts]

    def encode_docs(self, texts: list[str], special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Documents ready for a shard: (tokens, lengths), each document BOS first, flattened
        (`special` as in `encode`)."""
        return join_docs(
            [np.asarray(x, dtype=np.int64) for x in self.encode_batch(texts, special)], self.bos_id
        )

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def token_bytes(self) -> np.ndarray:
        """(vocab_size,) int32: UTF-8 bytes each token stands for; 0 for special tokens."""
        raise NotImplementedError

    def state(self) -> str:
        """Canonical text that defines the tokenizer; its sha256 is the fingerprint."""
        raise NotImplementedError

    def describe(self) -> str:
        """A short human description, e.g. 'bpe, 4,096 tokens'."""
        return f"{self.kind}, {self.vocab_size:,} tokens"

    @property
    def fingerprint(self) -> str:
        if getattr(self, "_fingerprint", None) is None:
            self._fingerprint = hashlib.sha256(self.state().encode()).hexdigest()
        return self._fingerprint

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_files(directory)
        meta = {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "fingerprint": self.fingerprint,
            "describe": self.describe(),
            **self._meta(),
        }
        (directory / META).write_text(json.dumps(meta, indent=2))

    def _save_files(self, directory: Path) -> None:
        pass

    def _meta(self) -> dict:
        """Extra fields `from_dir` needs, stored in tokenizer_meta.json."""
        return {}

    # Class-level hooks, which the tokenizer's config reaches through `tokenizer_class()`
    trainable = False  # learns from the run's documents (then `train` is called)

    @classmethod
    def from_config(cls, cfg: TokCfg) -> Tokenizer:
        """Build a tokenizer that needs no training data."""
        return cls()

    @classmethod
    def train(cls, cfg: TokCfg, texts: Iterator[str]) -> Tokenizer:
        raise NotImplementedError(f"{cls.kind} tokenizers are not trained")

    @classmethod
    def from_dir(cls, directory: Path, meta: dict) -> Tokenizer:
        return cls()

    @classmethod
    def vocab_size_for(cls, cfg: TokCfg) -> int:
        """The vocabulary size `cfg` will produce, without training it."""
        return cls.vocab_size

    @classmethod
    def chat_tokens_for(cls, cfg: TokCfg) -> int:
        """How many of littlelm's chat control tokens (data/chat.py) the tokenizer `cfg` will
        have, without training it (the planner's count of LoRA's trained token rows)."""
        return 0

    def chat_token_ids(self) -> list[int]:
        """The ids of littlelm's chat control tokens this tokenizer has, ascending."""
        return sorted(i for i in (self.special_id(t) for t in CHAT_TOKENS) if i is not None)

    @classmethod
    def train_chars_for(cls, cfg: TokCfg) -> int | None:
        """Characters of training text `train` reads at most (None: all it is given)."""
        return None

    @classmethod
    def cache_identity(cls, cfg: TokCfg) -> dict:
        """What the cache key of a trained tokenizer digests from its config."""
        return cfg.model_dump()


class TokenizerConfig(ComponentConfig):
    """Base of a tokenizer's config: `tokenizer_class()` is the tokenizer it describes, which
    builds itself from it (`from_config`, or `train` on the run's documents when trainable)."""

    @classmethod
    def tokenizer_class(cls) -> type[Tokenizer]:
        raise NotImplementedError(f"{cls.__name__} names no tokenizer")


def join_docs(docs: list[np.ndarray], bos: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents given as arrays of ids, ready for a shard: (tokens, lengths), each document
    BOS first, flattened."""
    lengths = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
    head = np.array([bos], dtype=np.int64)
    parts = [p for d in docs for p in (head, d)]
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), lengths


class ByteConfig(TokenizerConfig):
    """Bytes 0-255 are tokens 0-255; BOS is 256."""

    name: Literal["byte"] = named("byte")

    @classmethod
    def tokenizer_class(cls) -> type[Tokenizer]:
        return ByteTokenizer


class ByteTokenizer(Tokenizer[ByteConfig]):
    """One token per UTF-8 byte, plus BOS (vocabulary 257)."""

    kind = "byte"
    vocab_size = 257
    bos_id = 256

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(text.encode("utf-8"))  # no text makes BOS, the only special token

    def encode_docs(self, texts: list[str], special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return join_docs([np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts], self.bos_id)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        out = np.ones(self.vocab_size, dtype=np.int32)
        out[self.bos_id] = 0
        return out

    def state(self) -> str:
        return "byte-v1"


class HFTokenizer(Tokenizer[TokCfg]):
    """Wraps a `tokenizers.Tokenizer` (the Hugging Face library; encodes batches on every core)."""

    kind = "huggingface"

    def __init__(self, tok, bos_token: str):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()
        bos = tok.token_to_id(bos_token)
        if bos is None:
            raise DataError(
                f"the tokenizer has no {bos_token!r} token; set data.tokenizer.bos_token to one of "
                f"its special tokens: {', '.join(sorted(self.special_tokens())) or '(none)'}"
            )
        self.bos_token, self.bos_id = bos_token, bos

    def special_tokens(self) -> dict[str, int]:
        return {t.content: i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}

    def special_id(self, token: str) -> int | None:
        return self.special_tokens().get(token)

    def with_special_tokens(self, tokens: Iterable[str]) -> HFTokenizer:
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as RawTokenizer

        raw = RawTokenizer.from_str(self.tok.to_str())
        raw.add_special_tokens([AddedToken(t, special=True) for t in tokens])
        new = type(self)(raw, self.bos_token)
        new.rules = self.rules
        return new.with_chat_template(self.chat_template, self.template_tokens())

    def with_chat_template(self, template: str | None, tokens: dict[str, str]) -> HFTokenizer:
        """Carry `template` (tokenizer_config.json's chat_template) and its special strings."""
        self.chat_template, self._template_tokens = template, dict(tokens)
        return self

    def _raw(self, special: bool):
        """The library's tokenizer that encodes as `encode(..., special)` asks: `self.tok`
        (special-token text -> the token), or a copy with `encode_special_tokens` set, which
        encodes that text as ordinary text (transformers' split_special_tokens)."""
        if not special:
            if getattr(self, "_plain", None) is None:
                from tokenizers import Tokenizer as RawTokenizer

                plain = RawTokenizer.from_str(self.tok.to_str())
                plain.encode_special_tokens = True  # not serialized: saving reads self.tok
                self._plain = plain
            return self._plain
        return self.tok

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self._raw(special).encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], special: bool = False) -> list[list[int]]:
        return [e.ids for e in self._raw(special).encode_batch(texts, add_special_tokens=False)]

    def encode_docs(self, texts: list[str], special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """As `Tokenizer.encode_docs`; a document longer than ENCODE_CHARS is encoded in pieces
        (`encode_pieces`), each turned into an array at once: the library keeps about 100 bytes
        per token of an encoding (its strings and offsets), so a 50 MB row took 9.4 GB."""
        if all(len(t) <= ENCODE_CHARS for t in texts) or not self._cuts_safely():
            return super().encode_docs(texts, special)
        owner, pieces = [], []
        for d, text in enumerate(texts):
            for piece in encode_pieces(text, ENCODE_CHARS):
                owner.append(d)
                pieces.append(piece)
        ids: list[np.ndarray] = []
        i = 0
        while i < len(pieces):  # about BATCH_CHARS at a time, on every core
            j, size = i + 1, len(pieces[i])
            while j < len(pieces) and size + len(pieces[j]) <= BATCH_CHARS:
                size, j = size + len(pieces[j]), j + 1
            batch = self._raw(special).encode_batch(pieces[i:j], add_special_tokens=False)
            ids += [np.array(e.ids, dtype=np.int32) for e in batch]
            i = j
        docs: list[list[np.ndarray]] = [[] for _ in texts]
        for d, x in zip(owner, ids, strict=True):
            docs[d].append(x)
        return join_docs([np.concatenate(x) for x in docs], self.bos_id)

    def _cuts_safely(self) -> bool:
        """Whether `encode_pieces`'s cuts leave every token as the whole text would have it
        (outside runs without whitespace): a byte-level pre-tokenizer with the GPT-2 split
        (no token spans a space that starts a word), no normalizer, no added prefix space, and
        no special token holding whitespace (the library finds those before splitting)."""
        spec = json.loads(self.tok.to_str())
        pre = spec.get("pre_tokenizer") or {}
        plain = pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
        plain = plain and not pre.get("add_prefix_space") and spec.get("normalizer") is None
        added = [t.content for t in self.tok.get_added_tokens_decoder().values()]
        return plain and not any(c.isspace() for t in added for c in t)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self) -> np.ndarray:
        """Byte-level models: one character of a token's string is one byte. Others: the UTF-8
        length of the token decoded alone (a token holding part of a character counts as 3)."""
        out = np.zeros(self.vocab_size, dtype=np.int32)
        special = set(self.tok.get_added_tokens_decoder())
        byte_level = json.loads(self.tok.to_str()).get("decoder", {}) or {}
        byte_level = byte_level.get("type") == "ByteLevel"
        for i in range(self.vocab_size):
            if i in special:
                continue
            if byte_level:
                out[i] = len(self.tok.id_to_token(i) or "")
            else:
                out[i] = len(self.tok.decode([i]).encode("utf-8"))
        return out

    def state(self) -> str:
        return json.dumps({"tokenizer": self.tok.to_str(), "bos": self.bos_token})

    def _save_files(self, directory: Path) -> None:
        self.tok.save(str(directory / "tokenizer.json"))

    def _meta(self) -> dict:
        chat = {"chat_template": self.chat_template, "template_tokens": self.template_tokens()}
        rules = {"rules": self.rules} if self.rules else {}
        return {"bos_token": self.bos_token, **(chat if self.chat_template else {}), **rules}

    @classmethod
    def from_dir(cls, directory: Path, meta: dict) -> HFTokenizer:
        tok = cls(_read_tokenizer_json(directory / "tokenizer.json"), meta["bos_token"])
        tok.rules = meta.get("rules") or {}
        return tok.with_chat_template(meta.get("chat_template"), meta.get("template_tokens", {}))


def read_chat_template(directory: Path) -> tuple[str | None, dict[str, str]]:
    """(chat_template, special-token strings) of a Hugging Face model directory's
    tokenizer_config.json; (None, {}) when it has none. A list of named templates gives the
    'default' one."""
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return None, {}
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path} is unreadable ({e}); fix or remove it") from None
    template = cfg.get("chat_template")
    if template is None and (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    tokens = {}
    for key in ("eos_token", "pad_token", "unk_token"):
        value = cfg.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            tokens[key] = value
    return (template if isinstance(template, str) else None), tokens


def _read_tokenizer_json(path: Path):
    from tokenizers import Tokenizer as RawTokenizer

    if not path.is_file():
        raise DataError(f"tokenizer file not found: {path}")
    try:
        return RawTokenizer.from_file(str(path))
    except Exception as e:  # the library raises plain Exceptions for malformed files
        raise DataError(
            f"{path} is not a tokenizer.json the tokenizers library reads: {e}"
        ) from None


class BPEConfig(TokenizerConfig):
    """Byte-level BPE trained on a sample of the run's training documents."""

    name: Literal["bpe"] = named("bpe")

    vocab_size: int = Field(8192, description="Vocabulary size, special tokens included.", ge=260)
    train_chars: int = Field(
        50_000_000, description="Characters of training text sampled to learn the merges.", ge=1000
    )
    special_tokens: list[str] = Field(
        default_factory=list, description="Extra special tokens besides <|bos|>."
    )
    chat_tokens: bool = Field(
        True,
        description="Reserve the chat format's special tokens (<|system|>, <|user|>, "
        "<|assistant|>, <|end|>: docs/post-training.md); false = a tokenizer as trained before "
        "they existed (same fingerprint and cache entry).",
    )

    @classmethod
    def tokenizer_class(cls) -> type[Tokenizer]:
        return BPETokenizer


class BPETokenizer(HFTokenizer[BPEConfig]):
    """Byte-level BPE (GPT-2 style pre-tokenisation) trained with the `tokenizers` library."""

    kind = "bpe"
    trainable = True

    @classmethod
    def train(cls, cfg: BPEConfig, texts: Iterator[str]) -> BPETokenizer:
        from tokenizers import Tokenizer as RawTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = RawTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=cfg.vocab_size,
            special_tokens=[BOS, *(CHAT_TOKENS if cfg.chat_tokens else ()), *cfg.special_tokens],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        sample = Sample(cfg.train_chars)
        tok.train_from_iterator(sample.take(texts), trainer=trainer)
        out = cls(tok, BOS)
        out.notes = tuple(sample.notes())
        return out

    @classmethod
    def from_dir(cls, directory: Path, meta: dict) -> BPETokenizer:
        return cls(_read_tokenizer_json(directory / "tokenizer.json"), BOS)

    @classmethod
    def chat_tokens_for(cls, cfg: BPEConfig) -> int:
        return len(CHAT_TOKENS) if cfg.chat_tokens else 0

    @classmethod
    def vocab_size_for(cls, cfg: BPEConfig) -> int:
        return cfg.vocab_size

    @classmethod
    def train_chars_for(cls, cfg: BPEConfig) -> int:
        return cfg.train_chars

    @classmethod
    def cache_identity(cls, cfg: BPEConfig) -> dict:
        # chat_tokens false leaves the field out: a tokenizer trained before it existed is
        # found in the cache again, with the same fingerprint (so are the shards made with it)
        return cfg.model_dump(exclude=set() if cfg.chat_tokens else {"chat_tokens"})

    def state(self) -> str:
        return self.tok.to_str()


DOC_SHARE = 10  # one document gives at most 1/10 of the training sample
ENCODE_CHARS = 1 << 16  # a longer document is encoded in pieces of at most this many characters
BATCH_CHARS = 1 << 20  # characters of pieces encoded in one call (as data/workers.py batches)
SAFE_CUT = re.compile(r"(?<=\S) (?=\S)")  # a space that starts a word: GPT-2's split is there


def encode_pieces(text: str, size: int) -> list[str]:
    """`text` in pieces of at most `size` characters, for encoding one at a time. Each cut is at
    the last space that starts a word in the second half of a piece's span, where the GPT-2
    pre-tokenizer splits anyway, so the tokens are those of the whole text; a span without one
    (a run without whitespace) is cut at `size`, and no token crosses that cut (BPE training
    never sees a run that long whole either: MAX_RUN)."""
    pieces, start = [], 0
    while len(text) - start > size:
        end = start + size
        cut = None
        for m in SAFE_CUT.finditer(text, start + size // 2, end):
            cut = m.start()
        cut = cut or end
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


MAX_RUN = 256  # characters without whitespace that BPE training sees as one piece
LONG_RUN = re.compile(rf"\S{{{MAX_RUN + 1},}}")


class Sample:
    """The BPE training sample: `limit` characters of documents, bounded so one pathological
    document cannot make training take minutes and gigabytes (a 50 MB row without whitespace is
    one pre-token, whose merges cost memory in proportion): each document gives at most
    1/DOC_SHARE of the sample, and a run of more than MAX_RUN characters without whitespace is
    cut into MAX_RUN pieces (no useful token is that long). `notes` says what was bounded."""

    def __init__(self, limit: int):
        self.limit, self.cap = limit, max(limit // DOC_SHARE, 1)
        self.capped, self.split = 0, 0

    def take(self, texts: Iterator[str]) -> Iterator[str]:
        seen = 0
        for t in texts:
            if seen >= self.limit:
                return
            if len(t) > self.cap:
                self.capped += 1
                t = t[: self.cap]
            seen += len(t)
            yield from self._pieces(t)

    def _pieces(self, text: str) -> Iterator[str]:
        start = 0
        for m in LONG_RUN.finditer(text):
            self.split += 1
            yield text[start : m.start()]
            yield from (text[i : i + MAX_RUN] for i in range(m.start(), m.end(), MAX_RUN))
            start = m.end()
        yield text[start:]

    def notes(self) -> list[str]:
        out = []
        if self.capped:
            out.append(
                f"{self.capped} document(s) longer than {self.cap:,} characters gave only their "
                f"first {self.cap:,} to the tokenizer's training sample (1/{DOC_SHARE} of "
                "train_chars), so no one document dominates it"
            )
        if self.split:
            out.append(
                f"{self.split} run(s) of more than {MAX_RUN} characters without whitespace were "
                f"cut into {MAX_RUN}-character pieces for tokenizer training"
            )
        return out


class HuggingFaceConfig(TokenizerConfig):
    """A Hugging Face tokenizer.json file (Llama, Mistral, GPT-NeoX, SmolLM, ...)."""

    name: Literal["huggingface"] = named("huggingface")

    path: str = Field(..., description="A tokenizer.json file, or a directory holding one.")
    bos_token: str | None = Field(
        None,
        description="Special token that starts every document; null = the first of <|bos|>, "
        "<s>, <|begin_of_text|>, <|endoftext|>, <bos> the tokenizer has.",
    )

    @classmethod
    def tokenizer_class(cls) -> type[Tokenizer]:
        return HuggingFaceJSON


BOS_CANDIDATES = (BOS, "<s>", "<|begin_of_text|>", "<|endoftext|>", "<bos>")


class HuggingFaceJSON(HFTokenizer[HuggingFaceConfig]):
    """A tokenizer.json loaded with the `tokenizers` library."""

    @classmethod
    def from_config(cls, cfg: HuggingFaceConfig) -> HFTokenizer:
        path = Path(cfg.path).expanduser()
        raw = _read_tokenizer_json(path / "tokenizer.json" if path.is_dir() else path)
        bos = cfg.bos_token or next(
            (t for t in BOS_CANDIDATES if raw.token_to_id(t) is not None), None
        )
        if bos is None:
            raise DataError(
                f"data.tokenizer: {path} has none of {', '.join(BOS_CANDIDATES)}; "
                "set data.tokenizer.bos_token to the token that should start each document"
            )
        template, tokens = read_chat_template(path if path.is_dir() else path.parent)
        return HFTokenizer(raw, bos).with_chat_template(template, tokens)

    @classmethod
    def vocab_size_for(cls, cfg: HuggingFaceConfig) -> int:
        return cls.from_config(cfg).vocab_size

    @classmethod
    def chat_tokens_for(cls, cfg: HuggingFaceConfig) -> int:
        return len(cls.from_config(cfg).chat_token_ids())


def read_meta(directory: Path) -> dict:
    meta_path = directory / META
    if not meta_path.is_file():
        raise DataError(
            f"no tokenizer in {directory} ({META} missing); point at a directory written by "
            "`littlelm data prepare` (its tokenizer/) or a checkpoint's tokenizer/"
        )
    try:
        return json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{meta_path} is unreadable ({e}); prepare the data again") from None
