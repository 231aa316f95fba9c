"""The `preference` source and its batches: (prompt, chosen, rejected) pairs for DPO
(train/dpo.py, docs/post-training.md).

    prefs: {name: preference, dataset: data/pref_example/train.jsonl}

Rows are Hugging Face's preference layouts, in a JSONL or Parquet file, a directory of them, a
`datasets` save_to_disk directory or a hub dataset id (what the `chat` source reads):

    {"prompt": "2+2?", "chosen": "4", "rejected": "5"}                          plain strings
    {"prompt": [{"role": "user", "content": "2+2?"}],                           conversations
     "chosen": [{"role": "assistant", "content": "4"}], "rejected": [...]}
    {"chosen": [user, assistant], "rejected": [user, assistant]}                implicit prompt

A plain-string prompt is one user turn and a plain-string reply one assistant turn; a
conversational `chosen` that starts with the prompt's messages (UltraFeedback's layout) has them
taken off; without `prompt`, the prompt is what `chosen` and `rejected` share before their last
message. Each reply must be one assistant message, the two replies different (a pair whose
chosen equals its rejected gives the loss no gradient), and the prompt a conversation ending with a
user turn (data/chat.py's rules); a bad row is counted or, with `on_error: fail`, stops
preparation naming FILE:LINE.

A pair is tokenized as two documents, one after the other in the shards: prompt + chosen, then
prompt + rejected, each rendered in the tokenizer's chat format with its BOS. The tokens the DPO
loss counts are those of the last reply of each (its content and end token: the chat mask's
last run), so a multi-turn prompt's earlier assistant turns are context only.

Batches (PairLoader): pairs are not packed. Each micro-batch holds `train.micro_batch_size`
pairs as 2·B rows of seq_len + 1 tokens, the B chosen sequences first and then their B rejected
ones in the same order (TRL's layout), each padded at the end with BOS tokens whose targets are
ignored. Pairs are drawn in a seeded order, a new one each epoch; a pair with a sequence longer
than a row is left out (counted at start). The loader's state is (epoch, position), so a resumed
run gets exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from littlelm.config import named
from littlelm.data.chat import ChatFormat, conversation_problem
from littlelm.data.conversations import ChatConfig, ChatSource
from littlelm.data.loader import IGNORE, DataExhausted
from littlelm.errors import DataError

FIELDS = ("prompt", "chosen", "rejected")


class PreferenceConfig(ChatConfig):
    """(prompt, chosen, rejected) pairs for DPO (a run with a `dpo:` section): plain strings or
    conversations, in Hugging Face's preference layouts."""

    name: Literal["preference"] = named("preference")  # type: ignore[assignment]  # a subclass narrows the discriminator
    rows: Literal["messages"] = Field(  # pairs have one layout family
        "messages",
        description="Row layout: prompt / chosen / rejected columns (plain strings or lists of "
        "{role, content} messages); the only one for pairs.",
    )

    @field_validator("train_on_inputs")
    @classmethod
    def _no_inputs(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "DPO scores the chosen reply against the rejected one, never the prompt; "
                "train_on_inputs is a chat source's option: remove it here"
            )
        return value

    def build(self, label: str) -> PreferenceSource:
        return PreferenceSource(self, label)


class PreferenceSource(ChatSource):
    """Preference pairs, one per row; see the module docstring."""

    cfg: PreferenceConfig
    pairs = True  # each row becomes two documents (data/workers.py asks `rendered`)

    @property
    def columns(self) -> list[str]:
        return list(FIELDS)

    def rendered(self, doc: str, fmt: ChatFormat) -> list[str]:
        """A pair (canonical JSON) as its two documents' text: prompt + chosen, prompt +
        rejected."""
        pair = json.loads(doc)
        return [fmt.render([*pair["prompt"], r]) for r in (pair["chosen"], pair["rejected"])]

    def words(self, doc: str) -> str:
        pair = json.loads(doc)
        msgs = [*pair["prompt"], pair["chosen"], pair["rejected"]]
        return "\n".join(m["content"] for m in msgs)

    def _fill(self, row: dict, where) -> str | None:
        """The row as canonical JSON {prompt, chosen, rejected}, or None when it is bad."""
        pair = as_pair(row, self.cfg.system)
        if isinstance(pair, str):
            self.bad(f"preference: {pair.split(':')[0]}", f"{where} ({pair})")
            return None
        return json.dumps(pair, ensure_ascii=False)


def _messages(value, role: str) -> list[dict] | None:
    """A plain string as one message of `role`, a list of messages as it is, else None."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return [{"role": m.get("role"), "content": m.get("content")} for m in value]
    return None


def as_pair(row: dict, system: str | None = None) -> dict | str:
    """{"prompt": [messages], "chosen": message, "rejected": message} of a row in one of the
    layouts of the module docstring, or a string saying what is wrong ('kind: detail')."""
    chosen, rejected = (
        _messages(row.get("chosen"), "assistant"),
        _messages(row.get("rejected"), "assistant"),
    )
    if chosen is None or rejected is None:
        which = "chosen" if chosen is None else "rejected"
        return f"missing reply: no {which!r} string or list of messages"
    if row.get("prompt") is None:  # implicit prompt: the messages both share before their last
        if chosen[:-1] != rejected[:-1] or len(chosen) < 2:
            return "no prompt: no 'prompt' column, and chosen and rejected share no prompt"
        prompt = chosen[:-1]
    else:
        given = _messages(row["prompt"], "user")
        if given is None:
            return "bad prompt: 'prompt' is neither a string nor a list of messages"
        prompt = given
    for replies in (chosen, rejected):  # UltraFeedback's layout: each reply after the prompt
        if len(replies) > 1 and replies[: len(prompt)] == prompt:
            del replies[: len(prompt)]
    if len(chosen) != 1 or len(rejected) != 1:
        return "not one reply: chosen and rejected must each be one assistant message"
    if chosen[0] == rejected[0]:  # DPO's loss has no gradient on such a pair: it teaches nothing
        return "same reply: chosen and rejected are the same message"
    if system and prompt[0].get("role") != "system":
        prompt = [{"role": "system", "content": system}, *prompt]
    for reply in (chosen[0], rejected[0]):
        problem = conversation_problem([*prompt, reply])
        if problem is not None:
            return f"{problem[0]}: {problem[1]}"
    return {"prompt": prompt, "chosen": chosen[0], "rejected": rejected[0]}


def reply_mask(tokens: np.ndarray, fmt: ChatFormat) -> np.ndarray:
    """(n,) bool: the tokens of the last assistant reply of `tokens` (content and end token)."""
    m = fmt.mask(tokens)
    on = np.flatnonzero(m)
    if not len(on):
        return m
    off = np.flatnonzero(~m[: on[-1]])  # the reply's run starts after the last False before it
    first = off[-1] + 1 if len(off) else 0
    out = np.zeros_like(m)
    out[first : on[-1] + 1] = True
    return out


def pair_docs(shards: list, label: str) -> list[np.ndarray]:
    """Every document of `shards` in order (a pair is two consecutive ones)."""
    docs = [s.doc(i) for s in shards for i in range(len(s))]
    if len(docs) % 2:
        raise DataError(
            f"data.sources.{label}: {len(docs)} documents, an odd number, so they are not "
            "(chosen, rejected) pairs; prepare the source again (remove its cached directory)"
        )
    return docs


@dataclass
class Pair:
    chosen: np.ndarray
    rejected: np.ndarray


def pairs_of(shards: list, label: str, row_len: int) -> tuple[list[Pair], int]:
    """The pairs of `shards` whose two sequences fit a row of `row_len` tokens, and how many
    did not."""
    docs = pair_docs(shards, label)
    pairs = [Pair(docs[i], docs[i + 1]) for i in range(0, len(docs), 2)]
    kept = [p for p in pairs if max(len(p.chosen), len(p.rejected)) <= row_len]
    return kept, len(pairs) - len(kept)


def pair_rows(
    pairs: list[Pair], row_len: int, bos: int, fmt: ChatFormat
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y (2·len(pairs), row_len - 1): chosen rows, then rejected rows; padding is BOS and
    every target outside a row's last reply is IGNORE."""
    seqs = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    t = np.full((len(seqs), row_len), bos, dtype=np.int64)
    keep = np.zeros((len(seqs), row_len), dtype=bool)
    for r, s in enumerate(seqs):
        t[r, : len(s)] = s
        keep[r, : len(s)] = reply_mask(s, fmt)
    y = np.where(keep[:, 1:], t[:, 1:], IGNORE)
    return torch.from_numpy(t[:, :-1]), torch.from_numpy(y)


@dataclass
class PairSnapshot:
    """The pair loader's state after a batch (what a checkpoint keeps), and the figures a run's
    records read of a loader (a pair source has no mixture, cropping or splitting)."""

    label: str
    epoch: int
    pos: int
    left_out: int

    def state_dict(self) -> dict:
        return {"pairs": {"epoch": self.epoch, "pos": self.pos}}

    def proportions(self) -> dict[str, float]:
        return {self.label: 1.0}

    def crop_rate(self) -> float:
        return 0.0

    def split_rate(self) -> float:
        return 0.0

    def report(self) -> str:
        return (
            f"{self.label}: preference pairs, epoch {self.epoch + 1}, {self.pos:,} pairs into it; "
            f"{self.left_out:,} pair(s) longer than a row left out"
        )


class PairLoader:
    """Batches of preference pairs for one data-parallel rank (module docstring): rank r of w
    takes every w-th pair of each epoch's seeded order."""

    masks = True  # targets are masked: batches count their trained tokens

    def __init__(
        self,
        shards: list,
        label: str,
        fmt: ChatFormat,
        batch: int,
        seq_len: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        repeat: bool = True,
    ):
        self.row_len, self.batch, self.fmt, self.label = seq_len + 1, batch, fmt, label
        self.pairs, self.left_out = pairs_of(shards, label, self.row_len)
        if len(self.pairs) < world:
            raise DataError(
                f"data.sources.{label}: {len(self.pairs)} pair(s) fit a row of train.seq_len + 1 "
                f"= {self.row_len} tokens ({self.left_out:,} longer left out), fewer than the "
                f"{world} process(es); raise train.seq_len (within model.max_seq_len) or add pairs"
            )
        self.seed, self.rank, self.world, self.repeat = seed, rank, world, repeat
        self.bos = fmt.tokenizer.bos_id
        self.epoch, self.pos = 0, 0
        self._order: list[int] | None = None

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            perm = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.pairs))
            self._order = perm[self.rank :: self.world].tolist()
        return self._order

    def _next(self) -> Pair:
        if self.pos >= len(self._epoch_order()):
            if not self.repeat:
                raise DataExhausted(
                    f"source {self.label!r} is exhausted after {self.epoch + 1} epoch(s); set "
                    "data.on_exhausted=repeat to start a new epoch, or add pairs"
                )
            self.epoch, self.pos, self._order = self.epoch + 1, 0, None
        i = self._epoch_order()[self.pos]
        self.pos += 1
        return self.pairs[i]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return pair_rows(
            [self._next() for _ in range(self.batch)], self.row_len, self.bos, self.fmt
        )

    def snapshot(self) -> PairSnapshot:
        return PairSnapshot(self.label, self.epoch, self.pos, self.left_out)

    def proportions(self) -> dict[str, float]:
        return self.snapshot().proportions()

    def state_dict(self) -> dict:
        return self.snapshot().state_dict()

    def load_state_dict(self, state: dict) -> None:
        if "pairs" not in state:
            raise DataError(
                "the checkpoint's data position is not a preference loader's: it was saved by a "
                "run on other data sources; resume it with its own config"
            )
        self.epoch, self.pos = int(state["pairs"]["epoch"]), int(state["pairs"]["pos"])
        self._order = None
