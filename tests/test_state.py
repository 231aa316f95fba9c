"""The Trainer's explicit state (train/checkpoint/state.py) and the checkpointer that saves and restores it
(train/checkpoint/save_restore.py)."""

from __future__ import annotations

import json
import math

import torch

from conftest import tiny_tree, write_config
from littlelm.data.loader import Batch
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.checkpoint.state import Window
from littlelm.train.guard import Verdict
from littlelm.train.trainer import Trainer

# state.json's keys, as checkpoints of every earlier littlelm wrote them (one process)
STATE_JSON_KEYS = {
    "format_version",
    "step",
    "tokens",
    "train_time",
    "loader",
    "tokenizer",
    "data_files",
    "config",
    "guard",
}


def run_cfg(tmp_path, corpus):
    tree = tiny_tree(
        corpus, tmp_path / "runs", train={"max_steps": 6}, eval={"every": 0, "at_end": False}
    )
    return load_run(write_config(tmp_path / "run.yaml", tree))


def test_state_json_keeps_its_keys_and_a_resume_restores_every_field(tmp_path, corpus):
    cfg = run_cfg(tmp_path, corpus)
    first = Trainer(cfg, resume="never")
    first.fit(stop_after=3)  # checkpoint at 3 (checkpoint.every 3)
    path = ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints")
    saved = json.loads((path / "state.json").read_text())
    assert set(saved) == STATE_JSON_KEYS
    assert saved["guard"]["recent"]  # the loss window is in the checkpoint, not empty

    second = Trainer(cfg)
    a, b = first.state, second.state
    assert (
        (b.step, b.tokens, b.train_time)
        == (a.step, a.tokens, a.train_time)
        == (
            3,
            3 * cfg.train.batch_tokens,
            saved["train_time"],
        )
    )
    assert b.loader.state_dict() == a.loader.state_dict() == saved["loader"]
    assert b.guard.state_dict() == a.guard.state_dict() == saved["guard"]
    assert b.last_checkpoint == a.last_checkpoint == path and b.saved_step == 3
    rng = torch.load(path / "rng.pt", weights_only=True)
    assert torch.equal(torch.get_rng_state(), rng["torch"])  # set by the resume


def test_the_trainer_declares_every_attribute_at_construction(tmp_path, corpus):
    """No attribute appears on a Trainer after __init__: the run's changing state lives in
    `trainer.state` (it used to be spread over ~20 attributes a mixin set as it went)."""
    cfg = run_cfg(tmp_path, corpus)
    trainer = Trainer(cfg, resume="never")
    declared = set(vars(trainer))
    trainer.fit()
    assert set(vars(trainer)) == declared
    assert trainer.state.step == trainer.step == 6 and trainer.state.saved_step == 6


def test_a_step_reports_its_verdict_and_leaves_a_rejected_update_out(tmp_path, corpus):
    cfg = run_cfg(tmp_path, corpus)
    trainer = Trainer(cfg, resume="never")
    real = trainer.forward
    trainer.forward = lambda x, y: real(x, y) * math.nan
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    batches = iter(lambda: _batch(trainer), None)
    step = trainer.train_step(batches)
    assert step.verdict is Verdict.SKIP and math.isnan(step.loss.item())
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert trainer.state.step == 1 and all(p.grad is None for p in trainer.model.parameters())
    trainer.forward = real
    step = trainer.train_step(batches)
    assert step.verdict is Verdict.OK and trainer.state.step == 2
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def _batch(trainer: Trainer) -> Batch:
    x, y = trainer.loader.next_batch()
    return Batch(x, y, trainer.loader.snapshot())


def test_mfu_counts_every_row_token_while_tok_per_s_counts_the_trained_ones(tmp_path, corpus):
    """An SFT step trains on a few tokens of its rows (the assistant's) but the model computes
    on all of them: tok/s reports the trained tokens, MFU the work done."""
    trainer = Trainer(run_cfg(tmp_path, corpus))
    s = trainer.state
    window = Window.starting_at(s, torch.device("cpu"))
    s.step, s.tokens, s.train_time = s.step + 4, s.tokens + 100, s.train_time + 2.0  # 4 steps
    m = window.record(s, lambda t: t, flops_per_token=10, peak=1e4, batch_tokens=1000)
    assert m["tok_per_s"] == 50.0  # the 100 trained tokens over 2 s
    assert m["mfu"] == 4 * 1000 / 2.0 * 10 / 1e4  # every row token of the 4 steps
