"""Checkpoints written in the background (checkpoint.async_save, train/checkpoint/writer.py): the
same checkpoints as a synchronous save, skipped saves and slow ones said, write errors handled as
checkpoint.on_save_error says, and a stalled filesystem (a blocking fsync: the
LITTLELM_FAULT_SAVE_STALL hook) never hangs the loop nor the exit."""

from __future__ import annotations

import errno
import json
import signal
import sys
import time

import pytest
import torch

from conftest import tiny_tree, write_config
from littlelm.errors import CheckpointError
from littlelm.schema import load_run
from littlelm.train.callbacks import Callback
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.checkpoint.writer import BackgroundWriter, SaveStuck, choose
from littlelm.train.trainer import Trainer


def run_cfg(tmp_path, corpus, name, max_steps, every, **checkpoint):
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        run={"name": name},
        train={"max_steps": max_steps, "log_every": 1},
        eval={"every": 0, "at_end": False},
        checkpoint={"every": every, "keep_last": 10, **checkpoint},
    )
    path = write_config(tmp_path / f"{name}.yaml", tree)
    return path, load_run(path)


class At(Callback):
    """Calls `fn(trainer)` at the end of step `step`."""

    def __init__(self, step: int, fn):
        self.step, self.fn = step, fn

    def on_step_end(self, trainer, metrics: dict) -> None:
        if metrics["step"] == self.step:
            self.fn(trainer)


def release(flag):
    """Remove the stall and wait for the save in flight to be written (the next save is then
    taken, not skipped: the test does not depend on the writer's pace)."""

    def go(trainer):
        flag.unlink()
        written(trainer)

    return go


def stalled(monkeypatch, tmp_path):
    flag = tmp_path / "stall"
    flag.touch()
    monkeypatch.setenv(ckpt.FAULT_STALL_ENV, str(flag))
    return flag


def saved(cfg, step):
    return ckpt.step_dir(cfg.run_dir() / "checkpoints", step)


def test_background_checkpoints_hold_the_step_they_were_taken_at(tmp_path, corpus, monkeypatch):
    """The save of step 3 is written while steps 4 and 5 train (its fsync blocks until then):
    the staged copy, not the live weights, is what lands on disk, bitwise a synchronous save's."""
    _, sync = run_cfg(tmp_path, corpus, "sync", 7, 3, async_save=False)
    Trainer(sync, resume="never").fit()
    _, bg = run_cfg(tmp_path, corpus, "bg", 7, 3, async_save=True)
    flag = stalled(monkeypatch, tmp_path)
    trainer = Trainer(bg, resume="never", callbacks=(At(5, release(flag)),))
    assert trainer.fit()["finished"]
    for step in (3, 6, 7):
        a, b = saved(sync, step), saved(bg, step)
        # safetensors orders its header's metadata by a hash map: compare what it holds
        x, y = (ckpt.LazyTensors(d / "model.safetensors") for d in (a, b))
        assert x.metadata == y.metadata and x.shapes == y.shapes
        assert all(torch.equal(x[k], y[k]) for k in x.shapes)
        for name in ("optimizer.pt", "rng.pt"):
            x, y = (torch.load(d / name, weights_only=True) for d in (a, b))
            assert same(x, y), (step, name)
        x, y = (json.loads((d / "state.json").read_text()) for d in (a, b))
        for key in ("train_time", "config", "budget"):  # time spent; the setting itself
            x.pop(key, None), y.pop(key, None)
        assert x == y


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_save_due_while_one_is_written_is_skipped_and_a_slow_one_said(
    tmp_path, corpus, monkeypatch, capsys
):
    _, cfg = run_cfg(tmp_path, corpus, "skip", 8, 2, async_save=True, slow_after_minutes=0.0005)
    flag = stalled(monkeypatch, tmp_path)
    pause = At(3, lambda t: time.sleep(0.2))  # past the 0.03 s after which a save is slow
    trainer = Trainer(cfg, resume="never", callbacks=(pause, At(5, release(flag))))
    assert trainer.fit()["finished"]
    out = capsys.readouterr().out
    assert "checkpoints: written in the background" in out
    assert "checkpoint of step 4 skipped: the save of step 2 (" in out
    assert "past checkpoint.slow_after_minutes=0.0005; training goes on" in out
    found = [d.name for d in ckpt.list_checkpoints(cfg.run_dir() / "checkpoints")]
    assert found == ["step_000002", "step_000006", "step_000008"]


def failing_once(monkeypatch):
    real, calls = ckpt.save_file, []

    def save_file(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save_file", save_file)


def written(trainer):
    """Wait for the save in flight (the next save is then taken, not skipped)."""
    deadline = time.monotonic() + 60
    while trainer.saves.writer.busy is not None and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_failed_background_write_goes_on_under_continue(tmp_path, corpus, monkeypatch):
    _, cfg = run_cfg(tmp_path, corpus, "cont", 6, 2, async_save=True, on_save_error="continue")
    failing_once(monkeypatch)
    final = Trainer(cfg, resume="never", callbacks=(At(3, written),)).fit()
    assert final["finished"] and final["save_failures"] == 1
    found = [d.name for d in ckpt.list_checkpoints(cfg.run_dir() / "checkpoints")]
    assert found == ["step_000004", "step_000006"]
    assert not [d for d in (cfg.run_dir() / "checkpoints").iterdir() if ".tmp-" in d.name]


def test_a_failed_background_write_stops_the_run_by_default(tmp_path, corpus, monkeypatch):
    _, cfg = run_cfg(tmp_path, corpus, "stop", 6, 2, async_save=True)
    failing_once(monkeypatch)
    with pytest.raises(
        CheckpointError, match="cannot save the checkpoint of step 2 .*disk is full"
    ):
        Trainer(cfg, resume="never").fit()


def test_a_stalled_save_ends_the_run_within_the_wait_naming_it(tmp_path, corpus, monkeypatch):
    _, cfg = run_cfg(tmp_path, corpus, "stuck", 6, 4, async_save=True, save_wait_seconds=0.5)
    Trainer(cfg, resume="never").fit(stop_after=2)  # step 2's checkpoint, written in time
    flag = stalled(monkeypatch, tmp_path)
    try:
        trainer = Trainer(cfg)
        with pytest.raises(SaveStuck, match=r"the save of step 4 \(.*step_000004\.tmp-"):
            trainer.fit()
        assert trainer.step == 6  # training went on past the stuck save
        newest = ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints")
        assert newest is not None and newest.name == "step_000002"
        ckpt.load_checkpoint(newest)
    finally:
        flag.unlink()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_with_a_stalled_filesystem_exits_within_the_wait(tmp_path, corpus):
    from test_signals import Proc

    path, cfg = run_cfg(tmp_path, corpus, "term", 100_000, 5, async_save=True, save_wait_seconds=1)
    flag = tmp_path / "stall"
    proc = Proc(path, env={ckpt.FAULT_STALL_ENV: str(flag)})
    root = cfg.run_dir() / "checkpoints"
    proc.wait_until(lambda: ckpt.latest_checkpoint(root, warn=False), "a first checkpoint")
    flag.touch()  # from now on every fsync of a save hangs
    proc.wait_until(lambda: proc.saw("skipped: the save of step"), "a skipped save")
    stuck = next(line for line in proc.out if "skipped: the save of step" in line)
    step = int(stuck.split("skipped: the save of step ")[1].split(" ")[0])
    proc.p.send_signal(signal.SIGTERM)
    assert proc.finish(timeout=60) == 2, proc.text()
    assert f"the save of step {step} (" in proc.text()
    assert "did not finish within checkpoint.save_wait_seconds=1" in proc.text()
    newest = ckpt.latest_checkpoint(root, warn=False)
    assert newest is not None and ckpt.checkpoint_step(newest) < step
    ckpt.load_checkpoint(newest)
    flag.unlink()


def test_staging_copies_and_keeps_tied_tensors_tied():
    w = torch.arange(6.0).reshape(2, 3)
    tree = {"a": w, "tied": w, "moments": {"state": {0: {"exp_avg": w * 2}}, "lr": [0.1]}}
    writer = BackgroundWriter()
    staged = writer.stage(tree)
    assert staged["a"] is staged["tied"] and staged["a"].data_ptr() != w.data_ptr()
    w.add_(1)  # training goes on: the staged copy stays
    assert torch.equal(staged["a"], torch.arange(6.0).reshape(2, 3))
    again = writer.stage(tree)  # the next save reuses the buffers
    assert again["a"].data_ptr() == staged["a"].data_ptr()
    assert writer.staged_bytes == 2 * 6 * 4


def test_auto_stages_only_when_half_the_memory_is_left():
    assert choose("auto", 10, 100)[0] and not choose("auto", 60, 100)[0]
    assert "more than half" in choose("auto", 60, 100)[1]
    assert choose(True, 60, 100)[0] and not choose(False, 1, 100)[0]
    assert not choose("auto", 1, None)[0]  # unknown memory: the safe side
