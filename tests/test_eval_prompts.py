"""Few-shot sampling, prompt rendering, scored spans and fitting (littlelm.eval.prompts)."""

from __future__ import annotations

import random

import pytest

from littlelm.data.tokenizer import ByteTokenizer
from littlelm.eval.prompts import PromptBuilder, fewshot_indices, render, spans_of
from littlelm.eval.tasks import TaskSpec

TOK = ByteTokenizer()
BOS = TOK.bos_id


def task(kind="multiple_choice", shots=2, delim=" ") -> TaskSpec:
    return TaskSpec(
        label="t",
        dataset_uri="t.jsonl",
        icl_task_type=kind,
        num_fewshot=shots,
        continuation_delimiter=delim,
        random_baseline=50,
    )


def mc_items(n: int) -> list[dict]:
    return [{"query": f"Q{i}?", "choices": [f"yes{i}", f"no{i}"], "gold": i % 2} for i in range(n)]


@pytest.mark.parametrize("n, k", [(2, 1), (5, 4), (50, 10), (1000, 3)])
def test_fewshot_indices_equal_sampling_from_the_other_items(n, k):
    for i in [0, 1, n // 2, n - 1]:
        naive = random.Random(1234 + i).sample([j for j in range(n) if j != i], k)
        got = fewshot_indices(i, n, k)
        assert got == naive and i not in got and len(set(got)) == k
    assert fewshot_indices(3, 10, 0) == []


def test_render_multiple_choice_with_blank_line_between_examples():
    shots = [
        {"query": "A?", "choices": ["x", "y"], "gold": 1},
        {"query": "B?", "choices": ["z"], "gold": 0},
    ]
    item = {"query": "C?", "choices": ["p", "q"], "gold": 0}
    texts, prefix = render(task(delim="\nAnswer: "), item, shots)
    assert prefix == "A?\nAnswer: y\n\nB?\nAnswer: z\n\n"
    assert texts == [prefix + "C?\nAnswer: p", prefix + "C?\nAnswer: q"]


def test_render_schema_and_language_modeling():
    shot = {"context_options": ["He", "She"], "continuation": "ran.", "gold": 1}
    item = {"context_options": ["The cat", "The dog"], "continuation": "barked.", "gold": 1}
    texts, _ = render(task("schema", 1), item, [shot])
    assert texts == ["She ran.\n\nThe cat barked.", "She ran.\n\nThe dog barked."]
    lm_shot = {"context": " 1+1= ", "continuation": "2"}
    lm_item = {"context": "2+2=\n", "continuation": "4"}
    texts, _ = render(task("language_modeling", 1, delim="\nAnswer: "), lm_item, [lm_shot])
    # contexts are stripped; the prompt without the answer loses its trailing space
    assert texts == ["1+1=\nAnswer: 2\n\n2+2=\nAnswer:", "1+1=\nAnswer: 2\n\n2+2=\nAnswer: 4"]


def enc(texts):
    return [[BOS, *TOK.encode(t)] for t in texts]


def test_spans_cover_what_is_judged():
    mc = enc(["Q? cat", "Q? cow", "Q? c"])
    prompts, spans = spans_of("multiple_choice", mc)
    assert spans == [(4, 7), (4, 7), (4, 5)]  # "Q? c" is shared; the span keeps >= 1 token
    assert all(p[0] == BOS for p in prompts)
    _, spans = spans_of("multiple_choice", enc(["Q? x", "Q? x"]))  # identical choices
    assert spans == [(4, 5), (4, 5)]
    schema = enc(["The cat sat.", "A dog sat."])
    _, spans = spans_of("schema", schema)
    assert [(len(p) - s) for p, (s, _) in zip(schema, spans)] == [5, 5]  # " sat." is shared
    prompts, spans = spans_of("language_modeling", enc(["2+2=", "2+2= 4"]))
    assert prompts == enc(["2+2= 4"]) and spans == [(5, 7)]


def test_prompts_fit_and_report_crop():
    data = mc_items(20)
    b = PromptBuilder(task(shots=3), data, TOK, context=24, truncation="crop")
    full = PromptBuilder(task(shots=3), data, TOK, context=10_000, truncation="crop").build(0)
    item = b.build(0)
    assert item.fit.over and item.fit.cropped > 0 and item.fit.dropped == 0
    assert max(len(p) for p in item.tokens) == 24
    for p, q, (s, e), (fs, fe) in zip(item.tokens, full.tokens, item.spans, full.spans):
        assert p[0] == BOS and p[1:] == q[1 + item.fit.cropped :]  # same cut for every prompt
        assert p[s:e] == q[fs:fe]  # the judged tokens are intact
    assert not item.fit.into_item  # 3 examples are longer than the cut


def test_crop_into_the_item_and_into_the_answer_is_flagged():
    data = [{"query": "Q" * 40, "choices": ["aaaa", "bbbb"], "gold": 0} for _ in range(3)]
    item = PromptBuilder(task(shots=0), data, TOK, context=20, truncation="crop").build(0)
    assert item.fit.into_item and not item.fit.span_cut
    item = PromptBuilder(task(shots=0), data, TOK, context=4, truncation="crop").build(0)
    assert item.fit.span_cut and all(s >= 1 for s, _ in item.spans)


def test_drop_shots_removes_farthest_examples_first():
    data = mc_items(20)
    fitted = PromptBuilder(task(shots=3), data, TOK, context=30, truncation="drop_shots").build(5)
    assert fitted.fit.over and 0 < fitted.fit.dropped <= 3 and fitted.fit.cropped == 0
    shots = [data[j] for j in fewshot_indices(5, 20, 3)]
    kept = shots[fitted.fit.dropped :]  # the examples nearest the item stay
    texts, _ = render(task(shots=3), data[5], kept)
    assert fitted.tokens == enc(texts) and max(len(p) for p in fitted.tokens) <= 30


def test_drop_shots_crops_when_the_item_alone_is_too_long():
    data = [{"query": "Q" * 60, "choices": ["a", "b"], "gold": 0} for _ in range(4)]
    item = PromptBuilder(task(shots=2), data, TOK, context=40, truncation="drop_shots").build(0)
    assert item.fit.dropped == 2 and item.fit.cropped > 0 and item.fit.into_item
    assert max(len(p) for p in item.tokens) == 40


def test_prompts_do_not_depend_on_how_many_items_are_scored():
    """Examples come from the whole task: an item's prompt is the same in a 1-item run."""
    data = mc_items(30)
    b = PromptBuilder(task(shots=10), data, TOK, context=10_000, truncation="crop")
    assert b.build(0).tokens == b.build(0).tokens
    shots = [data[j] for j in fewshot_indices(0, 30, 10)]
    assert b.build(0).tokens == enc(render(task(shots=10), data[0], shots)[0])
