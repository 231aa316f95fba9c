"""train.epochs (HF's num_train_epochs): the run's steps from the prepared data's size, one
length at a time, said at start and recorded as max_steps in the run's config.yaml."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from conftest import tiny_tree, write_config
from littlelm.cli import main
from littlelm.errors import ConfigError
from littlelm.schema import load_run
from littlelm.train.build import steps_from_epochs
from littlelm.train.dpo import DPOConfig
from littlelm.train.trainer import Trainer


def epochs_config(tmp_path, corpus, **train):
    tree = tiny_tree(corpus, tmp_path / "runs", train={"max_steps": None, **train})
    return write_config(tmp_path / "run.yaml", tree)


@pytest.mark.parametrize("other", ["max_steps=6", "max_tokens=4096", "budget.tokens=4096"])
def test_epochs_and_another_length_are_refused_naming_both(tmp_path, corpus, other):
    path = epochs_config(tmp_path, corpus)
    with pytest.raises(ConfigError) as e:
        load_run(path, ["train.epochs=2", f"train.{other}"])
    key = "train." + other.split("=")[0].split(".")[0]
    assert f"train.epochs and {key} both set the run's length" in str(e.value)
    assert "remove train.epochs" in str(e.value)


def test_no_length_at_all_names_epochs_among_the_fixes(tmp_path, corpus):
    with pytest.raises(
        ConfigError, match="set train.max_steps, train.max_tokens, train.epochs or train.budget"
    ):
        load_run(epochs_config(tmp_path, corpus))


def test_epochs_give_the_steps_from_the_training_tokens(tmp_path, corpus):
    path = epochs_config(tmp_path, corpus)
    cfg = load_run(path, ["train.epochs=0.02"])
    assert cfg.train.max_steps is None  # unknown until the data is prepared
    trainer = Trainer(cfg)
    tokens = sum(s.train_tokens for s in trainer.data.sources.values())
    batch = trainer.cfg.train.batch_tokens
    assert batch == 4 * 32
    steps = math.ceil(0.02 * tokens / batch)
    assert 1 < steps < 10  # the test's corpus: a few steps, not one
    assert trainer.max_steps == steps == trainer.cfg.train.max_steps
    assert trainer.cfg.train.max_tokens == steps * batch
    trainer.fit()
    assert trainer.step == steps
    saved = yaml.safe_load((trainer.run_dir / "config.yaml").read_text())
    assert saved["train"]["max_steps"] == steps and saved["train"]["epochs"] is None
    assert load_run(trainer.run_dir / "config.yaml").train.max_steps == steps
    more = Trainer(load_run(path, ["train.epochs=0.04"]))  # a longer run resumes from it
    assert more.step == steps and more.max_steps > steps
    more.fit()
    assert more.step == more.max_steps


def test_the_start_line_says_the_steps(tmp_path, corpus, capsys):
    cfg = load_run(epochs_config(tmp_path, corpus), ["train.epochs=0.25"])
    Trainer(cfg)
    out = capsys.readouterr()
    assert "train.epochs 0.25: " in out.out + out.err
    assert "tokens per step, rounded up" in out.out + out.err


def test_a_dpo_run_refuses_epochs_naming_max_steps(tmp_path, corpus):
    cfg = load_run(epochs_config(tmp_path, corpus), ["train.epochs=1"])
    dpo = cfg.model_copy(update={"dpo": DPOConfig()})
    with pytest.raises(ConfigError, match="give train.max_steps instead"):
        steps_from_epochs(dpo, data=None, log=print)  # refused before the data is read


def test_plan_counts_the_epochs_as_the_trainer_does(tmp_path, corpus, capsys):
    path = epochs_config(tmp_path, corpus, epochs=0.5)
    main(["plan", str(path), "--json", "--no-trace"])
    out = capsys.readouterr()
    tokens = sum(s.train_tokens for s in Trainer(load_run(path)).data.sources.values())
    steps = math.ceil(0.5 * tokens / (4 * 32))
    assert json.loads(out.out)["tokens"] == steps * 4 * 32  # one document on stdout
    assert f"train.epochs 0.5: {steps} steps" in out.err
