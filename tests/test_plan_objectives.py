"""The planner plans an objective, not only the language-model step: a DPO run's frozen
reference (a copy, or under LoRA the model with its adapters off) and its two rows a pair, held
to the FakeTensorMode trace of the objective's own loss (train/dpo.py's `loss_of`); an RL run's
reference, its sampling (a group's KV cache, the prompt's forward) and its groups' rows through
RL's own loss (train/rl.py's `group_loss`); as the language-model step is in
test_plan_memory.py."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import write_config
from littlelm.cli import main
from littlelm.plan import memory as mem
from littlelm.plan.dims import Dims
from littlelm.plan.trace import CATEGORIES, FB, KV, OPT, REF, SAMPLE, rl_rows, trace_step
from littlelm.schema import load_run

TOLERANCE = 0.10  # analytic / trace - 1, per category and phase peak (the bound)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny base (a BPE tokenizer with the chat tokens), its SFT tree and preference pairs."""
    from test_chat import sft_trees
    from test_dpo import reversal_pairs, write_jsonl

    tmp = tmp_path_factory.mktemp("objectives")
    base, sft = sft_trees(tmp)
    pairs = write_jsonl(tmp / "pairs.jsonl", reversal_pairs(80))
    return tmp, base, sft, pairs


def dpo_config(runs, name: str, lora: bool, **train):
    from test_dpo import dpo_tree

    tmp, base, sft, pairs = runs
    tree = dpo_tree(tmp, base, copy.deepcopy(sft["model"]), pairs)
    tree["run"]["name"] = name
    if lora:
        tree["lora"] = {}
    tree["train"].update(train)
    return load_run(write_config(tmp / f"{name}.yaml", tree))


def assert_within_tolerance(traced, analytic, categories, phases) -> None:
    """The analytic model within TOLERANCE of the trace on each of `categories` (or both 0)
    and at each of `phases`' peak."""
    for k in categories:
        t, a = traced.categories[k], analytic.categories[k]
        assert (t == a == 0) or abs(a / t - 1) <= TOLERANCE, f"{k}: analytic {a:,} vs trace {t:,}"
    for phase in phases:
        t, a = traced.phases[phase], analytic.phases[phase]
        assert abs(a / t - 1) <= TOLERANCE, f"peak {phase}: analytic {a:,} vs trace {t:,}"


SHAPES = {
    "4 pairs x 64": dict(micro_batch_size=4, seq_len=64),
    "2 pairs x 96": dict(micro_batch_size=2, seq_len=96),
}


@pytest.mark.parametrize("lora", [False, True], ids=["dpo", "lora-dpo"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_dpo_analytic_agrees_with_the_trace_of_its_objective(runs, lora, shape):
    cfg = dpo_config(runs, f"dpo-{lora}-{shape['seq_len']}", lora, **shape)
    traced = trace_step(cfg)
    analytic = mem.estimate(Dims.of(cfg))
    backward = mem.BWD
    if lora:  # a frozen MLP's backward peaks lower (test_plan_lora.py)
        t, a = traced.categories[backward], analytic.categories[backward]
        assert 0.9 < t / a < 1.15, f"{backward}: trace/analytic {t / a:.3f}"
    categories = [k for k in CATEGORIES if not (lora and k == backward)]
    assert_within_tolerance(traced, analytic, categories, (FB, OPT))
    # the reference: a whole copy of the model's weights, or none under LoRA (adapters off)
    params = traced.categories[mem.PARAMS]
    assert (traced.categories[REF] == 0) if lora else (traced.categories[REF] == params)


def test_plan_of_a_dpo_run_is_not_the_sft_runs(runs, capsys):
    """What `plan --json` said before: the same memory for SFT and DPO of one model."""
    tmp, _, sft, _ = runs
    dpo = dpo_config(runs, "dpo-json", False, micro_batch_size=4, seq_len=64)
    tree = copy.deepcopy(sft)
    tree["run"]["name"] = "sft-json"
    tree["train"].update(micro_batch_size=4, seq_len=64)
    sft_path = write_config(tmp / "sft-json.yaml", tree)
    out = {}
    for name, path in (("sft", sft_path), ("dpo", tmp / "dpo-json.yaml")):
        assert main(["plan", str(path), "--json", "--gpu", "A100-80GB"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
    assert dpo.dpo is not None
    plan = {k: v["memory_bytes"]["plan"] for k, v in out.items()}
    assert plan["sft"][REF] == 0
    assert plan["dpo"][REF] == plan["dpo"][mem.PARAMS]
    peak = f"peak {FB}"
    assert plan["dpo"][peak] > 1.5 * plan["sft"][peak]


def test_the_objectives_check_script_holds_its_bound(tmp_path):
    """benchmarks/lora_plan_check.py --objectives cut down to one tiny shape: the analytic peak
    within 10% of the trace's for SFT, LoRA-SFT, DPO and LoRA-DPO, each run as its script does
    (a base and a preference source named, neither read)."""
    from conftest import load_benchmark, make_corpus, tiny_tree

    check = load_benchmark("lora_plan_check.py")
    base = {
        "model": {"n_layer": 2, "d_model": 64, "n_head": 2, "max_seq_len": 128},
        "train": {"micro_batch_size": 2, "seq_len": 128, "max_steps": 2},
    }
    tree = tiny_tree(make_corpus(tmp_path / "corpus.txt"), tmp_path / "runs", **base)
    path = str(write_config(tmp_path / "run.yaml", tree))
    for name, over in check.OBJECTIVES.items():
        _, analytic, traced = check.compare(path, over)
        assert abs(analytic / traced - 1) <= TOLERANCE, f"{name}: {analytic:,} vs {traced:,}"


def test_a_dpo_plans_lora_columns_hold_each_methods_reference(tmp_path):
    """The plan's full / LoRA / QLoRA columns of a DPO run (Dims.with_lora, without_lora): full
    holds a copy of the base as its reference, LoRA none (its adapters off), whichever method
    the run itself was configured with."""
    from conftest import load_benchmark, make_corpus, tiny_tree

    tree = tiny_tree(make_corpus(tmp_path / "corpus.txt"), tmp_path / "runs")
    path = str(write_config(tmp_path / "run.yaml", tree))
    check = load_benchmark("lora_plan_check.py")
    full = Dims.of(load_run(path, check.OBJECTIVES["DPO"]))
    lora = Dims.of(load_run(path, check.OBJECTIVES["LoRA-DPO"]))
    assert full.reference_copy and not lora.reference_copy
    assert not full.with_lora(lora.lora).reference_copy  # the LoRA column of a full DPO plan
    assert lora.without_lora().reference_copy  # the full column of a LoRA-DPO plan
    copy = mem.estimate(full).categories[REF]
    assert copy > 0 and mem.estimate(lora.without_lora()).categories[REF] == copy


@pytest.fixture(scope="module")
def rl_tree(tmp_path_factory):
    """An RL run's tree (test_rl.py's: a few-step SFT base with its saved tokenizer, and
    prompts of reversals)."""
    from test_rl import rl_trees

    tmp = tmp_path_factory.mktemp("rl-plan")
    return tmp, rl_trees(tmp)


def rl_config(rl_tree, name: str, lora: bool, **rl):
    tmp, tree = rl_tree
    tree = copy.deepcopy(tree)
    tree["run"]["name"] = name
    tree["rl"].update(rl)
    if lora:
        tree["lora"] = {}
    return load_run(write_config(tmp / f"{name}.yaml", tree))


RL_SHAPES = {
    "4 replies": dict(group_size=4, max_new_tokens=5),
    "8 replies, iterations 2": dict(group_size=8, max_new_tokens=24, iterations=2),
}


@pytest.mark.parametrize("lora", [False, True], ids=["rl", "lora-rl"])
@pytest.mark.parametrize("shape", RL_SHAPES.values(), ids=RL_SHAPES.keys())
def test_rl_analytic_agrees_with_the_trace_of_its_objective(rl_tree, lora, shape):
    cfg = rl_config(rl_tree, f"rl-{lora}-{shape['group_size']}", lora, **shape)
    traced = trace_step(cfg)
    analytic = mem.estimate(Dims.of(cfg))
    assert set(traced.phases) == set(analytic.phases) == {SAMPLE, FB, OPT}
    # every phase's peak, sampling's too, despite the tiny model's many small tensors
    categories = (mem.PARAMS, REF, mem.GRADS, mem.STATE, mem.ACT, mem.LOSS)
    assert_within_tolerance(traced, analytic, categories, traced.phases)
    params = traced.categories[mem.PARAMS]
    assert (traced.categories[REF] == 0) if lora else (traced.categories[REF] == params)
    assert traced.categories[KV] > 0


def test_rl_rows_are_the_longest_prompt_and_reply_or_the_models_bound(rl_tree, tmp_path):
    """Rows are planned at the longest prompt of rl.prompts (read with the run's tokenizer)
    plus rl.max_new_tokens; with no file to read yet, at the longest the model allows."""
    cfg = rl_config(rl_tree, "rl-rows", False)
    prompt, width, measured = rl_rows(cfg)
    assert measured and width == prompt + cfg.rl.max_new_tokens
    assert prompt < cfg.model.max_seq_len - cfg.rl.max_new_tokens  # the prompts are short
    missing = rl_config(rl_tree, "rl-rows-missing", False, prompts=str(tmp_path / "none.jsonl"))
    assert rl_rows(missing) == (
        missing.model.max_seq_len - missing.rl.max_new_tokens,
        missing.model.max_seq_len,
        False,
    )
    # the planned rows follow: the step's tokens are the groups' rows (inputs: all but one)
    d = Dims.of(cfg)
    assert d.tokens == cfg.rl.group_size * (width - 1)
    assert Dims.of(missing).tokens > d.tokens
    # the plan's summary line says which (read once, kept in the Dims)
    assert d.groups is not None and d.groups.measured
    assert Dims.of(missing).groups is not None and not Dims.of(missing).groups.measured


def test_plan_of_an_rl_run_is_not_the_sft_runs(rl_tree, capsys):
    """`plan --json` of an RL run: its reference, its sampling phase and its groups' rows, where
    it once gave the SFT run's figures."""
    tmp, tree = rl_tree
    rl_config(rl_tree, "rl-json", False, group_size=8, max_new_tokens=24)
    sft = copy.deepcopy(tree)
    del sft["rl"]
    sft["run"]["name"] = "sft-json"
    sft_path = write_config(tmp / "sft-json.yaml", sft)
    out = {}
    for name, path in (("sft", sft_path), ("rl", tmp / "rl-json.yaml")):
        assert main(["plan", str(path), "--json", "--gpu", "A100-80GB"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
    plan = {k: v["memory_bytes"]["plan"] for k, v in out.items()}
    assert plan["sft"][REF] == plan["sft"][KV] == 0 and f"peak {SAMPLE}" not in plan["sft"]
    assert plan["rl"][REF] == plan["rl"][mem.PARAMS]
    assert plan["rl"][KV] > 0 and plan["rl"][f"peak {SAMPLE}"] > 0
    assert plan["rl"][f"peak {FB}"] != plan["sft"][f"peak {FB}"]


@pytest.mark.parametrize("lora", [False, True], ids=["rl", "lora-rl"])
def test_an_rl_runs_measured_peak_is_its_traces(rl_tree, lora):
    """`littlelm bench` runs RL's real step (sampling, rewards, groups) on real tensors: the
    measured tensor peak is what the trace of the same step on this CPU's kernels predicts; its
    step time, mostly sampling, is stored without a speed ratio (no plan calibrates on it)."""
    from littlelm.plan.bench import run_bench

    cfg = rl_config(rl_tree, f"rl-bench-{lora}", lora, group_size=8, max_new_tokens=12)
    r = run_bench(cfg, steps=2)
    assert abs(r["peak_tensor"] / r["predicted_tensor_peak"] - 1) <= TOLERANCE
    assert "speed_ratio" not in r and "predicted_tok_s" not in r


def test_no_fsdp_remedy_where_the_run_refuses_fsdp(rl_tree):
    """A plan's remedies offer FSDP to an SFT run that does not fit, never to an RL run (each rank
    samples its own replies through the whole model: refused under fsdp)."""
    from littlelm.plan.cost import load_catalog, remedies

    tmp, tree = rl_tree
    catalog = load_catalog()
    gpu = catalog.select(["A100-80GB"])[0].model_copy(update={"memory_gib": 1e-4})
    sft = copy.deepcopy(tree)
    del sft["rl"]
    sft["run"]["name"] = "sft-remedies"
    for cfg, offered in (
        (load_run(write_config(tmp / "sft-remedies.yaml", sft)), True),
        (rl_config(rl_tree, "rl-remedies", False), False),
    ):
        names = [r.name for r in remedies(Dims.of(cfg.with_precision(True)), gpu, catalog)]
        assert names and any("strategy=fsdp" in n for n in names) == offered, names


def test_the_references_forward_is_in_the_step_time(tmp_path):
    """A DPO step runs the frozen reference's forward over its rows beside the policy's forward
    and backward: about a third more compute than an SFT step of the same rows."""
    from dataclasses import replace

    from conftest import load_benchmark
    from littlelm.plan import speed
    from littlelm.plan.cost import load_catalog

    check = load_benchmark("lora_plan_check.py")
    d = Dims.of(load_run("demo", check.OBJECTIVES["DPO"]).with_precision(True))
    catalog = load_catalog()
    rates = speed.catalog_rates(catalog.select(["H100-SXM"])[0], catalog, d)
    with_ref = speed.step_time(d, rates).seconds
    assert (
        d.reference
        and 1.2 < with_ref / speed.step_time(replace(d, reference=False), rates).seconds < 1.4
    )
