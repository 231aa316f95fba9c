"""Task lists, task files and their errors (littlelm.eval.tasks)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import SHARED
from littlelm.errors import EvalError
from littlelm.eval.tasks import (
    CORE_TASKS,
    TaskSpec,
    bundle_differences,
    load_items,
    load_task_list,
    resolve_bundle,
    select_tasks,
    shuffled,
)

DEV = SHARED / "data" / "eval_dev"

CORE_LABELS = {
    "hellaswag_zeroshot",
    "jeopardy",
    "bigbench_qa_wikidata",
    "arc_easy",
    "arc_challenge",
    "copa",
    "commonsense_qa",
    "piqa",
    "openbook_qa",
    "lambada_openai",
    "hellaswag",
    "winograd",
    "winogrande",
    "bigbench_dyck_languages",
    "agi_eval_lsat_ar",
    "bigbench_cs_algorithms",
    "bigbench_operators",
    "bigbench_repeat_copy_logic",
    "squad",
    "coqa",
    "boolq",
    "bigbench_language_identification",
}


def mc_task(**kw) -> TaskSpec:
    base = dict(
        label="t",
        dataset_uri="t.jsonl",
        icl_task_type="multiple_choice",
        num_fewshot=1,
        random_baseline=25,
    )
    return TaskSpec(**{**base, **kw})


def write_lines(path, lines) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def test_packaged_core_tasks_are_the_22_with_dclm_baselines():
    specs = {s.label: s for s in load_task_list()}
    assert set(specs) == CORE_LABELS
    kinds = [s.icl_task_type for s in specs.values()]
    assert (kinds.count("multiple_choice"), kinds.count("schema")) == (11, 2)
    assert kinds.count("language_modeling") == 9
    assert specs["boolq"].random_baseline == 62 and specs["boolq"].num_fewshot == 10
    assert specs["bigbench_language_identification"].random_baseline == 9.1
    assert specs["commonsense_qa"].random_baseline == 20
    assert specs["jeopardy"].continuation_delimiter == "\nAnswer: "
    assert specs["agi_eval_lsat_ar"].num_fewshot == 3
    assert specs["winograd"].dataset_uri == "language_understanding/winograd_wsc.jsonl"
    assert sum(s.random_baseline == 0 for s in specs.values()) == 9  # every LM task


def test_centered_score():
    t = mc_task(random_baseline=25)
    assert t.centered(0.25) == 0 and t.centered(1.0) == 1
    assert t.centered(0.625) == pytest.approx(0.5)


@pytest.mark.skipif(not DEV.is_dir(), reason="needs ../shared/data/eval_dev")
def test_dev_suite_loads_and_validates():
    listed, data_dir = resolve_bundle(DEV)
    specs = load_task_list(listed)
    assert len(specs) == 8
    for s in specs:
        assert len(load_items(data_dir / s.dataset_uri, s)) > s.num_fewshot


def test_resolve_bundle_layouts(tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "tasks.yaml").write_text("tasks: []")
    assert resolve_bundle(tmp_path / "own") == (tmp_path / "own" / "tasks.yaml", tmp_path / "own")
    (tmp_path / "b" / "eval_data").mkdir(parents=True)
    assert resolve_bundle(tmp_path / "b") == (CORE_TASKS, tmp_path / "b" / "eval_data")
    with pytest.raises(EvalError, match="littlelm eval-bundle"):
        resolve_bundle(tmp_path / "missing")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tasks: [", "malformed YAML"),
        ("other: 1", "non-empty `tasks:`"),
        ("tasks:\n  - {label: a, dataset_uri: a.jsonl, num_fewshot: 0}", "a: icl_task_type"),
        (
            "tasks:\n  - {label: a, dataset_uri: a, icl_task_type: mcq, num_fewshot: 0, random_baseline: 1}",
            "a: icl_task_type",
        ),
        (
            "tasks:\n  - {label: a, dataset_uri: a, icl_task_type: schema, num_fewshot: -1, random_baseline: 1}",
            "a: num_fewshot",
        ),
        (
            "tasks:\n"
            "  - {label: a, dataset_uri: a, icl_task_type: schema, num_fewshot: 0, random_baseline: 1}\n"
            "  - {label: a, dataset_uri: b, icl_task_type: schema, num_fewshot: 0, random_baseline: 1}",
            "listed twice",
        ),
    ],
    ids=["yaml", "no-tasks", "missing-key", "bad-type", "negative-shots", "duplicate"],
)
def test_bad_task_lists_name_the_problem(tmp_path, text, expected):
    path = tmp_path / "tasks.yaml"
    path.write_text(text)
    with pytest.raises(EvalError, match=expected) as e:
        load_task_list(path)
    assert str(path) in str(e.value)


def test_task_list_accepts_llm_foundry_shot_lists(tmp_path):
    path = tmp_path / "tasks.yaml"
    entry = dict(
        label="a",
        dataset_uri="a.jsonl",
        icl_task_type="language_modeling",
        num_fewshot=[10],
        random_baseline=0,
    )
    path.write_text(yaml.safe_dump({"tasks": [entry]}))
    assert load_task_list(path)[0].num_fewshot == 10


def test_select_tasks_keeps_order_and_suggests():
    specs = load_task_list()
    assert [s.label for s in select_tasks(specs, ["piqa", "copa"])] == ["piqa", "copa"]
    assert select_tasks(specs, None) == specs
    with pytest.raises(EvalError, match="did you mean 'hellaswag'"):
        select_tasks(specs, ["helaswag"])


GOOD = json.dumps({"query": "q", "choices": ["a", "b"], "gold": 1})


@pytest.mark.parametrize(
    "lines, expected",
    [
        ([GOOD, "{not json"], ":2: not valid JSON"),
        ([GOOD, "[1, 2]"], ":2: expected a JSON object"),
        ([GOOD, json.dumps({"query": "q", "choices": ["a", "b"]})], ":2: `gold` must be"),
        (
            [json.dumps({"query": "q", "choices": ["a", "b"], "gold": 2}), GOOD],
            ":1: `gold` must be",
        ),
        ([json.dumps({"query": "q", "choices": ["a", "b"], "gold": True}), GOOD], ":1: `gold`"),
        ([json.dumps({"query": "q", "choices": ["a"], "gold": 0}), GOOD], ":1: `choices` must be"),
        ([json.dumps({"query": "q", "choices": ["a", ""], "gold": 0}), GOOD], ":1: every choice"),
        ([json.dumps({"choices": ["a", "b"], "gold": 0}), GOOD], ":1: `query` must be"),
        ([], "no items"),
        ([GOOD], "needs at least 2"),
    ],
    ids=[
        "json",
        "not-object",
        "no-gold",
        "gold-range",
        "gold-bool",
        "one-choice",
        "empty-choice",
        "no-query",
        "empty",
        "too-few-for-shots",
    ],
)
def test_bad_items_name_file_and_line(tmp_path, lines, expected):
    path = tmp_path / "t.jsonl"
    write_lines(path, lines)
    with pytest.raises(EvalError, match=expected) as e:
        load_items(path, mc_task())
    assert str(path) in str(e.value)


def test_schema_and_lm_items_are_checked(tmp_path):
    path = tmp_path / "s.jsonl"
    write_lines(path, [json.dumps({"context_options": ["a", "b"], "continuation": "", "gold": 0})])
    with pytest.raises(EvalError, match=":1: `continuation` must be a non-empty string"):
        load_items(path, mc_task(icl_task_type="schema", num_fewshot=0))
    write_lines(path, [json.dumps({"context": "a", "continuation": 3})])
    with pytest.raises(EvalError, match=":1: `continuation`"):
        load_items(path, mc_task(icl_task_type="language_modeling", num_fewshot=0))


def test_blank_lines_are_skipped_and_missing_file_named(tmp_path):
    path = tmp_path / "t.jsonl"
    write_lines(path, [GOOD, "", "   ", GOOD])
    assert len(load_items(path, mc_task())) == 2
    with pytest.raises(EvalError, match="task t: file not found"):
        load_items(tmp_path / "nope.jsonl", mc_task())


def test_shuffle_is_fixed():
    items = [{"i": i} for i in range(50)]
    assert shuffled(items) == shuffled(items) != items
    assert sorted(x["i"] for x in shuffled(items)) == list(range(50))


def test_bundle_core_yaml_differences_are_reported(tmp_path):
    specs = load_task_list()
    assert bundle_differences(tmp_path, specs) == []
    core = [
        {
            "label": "jeopardy",
            "dataset_uri": "world_knowledge/jeopardy_all.jsonl",
            "num_fewshot": [10],
            "icl_task_type": "language_modeling",
            "continuation_delimiter": "\nAnswer: ",
        },
        {
            "label": "copa",
            "dataset_uri": "commonsense_reasoning/copa.jsonl",
            "num_fewshot": [5],
            "icl_task_type": "multiple_choice",
        },
    ]
    (tmp_path / "core.yaml").write_text(yaml.safe_dump({"icl_tasks": core}))
    diffs = bundle_differences(tmp_path, specs)
    assert len(diffs) == 1 and "copa" in diffs[0] and "5" in diffs[0]
