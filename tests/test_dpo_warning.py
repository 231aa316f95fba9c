"""DPO's over-optimisation warning (train/dpo.py: the chosen replies falling below the reference
while the reward margin rises): the rule on records, and a run made to fail that way (a high lr)
warning on the console's progress line and in `littlelm report`, where a healthy run does not."""

from __future__ import annotations

import io

import pytest
from test_dpo import dpo_tree, records, reversal_pairs, write_jsonl

from conftest import write_config
from littlelm.console import Console
from littlelm.progress import Progress
from littlelm.report import write_report
from littlelm.schema import load_run
from littlelm.train.dpo import CHOSEN_DROP, chosen_drop, over_optimising
from littlelm.train.trainer import Trainer


def test_the_rule_is_chosen_down_per_token_while_the_margin_rises():
    fell = {"logratio_chosen": -0.6, "tokens_chosen": 4.0, "reward_margin": 0.3}
    assert chosen_drop(fell) == pytest.approx(0.6)
    w = over_optimising(fell)
    assert w is not None and "0.60 nats below" in w.what
    assert "-0.60 against the reference's, 0.150 per reply token" in w.advice
    assert "optimizer.lr" in w.advice and "dpo.rpo_alpha" in w.advice
    assert over_optimising({**fell, "logratio_chosen": -0.4}) is None  # within 0.5 nats
    assert over_optimising({**fell, "reward_margin": -0.1}) is None  # the margin did not rise
    assert over_optimising(fell, limit=1.0) is None  # dpo.warn_chosen_drop raised
    assert over_optimising({"loss": 1.0}) is None  # not a DPO record
    held_out = {f"val_{k}": v for k, v in fell.items()}
    assert over_optimising(held_out) is None and over_optimising(held_out, "val_") is not None
    assert CHOSEN_DROP == 0.5


SFT_STEPS = 60


@pytest.fixture(scope="module")
def dpo_runs(tmp_path_factory):
    """Two DPO runs from the same SFT model on the same pairs: one at lr 1e-5 (healthy) and one
    at a lr 3,000 times higher (made to fail: the chosen replies collapse with the rejected
    ones). The SFT model has learnt the task the pairs' chosen replies answer (reversal), so
    they are likely already and DPO can only raise the margin by pushing replies down."""
    from test_chat import sft_trees

    tmp = tmp_path_factory.mktemp("dpo_warning")
    _, sft = sft_trees(tmp)
    sft["train"].update(max_steps=SFT_STEPS, log_every=10)
    sft["eval"] = {"every": 0, "at_end": False}
    sft["checkpoint"] = {"every": 0}
    Trainer(load_run(write_config(tmp / "sft.yaml", sft)), resume="never").fit()
    base = tmp / "runs" / "sft"
    pairs = write_jsonl(tmp / "pairs.jsonl", reversal_pairs(80))
    out = {}
    for name, lr in (("healthy", 1e-5), ("broken", 3e-2)):
        tree = dpo_tree(tmp, base, sft["model"], pairs)
        tree["run"]["name"] = name
        tree["dpo"]["rpo_alpha"] = 0.0  # plain DPO, the loss that fails this way
        tree["optimizer"]["lr"] = lr
        tree["schedule"] = {"name": "constant", "warmup_steps": 0}
        tree["train"].update(max_steps=8, log_every=2)
        tree["eval"] = {"every": 4}
        cfg = load_run(write_config(tmp / f"{name}.yaml", tree))
        text = io.StringIO()
        Trainer(cfg, resume="never", progress=Progress(text), callbacks=(Console(),)).fit()
        out[name] = (cfg.run_dir(), text.getvalue())
    return out


def test_a_run_made_to_fail_warns_on_the_console_and_in_the_report(dpo_runs, tmp_path):
    run_dir, text = dpo_runs["broken"]
    logged = [r for r in records(run_dir) if "loss" in r]
    fired = [r["step"] for r in logged if over_optimising(r)]
    assert fired
    said = f"warning at step {fired[0]}: chosen replies "
    assert said in text and "while the margin rises: the chosen reply's log-prob is" in text
    assert text.count("warning at step") == 1  # said in full once ...
    progress = [line for line in text.splitlines() if line.startswith("step ")]
    tagged = [line for line in progress if "| warning: chosen replies" in line]
    assert len(tagged) == len(fired)  # ... and on each progress line while it holds
    report = write_report([run_dir], tmp_path / "rep").read_text()
    assert f"WARNING (training pairs, {len(fired)} record(s), at step {fired[0]}" in report
    assert "dpo.rpo_alpha" in report


def test_a_healthy_run_does_not_warn(dpo_runs, tmp_path):
    run_dir, text = dpo_runs["healthy"]
    logged = [r for r in records(run_dir) if "loss" in r]
    assert logged and all(chosen_drop(r) < CHOSEN_DROP for r in logged)
    assert "warning at step" not in text and "| warning:" not in text
    assert "warning on the held-out data" not in text
    assert "WARNING" not in write_report([run_dir], tmp_path / "rep").read_text()
