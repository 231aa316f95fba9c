"""Text generation with a KV cache: temperature, top-k, seeded sampling or greedy decoding."""

from __future__ import annotations

import torch

from littlelm.model.gpt import GPT


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
    so it neither consumes nor disturbs the global RNG. Stops early at the `stop` token.
    """
    device = model.wte.weight.device
    limit = model.cfg.max_seq_len
    prompt = prompt[-(limit - 1) :] if len(prompt) >= limit else prompt
    max_tokens = min(max_tokens, limit - len(prompt))
    gen = torch.Generator(device=device)
    if seed is not None:
        gen.manual_seed(seed)
    caches = model.new_caches(1, len(prompt) + max_tokens)
    logits = model(torch.tensor([prompt], device=device), caches=caches)[:, -1]  # (1, V)
    out: list[int] = []
    for _ in range(max_tokens):
        nxt = pick(logits, temperature, top_k, gen)
        out.append(nxt)
        if nxt == stop:
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
