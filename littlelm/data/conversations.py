"""The `chat` source: conversations for supervised fine-tuning (docs/post-training.md).

    chat:   {name: chat, dataset: data/arith/train.jsonl}                 # {"messages": [...]}
    alpaca: {name: chat, dataset: ~/alpaca/, rows: alpaca}                 # instruction/input/output
    smol:   {name: chat, dataset: HuggingFaceTB/smoltalk, subset: everyday-conversations}

Rows are `{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}` (SmolTalk,
UltraChat, OpenHermes after mapping), or Alpaca-style instruction / input / output columns,
which become one user turn (the instruction, then the input after a blank line) and one
assistant turn. The files are what the `hf` source reads (a JSONL or Parquet file, a directory
of them, a `datasets` save_to_disk directory, or a hub dataset id).

Each row is checked (data/chat.py: unknown role, no assistant turn, roles out of order, empty
content, a chat special token inside the content); a bad row is counted under its kind in the
manifest (`littlelm data inspect`) or, with `on_error: fail`, stops preparation naming FILE:LINE
(FILE:ROW for Parquet and Arrow). A good row is handed on as canonical JSON, and rendered with the
run's tokenizer's chat format when it is tokenized, so the shards hold exactly the tokens the
model is trained on. Conversations longer than a training row are refused or left out when the
loader is built (`on_error`), since only then is the context known.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import Field

from littlelm.config import named
from littlelm.data.chat import conversation_problem
from littlelm.data.hub import HFConfig, HubDataset


class ChatConfig(HFConfig):
    """Conversations (messages or Alpaca rows) for supervised fine-tuning; the loss counts the
    assistant's tokens only (unless train_on_inputs)."""

    name: Literal["chat"] = named("chat")  # type: ignore[assignment]  # a subclass narrows the discriminator
    dataset: str = Field(
        ...,
        description="A JSONL or Parquet file, a directory of them, a `datasets` save_to_disk "
        "directory, or a hub dataset id (owner/name).",
    )
    rows: Literal["messages", "alpaca"] = Field(
        "messages",
        description="Row layout: a list of {role, content} messages in `field`, or Alpaca "
        "instruction / input / output columns.",
    )
    field: str = Field("messages", description="Column holding each row's messages.")
    system: str | None = Field(
        None, description="A system message put first in every conversation that has none."
    )
    train_on_inputs: bool = Field(
        False,
        description="Also train on the prompts (axolotl's train_on_inputs): the loss counts every "
        "token of each conversation (system and user turns, the chat tokens) but its BOS, "
        "instead of the assistant's replies alone.",
    )
    # conversations are padded where documents are split or cropped: a choice of their own
    long_docs: Literal["pad"] = Field(  # type: ignore[assignment]  # pad: conversations' own choice
        "pad",
        description="Conversations are never cut: one that does not fit the rest of a row "
        "starts the next row, the rest being padding the loss ignores.",
    )

    def build(self, label: str) -> ChatSource:
        return ChatSource(self, label)


ALPACA = ("instruction", "input", "output")


class ChatSource(HubDataset):
    """Conversations, one per row; see the module docstring."""

    cfg: ChatConfig
    conversations = True  # rendered with the tokenizer's chat format when tokenized

    def __init__(self, cfg: ChatConfig, label: str):
        super().__init__(cfg, label)
        self._rows_seen = 0  # rows of the file before the batch being read (FILE:ROW)

    @property
    def columns(self) -> list[str]:
        return list(ALPACA) if self.cfg.rows == "alpaca" else [self.cfg.field]

    @property
    def text_column(self) -> None:
        return None  # messages (or Alpaca columns), made into a conversation

    def local(self) -> Path | None:
        p = Path(self.cfg.dataset).expanduser()
        return p if p.is_file() else super().local()

    def _local_files(self, root: Path) -> list[Path]:
        return [root] if root.is_file() else super()._local_files(root)

    def pieces(self, doc: str) -> Iterator[str]:
        yield doc  # a conversation is never cut

    def _batch_texts(self, batch, path: Path) -> Iterator[str]:
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        start = self._rows_seen
        for n, values in enumerate(zip(*columns), start + 1):
            text = self._fill(dict(zip(self.columns, values)), f"{path}:{n}")
            if text is not None:
                yield text
        self._rows_seen = start + batch.num_rows

    def _parquet(self, path: Path, start: int, stop: int | None) -> Iterator[str]:
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata  # rows before the unit's first row group
        self._rows_seen = sum(meta.row_group(i).num_rows for i in range(start))
        yield from super()._parquet(path, start, stop)

    def _arrow(self, path: Path) -> Iterator[str]:
        self._rows_seen = 0
        yield from super()._arrow(path)

    def _where(self, path: Path, n: int) -> str:
        return f"{path}:{n}"  # FILE:LINE, as editors and the users read it

    def _fill(self, row: dict, where) -> str | None:
        """The row as canonical JSON messages, or None (counted, or an error) when it is bad."""
        if self.cfg.rows == "alpaca":
            messages = _alpaca(row)
            if messages is None:
                self.bad("missing instruction or output", where)
                return None
        else:
            messages = row.get(self.cfg.field)
            if messages is None:
                self.bad(f"missing field {self.cfg.field!r}", where)
                return None
        if self.cfg.system and isinstance(messages, list) and messages:
            first = messages[0]
            if not (isinstance(first, dict) and first.get("role") == "system"):
                messages = [{"role": "system", "content": self.cfg.system}, *messages]
        problem = conversation_problem(messages)
        if problem is not None:
            kind, detail = problem
            self.bad(f"conversation: {kind}", f"{where} ({detail})")
            return None
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        return json.dumps(plain, ensure_ascii=False)


def _alpaca(row: dict) -> list[dict] | None:
    instruction, extra, output = (row.get(k) for k in ALPACA)
    if not isinstance(instruction, str) or not isinstance(output, str):
        return None
    prompt = instruction + (f"\n\n{extra}" if isinstance(extra, str) and extra.strip() else "")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
