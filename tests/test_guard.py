"""The loss guard: skipped updates, rollback to the last checkpoint, stopping."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_tree, write_config
from littlelm.errors import TrainingError
from littlelm.report.figures import render_figures
from littlelm.report.runs import load_run_dir
from littlelm.schema import load_run
from littlelm.train.callbacks import Callback
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.guard import GuardConfig, LossGuard, Verdict
from littlelm.train.trainer import Trainer


def test_verdicts():
    g = LossGuard(GuardConfig(max_consecutive=2, max_rollbacks=1, spike_factor=2, spike_window=2))
    assert g.verdict(3.0, 1.0) is Verdict.OK
    assert g.verdict(9.0, 1.0) is Verdict.OK  # window not full yet: no spike test
    assert g.verdict(math.nan, 1.0) is Verdict.SKIP and "loss is nan" in g.reason
    assert g.verdict(2.0, math.inf) is Verdict.ROLLBACK and "gradient norm is inf" in g.reason
    g.rolled_back({"recent": [3.0, 3.0]})
    assert g.rollbacks == 1 and g.in_a_row == 0 and g.skipped_total == 2
    assert g.verdict(6.5, 1.0) is Verdict.SKIP and "2.2x the mean" in g.reason  # > 2 x 3.0
    assert g.verdict(math.inf, None) is Verdict.STOP  # max_rollbacks used up
    assert g.take_window() == 2 and g.take_window() == 0  # the rollback reset the window
    again = LossGuard(g.cfg)
    again.load_state_dict(json.loads(json.dumps(g.state_dict())))
    assert again.state_dict() == g.state_dict()


def test_stop_policy():
    g = LossGuard(GuardConfig(max_consecutive=1, on_persistent="stop"))
    assert g.verdict(math.nan, None) is Verdict.STOP


def run_cfg(tmp_path, corpus, name="tiny", max_steps=8, **sections):
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        run={"name": name},
        train={"max_steps": max_steps},
        eval={"every": 0, "at_end": False},
        **sections,
    )
    return load_run(write_config(tmp_path / f"{name}.yaml", tree))


def batches_of(trainer: Trainer, steps: set[int]) -> list[torch.Tensor]:
    """The inputs the loader gives at these steps (1-based; grad_accum 1)."""
    c = trainer.cfg
    loader = trainer.data.loader(c.data, c.train.micro_batch_size, c.train.seq_len, c.run.seed)
    xs = [loader.next_batch()[0] for _ in range(max(steps))]
    return [xs[s - 1] for s in sorted(steps)]


def poison(trainer: Trainer, bad: list[torch.Tensor], factor: float = math.nan, crash=None):
    """Make the loss of these batches `factor` times too large (NaN by default): a bad batch
    stays bad whenever it is seen. `crash` raises on that batch instead (a dying process)."""
    real = trainer.forward

    def forward(x, y):
        loss = real(x, y)
        if crash is not None and torch.equal(x, crash):
            raise RuntimeError("the machine died")
        return loss * factor if any(torch.equal(x, b) for b in bad) else loss

    trainer.forward = forward
    return trainer


def train_records(cfg, kind="train"):
    lines = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def guard_points(cfg, out) -> dict[str, list[tuple[float, float]]]:
    """The points `littlelm report` draws in guard.png, by line label, x in optimizer steps
    (the plot's x axis is thousands of tokens seen)."""
    per_step = cfg.train.batch_tokens / 1000
    figs = {f.key: f.figure for f in render_figures([load_run_dir(cfg.run_dir())], out)}
    assert (out / "guard.png").is_file()
    return {
        line.get_label(): [(round(x / per_step, 6), y) for x, y in line.get_xydata().tolist()]
        for ax in figs["guard"].axes
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def test_nan_step_is_skipped_counted_and_the_data_moves_on(tmp_path, corpus):
    cfg = run_cfg(tmp_path, corpus, "skip")
    t = Trainer(cfg, resume="never")
    poison(t, batches_of(t, {3}))
    t.fit(stop_after=3)
    clean = run_cfg(tmp_path, corpus, "clean")
    Trainer(clean, resume="never").fit(stop_after=2)

    skipped = ckpt.load_checkpoint(cfg.run_dir() / "checkpoints" / "step_000003")
    before = ckpt.load_checkpoint(clean.run_dir() / "checkpoints" / "step_000002")
    # the update of step 3 was left out: weights and optimizer state are those after step 2
    assert all(torch.equal(skipped.model[k], before.model[k]) for k in before.model)
    a, b = skipped.optimizer, before.optimizer
    assert a["state"].keys() == b["state"].keys()
    for k, st in a["state"].items():
        assert all(torch.equal(t, b["state"][k][name]) for name, t in st.items())
    assert skipped.state["loader"] != before.state["loader"]  # but its batch was consumed
    assert skipped.state["guard"]["skipped_total"] == 1
    rec = train_records(cfg)[-1]
    assert rec["step"] == 3 and rec["skipped"] == 1 and rec["loss"] is None

    result = Trainer(cfg).fit()  # the count survives a resume
    assert result["finished"] and result["skipped_steps"] == 1
    assert train_records(cfg, "end")[0]["skipped_steps"] == 1
    assert all("skipped" not in r for r in train_records(cfg) if r["step"] != 3)
    points = guard_points(cfg, tmp_path / "report")
    assert list(points.values()) == [[(3, 1)]]  # the report shows the skip at step 3


def test_loss_spike_is_skipped(tmp_path, corpus, capsys):
    cfg = run_cfg(tmp_path, corpus, guard={"spike_factor": 2.0, "spike_window": 3})
    t = Trainer(cfg, resume="never")
    poison(t, batches_of(t, {6}), factor=10.0)
    result = t.fit()
    assert result["skipped_steps"] == 1 and result["rollbacks"] == 0
    assert "step 6: update skipped, loss" in capsys.readouterr().out


class WeightsAtRollback(Callback):
    def on_rollback(self, trainer, info):
        self.info = info
        self.weights = {k: v.clone() for k, v in ckpt.model_tensors(trainer.model).items()}


def rollback_cfg(tmp_path, corpus, name="rb", **guard):
    return run_cfg(
        tmp_path,
        corpus,
        name,
        checkpoint={"every": 3, "keep_last": 5},
        guard={"max_consecutive": 2, **guard},
    )


def test_persistent_nans_roll_back_past_the_bad_batches(tmp_path, corpus):
    cfg = rollback_cfg(tmp_path, corpus)
    t = Trainer(cfg, resume="never")
    seen = WeightsAtRollback()
    t.callbacks.append(seen)
    poison(t, batches_of(t, {5, 6}))
    result = t.fit()
    assert result["finished"] and result["rollbacks"] == 1 and result["skipped_steps"] == 2
    assert seen.info["step"] == 3 and seen.info["failed_at"] == 6
    assert all(r["loss"] is not None for r in train_records(cfg))
    at_3 = load_file(cfg.run_dir() / "checkpoints" / "step_000003" / "model.safetensors")
    assert all(torch.equal(seen.weights[k], at_3[k]) for k in at_3)

    # steps 4-8 after the rollback trained on the batches of steps 7-11: 4-6 were skipped
    clean = run_cfg(tmp_path, corpus, "clean11", max_steps=11)
    Trainer(clean, resume="never").fit()
    end = ckpt.load_checkpoint(cfg.run_dir() / "checkpoints" / "step_000008")
    end11 = ckpt.load_checkpoint(clean.run_dir() / "checkpoints" / "step_000011")
    assert end.state["loader"] == end11.state["loader"]

    # metrics: the abandoned steps 4-6 are replaced by a rollback record and the new 4-8
    lines = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    kinds = [(r["kind"], r["step"]) for r in map(json.loads, lines) if r["kind"] != "start"]
    assert kinds[:4] == [("train", 1), ("train", 2), ("train", 3), ("rollback", 3)]
    assert [s for k, s in kinds[4:] if k == "train"] == [4, 5, 6, 7, 8]
    # the report draws the rollback: back to step 3 from step 6 (the skips were abandoned)
    assert list(guard_points(cfg, tmp_path / "report").values()) == [[(3, 6)]]


def test_rollback_is_reproduced_exactly_after_a_crash(tmp_path, corpus):
    """A crash after the rollback (resume: replay up to the bad batches, roll back the same
    way) and a crash just before the bad batches both end with the uninterrupted weights."""

    def final_weights(cfg):
        return load_file(
            ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints") / "model.safetensors"
        )

    straight = rollback_cfg(tmp_path, corpus, "straight")
    t = Trainer(straight, resume="never")
    bad = batches_of(t, {5, 6})
    poison(t, bad).fit()
    reference = final_weights(straight)

    for name, crash_step in (("after", 9), ("before", 5)):
        cfg = rollback_cfg(tmp_path, corpus, name)
        t = Trainer(cfg, resume="never")
        crash = batches_of(t, {crash_step})[0]  # step 9's batch is seen at step 6 after rollback
        with pytest.raises(RuntimeError, match="the machine died"):
            poison(t, bad, crash=crash).fit()
        assert ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints").name == "step_000003"
        poison(Trainer(cfg), bad).fit()
        weights = final_weights(cfg)
        assert all(torch.equal(weights[k], reference[k]) for k in reference), name


def test_stop_policy_ends_the_run_with_a_message(tmp_path, corpus):
    cfg = rollback_cfg(tmp_path, corpus, on_persistent="stop")
    t = Trainer(cfg, resume="never")
    poison(t, batches_of(t, {4, 5, 6, 7, 8}))
    with pytest.raises(TrainingError) as e:
        t.fit()
    msg = str(e.value)
    assert "stopped at step 5: 2 updates in a row were skipped (guard.on_persistent is stop)" in msg
    assert "step_000003" in msg and "optimizer.lr" in msg and e.value.exit_code == 3
    assert [d.name for d in ckpt.list_checkpoints(cfg.run_dir() / "checkpoints")] == ["step_000003"]


def test_rollbacks_are_bounded(tmp_path, corpus):
    cfg = rollback_cfg(tmp_path, corpus, max_rollbacks=1)
    t = Trainer(cfg, resume="never")
    poison(t, batches_of(t, set(range(4, 20))))  # every batch after step 3 is bad
    with pytest.raises(TrainingError, match=r"after 1 rollback\(s\) \(guard.max_rollbacks 1\)"):
        t.fit()


def test_no_checkpoint_to_roll_back_to(tmp_path, corpus):
    cfg = rollback_cfg(tmp_path, corpus)
    t = Trainer(cfg, resume="never")
    poison(t, batches_of(t, {1, 2}))
    with pytest.raises(TrainingError, match="no checkpoint yet to roll back to"):
        t.fit()
