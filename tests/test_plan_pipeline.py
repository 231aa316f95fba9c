"""`littlelm plan STAGE.yaml STAGE.yaml ...`: a pipeline's stages planned together per GPU kind
and count, the deadline's choice, and a stage whose base is not trained yet (plan/pipeline.py)."""

from __future__ import annotations

import json

import pytest

from littlelm.cli import main
from littlelm.errors import LittleLMError
from littlelm.plan.cost import load_catalog, plan_gpu
from littlelm.plan.dims import Dims
from littlelm.plan.pipeline import load_stages, plan_pipeline
from littlelm.schema import load_run
from tests.conftest import tiny_tree, write_config


@pytest.fixture
def stages(tmp_path, corpus):
    """A tiny pretraining run and an SFT of it whose tokenizer and base are that run's
    directory, which does not exist yet."""
    runs = tmp_path / "runs"
    base = write_config(tmp_path / "base.yaml", tiny_tree(corpus, runs, train={"max_steps": 600}))
    sft = tiny_tree(
        corpus,
        runs,
        run={"name": "tiny-sft"},
        data={"tokenizer": {"name": "saved", "path": str(runs / "tiny")}},
        train={"max_steps": 40},
    )
    sft["sft"] = {"base": str(runs / "tiny")}
    return base, write_config(tmp_path / "sft.yaml", sft)


def test_a_stage_whose_base_is_not_trained_is_planned_from_the_earlier_stage(stages):
    base, sft = stages
    with pytest.raises(LittleLMError, match="no tokenizer"):  # alone, it cannot be resolved
        load_run(sft)
    (_, base_cfg), (stage, sft_cfg) = load_stages([str(base), str(sft)])
    assert "stage tiny's config" in stage.based_on
    assert sft_cfg.model.vocab_size == base_cfg.model.vocab_size
    assert sft_cfg.sft is not None  # still planned as a fine-tuning run


def test_each_stage_is_priced_per_gpu_kind_and_count_and_the_totals_add_up(
    stages, tmp_path, monkeypatch
):
    monkeypatch.setenv("LITTLELM_CACHE", str(tmp_path / "cache"))  # no other test's benches
    base, sft = stages
    cat = load_catalog()
    loaded = load_stages([str(base), str(sft)])
    p = plan_pipeline(loaded, cat, ["H100-SXM", "A100-80GB"], counts=(1, 2), trace=False)
    assert {(o.gpu, o.devices) for o in p.options} == {
        (g, n) for g in ("H100-SXM", "A100-80GB") for n in (1, 2)
    }
    h100 = next(o for o in p.options if (o.gpu, o.devices) == ("H100-SXM", 1))
    for (_, cfg), sp in zip(loaded, h100.stages, strict=True):
        d = Dims.of(cfg.with_precision(True))
        tokens = cfg.train.max_steps * cfg.train.batch_tokens
        alone = plan_gpu(d, cat.gpus["H100-SXM"], cat, tokens, with_methods=False)
        assert sp.tokens == tokens and sp.plan.hours == pytest.approx(alone.hours)
        assert sp.plan.dollars == pytest.approx(alone.hours * cat.gpus["H100-SXM"].price_per_hour)
    assert h100.hours == pytest.approx(sum(s.plan.hours for s in h100.stages))
    assert h100.dollars == pytest.approx(sum(s.plan.dollars for s in h100.stages))
    two = next(o for o in p.options if (o.gpu, o.devices) == ("H100-SXM", 2))
    assert two.dollars == pytest.approx(sum(s.plan.hours * 2 * 2.69 for s in two.stages), rel=0.01)
    # no deadline: the cheapest of all; the options come cheapest first
    assert p.choice is p.options[0]
    assert [o.dollars for o in p.options] == sorted(o.dollars for o in p.options)


def test_a_deadline_picks_the_cheapest_in_time_or_says_none_is_and_what_comes_closest(stages):
    base, sft = stages
    cat = load_catalog()
    loaded = load_stages([str(base), str(sft)])
    every = plan_pipeline(loaded, cat, ["H100-SXM", "A100-80GB"], counts=(1, 2), trace=False)
    hours = sorted(o.hours for o in every.options)
    deadline = (hours[0] + hours[1]) / 2  # only the fastest option finishes in time
    p = plan_pipeline(loaded, cat, ["H100-SXM", "A100-80GB"], (1, 2), deadline, trace=False)
    fastest = min(p.options, key=lambda o: o.hours)
    assert p.choice is not None and p.choice.hours == fastest.hours
    in_time = [o for o in p.options if o.hours <= deadline]
    assert p.choice.dollars == min(o.dollars for o in in_time)
    none = plan_pipeline(loaded, cat, ["H100-SXM", "A100-80GB"], (1, 2), 1e-9, trace=False)
    assert none.choice is None and none.closest is not None
    assert none.closest.hours == fastest.hours


def test_plan_of_several_stages_on_the_command_line(stages, capsys):
    base, sft = stages
    args = ["plan", str(base), str(sft), "--gpu", "H100-SXM", "--no-trace"]
    assert main([*args, "--deadline", "1000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # exactly one JSON document
    assert doc["deadline_hours"] == 1000
    assert [s["name"] for s in doc["stages"]] == ["tiny", "tiny-sft"]
    assert "tiny's config" in doc["stages"][1]["planned_from"]
    choice = doc["choice"]
    assert choice["gpu"] == "H100-SXM" and choice["in_time"]
    assert choice["dollars"] == pytest.approx(sum(s["dollars"] for s in choice["stages"]))
    assert main([*args, "--deadline", "1e-9"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no GPU kind and count finishes within 1e-09 h; closest:" in out
    # the SFT alone, its base not trained: the error says to name the stage that trains it
    assert main(["plan", str(sft), "--deadline", "10", "--no-trace"]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "not trained yet: name the stage that trains it first" in err


def test_one_stage_whose_base_has_only_its_config_on_disk_is_planned_from_it(stages, capsys):
    base, sft = stages
    assert main(["plan", str(sft), "--no-trace", "--gpu", "H100-SXM"]) == 2  # base not trained
    assert "not trained yet: name the stage that trains it first" in capsys.readouterr().err
    run_dir = load_run(base).run_dir()
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(base.read_text())  # what a run writes before its steps
    ((stage, cfg),) = load_stages([str(sft)])
    assert "config.yaml (no checkpoint yet)" in stage.based_on
    assert cfg.model.vocab_size == load_run(base).model.vocab_size
    assert main(["plan", str(sft), "--no-trace", "--gpu", "H100-SXM"]) == 0


def test_epochs_of_a_stage_whose_base_is_not_trained_are_refused_naming_max_steps(stages):
    base, sft = stages
    with pytest.raises(LittleLMError, match="plan it with train.max_steps=N"):
        load_stages([str(base), str(sft)], ["train.max_steps=null", "train.epochs=1"])
