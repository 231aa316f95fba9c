"""RL in several processes (train/rl.py): each rank samples its own prompts, DDP averages the
gradients, and a resumed run draws exactly the replies the uninterrupted one drew."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_distributed import run_procs
from test_rl import parity_reward, rl_records, rl_trees, weights

from conftest import write_config
from littlelm.train.rl import step_prompts, step_seed


def test_each_rank_takes_its_own_prompts_and_one_rank_reads_as_before():
    n, k, seed = 11, 3, 5
    for step in range(6):
        ranks = [step_prompts(n, k, seed, step, r, 2) for r in range(2)]
        # the two ranks read the next 2k prompts of the stream that one process reads k at a time
        stream = step_prompts(n, k, seed, 2 * step, 0, 1) + step_prompts(
            n, k, seed, 2 * step + 1, 0, 1
        )
        assert ranks[0] + ranks[1] == stream
    # one process: the positions step·k .. step·k + k of the file shuffled per pass (as before)
    order = np.random.default_rng
    want = [int(order(step_seed(seed, p // n)).permutation(n)[p % n]) for p in range(6, 9)]
    assert step_prompts(n, k, seed, 2, 0, 1) == want


def logged_parity(reply: str, answer: str) -> float:
    """parity_reward, noting which process scored which answer (the file $RL_PROMPT_LOG)."""
    with open(os.environ["RL_PROMPT_LOG"], "a") as f:
        f.write(f"{os.getpid()} {answer}\n")
    return parity_reward(reply, answer)


@pytest.mark.slow
@pytest.mark.parametrize("iterations", [1, 4])  # 4: step 2's checkpoint is inside a batch
def test_rl_at_two_processes_samples_per_rank_and_resumes_bitwise(tmp_path, iterations):
    tree = rl_trees(tmp_path, reward="test_rl_ranks:logged_parity", iterations=iterations)
    tree["train"].update(precision="fp32")
    tree["distributed"] = {"timeout_s": 60}
    config = write_config(tmp_path / "rl.yaml", tree)
    log = tmp_path / "answers.txt"
    os.environ["RL_PROMPT_LOG"] = str(log)
    try:
        run_procs(
            [sys.executable, "-m", "littlelm", "train", str(config), "--nproc", "2"], tmp_path
        )
        by_pid: dict[str, list[str]] = {}
        for line in log.read_text().splitlines():
            pid, _, answer = line.partition(" ")
            by_pid.setdefault(pid, []).append(answer)
        assert len(by_pid) == 2  # both ranks sampled and scored
        a, b = by_pid.values()
        assert len(a) == len(b) and a != b  # each its own prompts
        run = Path(tree["run"]["out_dir"]) / tree["run"]["name"]
        got = rl_records(run)
        assert [r[0] for r in got] == [1, 2, 3, 4]
        # resumed at step 2 (the step-4 checkpoint and its records gone): the same replies,
        # rewards and weights
        split = tmp_path / "split_runs" / run.name  # the same run, elsewhere
        shutil.copytree(run, split)
        shutil.rmtree(split / "checkpoints" / "step_000004")
        lines = (split / "metrics.jsonl").read_text().splitlines()
        kept = [
            x for x in lines if json.loads(x).get("step", 0) <= 2 and json.loads(x)["kind"] != "end"
        ]
        (split / "metrics.jsonl").write_text("".join(x + "\n" for x in kept))
        tree["run"]["out_dir"] = str(split.parent)
        config = write_config(tmp_path / "split.yaml", tree)
        run_procs(
            [sys.executable, "-m", "littlelm", "train", str(config), "--nproc", "2"], tmp_path
        )
    finally:
        del os.environ["RL_PROMPT_LOG"]
    assert rl_records(split) == got
    wa, wb = weights(run), weights(split)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
