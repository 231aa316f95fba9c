"""The fast CORE harness against the slow per-prompt reference, and its reports."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import SHARED, make_task_dir
from littlelm.data.tokenizer import BPEConfig, BPETokenizer
from littlelm.eval.core import (
    EvalOptions,
    Row,
    batches,
    decide,
    evaluate_suite,
    evaluate_task,
    format_table,
    is_full_core,
    load_suite,
    task_items,
)
from littlelm.eval.reference import reference_decisions
from littlelm.eval.tasks import load_task_list, resolve_bundle
from littlelm.model.gpt import GPT, GPTConfig

DEV = SHARED / "data" / "eval_dev"


def _texts(data_dir) -> list[str]:
    out = []
    for path in sorted(data_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines()[:200]:
            out.extend(v for v in json.loads(line).values() if isinstance(v, str))
    return out


def tiny_model(vocab: int, context: int) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        name="gpt", vocab_size=vocab, n_layer=2, d_model=32, n_head=2, max_seq_len=context
    )
    model = GPT(cfg)
    with torch.no_grad():  # break the identity init so that choices get distinct losses
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = make_task_dir(tmp_path_factory.mktemp("synthetic"))
    tok = BPETokenizer.train(
        BPEConfig(name="bpe", vocab_size=300, train_chars=1000), iter(_texts(d) * 3)
    )
    return d, tok


@pytest.fixture(scope="module")
def dev_tokenizer():
    if not DEV.is_dir():
        pytest.skip("needs ../shared/data/eval_dev")
    return BPETokenizer.train(
        BPEConfig(name="bpe", vocab_size=512, train_chars=200_000), iter(_texts(DEV))
    )


def assert_matches_reference(model, tok, tasks, data_dir, n, mode) -> list:
    results = []
    for task in tasks:
        data = task_items(task, data_dir)
        res = evaluate_task(
            model, tok, task, data, EvalOptions(max_per_task=n, truncation=mode, batch_tokens=2048)
        )
        ref = reference_decisions(model, tok, task, data, res.items, mode)
        assert res.decisions == ref, (
            f"{task.label} ({mode}): fast {res.decisions} != reference {ref}"
        )
        results.append(res)
    return results


@pytest.mark.parametrize("mode", ["crop", "drop_shots"])
def test_dev_suite_decisions_equal_reference(dev_tokenizer, mode):
    """Per-item decisions on the 8 real dev tasks, a context short enough to cut many prompts."""
    listed, data_dir = resolve_bundle(DEV)
    model = tiny_model(dev_tokenizer.vocab_size, context=160)
    results = assert_matches_reference(
        model, dev_tokenizer, load_task_list(listed), data_dir, 6, mode
    )
    cut = [r for r in results if r.truncation.prompts_over]
    assert cut, "the short context should have cut some prompts"
    if mode == "drop_shots":
        assert any(r.truncation.shots_dropped for r in results)


@pytest.mark.parametrize("mode", ["crop", "drop_shots"])
@pytest.mark.parametrize("context", [48, 256])
def test_synthetic_tasks_of_every_type_equal_reference(synthetic, mode, context):
    d, tok = synthetic
    model = tiny_model(tok.vocab_size, context)
    results = assert_matches_reference(model, tok, load_task_list(d / "tasks.yaml"), d, 12, mode)
    assert [r.task_type for r in results] == ["multiple_choice", "schema", "language_modeling"]
    assert any(r.truncation.prompts_over for r in results) == (context == 48)


def test_mc_decision_is_the_lowest_mean_loss_over_the_choice(synthetic):
    """Hand-check one item: mean loss over the choice's own tokens, from the plain forward."""
    d, tok = synthetic
    task = load_task_list(d / "tasks.yaml")[0]
    data = task_items(task, d)
    model = tiny_model(tok.vocab_size, 512)
    res = evaluate_task(model, tok, task, data, EvalOptions(max_per_task=1))
    from littlelm.eval.prompts import PromptBuilder

    item = PromptBuilder(task, data, tok, 512, "crop").build(0)
    means = []
    with torch.no_grad():
        for p, (s, e) in zip(item.tokens, item.spans):
            logp = torch.log_softmax(model(torch.tensor([p]))[0], -1)
            means.append(-sum(logp[j - 1, p[j]].item() for j in range(s, e)) / (e - s))
    assert res.decisions == [min(range(len(means)), key=means.__getitem__)]


def test_truncation_report_and_warning(synthetic):
    d, tok = synthetic
    model = tiny_model(tok.vocab_size, 48)
    logs: list[str] = []
    suite = evaluate_suite(
        model,
        tok,
        load_suite(load_task_list(d / "tasks.yaml"), d),
        EvalOptions(max_per_task=8),
        logs.append,
    )
    mc = suite.tasks[0]
    assert mc.truncation.share == 1.0 and mc.truncation.items_cropped == 8
    assert any("mc_words" in m and "exceed the model's 48-token context" in m for m in logs)
    assert "drop_shots" in " ".join(logs)
    table = format_table(suite)
    assert "mc_words" in table and "100.0%: 8 cropped" in table and "mean centered" in table
    quiet_logs: list[str] = []
    quiet = evaluate_suite(
        model,
        tok,
        load_suite(load_task_list(d / "tasks.yaml"), d),
        EvalOptions(max_per_task=8, warn_share=1.0),
        quiet_logs.append,
    )
    assert quiet.tasks[0].truncation.share == 1.0 and not quiet_logs


def test_accuracy_centered_and_core_flag(synthetic):
    d, tok = synthetic
    model = tiny_model(tok.vocab_size, 256)
    tasks = load_task_list(d / "tasks.yaml")
    suite = evaluate_suite(
        model, tok, load_suite(tasks, d), EvalOptions(max_per_task=10), lambda m: None
    )
    for task, t in zip(tasks, suite.tasks):
        items = task_items(task, d)[:10]
        if t.task_type == "language_modeling":
            right = [dec is True for dec in t.decisions]
        else:
            right = [dec == it["gold"] for dec, it in zip(t.decisions, items)]
        assert t.items == 10 and t.accuracy == sum(right) / 10
        rb = t.random_baseline / 100
        assert t.centered == pytest.approx((t.accuracy - rb) / (1 - rb))
    assert suite.mean_centered == pytest.approx(sum(t.centered for t in suite.tasks) / 3)
    assert not suite.is_core and "CORE needs all 22" in format_table(suite)
    assert is_full_core(load_task_list()) and not is_full_core(load_task_list()[:21])


def test_decide_ties_go_to_the_lowest_index():
    assert decide("multiple_choice", [2.0, 1.0, 1.0], [False] * 3) == 1
    assert decide("schema", [1.0 + 1e-7, 1.0], [False] * 2) == 0  # float noise is a tie
    assert decide("multiple_choice", [1.001, 1.0], [False] * 2) == 1
    assert decide("language_modeling", [math.nan], [True]) is True


def test_batches_respect_the_token_budget():
    rows = [Row([0] * n, [], [], [], [], []) for n in [5, 40, 12, 40, 3, 100]]
    groups = batches(rows, batch_tokens=80)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        lengths = [len(rows[i].tokens) for i in g]
        assert lengths == sorted(lengths, reverse=True)
        assert len(g) == 1 or len(g) * lengths[0] <= 80


def fake_core_bundle(root, n: int = 12):
    """Synthetic items at every packaged CORE path (the real bundle is not shipped)."""
    for spec in load_task_list():
        path = root / "eval_data" / spec.dataset_uri
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        for i in range(n):
            if spec.icl_task_type == "multiple_choice":
                rows.append({"query": f"q{i}", "choices": ["ab", "cd", "ef"], "gold": i % 3})
            elif spec.icl_task_type == "schema":
                rows.append({"context_options": ["x", "y"], "continuation": f"z{i}", "gold": i % 2})
            else:
                rows.append({"context": f"c{i}", "continuation": f" {i}"})
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_full_core_suite_reports_core(tmp_path):
    from littlelm.data.tokenizer import ByteTokenizer
    from littlelm.eval.run import tasks_and_data

    tasks, data_dir = tasks_and_data(fake_core_bundle(tmp_path / "eb"), None, None)
    assert data_dir == tmp_path / "eb" / "eval_data" and len(tasks) == 22
    tok, model = ByteTokenizer(), tiny_model(257, 128)
    suite = evaluate_suite(model, tok, load_suite(tasks, data_dir), EvalOptions(), lambda m: None)
    assert suite.is_core and f"CORE {suite.mean_centered:.4f}" in format_table(suite)
    part = evaluate_suite(
        model, tok, load_suite(tasks, data_dir), EvalOptions(max_per_task=5), lambda m: None
    )
    assert not part.is_core
