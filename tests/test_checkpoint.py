"""Checkpoint files: atomic writes, retention, failed saves, safe loading."""

from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
from collections import namedtuple

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_tree, write_config
from littlelm.errors import CheckpointError
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.trainer import Trainer


def small_save(root, step, fill=0.0):
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.fill_(fill)
    opt = torch.optim.AdamW(model.parameters())
    return ckpt.save_checkpoint(root, step, model, opt, {"tokens": step}, {})


def steps(root):
    return [ckpt.checkpoint_step(d) for d in ckpt.list_checkpoints(root, warn=False)]


def leftovers(root):
    return sorted(d.name for d in root.iterdir() if not ckpt.STEP_DIR.match(d.name))


# ---------------------------------------------------------------------------------------------
# Retention and atomic replacement


def test_prune_keeps_last_n_and_every_k(tmp_path):
    for s in range(1, 11):
        small_save(tmp_path, s)
    gone = ckpt.prune(tmp_path, keep_last=2, keep_every=4)
    assert steps(tmp_path) == [4, 8, 9, 10]
    assert [ckpt.checkpoint_step(d) for d in gone] == [1, 2, 3, 5, 6, 7]
    ckpt.prune(tmp_path, keep_last=1)  # keep_every off: only the newest stays
    assert steps(tmp_path) == [10]


def test_trainer_retention_follows_config(tmp_path, corpus):
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        train={"max_steps": 7},
        checkpoint={"every": 1, "keep_last": 2, "keep_every": 3},
    )
    cfg = load_run(write_config(tmp_path / "c.yaml", tree))
    Trainer(cfg, resume="never").fit()
    assert steps(cfg.run_dir() / "checkpoints") == [3, 6, 7]


def test_resaving_a_step_replaces_it_without_a_gap(tmp_path):
    small_save(tmp_path, 5, fill=1.0)
    small_save(tmp_path, 5, fill=2.0)
    assert steps(tmp_path) == [5] and leftovers(tmp_path) == []
    weights = load_file(tmp_path / "step_000005" / "model.safetensors")
    assert torch.all(weights["weight"] == 2.0)


def test_kill_between_the_two_renames_keeps_the_old_copy(tmp_path):
    """A save of an existing step moves the old copy aside first; if the process dies before
    the new one is renamed in, the old copy still counts and is put back."""
    old = small_save(tmp_path, 5)
    aside = old.with_name("step_000005.replaced-4242")
    os.replace(old, aside)
    (tmp_path / "step_000005.tmp-4242").mkdir()  # the new copy, unfinished
    with pytest.warns(UserWarning, match="incomplete checkpoint"):
        assert ckpt.latest_checkpoint(tmp_path) == aside
    notes = ckpt.clean_incomplete(tmp_path)
    assert any("restored" in n for n in notes) and any("removed" in n for n in notes)
    assert steps(tmp_path) == [5] and leftovers(tmp_path) == []
    ckpt.load_checkpoint(tmp_path / "step_000005")


def test_failed_rename_puts_the_old_copy_back(tmp_path, monkeypatch):
    small_save(tmp_path, 5, fill=1.0)
    real = os.replace

    def fail_on_publish(src, dst):
        if ".tmp-" in str(src):
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", fail_on_publish)
    with pytest.raises(CheckpointError, match="step 5"):
        small_save(tmp_path, 5, fill=2.0)
    assert steps(tmp_path) == [5] and leftovers(tmp_path) == []
    assert torch.all(load_file(tmp_path / "step_000005" / "model.safetensors")["weight"] == 1.0)


# ---------------------------------------------------------------------------------------------
# Failed saves: disk full, unwritable directory


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    previous = small_save(tmp_path, 1)
    monkeypatch.setattr(ckpt.torch, "save", enospc)
    with pytest.raises(CheckpointError) as e:
        small_save(tmp_path, 2)
    msg = str(e.value)
    assert "the disk is full" in msg and f"{previous} is intact" in msg and "run.out_dir" in msg
    assert steps(tmp_path) == [1] and leftovers(tmp_path) == []
    ckpt.load_checkpoint(previous)


def test_save_refused_up_front_when_it_cannot_fit(tmp_path, monkeypatch):
    small_save(tmp_path, 1)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 100, 100))
    with pytest.raises(CheckpointError, match=r"disk is full: 0\.0 MiB free"):
        small_save(tmp_path, 2)
    assert steps(tmp_path) == [1] and leftovers(tmp_path) == []


def fail_saves(monkeypatch, which: set[int]):
    """Make the n-th calls of save_checkpoint (1-based) fail as on a full disk."""
    real, calls = ckpt.save_checkpoint, []

    def save(root, step, *args, **kwargs):
        calls.append(step)
        if len(calls) in which:
            raise CheckpointError(f"cannot save the checkpoint of step {step}: the disk is full")
        return real(root, step, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", save)
    return calls


def disk_full_cfg(tmp_path, corpus, policy):
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        train={"max_steps": 6},
        # synchronous: the n-th save call is the n-th due checkpoint (a background save still
        # in flight skips the next one, so which call fails would depend on the writer's pace;
        # tests/test_async_save.py covers the policies on background saves)
        checkpoint={"every": 2, "on_save_error": policy, "async_save": False},
    )
    return load_run(write_config(tmp_path / "c.yaml", tree))


def test_failed_save_stops_the_run_by_default(tmp_path, corpus, monkeypatch):
    cfg = disk_full_cfg(tmp_path, corpus, "stop")
    fail_saves(monkeypatch, {2})
    with pytest.raises(CheckpointError, match="step 4"):
        Trainer(cfg, resume="never").fit()
    assert steps(cfg.run_dir() / "checkpoints") == [2]


def test_failed_save_can_be_survived(tmp_path, corpus, monkeypatch):
    cfg = disk_full_cfg(tmp_path, corpus, "continue")
    fail_saves(monkeypatch, {2})
    result = Trainer(cfg, resume="never").fit()
    assert result["finished"] and result["save_failures"] == 1
    assert steps(cfg.run_dir() / "checkpoints") == [2, 6]


def test_failed_final_save_is_an_error_even_when_continuing(tmp_path, corpus, monkeypatch):
    cfg = disk_full_cfg(tmp_path, corpus, "continue")
    fail_saves(monkeypatch, {3})  # saves at 2, 4, then the final one at 6
    with pytest.raises(CheckpointError, match="step 6"):
        Trainer(cfg, resume="never").fit()
    assert steps(cfg.run_dir() / "checkpoints") == [2, 4]


@pytest.fixture
def small_fs(tmp_path):
    """Mount a tmpfs of a given size (needs root and mount); unmounted afterwards."""
    mounted = []

    def mount(size_kb: int, options: str = ""):
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        opts = f"size={size_kb}k" + (f",{options}" if options else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()})")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fs_cfg(tmp_path, corpus, out_dir, **checkpoint):
    tree = tiny_tree(corpus, out_dir, train={"max_steps": 6}, checkpoint={"every": 3, **checkpoint})
    return load_run(write_config(tmp_path / "c.yaml", tree))


def test_really_full_disk_stops_with_the_previous_checkpoint_intact(tmp_path, corpus, small_fs):
    """On a 1 MiB filesystem the first checkpoint (~0.6 MiB) fits and the second cannot."""
    cfg = fs_cfg(tmp_path, corpus, small_fs(1024))
    with pytest.raises(CheckpointError, match="disk is full") as e:
        Trainer(cfg, resume="never").fit()
    root = cfg.run_dir() / "checkpoints"
    assert "step_000003 is intact" in str(e.value)
    assert steps(root) == [3] and leftovers(root) == []
    assert Trainer(cfg).step == 3  # and it resumes from it


def test_disk_full_in_the_middle_of_the_first_save(tmp_path, corpus, small_fs):
    cfg = fs_cfg(tmp_path, corpus, small_fs(400))
    with pytest.raises(CheckpointError, match="disk is full") as e:
        Trainer(cfg, resume="never").fit()
    assert "no earlier checkpoint" in str(e.value)
    root = cfg.run_dir() / "checkpoints"
    assert steps(root) == [] and leftovers(root) == []


def test_read_only_run_directory_is_a_clear_error(tmp_path, corpus, small_fs):
    where = small_fs(1024)
    cfg = fs_cfg(tmp_path, corpus, where)
    Trainer(cfg, resume="never").fit(stop_after=3)
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    cfg = fs_cfg(tmp_path, corpus, where)
    trainer = Trainer(cfg)  # reading works
    assert trainer.step == 3
    with pytest.raises(Exception, match="Read-only file system|not writable") as e:
        trainer.fit()
    assert e.type.__name__ in ("RunDirError", "CheckpointError")
    assert steps(cfg.run_dir() / "checkpoints") == [3]


# ---------------------------------------------------------------------------------------------
# Safe loading


class Payload:
    def __reduce__(self):
        return (print, ("this ran while loading a checkpoint",))


def test_pickled_code_in_a_checkpoint_is_refused(tmp_path):
    path = small_save(tmp_path, 1)
    with open(path / "optimizer.pt", "wb") as f:
        pickle.dump({"state": Payload()}, f, protocol=2)
    with pytest.raises(
        ckpt.UnreadableCheckpoint,
        match=r"optimizer.pt holds Python objects other than tensors.*\(print\)",
    ):
        ckpt.load_checkpoint(path)


def test_truncated_weights_are_reported(tmp_path):
    path = small_save(tmp_path, 1)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ckpt.UnreadableCheckpoint, match="cannot read checkpoint files.*invalid header"
    ):
        ckpt.load_checkpoint(path)


def test_garbled_state_is_reported(tmp_path):
    path = small_save(tmp_path, 1)
    (path / "state.json").write_text('{"step": 1, "tok')
    with pytest.raises(ckpt.UnreadableCheckpoint, match="state.json is unreadable"):
        ckpt.load_checkpoint(path)


def test_checkpoint_files_are_plain_data(tmp_path):
    path = small_save(tmp_path, 3)
    state = json.loads((path / "state.json").read_text())
    assert state["step"] == 3 and state["format_version"] == ckpt.FORMAT_VERSION
    rng = torch.load(path / "rng.pt", weights_only=True)  # loads under the safe unpickler
    assert torch.equal(rng["torch"], torch.get_rng_state())
