"""A slow, obviously-correct scorer, written independently of core.py to check it.

One prompt at a time: render the text, tokenize it, run the plain causal model over the whole
prompt, take the log-softmax and read off the scored tokens. No batching, no tree rows, no
hidden-state tricks; prompts are rendered here again from the documented rules. The tests and
benchmarks/eval.py require its per-item decisions to equal `core.evaluate_task`'s.
"""

from __future__ import annotations

import random

import torch

from littlelm.eval.tasks import TaskSpec


def few_shots(data: list[dict], i: int, k: int) -> list[dict]:
    others = [j for j in range(len(data)) if j != i]
    return [data[j] for j in random.Random(1234 + i).sample(others, k)] if k else []


def texts(task: TaskSpec, item: dict, shots: list[dict]) -> tuple[list[str], str]:
    """Full prompt texts (language modeling: without and with the continuation), shots text."""
    d, kind, sep = task.continuation_delimiter, task.icl_task_type, task.example_delimiter
    examples = ""
    for s in shots:
        if kind == "multiple_choice":
            examples += s["query"] + d + s["choices"][s["gold"]] + sep
        elif kind == "schema":
            examples += s["context_options"][s["gold"]] + d + s["continuation"] + sep
        else:
            examples += s["context"].strip() + d + s["continuation"] + sep
    if kind == "multiple_choice":
        return [examples + item["query"] + d + c for c in item["choices"]], examples
    if kind == "schema":
        return [examples + o + d + item["continuation"] for o in item["context_options"]], examples
    start = examples + item["context"].strip() + d
    return [start.strip(), start + item["continuation"]], examples


def tokens_and_spans(task: TaskSpec, tokenizer, strs: list[str]):
    toks = [[tokenizer.bos_id, *tokenizer.encode(s)] for s in strs]
    if task.icl_task_type == "language_modeling":
        without, with_ = toks
        same = 0
        while same < len(without) and without[same] == with_[same]:
            same += 1
        return [with_], [(min(same, len(with_) - 1), len(with_))]
    shortest = min(len(t) for t in toks)
    if task.icl_task_type == "multiple_choice":
        same = 0
        while same < shortest and all(t[same] == toks[0][same] for t in toks):
            same += 1
        start = min(same, shortest - 1)
        return toks, [(start, len(t)) for t in toks]
    same = 0
    while same < shortest and all(t[-1 - same] == toks[0][-1 - same] for t in toks):
        same += 1
    same = min(same, shortest - 1)
    return toks, [(len(t) - same, len(t)) for t in toks]


def fitted(task: TaskSpec, tokenizer, item: dict, shots: list[dict], context: int, mode: str):
    """Prompts and spans made to fit `context` by the documented rules."""
    strs, _ = texts(task, item, shots)
    toks, spans = tokens_and_spans(task, tokenizer, strs)
    if mode == "drop_shots":
        kept = len(shots)
        while max(len(t) for t in toks) > context and kept > 0:
            kept -= 1
            strs, _ = texts(task, item, shots[len(shots) - kept :])
            toks, spans = tokens_and_spans(task, tokenizer, strs)
    cut = max(len(t) for t in toks) - context
    if cut > 0:
        cuts = [min(cut, len(t) - 2) for t in toks]
        toks = [[t[0], *t[1 + c :]] for t, c in zip(toks, cuts)]
        spans = [(max(1, s - c), e - c) for (s, e), c in zip(spans, cuts)]
    return toks, spans


@torch.no_grad()
def score_prompt(model, tokens: list[int], span: tuple[int, int], device) -> tuple[float, bool]:
    """(mean loss over the span, whether greedy argmax reproduces every span token)."""
    logits = model(torch.tensor([tokens], device=device))[0].float()  # (T, V)
    logp = torch.log_softmax(logits, dim=-1)
    losses, hits = [], []
    for j in range(*span):
        losses.append(-logp[j - 1, tokens[j]].item())
        hits.append(int(logits[j - 1].argmax()) == tokens[j])
    return sum(losses) / len(losses), all(hits)


def reference_decisions(
    model, tokenizer, task: TaskSpec, data: list[dict], n: int, mode: str = "crop"
) -> list:
    """Decisions for items 0..n-1 of `data` (shuffled task data), one prompt at a time."""
    device = next(model.parameters()).device
    context = model.cfg.max_seq_len
    out: list[bool | int] = []  # language modelling: all tokens right; else the chosen index
    for i in range(n):
        shots = few_shots(data, i, task.num_fewshot)
        toks, spans = fitted(task, tokenizer, data[i], shots, context, mode)
        scored = [score_prompt(model, t, s, device) for t, s in zip(toks, spans)]
        if task.icl_task_type == "language_modeling":
            out.append(scored[0][1])
        else:  # lowest mean loss; near-ties (relative 1e-5, float noise) go to the lowest index
            best = min(m for m, _ in scored)
            tol = 1e-5 * max(1.0, abs(best))
            out.append(next(i for i, (m, _) in enumerate(scored) if m <= best + tol))
    return out
