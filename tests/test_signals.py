"""Real processes: SIGTERM and SIGINT stop cleanly, a second SIGINT aborts, SIGKILL in a save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_tree, write_config
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.trainer import Trainer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


class Proc:
    """`littlelm train` in a child process, its output collected line by line."""

    def __init__(self, config, *args, save_delay: float = 0.0, env: dict | None = None):
        env = {**os.environ, ckpt.FAULT_DELAY_ENV: str(save_delay), **(env or {})}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "littlelm", "train", str(config), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=lambda s=stream, k=sink: k.extend(s), daemon=True).start()

    def wait_until(self, test, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            if self.p.poll() is not None:
                time.sleep(0.2)  # let the readers finish
                pytest.fail(f"exited ({self.p.returncode}) before {what}:\n{self.text()}")
            if time.monotonic() > deadline:
                self.p.kill()
                pytest.fail(f"timed out waiting for {what}:\n{self.text()}")
            time.sleep(0.005)

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.out + self.err)

    def finish(self, timeout: float = 60) -> int:
        rc = self.p.wait(timeout)
        time.sleep(0.2)
        return rc

    def text(self) -> str:
        return "".join(self.out) + "\n--- stderr ---\n" + "".join(self.err)


def cfg_for(tmp_path, corpus, name, max_steps, every=1000):
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        run={"name": name},
        train={"max_steps": max_steps, "log_every": 1},
        eval={"every": 0, "at_end": False},
        checkpoint={"every": every, "keep_last": 3},
    )
    path = write_config(tmp_path / f"{name}.yaml", tree)
    return path, load_run(path)


def final_weights(cfg):
    return load_file(ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints") / "model.safetensors")


def same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def temporaries(cfg) -> list[str]:
    root = cfg.run_dir() / "checkpoints"
    return [d.name for d in root.iterdir() if ".tmp-" in d.name] if root.is_dir() else []


def test_sigterm_saves_exits_zero_and_resumes_exactly(tmp_path, corpus):
    path, cfg = cfg_for(tmp_path, corpus, "term", max_steps=80)
    proc = Proc(path)
    proc.wait_until(lambda: proc.saw("step 5/80"), "step 5")
    proc.p.send_signal(signal.SIGTERM)
    assert proc.finish() == 0, proc.text()
    out = proc.text()
    assert "SIGTERM received: finishing this step, saving a checkpoint" in out
    stopped = next(line for line in proc.out if line.startswith("stopped by SIGTERM at step"))
    step = int(stopped.split("at step ")[1].split(";")[0])
    assert 5 <= step < 80 and "Run the same command to resume" in stopped
    assert ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints").name == f"step_{step:06d}"

    resumed = Trainer(cfg)
    assert resumed.step == step
    assert resumed.fit()["finished"]
    _, straight = cfg_for(tmp_path, corpus, "straight", max_steps=80)
    Trainer(straight, resume="never").fit()
    assert same_weights(final_weights(cfg), final_weights(straight))


def test_second_sigint_aborts_the_save_at_once(tmp_path, corpus):
    path, cfg = cfg_for(tmp_path, corpus, "int", max_steps=80)
    Trainer(cfg, resume="never").fit(stop_after=2)
    proc = Proc(path, save_delay=3.0)  # a save now takes at least 12 s
    proc.wait_until(lambda: proc.saw("step 4/80"), "step 4")
    proc.p.send_signal(signal.SIGINT)
    proc.wait_until(lambda: temporaries(cfg), "the save to start")
    t0 = time.monotonic()
    proc.p.send_signal(signal.SIGINT)
    rc = proc.finish()
    assert rc == 130 and time.monotonic() - t0 < 5, proc.text()
    assert "Ctrl-C again aborts at once" in proc.text()
    assert "without saving; newest checkpoint:" in proc.text()
    assert temporaries(cfg) == []  # the half-written save was removed
    newest = ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints")
    assert newest.name == "step_000002"
    ckpt.load_checkpoint(newest)


def test_sigkill_inside_a_save_loses_at_most_one_interval(tmp_path, corpus):
    path, cfg = cfg_for(tmp_path, corpus, "kill", max_steps=8, every=4)
    Trainer(cfg, resume="never").fit(stop_after=2)
    proc = Proc(path, save_delay=2.0)
    proc.wait_until(lambda: temporaries(cfg), "the save of step 4 to start")
    proc.p.kill()
    proc.finish()
    assert temporaries(cfg)  # what the killed save left behind

    with pytest.warns(UserWarning, match="ignoring incomplete checkpoint"):
        resumed = Trainer(cfg)
    assert resumed.step == 2  # lost steps 3-4: less than one interval
    resumed.fit()
    assert temporaries(cfg) == []
    _, straight = cfg_for(tmp_path, corpus, "straight", max_steps=8, every=4)
    Trainer(straight, resume="never").fit()
    assert same_weights(final_weights(cfg), final_weights(straight))
