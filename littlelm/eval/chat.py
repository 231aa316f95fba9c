"""`littlelm chat RUN`: talk to a model in its chat format (data/chat.py), streamed token by token.

    littlelm chat runs/demo-sft                          # interactive; /reset, /quit
    littlelm chat runs/demo-sft --prompt "12+30?"        # one reply, to stdout
    echo '{"messages": [{"role": "user", "content": "12+30?"}]}' | littlelm chat runs/demo-sft

A `Chat` holds the conversation and the model's KV cache: each turn feeds only the tokens the
cache does not hold yet (the new user turn and the header of the reply), and the reply's tokens
go into the cache as they are generated, so a long conversation is not re-read at every turn.
A conversation that no longer fits the context starts over from its system message (and says so).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator

import torch

from littlelm.data.chat import chat_format, check_messages, json_lines
from littlelm.errors import DataError, LittleLMError
from littlelm.model.generate import stream


class Chat:
    """A conversation with `model` (in eval mode); `reply` answers the next user turn."""

    def __init__(
        self,
        model,
        tokenizer,
        system: str | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        max_tokens: int = 256,
        seed: int | None = None,
    ):
        self.model, self.tokenizer, self.format = model, tokenizer, chat_format(tokenizer)
        self.system, self.max_tokens = system, max_tokens
        self.sampling = (temperature, top_k, top_p)
        self.device = model.wte.weight.device
        self.gen = torch.Generator(device=self.device)
        if seed is not None:
            self.gen.manual_seed(seed)
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages: list[dict] = (
            [{"role": "system", "content": self.system}] if self.system else []
        )
        self.caches = None  # the KV cache
        self.cached: list[int] = []  # the token ids it holds

    def reply(self, user: str, on_text: Callable[[str], None] | None = None) -> str:
        """The model's reply to `user` (streamed through `on_text` piece by piece)."""
        self.messages.append({"role": "user", "content": user})
        text = self.respond(on_text)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def respond(self, on_text: Callable[[str], None] | None = None) -> str:
        """The reply to `self.messages` as they stand (their last turn is the user's)."""
        pieces = []
        for piece in self.pieces():
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)
        return "".join(pieces)

    @torch.no_grad()
    def pieces(self) -> Iterator[str]:
        """The reply to `self.messages` as text pieces, each whole characters, as they are
        generated (`littlelm serve` streams them). Closing the generator stops generation.
        Afterwards `finish` is "stop" (the end token came) or "length", and `generated` counts
        the tokens generated, the end token included."""
        limit = self.model.cfg.max_seq_len
        prompt = self.format.encode(self.messages, add_generation_prompt=True)
        if len(prompt) >= limit:
            raise LittleLMError(
                f"the conversation ({len(prompt)} tokens) no longer fits the model's "
                f"{limit}-token context; /reset to start over"
            )
        self.prompt_tokens, self.generated, self.finish = len(prompt), 0, "length"
        logits = self._feed(prompt)
        budget = min(self.max_tokens, limit - len(prompt))
        temperature, top_k, top_p = self.sampling
        ids: list[int] = []
        shown, nxt = "", None
        steps = stream(
            self.model, logits, self.caches, budget, temperature, top_k, self.gen,
            self.format.end, top_p,
        )  # fmt: skip
        try:
            for nxt in steps:
                self.generated += 1
                if nxt == self.format.end:
                    self.finish = "stop"
                    break
                ids.append(nxt)
                text = self.tokenizer.decode(ids)
                if not text.endswith("\ufffd"):  # a character completed
                    piece, shown = text[len(shown) :], text
                    if piece:
                        yield piece
            rest = self.tokenizer.decode(ids)[len(shown) :]
            if rest:
                yield rest
        finally:
            # the cache holds the prompt and the reply's tokens but the last one picked
            done = ids and nxt != self.format.end
            self.cached = prompt + ids[:-1] if done else prompt + ids

    def _feed(self, prompt: list[int]) -> torch.Tensor:
        """Logits after `prompt`, feeding the cache only what it does not hold already."""
        keep = 0
        if self.caches is not None and prompt[: len(self.cached)] == self.cached:
            keep = len(self.cached)
        if keep == 0 or keep == len(prompt):
            self.caches = self.model.new_caches(1, self.model.cfg.max_seq_len)
            keep = 0
        new = torch.tensor([prompt[keep:]], device=self.device)
        return self.model(new, caches=self.caches)[:, -1]


def conversations(lines: Iterator[str]) -> Iterator[list[dict]]:
    """The messages of JSON lines: {"messages": [...]} or a bare list; the last
    message is the user's, the turn to answer. A bad line is a DataError naming it."""
    for where, row in json_lines(lines, "stdin", "; one conversation per line"):
        messages = row.get("messages") if isinstance(row, dict) else row
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            raise DataError(f'{where}: expected {{"messages": [...]}} ending with a user turn')
        if messages[-1].get("role") != "user":
            raise DataError(f"{where}: the last message must be the user's (the turn to answer)")
        # the conversation checks need a reply at the end: check it with a stand-in one
        stand_in = [*messages, {"role": "assistant", "content": "-"}]
        yield check_messages(stand_in, where)[:-1]


def interactive(chat: Chat, read=input, write=None) -> None:
    """The terminal loop: a line is a user turn; /reset forgets, /quit (or end of input) ends."""
    write = write or (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    write(
        f"chatting with the model ({chat.format.name} chat format); /reset starts over, "
        "/quit ends\n"
    )
    while True:
        try:
            line = read("you> ")
        except EOFError:
            write("\n")
            return
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return
        if text == "/reset":
            chat.reset()
            write("(conversation reset)\n")
            continue
        write("model> ")
        try:
            chat.reply(text, write)
        except LittleLMError as e:
            chat.messages.pop()  # the unanswered turn
            write(f"\n{e}")
        write("\n")


def run(
    checkpoint: str,
    prompt: str | None = None,
    system: str | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_tokens: int = 256,
    seed: int = 0,
    device: str = "auto",
    precision: str = "auto",
) -> int:
    """`littlelm chat`: interactive on a terminal; else one reply to --prompt, or one JSON line
    {"reply": ...} per conversation read from stdin."""
    from littlelm.load import load_model
    from littlelm.model.generate import check_sampling
    from littlelm.train.device import autocast, inference_precision, pick_device

    check_sampling(max_tokens, temperature, top_k, top_p)
    dev = pick_device(device)
    model, tok, cfg = load_model(checkpoint, dev)
    chat = Chat(model, tok, system, temperature, top_k, top_p, max_tokens, seed)
    with autocast(dev, inference_precision(precision, cfg.train.precision, dev)):
        if prompt is not None:
            print(chat.reply(prompt))
        elif sys.stdin.isatty():
            interactive(chat)
        else:
            for messages in conversations(sys.stdin):
                chat.reset()  # --system comes first unless the conversation has its own
                own = messages[0]["role"] == "system"
                chat.messages = messages if own else [*chat.messages, *messages]
                print(json.dumps({"reply": chat.respond()}, ensure_ascii=False), flush=True)
    return 0
