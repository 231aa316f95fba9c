"""Text generation with a KV cache: temperature, top-k, seeded sampling or greedy decoding."""

from __future__ import annotations

import warnings

import torch

from littlelm.errors import LittleLMError
from littlelm.model.gpt import GPT


def check_sampling(max_tokens: int, temperature: float, top_k: int | None) -> None:
    """Refuse settings that cannot sample (a user error, named)."""
    if max_tokens < 1:
        raise LittleLMError(f"--max-tokens must be at least 1, got {max_tokens}")
    if temperature < 0:
        raise LittleLMError(f"--temperature must be 0 (greedy) or more, got {temperature}")
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
    out: list[int] = []
    for _ in range(max_tokens):
        nxt = pick(logits, temperature, top_k, gen)
        out.append(nxt)
        if nxt == stop or len(out) == max_tokens:
            break
        logits = model(torch.tensor([[nxt]], device=device), caches=caches)[:, -1]
    return out


def pick(logits: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator) -> int:
    """One token id from logits (1, V)."""
    if temperature <= 0:
        return int(logits.argmax(-1))
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits.float(), dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))
