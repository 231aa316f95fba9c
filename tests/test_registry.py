"""Components are chosen by `name:` among the config classes a field's type offers (a union,
littlelm/config.py); callbacks alone come from an open table (littlelm/registry.py)."""

import pytest
from pydantic import TypeAdapter

from littlelm.config import Cfg, validate
from littlelm.errors import ConfigError
from littlelm.optim.groups import AdamWConfig, MuonConfig, OptimizerChoice
from littlelm.schema import RunConfig, components


def test_every_kind_of_component_offers_its_choices():
    kinds = components()
    for kind in ("model", "optimizer", "schedule", "tokenizer", "dataset", "callback"):
        assert kinds[kind], kind
    assert [name for name, _ in kinds["optimizer"]] == ["adamw", "muon"]
    assert all(doc for rows in kinds.values() for _, doc in rows)  # `littlelm list` says each


def test_an_unknown_name_says_did_you_mean_and_lists_the_known():
    with pytest.raises(ConfigError) as e:
        validate(
            RunConfig,
            {"optimizer": {"name": "adamx"}, "data": {"sources": {"a": {"name": "txt"}}}},
            {"optimizer.name": "run.yaml", "data.sources.a.name": "base.yaml"},
        )
    problems = e.value.problems
    assert (
        "optimizer.name (run.yaml): unknown optimizer 'adamx' (did you mean 'adamw'?); "
        "known optimizers: adamw, muon" in problems
    )  # both problems at once, each with its file
    assert any(
        p.startswith("data.sources.a.name (base.yaml): unknown dataset 'txt'") for p in problems
    )


def test_a_name_picks_its_class_and_the_class_builds():
    cfg = validate(RunConfig, {"optimizer": {"name": "adamw", "lr": 0.01}})
    assert type(cfg.optimizer) is AdamWConfig and cfg.optimizer.lr == 0.01
    assert type(validate(RunConfig, {}).optimizer) is MuonConfig  # the field's default
    assert TypeAdapter(OptimizerChoice).validate_python({"name": "muon"}) == MuonConfig()


def test_pydantics_own_union_error_is_said_as_ours():
    class Holder(Cfg):
        opt: OptimizerChoice  # a union field without the Kind marker: pydantic validates it

    with pytest.raises(ConfigError) as e:
        validate(Holder, {"opt": {"name": "muom"}})
    (problem,) = e.value.problems
    assert problem == (
        "opt.name: unknown component 'muom' (did you mean 'muon'?); known components: adamw, muon"
    )
