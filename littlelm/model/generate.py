"""Text generation with a KV cache: temperature, top-k, top-p, seeded sampling or greedy
decoding; `stream` yields the tokens one at a time from a cache the caller may keep (chat)."""

from __future__ import annotations

import math
import warnings

import torch

from littlelm.errors import LittleLMError
from littlelm.model.gpt import GPT


def check_sampling(
    max_tokens: int, temperature: float, top_k: int | None, top_p: float | None = None
) -> None:
    """Refuse settings that cannot sample (a user error, named)."""
    if top_p is not None and not 0 < top_p <= 1:
        raise LittleLMError(f"--top-p must be in (0, 1], got {top_p}")
    if max_tokens < 1:
        raise LittleLMError(f"--max-tokens must be at least 1, got {max_tokens}")
    if not math.isfinite(temperature) or temperature < 0:  # nan: a traceback; inf: noise
        raise LittleLMError(
            f"--temperature must be a finite number, 0 (greedy) or more, got {temperature}"
        )
    if top_k is not None and top_k < 1:
        raise LittleLMError(f"--top-k must be at least 1 (or 0 for no filter), got {top_k}")


def fit_prompt(prompt: list[int], max_tokens: int, limit: int) -> tuple[list[int], int, str]:
    """(prompt, max_tokens, note) fitted to a `limit`-token context; note is '' when unchanged.

    A prompt that leaves no room keeps its first token (BOS) and its last limit - 2 tokens, so
    that at least one token can be generated; max_tokens shrinks to the room left.
    """
    notes = []
    if len(prompt) >= limit:
        notes.append(
            f"prompt of {len(prompt)} tokens does not fit the {limit}-token context; "
            f"kept BOS and its last {limit - 2} tokens"
        )
        prompt = [prompt[0], *prompt[len(prompt) - (limit - 2) :]]
    room = limit - len(prompt)
    if max_tokens > room:
        notes.append(f"generating {room} tokens, not {max_tokens}: the context ends there")
        max_tokens = room
    return prompt, max_tokens, "; ".join(notes)


@torch.no_grad()
def generate(
    model: GPT,
    prompt: list[int],
    max_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    stop: int | None = None,
    top_p: float | None = None,
) -> list[int]:
    """Continue `prompt` (token ids, BOS included if wanted) by up to `max_tokens` tokens.

    temperature 0 is greedy (deterministic). Sampling uses its own generator seeded by `seed`,
    so it neither consumes nor disturbs the global RNG. Stops early at the `stop` token. A prompt
    or length that does not fit the context is fitted with a warning (see fit_prompt).
    """
    device = model.wte.weight.device
    prompt, max_tokens, note = fit_prompt(prompt, max_tokens, model.cfg.max_seq_len)
    if note:
        warnings.warn(note, stacklevel=3)  # the caller of generate (past no_grad)
    gen = torch.Generator(device=device)
    if seed is not None:
        gen.manual_seed(seed)
    caches = model.new_caches(1, len(prompt) + max_tokens)
    logits = model(torch.tensor([prompt], device=device), caches=caches)[:, -1]  # (1, V)
    return list(stream(model, logits, caches, max_tokens, temperature, top_k, gen, stop, top_p))


def stream(model, logits, caches, max_tokens, temperature, top_k, gen, stop=None, top_p=None):
    """Tokens one at a time from `logits` (1, V) of the last position fed into `caches`; each
    picked token is fed on into the caches (but the last), so a caller can keep them."""
    device = logits.device
    for i in range(max_tokens):
        nxt = pick(logits, temperature, top_k, gen, top_p)
        yield nxt
        if nxt == stop or i + 1 == max_tokens:
            return
        logits = model(torch.tensor([[nxt]], device=device), caches=caches)[:, -1]


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 `logits / temperature`, shifted so that the largest is 0: what a softmax at that
    temperature reads. Computed so that any temperature > 0 gives a distribution: a tiny one
    (1e-300 is 0 in fp32) would make inf / inf or 0 / 0, nan probabilities; here it is
    held at fp32's smallest normal number, where every token but the most likely gets -inf
    (greedy, its limit)."""
    logits = logits.float()
    shifted = logits - logits.amax(-1, keepdim=True)
    return shifted / max(temperature, torch.finfo(torch.float32).tiny)


def pick(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    gen: torch.Generator,
    top_p: float | None = None,
) -> int:
    """One token id from logits (1, V)."""
    if temperature <= 0:
        return int(logits.argmax(-1))
    logits = tempered(logits, temperature)
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:  # the smallest set of tokens holding top_p of the mass
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        mass = torch.softmax(sorted_logits.float(), dim=-1).cumsum(-1)
        drop = mass - torch.softmax(sorted_logits.float(), dim=-1) >= top_p
        drop[..., 0] = False  # the most likely stays, also for a top_p that is 0 in fp32
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits.float(), dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


@torch.no_grad()
def sample_group(
    model: GPT,
    prompt: list[int],
    n: int,
    max_tokens: int,
    temperature: float,
    gen: torch.Generator,
    stop: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` continuations of one `prompt` sampled side by side through one batched KV cache
    (RL's group, train/rl.py). Returns (tokens (n, max_tokens), lengths (n,)): a row's reply is
    its first `length` tokens, the `stop` token included when it came; after it the row holds
    `stop` (filler). The prompt and max_tokens must fit the context (the caller checks)."""
    device = model.wte.weight.device
    caches = model.new_caches(n, len(prompt) + max_tokens)
    x = torch.tensor([prompt], device=device).expand(n, -1)
    logits = model(x, caches=caches)[:, -1]  # (n, V)
    out = torch.full((n, max_tokens), stop, dtype=torch.long, device=device)
    lengths = torch.full((n,), max_tokens, dtype=torch.long, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    for i in range(max_tokens):
        probs = torch.softmax(tempered(logits, temperature), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        nxt = torch.where(done, stop, nxt)  # a finished row only holds filler
        out[:, i] = nxt
        ended = (nxt == stop) & ~done
        lengths[ended] = i + 1
        done |= ended
        if bool(done.all()) or i + 1 == max_tokens:
            break
        logits = model(nxt[:, None], caches=caches)[:, -1]
    return out, lengths
