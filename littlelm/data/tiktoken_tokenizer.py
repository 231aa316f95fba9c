"""tiktoken encodings (GPT-2's r50k_base, cl100k_base, o200k_base, ...) as littlelm tokenizers.

    tokenizer: {name: tiktoken, encoding: r50k_base}                            # tiktoken's cache
    tokenizer: {name: tiktoken, encoding: r50k_base, file: gpt2.tiktoken}       # a local file

Without `file`, `tiktoken.get_encoding` reads the ranks from its cache ($TIKTOKEN_CACHE_DIR) or
downloads them. With `file`, the ranks come from that file (checked against the sha256 tiktoken
expects for the named encoding) and the split pattern and special tokens from tiktoken's own
definition of the encoding, so nothing is downloaded. Saved beside shards as `ranks.tiktoken`
plus the pattern and special tokens, so a prepared dataset never needs the network again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Literal, cast
from unittest import mock

import numpy as np
from pydantic import Field

from littlelm.config import named
from littlelm.data.tokenizer import Tokenizer, TokenizerConfig, join_docs
from littlelm.errors import DataError

RANKS = "ranks.tiktoken"
ALIASES = {
    "gpt2": "r50k_base"
}  # same ranks, pattern and special tokens; tiktoken's single-file form


class TiktokenConfig(TokenizerConfig):
    """A tiktoken BPE encoding, from a local .tiktoken file or tiktoken's cache."""

    name: Literal["tiktoken"] = named("tiktoken")

    encoding: str = Field(
        "r50k_base",
        description="tiktoken encoding (r50k_base = gpt2, p50k_base, cl100k_base, o200k_base): "
        "its split pattern and special tokens, and its ranks when `file` is null.",
    )
    file: str | None = Field(
        None,
        description="Local .tiktoken ranks file; null = tiktoken.get_encoding(encoding), "
        "which reads $TIKTOKEN_CACHE_DIR or downloads.",
    )
    bos_token: str = Field("<|endoftext|>", description="Special token that starts every document.")
    threads: int | None = Field(
        None, description="Threads for batch encoding; null = every core.", ge=1
    )

    @classmethod
    def tokenizer_class(cls) -> type[Tokenizer]:
        return TiktokenTokenizer


class TiktokenTokenizer(Tokenizer[TiktokenConfig]):
    """An OpenAI tiktoken encoding (byte-level BPE, fast batch encoding on every core)."""

    kind = "tiktoken"

    def __init__(self, enc, bos_token: str, threads: int | None = None):
        self.enc, self.name = enc, enc.name
        self.vocab_size = enc.n_vocab
        specials = self.special_tokens()
        if bos_token not in specials:
            raise DataError(
                f"tiktoken encoding {enc.name} has no special token {bos_token!r}; "
                f"set data.tokenizer.bos_token to one of: {', '.join(sorted(specials))}"
            )
        self.bos_token, self.bos_id = bos_token, specials[bos_token]
        self.threads = threads or os.cpu_count() or 1

    def special_tokens(self) -> dict[str, int]:
        return {t: self.enc.encode_single_token(t) for t in self.enc.special_tokens_set}

    @classmethod
    def from_config(cls, cfg: TiktokenConfig) -> TiktokenTokenizer:
        return cls(_encoding(cfg), cfg.bos_token, cfg.threads)

    @classmethod
    def vocab_size_for(cls, cfg: TiktokenConfig) -> int:
        return _encoding(cfg).n_vocab

    def encode(self, text: str, special: bool = False) -> list[int]:
        if special:
            return self.enc.encode(text, allowed_special="all")
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str], special: bool = False) -> list[list[int]]:
        if self.threads == 1:
            return [self.encode(t, special) for t in texts]
        if special:
            return self.enc.encode_batch(texts, num_threads=self.threads, allowed_special="all")
        return self.enc.encode_ordinary_batch(texts, num_threads=self.threads)

    def encode_docs(self, texts: list[str], special: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """As `Tokenizer.encode_docs`, without a Python object per token: each document is
        encoded straight into a numpy array (special-token text encoded as ordinary text, as
        `encode_ordinary` does, unless `special`), in `threads` chunks of documents at once."""
        encode = partial(self._encode_arrays, special=special)
        if self.threads == 1 or len(texts) < 2:
            arrays = encode(texts)
        else:
            n = min(len(texts), 4 * self.threads)  # chunks: few tasks, balanced across threads
            chunks = [texts[i::n] for i in range(n)]
            done = list(self._executor().map(encode, chunks))
            slots: list[np.ndarray | None] = [None] * len(texts)
            for i, part in enumerate(done):
                slots[i::n] = part
            arrays = cast(list[np.ndarray], slots)  # every slot is filled: the chunks cover all
        return join_docs(arrays, self.bos_id)

    def _encode_arrays(self, texts: list[str], special: bool = False) -> list[np.ndarray]:
        encode = self.enc.encode_to_numpy  # releases the GIL while it encodes
        allowed = "all" if special else set()
        return [encode(t, allowed_special=allowed, disallowed_special=()) for t in texts]

    def _executor(self) -> ThreadPoolExecutor:
        if getattr(self, "_pool", None) is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="littlelm-tiktoken")
        return self._pool

    def decode(self, ids: Iterable[int]) -> str:
        special = set(self.special_tokens().values())
        return self.enc.decode([i for i in ids if i not in special])

    def token_bytes(self) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.int32)
        for rank, token in self._ranks():
            out[rank] = len(token)
        return out

    def _ranks(self) -> list[tuple[int, bytes]]:
        """(rank, bytes) of every ordinary token, through the public API."""
        special = set(self.special_tokens().values())
        out = []
        for i in range(self.vocab_size):
            if i in special:
                continue
            try:
                out.append((i, self.enc.decode_single_token_bytes(i)))
            except KeyError:  # a hole in the ranks
                continue
        return out

    def _ranks_file(self) -> bytes:
        lines = (base64.b64encode(t) + b" " + str(i).encode() for i, t in self._ranks())
        return b"\n".join(lines) + b"\n"

    def state(self) -> str:
        return json.dumps(
            {
                "kind": "tiktoken",
                "pat_str": self.enc._pat_str,
                "special_tokens": sorted(self.special_tokens().items()),
                "ranks_sha256": hashlib.sha256(self._ranks_file()).hexdigest(),
                "bos": self.bos_token,
            }
        )

    def describe(self) -> str:
        return f"tiktoken {self.name}, {self.vocab_size:,} tokens"

    def _save_files(self, directory: Path) -> None:
        (directory / RANKS).write_bytes(self._ranks_file())

    def _meta(self) -> dict:
        return {
            "name": self.name,
            "pat_str": self.enc._pat_str,
            "special_tokens": self.special_tokens(),
            "bos_token": self.bos_token,
        }

    @classmethod
    def from_dir(cls, directory: Path, meta: dict) -> TiktokenTokenizer:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        enc = tiktoken.Encoding(
            name=meta["name"],
            pat_str=meta["pat_str"],
            mergeable_ranks=load_tiktoken_bpe(str(directory / RANKS)),
            special_tokens=meta["special_tokens"],
        )
        return cls(enc, meta["bos_token"])


def _encoding(cfg: TiktokenConfig):
    """The tiktoken Encoding a config names, converting every failure into a DataError."""
    import tiktoken

    name = ALIASES.get(cfg.encoding, cfg.encoding) if cfg.file else cfg.encoding
    if name not in tiktoken.list_encoding_names():
        raise DataError(
            f"data.tokenizer.encoding: unknown tiktoken encoding {cfg.encoding!r}; known: "
            f"{', '.join(tiktoken.list_encoding_names())}"
        )
    if not cfg.file:
        try:
            return tiktoken.get_encoding(name)
        except Exception as e:  # network or cache errors from inside tiktoken
            raise DataError(
                f"tiktoken could not load {name!r} from its cache or the internet "
                f"({type(e).__name__}: {e}); download the .tiktoken file and set "
                "data.tokenizer.file=PATH, or put it in $TIKTOKEN_CACHE_DIR"
            ) from None
    try:
        return _from_file(name, Path(cfg.file).expanduser())
    except DataError:
        raise
    except Exception as e:  # file errors from inside tiktoken
        raise DataError(f"cannot load tiktoken encoding {name}: {e}") from None


def _from_file(name: str, path: Path):
    """tiktoken's definition of `name` (pattern, special tokens) with the ranks read from `path`."""
    import tiktoken
    import tiktoken_ext.openai_public as public
    from tiktoken.load import load_tiktoken_bpe

    if not path.is_file():
        raise DataError(f"data.tokenizer.file: no such file: {path}")

    def local_ranks(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if expected_hash and actual != expected_hash:
            raise DataError(
                f"{path} is not the {name} ranks file (sha256 {actual[:12]}…, tiktoken expects "
                f"{expected_hash[:12]}…); set data.tokenizer.encoding to the encoding it belongs to"
            )
        return load_tiktoken_bpe(str(path))

    constructor = public.ENCODING_CONSTRUCTORS.get(name)
    if constructor is None:
        raise DataError(
            f"data.tokenizer.encoding {name!r} cannot be combined with a local file; use one of "
            f"{', '.join(n for n in public.ENCODING_CONSTRUCTORS if n not in ALIASES)}"
        )
    with mock.patch.object(public, "load_tiktoken_bpe", local_ranks):
        spec = constructor()
    spec.pop("explicit_n_vocab", None)
    return tiktoken.Encoding(**spec)
