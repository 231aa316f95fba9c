"""Prompts of an in-context-learning item: few-shot sampling, rendering, scored spans, fitting.

An item becomes one prompt per choice (multiple_choice), per context option (schema) or one
prompt (language_modeling). Each prompt is BOS, then `num_fewshot` solved examples each followed
by the task's example delimiter (a blank line unless the task list says otherwise), then the item:

    multiple_choice:    {query}{delim}{choice}
    schema:             {context_option}{delim}{continuation}
    language_modeling:  {context, stripped}{delim}{continuation}

The scored span of a prompt is the tokens being judged: a choice's tokens after the prefix all
choices share; the continuation that all context options share; the continuation of a
language-modeling item (the tokens after the prompt without it, stripped of trailing spaces).
Every span holds at least one token.

When the longest prompt of an item exceeds the model's context, it is fitted and the fitting is
recorded (`Fit`), never silent:

- `crop` removes the same number of tokens from every prompt of the item, right after BOS (the
  oldest few-shot text first), the fewest that make the longest prompt fit;
- `drop_shots` removes whole few-shot examples, the ones farthest from the item first, until it
  fits, and crops only when the item alone is too long.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from littlelm.eval.tasks import TaskSpec

Truncation = Literal["crop", "drop_shots"]
FEWSHOT_SEED = 1234  # item i draws its examples with random.Random(1234 + i), as nanochat


def fewshot_indices(index: int, n_items: int, k: int) -> list[int]:
    """k distinct example indices for item `index` of `n_items`, never `index` itself.

    Equal to sampling from the list of all other indices (nanochat's rule), in O(k): position p
    of that list holds p, or p + 1 from `index` on.
    """
    if k == 0:
        return []
    picks = random.Random(FEWSHOT_SEED + index).sample(range(n_items - 1), k)
    return [p + (p >= index) for p in picks]


def render(task: TaskSpec, item: dict, shots: list[dict]) -> tuple[list[str], str]:
    """(full prompt texts, few-shot prefix text). Language modeling gives [without, with]."""
    d, e = task.continuation_delimiter, task.example_delimiter
    kind = task.icl_task_type
    if kind == "multiple_choice":
        prefix = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}{e}" for s in shots)
        return [f"{prefix}{item['query']}{d}{c}" for c in item["choices"]], prefix
    if kind == "schema":
        prefix = "".join(
            f"{s['context_options'][s['gold']]}{d}{s['continuation']}{e}" for s in shots
        )
        cont = item["continuation"]
        return [f"{prefix}{o}{d}{cont}" for o in item["context_options"]], prefix
    prefix = "".join(f"{s['context'].strip()}{d}{s['continuation']}{e}" for s in shots)
    without = f"{prefix}{item['context'].strip()}{d}"
    return [without.strip(), without + item["continuation"]], prefix


def common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def common_suffix(seqs: list[list[int]]) -> int:
    return common_prefix([s[::-1] for s in seqs])


def spans_of(kind: str, tokens: list[list[int]]) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """(prompts, scored [start, end) per prompt) from the tokenized texts of `render`."""
    if kind == "language_modeling":
        without, with_ = tokens
        start = min(common_prefix([without, with_]), len(with_) - 1)
        return [with_], [(start, len(with_))]
    shortest = min(len(t) for t in tokens)
    if kind == "multiple_choice":
        start = min(common_prefix(tokens), shortest - 1)
        return tokens, [(start, len(t)) for t in tokens]
    suffix = min(common_suffix(tokens), shortest - 1)
    return tokens, [(len(t) - suffix, len(t)) for t in tokens]


@dataclass
class Fit:
    """How an item's prompts were made to fit the context."""

    over: bool = False  # the full prompts did not fit
    dropped: int = 0  # few-shot examples removed
    cropped: int = 0  # tokens removed from each prompt, right after BOS
    into_item: bool = False  # the crop reached past the few-shot examples into the item
    span_cut: bool = False  # the crop reached into a scored span


@dataclass
class ItemPrompts:
    tokens: list[list[int]]  # one per prompt; each starts with BOS and fits the context
    spans: list[tuple[int, int]]  # scored target positions [start, end) per prompt
    gold: int | None  # None for language modeling
    fit: Fit = field(default_factory=Fit)


class PromptBuilder:
    """Builds the fitted, tokenized prompts of a task's items."""

    def __init__(
        self, task: TaskSpec, data: list[dict], tokenizer, context: int, truncation: Truncation
    ):
        self.task, self.data, self.tok = task, data, tokenizer
        self.context, self.truncation = context, truncation

    def encode(self, texts: list[str]) -> list[list[int]]:
        bos = self.tok.bos_id
        return [[bos, *ids] for ids in self.tok.encode_batch(texts)]

    def build(self, index: int) -> ItemPrompts:
        """The prompts of item `index` of the (shuffled) task data."""
        item = self.data[index]
        shots = [
            self.data[j] for j in fewshot_indices(index, len(self.data), self.task.num_fewshot)
        ]
        texts, prefix = render(self.task, item, shots)
        prompts, spans = spans_of(self.task.icl_task_type, self.encode(texts))
        gold = item.get("gold") if self.task.icl_task_type != "language_modeling" else None
        fit = Fit()
        if max(len(p) for p in prompts) > self.context:
            fit.over = True
            if self.truncation == "drop_shots" and shots:
                prompts, spans, prefix = self._drop_shots(item, shots, fit)
            prompts, spans = self._crop(prompts, spans, prefix, fit)
        return ItemPrompts(prompts, spans, gold, fit)

    def _drop_shots(self, item: dict, shots: list[dict], fit: Fit):
        """Fewest whole examples removed (farthest from the item first) to fit, or all of them."""
        for keep in range(len(shots) - 1, -1, -1):
            texts, prefix = render(self.task, item, shots[len(shots) - keep :])
            prompts, spans = spans_of(self.task.icl_task_type, self.encode(texts))
            fit.dropped = len(shots) - keep
            if max(len(p) for p in prompts) <= self.context:
                break
        return prompts, spans, prefix

    def _crop(self, prompts, spans, prefix: str, fit: Fit):
        """Remove the same number of tokens after BOS from each prompt so the longest fits.

        A prompt shorter than the cut (choices whose lengths differ by more than the context)
        keeps BOS and its last token.
        """
        cut = max(len(p) for p in prompts) - self.context
        if cut <= 0:
            return prompts, spans
        fit.cropped = cut
        fit.into_item = cut > len(self.tok.encode(prefix)) if prefix else True
        cuts = [min(cut, len(p) - 2) for p in prompts]
        fit.span_cut = any(s - c < 1 for (s, _), c in zip(spans, cuts))
        prompts = [[p[0], *p[1 + c :]] for p, c in zip(prompts, cuts)]
        spans = [(max(1, s - c), e - c) for (s, e), c in zip(spans, cuts)]
        return prompts, spans
