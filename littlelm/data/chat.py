"""The chat format: conversations -> the tokens a model is trained and prompted on, and which of
them are the assistant's (the only ones the SFT loss counts; docs/post-training.md).

littlelm's own format, for every tokenizer littlelm trains (they reserve its four special tokens):

    <|bos|><|system|>You are terse.<|end|><|user|>2+2?<|end|><|assistant|>4<|end|>

A turn is its role's token, the content, then <|end|>; a prompt for a reply ends with
<|assistant|>, and the reply ends at <|end|> (the stop token). The assistant's tokens are each
reply's content and its <|end|>: the model learns what to say and when to stop, never the user's
words or the turn headers.

A tokenizer that brings its own chat template (an imported model's tokenizer_config.json
`chat_template`, a Jinja template) is rendered with that template instead, the way transformers'
`apply_chat_template` renders it; the assistant header (what the generation prompt adds) and the
end-of-turn token are found by rendering a probe conversation, and the mask is the same rule:
from after each header up to and including the next end token.

Every document starts with BOS (the tokenizer adds it), so a rendered conversation leaves out a
leading BOS the template writes itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np

from littlelm.errors import DataError

SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
CHAT_TOKENS = (SYSTEM, USER, ASSISTANT, END)  # reserved by every BPE tokenizer littlelm trains
ROLES = ("system", "user", "assistant")
# littlelm's format as a Jinja chat template (what `littlelm export` writes into
# tokenizer_config.json): renders exactly what `render` does, BOS first
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def conversation_problem(messages) -> tuple[str, str] | None:
    """(kind, detail) of what makes `messages` unusable for SFT, or None when it is fine: an
    optional system message, then user and assistant turns alternating, the last an assistant
    turn; every content a non-empty string holding no chat special token."""
    if not isinstance(messages, list) or not messages:
        return "not a list of messages", f"got {type(messages).__name__}"
    expect = "user"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return "malformed message", f"message {i + 1} has no role"
        role, content = m["role"], m.get("content")
        if role not in ROLES:
            return "unknown role", f"message {i + 1} has role {role!r} (system, user, assistant)"
        if not isinstance(content, str) or not content.strip():
            return "empty content", f"message {i + 1} ({role}) has no text"
        if any(t in content for t in (*CHAT_TOKENS, "<|bos|>")):
            return "reserved token in content", f"message {i + 1} ({role}) holds a chat token"
        if role == "system" and i == 0:
            continue
        if role != expect:
            return "roles out of order", f"message {i + 1} is {role}, expected {expect}"
        expect = "assistant" if role == "user" else "user"
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant turn", "nothing to train on"
    if expect == "assistant":
        return "roles out of order", "the last message is a user turn with no reply"
    return None


def extract(reply: str) -> str:
    """The answer in a reply: after the last `####`, else all of it; trimmed, commas of numbers
    dropped (GSM8K style). Chat evaluation (eval/chat_eval.py) and RL's rewards (train/rewards.py)
    read answers with it."""
    text = reply.rsplit("####", 1)[-1].strip()
    return re.sub(r"(?<=\d),(?=\d)", "", text)


def json_lines(lines, name: str, hint: str = "") -> Iterator[tuple[str, object]]:
    """(where, row) of each non-blank JSON line, `where` being NAME:LINE; a line that is not
    JSON is a DataError naming it (`hint`: what a line should be)."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{n}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not JSON ({e.msg}){hint}") from None


def check_messages(messages, where: str = "conversation") -> list[dict]:
    """`messages` as plain {role, content} dicts, or a DataError naming the problem."""
    problem = conversation_problem(messages)
    if problem is not None:
        raise DataError(f"{where}: {problem[0]}: {problem[1]}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


class Encoder(Protocol):
    """What a ChatFormat reads of its tokenizer (data/tokenizer.py's Tokenizer, which imports
    this module: a protocol here, so that it is not imported back)."""

    bos_id: int

    def encode(self, text: str, special: bool = False) -> list[int]: ...


@dataclass(frozen=True)
class ChatFormat:
    """How one tokenizer renders conversations: its template (None: littlelm's format), and the
    ids that open an assistant reply (`header`) and end one (`end`, the stop token)."""

    tokenizer: Encoder
    template: str | None
    header: tuple[int, ...]
    end: int
    special: dict  # bos_token, eos_token, ... strings the template may use

    @property
    def name(self) -> str:
        return "littlelm" if self.template is None else "the tokenizer's chat_template"

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as text, without the BOS every document starts with."""
        if self.template is None:
            text = "".join(f"<|{m['role']}|>{m['content']}{END}" for m in messages)
            return text + (ASSISTANT if add_generation_prompt else "")
        text = render_template(self.template, messages, add_generation_prompt, self.special)
        bos = self.special.get("bos_token")
        return text[len(bos) :] if bos and text.startswith(bos) else text

    def encode(self, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
        """Token ids the model sees: BOS, then the rendered conversation."""
        tok = self.tokenizer
        if self.template is None:
            # the format's tokens from the format, a message's content as text: "<|end|>" typed
            # in a message stays characters, so no message closes a turn it did not write
            # (transformers' apply_chat_template(..., sanitize_control_tokens=True) gives these ids)
            ids = [tok.bos_id]
            for m in messages:
                ids += tok.encode(f"<|{m['role']}|>", special=True)
                ids += [*tok.encode(m["content"]), *tok.encode(END, special=True)]
            return ids + (tok.encode(ASSISTANT, special=True) if add_generation_prompt else [])
        text = self.render(messages, add_generation_prompt)
        return [tok.bos_id, *tok.encode(text, special=True)]  # the format's tokens, from its text

    def render_json(self, text: str) -> str:
        """A conversation stored as JSON (what the conversation sources hand on) rendered."""
        return self.render(json.loads(text))

    def mask(self, tokens: np.ndarray) -> np.ndarray:
        """(n,) bool: which of `tokens` (from a document's BOS on) belong to an assistant reply."""
        return assistant_mask(tokens, self.header, self.end, self.tokenizer.bos_id)

    def every_token(self, tokens: np.ndarray) -> np.ndarray:
        """(n,) bool: every token of the conversations in `tokens` but their BOS (a chat
        source's train_on_inputs); a row's padding is BOS too (data/build.py packs with it)."""
        return np.asarray(tokens) != self.tokenizer.bos_id

    def identity(self) -> dict:
        """What the rendering depends on besides the tokenizer's fingerprint (cache keys)."""
        return {"template": self.template, "special": self.special}


def assistant_mask(tokens: np.ndarray, header: tuple[int, ...], end: int, bos: int) -> np.ndarray:
    """True from the token after each `header` up to and including the next `end`; a BOS
    (a new document) closes an open reply. Vectorised: the last opening and the last closing at
    or before each position decide it."""
    t = np.asarray(tokens)
    n, h = len(t), len(header)
    idx = np.arange(n)
    if n < h:
        return np.zeros(n, dtype=bool)
    if h == 1:
        hits = np.flatnonzero(t == header[0])
    else:
        win = np.lib.stride_tricks.sliding_window_view(t, h)
        hits = np.flatnonzero((win == np.asarray(header)).all(1))
    opened = np.full(n + 1, -1)
    opened[np.minimum(hits + h, n)] = hits + h  # the first reply token (n: past the end)
    closed = np.full(n + 1, -1)
    ends = np.flatnonzero(t == end) + 1  # the end token is the reply's; the next one is not
    closed[ends] = ends
    bos_at = np.flatnonzero(t == bos)
    closed[bos_at] = np.maximum(closed[bos_at], bos_at)
    last_open = np.maximum.accumulate(opened)[:n]
    last_close = np.maximum.accumulate(closed)[:n]
    return (last_open > last_close) & (last_open <= idx)


def render_template(
    template: str, messages: list[dict], add_generation_prompt: bool, special: dict
) -> str:
    """A Jinja chat template rendered as transformers' apply_chat_template renders it (sandboxed,
    trim_blocks and lstrip_blocks, raise_exception / strftime_now, a tojson that keeps non-ASCII)."""
    try:
        from jinja2.exceptions import TemplateError
    except ImportError:  # pragma: no cover - jinja2 ships with torch
        raise DataError("rendering a chat_template needs jinja2: pip install jinja2") from None
    try:
        compiled = _compile(template)
        return compiled.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special
        )
    except TemplateError as e:
        raise DataError(f"the tokenizer's chat_template failed to render: {e}") from None


_COMPILED: dict[str, object] = {}


def _compile(template: str):
    if template not in _COMPILED:
        import jinja2.ext
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(
                x,
                ensure_ascii=ensure_ascii,
                indent=indent,
                separators=separators,
                sort_keys=sort_keys,
            )

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _COMPILED[template] = env.from_string(template)
    return _COMPILED[template]


def chat_format(tok) -> ChatFormat:
    """The chat format of tokenizer `tok`: its own chat_template when it has one (imported
    models), else littlelm's, whose special tokens it must have."""
    template = tok.chat_template
    special = {"bos_token": tok.bos_token, **tok.template_tokens()}
    if template is None:
        ids = [tok.special_id(t) for t in CHAT_TOKENS]
        if None in ids:
            raise DataError(
                f"the tokenizer ({tok.describe()}) has no chat tokens ({', '.join(CHAT_TOKENS)}) "
                "and no chat_template: a bpe tokenizer trained by littlelm before they were "
                "reserved, or another kind. Retrain the base model with a current bpe tokenizer "
                "(data.tokenizer.chat_tokens: true, the default), or use a model whose "
                "tokenizer_config.json has a chat_template (docs/post-training.md)"
            )
        return ChatFormat(tok, None, (ids[2],), ids[3], special)
    return _template_format(tok, template, special)


def _template_format(tok, template: str, special: dict) -> ChatFormat:
    """Find the assistant header and end-of-turn token by rendering a probe conversation."""
    user = [{"role": "user", "content": "Q"}]
    bare = render_template(template, user, False, special)
    prompt = render_template(template, user, True, special)
    reply = render_template(
        template, [*user, {"role": "assistant", "content": "A"}], False, special
    )
    header = prompt[len(bare) :] if prompt.startswith(bare) else ""
    after = reply[len(prompt) :] if reply.startswith(prompt + "A") else ""
    header_ids = tuple(tok.encode(header, special=True)) if header else ()
    end_ids = tok.encode(after[1:], special=True) if after else []
    if not header_ids or not end_ids:
        raise DataError(
            "the tokenizer's chat_template does not render a reply as its generation prompt "
            "followed by the content and an end-of-turn token, so littlelm cannot tell the "
            f"assistant's tokens apart (probe: prompt {prompt!r}, reply {reply!r}); fix the "
            "template in tokenizer_config.json"
        )
    return ChatFormat(tok, template, header_ids, end_ids[0], special)
