"""A littlelm model as an lm-evaluation-harness `LM` (imported only when lm_eval is installed).

Every sequence starts with BOS, as littlelm's training documents do; a document's end is where
the next BOS would come, so BOS is also the end-of-text token. Log-likelihoods are computed in
batches of right-padded rows (causal attention: the padding after a row never changes it).
With `chat=True` (`--apply-chat-template`) lm_eval renders its prompts as conversations in the
model's chat format (data/chat.py) and generation stops at the end of the assistant's turn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from littlelm.data.chat import chat_format
from littlelm.model.generate import generate


class LittleLMAdapter(TemplateLM):
    def __init__(self, model, tokenizer, batch_size: int = 16, chat: bool = False):
        super().__init__()
        self.model, self.tok, self.batch_size = model, tokenizer, batch_size
        self.max_length = model.cfg.max_seq_len
        self.dev = model.wte.weight.device
        self.chat = chat_format(tokenizer) if chat else None
        self.stop = self.chat.end if self.chat else tokenizer.bos_id

    @property
    def tokenizer_name(self) -> str:
        return f"littlelm-{self.tok.fingerprint[:16]}"

    def chat_template(self, chat_template: bool | str = False) -> str:
        return (self.chat.template or "littlelm") if self.chat else ""

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt=True) -> str:
        """lm_eval's conversation as the text the model reads after its BOS."""
        # harness.py passes its `chat` to both: lm_eval's apply_chat_template and this adapter's
        assert self.chat is not None, "lm_eval applies chat templates only with chat=True"
        return self.chat.render(chat_history, add_generation_prompt)

    @property
    def eot_token_id(self) -> int:
        return self.tok.bos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tok.bos_id

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs
    ) -> list[int]:
        # with chat on, lm_eval hands over the text apply_chat_template rendered: the format's
        # special-token text becomes its tokens; without, task text is ordinary text
        return list(self.tok.encode(string, special=self.chat is not None))

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.tok.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        bos = self.tok.bos_id
        pairs = [(ctx if ctx[:1] == [bos] else [bos, *ctx], cont) for _, ctx, cont in requests]
        return self.score(pairs)

    @torch.no_grad()
    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether greedy decoding gives it) per pair;
        the left of a pair longer than the context is cut."""
        rows = [([*c, *t][-(self.max_length + 1) :], len(t)) for c, t in pairs]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        for b in range(0, len(order), self.batch_size):
            batch = [rows[i] for i in order[b : b + self.batch_size]]
            width = max(len(ids) for ids, _ in batch) - 1
            x = torch.zeros(len(batch), width, dtype=torch.long)
            for r, (ids, _) in enumerate(batch):
                x[r, : len(ids) - 1] = torch.tensor(ids[:-1])
            logp = F.log_softmax(self.model(x.to(self.dev)).float(), dim=-1).cpu()
            for r, (ids, n) in enumerate(batch):
                end = len(ids) - 1
                lp = logp[r, end - n : end]  # (n, V): the predictions of the n targets
                target = torch.tensor(ids[-n:])
                ll = lp.gather(-1, target[:, None]).sum().item()
                out[order[b + r]] = (ll, bool((lp.argmax(-1) == target).all()))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        results = []
        for (text,) in [req.args for req in requests]:
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    self.tok_encode(text), self.tok.bos_id, self.max_length, self.max_length
                )
            ]
            results.append(sum(ll for ll, _ in self.score(windows)))
        return results

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each context, cut at the first `until` string."""
        out = []
        for context, kwargs in [req.args for req in requests]:
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else until
            n = int(kwargs.get("max_gen_toks", 256))
            prompt = [self.tok.bos_id, *self.tok_encode(context)][-(self.max_length - 1) :]
            ids = generate(
                self.model,
                prompt,
                min(n, self.max_length - len(prompt)),
                0.0,
                None,
                0,
                self.stop,
            )
            text = self.tok.decode(ids)
            cut = min([text.find(u) for u in until if u and u in text], default=len(text))
            out.append(text[:cut])
        return out
