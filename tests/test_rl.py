"""RL with verifiable rewards (train/rl.py, train/rewards.py): rewards, group advantages, the KL
estimator, batched group sampling, and RL runs that resume bitwise (docs/post-training.md)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_tree, write_config
from littlelm.errors import ConfigError, DataError, TrainingError
from littlelm.model.generate import generate, sample_group
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.rewards import RewardStopped, exact, numeric, reward_function, score
from littlelm.train.rl import clipped, group_advantages, k3
from littlelm.train.rl import mean as rl_mean
from littlelm.train.signals import StopSignals
from littlelm.train.trainer import Trainer


def test_built_in_rewards_parse_the_answer_and_never_run_it():
    assert exact("so 12\n#### 1,234", "1234") == 1.0 and exact("1235", "1234") == 0.0
    assert numeric("#### 46.0", "46") == 1.0 and numeric(" 46 ", "46") == 1.0
    assert numeric("46 apples", "46") == 0.0 and numeric("", "46") == 0.0
    # text that would be code is a string that is not a number: 0, and nothing is evaluated
    assert numeric("__import__('os').getpid()", "1") == 0.0 and numeric("2+2", "4") == 0.0


def parity_reward(reply: str, answer: str) -> float:
    """A reward that varies between samples of an untrained model (its replies' lengths)."""
    return float(len(reply) % 2)


def nan_reward(reply: str, answer: str) -> float:
    return float("nan")


def test_a_reward_function_path_is_imported_and_its_errors_named():
    assert reward_function("test_rl:parity_reward") == (parity_reward, "pair")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_rewards'.*PYTHONPATH"):
        reward_function("no_such_rewards:score")
    with pytest.raises(ConfigError, match="has no function 'missing'"):
        reward_function("test_rl:missing")
    with pytest.raises(TrainingError, match="returned nan.*finite number"):
        score(nan_reward, "test_rl:nan_reward", "x", "y")


def two_args_missing(reply: str) -> float:
    return 1.0


def numpy_reward(reply: str, answer: str) -> np.float32:
    return np.float32(0.5)


def hanging_reward(reply: str, answer: str) -> float:
    while True:  # a loop that never ends: only the timeout or a signal gets out of it
        time.sleep(0.01)


def test_reward_functions_are_checked_before_their_first_call_and_numpy_numbers_count():
    with pytest.raises(ConfigError, match=r"cannot be called as two_args_missing\(reply, answer\)"):
        reward_function("test_rl:two_args_missing")
    assert score(numpy_reward, "test_rl:numpy_reward", "x", "y") == 0.5
    assert score(lambda r, a: np.int64(2), "f", "x", "y") == 2.0
    assert score(lambda r, a: np.bool_(True), "f", "x", "y") == 1.0
    with pytest.raises(TrainingError, match="returned 'x'.*finite number"):
        score(lambda r, a: "x", "f", "x", "y")
    # a sum of 1e308s is past float64's range; their mean is not
    assert rl_mean(torch.full((2, 4), 1e308, dtype=torch.float64)) == pytest.approx(1e308)
    assert rl_mean(torch.tensor([[0.0, 1.0, 1.0, 0.0]], dtype=torch.float64)) == 0.5


def test_a_reward_call_that_hangs_stops_at_its_timeout_or_on_sigterm():
    with pytest.raises(TrainingError, match="did not return within rl.reward_timeout = 0.2 s"):
        score(hanging_reward, "test_rl:hanging_reward", "reply", "y", timeout=0.2)

    def terminated(reply: str, answer: str) -> float:
        os.kill(os.getpid(), signal.SIGTERM)
        return hanging_reward(reply, answer)

    with StopSignals() as stop, pytest.raises(RewardStopped, match="SIGTERM received during"):
        score(terminated, "f", "x", "y", timeout=60)
    assert stop.requested == "SIGTERM"  # the trainer saves and exits as on any stop
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None, signal.default_int_handler)


def test_advantages_are_normalised_per_group_and_a_flat_group_has_none():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    adv = group_advantages(rewards)
    assert torch.equal(adv[1], torch.zeros(4))  # all equal: no signal
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.allclose(adv.sum(1), torch.zeros(3), atol=1e-5)
    assert adv[2, 3] > 0 and (adv[2, :3] < 0).all()


def test_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.equal(k3(logp, logp), torch.zeros(3))
    assert (k3(logp, logp + torch.tensor([0.3, -0.2, 1.0])) > 0).all()


def test_group_sampling_is_seeded_and_matches_greedy_generate():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, d_model=32, n_head=2, max_seq_len=32, vocab_size=40)).eval()
    prompt, stop = [1, 5, 7, 9], 3
    draw = [
        sample_group(model, prompt, 6, 8, 1.0, torch.Generator().manual_seed(4), stop)
        for _ in range(2)
    ]
    assert torch.equal(draw[0][0], draw[1][0]) and torch.equal(draw[0][1], draw[1][1])
    tokens, lengths = draw[0]
    for row, n in zip(tokens.tolist(), lengths.tolist()):  # after a reply's stop: filler only
        assert all(t == stop for t in row[n:]) and (n == 8 or row[n - 1] == stop)
    # near-zero temperature: every row is the greedy reply of the one-at-a-time generator
    greedy = generate(model, prompt, 8, temperature=0, stop=stop)
    cold, n = sample_group(model, prompt, 3, 8, 1e-6, torch.Generator().manual_seed(0), stop)
    assert all(row[: int(k)] == greedy for row, k in zip(cold.tolist(), n.tolist()))


def reversal(rng: random.Random) -> tuple[str, str]:
    letters = [rng.choice("abcd") for _ in range(rng.randint(2, 3))]
    return f"Rev: {' '.join(letters)}", " ".join(reversed(letters))


def rl_trees(tmp_path: Path, **rl) -> dict:
    """An SFT run (a few steps from random weights on reversals, bpe with the chat tokens) and
    the tree of an RL run from it."""
    rng = random.Random(0)
    pairs = [reversal(rng) for _ in range(200)]
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
            + "\n"
            for q, a in pairs
        )
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in pairs))
    runs = tmp_path / "runs"
    sft = tiny_tree(chats, runs, run={"name": "sft"})
    sft["data"]["tokenizer"] = {"name": "bpe", "vocab_size": 264, "train_chars": 3000}
    sft["data"]["sources"] = {"chat": {"name": "chat", "dataset": str(chats)}}
    sft["train"]["max_steps"] = 3
    Trainer(load_run(write_config(tmp_path / "sft.yaml", sft)), resume="never").fit()
    tree = tiny_tree(chats, runs, run={"name": "rl"})
    tree["data"] = {**sft["data"], "tokenizer": {"name": "saved", "path": str(runs / "sft")}}
    tree["sft"] = {"base": str(runs / "sft")}
    tree["rl"] = {
        "prompts": str(prompts),
        "group_size": 4,
        "prompts_per_step": 2,
        "max_new_tokens": 5,
        "kl_coef": 0.1,
        "reward": "test_rl:parity_reward",
        **rl,
    }
    tree["optimizer"] = {"name": "adamw", "lr": 1e-3}
    tree["train"].update(max_steps=4, log_every=1)
    tree["eval"] = {"every": 0, "at_end": False}
    tree["checkpoint"] = {"every": 2}
    return tree


def rl_records(run_dir: Path) -> list[tuple]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    keep = ("step", "loss", "rl_reward", "rl_kl", "rl_reply_tokens", "tokens")
    return [tuple(r[k] for k in keep) for r in map(json.loads, lines) if "rl_reward" in r]


def weights(run_dir: Path, vocab: int = 264) -> dict:
    """The newest checkpoint's tensors; the embedding's padding rows (past the tokenizer's
    `vocab`, never read) left out: a run started from another's draws its own."""
    w = load_file(ckpt.latest_checkpoint(run_dir / "checkpoints") / "model.safetensors")
    return {k: v[:vocab] if k in ("wte.weight", "lm_head.weight") else v for k, v in w.items()}


@pytest.mark.slow
def test_an_rl_run_learns_logs_its_figures_and_resumes_bitwise(tmp_path):
    tree = rl_trees(tmp_path)
    straight = load_run(write_config(tmp_path / "rl.yaml", tree))
    assert Trainer(straight, resume="never").fit()["finished"]
    a = rl_records(straight.run_dir())
    assert [r[0] for r in a] == [1, 2, 3, 4]
    assert a[0][3] < 1e-6 < a[-1][3]  # KL: 0 at the SFT model's weights, then it moves off
    assert 0 < a[-1][2] < 1 and a[-1][5] > a[0][5] > 0  # rewards vary; reply tokens counted
    base = weights(tmp_path / "runs" / "sft")
    assert any(not torch.equal(base[k], w) for k, w in weights(straight.run_dir()).items())
    # killed after step 2's checkpoint and resumed: the same replies, rewards and weights
    tree["run"]["name"] = "split"
    split = load_run(write_config(tmp_path / "split.yaml", tree))
    assert Trainer(split, resume="never").fit(stop_after=2)["step"] == 2
    assert Trainer(split).fit()["finished"]
    assert rl_records(split.run_dir()) == a
    wa, wb = weights(straight.run_dir()), weights(split.run_dir())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_clipped_ratio_stops_the_gradient_past_the_clip_on_the_advantage_side():
    old = torch.zeros(2, 3)
    # ratios 0.5, 1.0, 1.5 on both rows; row 0 with advantage +1, row 1 with -1
    logp = torch.log(torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]])).requires_grad_()
    loss, held = clipped(logp, old, torch.tensor([1.0, -1.0]), 0.2)
    # A > 0: a ratio above 1.2 is held at 1.2; A < 0: a ratio below 0.8 is held at 0.8
    assert torch.allclose(loss, torch.tensor([[-0.5, -1.0, -1.2], [0.8, 1.0, 1.5]]))
    assert held.tolist() == [[False, False, True], [True, False, False]]
    loss.sum().backward()
    g = logp.grad
    assert g[0, 2] == 0 and g[1, 0] == 0  # clipped: no gradient
    assert torch.allclose(g[0, :2], torch.tensor([-0.5, -1.0]))  # -A·ρ where it counts
    assert torch.allclose(g[1, 1:], torch.tensor([1.0, 1.5]))


@pytest.mark.slow
def test_iterations_reuse_a_batch_and_resume_bitwise_in_the_middle_of_one(tmp_path):
    tree = rl_trees(tmp_path, iterations=2, clip_eps=0.2)
    tree["train"]["max_steps"] = 6
    tree["checkpoint"] = {"every": 1}
    straight = load_run(write_config(tmp_path / "rl.yaml", tree))
    assert Trainer(straight, resume="never").fit()["finished"]
    lines = (straight.run_dir() / "metrics.jsonl").read_text().splitlines()
    a = [r for r in map(json.loads, lines) if "rl_reward" in r]
    # steps 2k+1 and 2k+2 learn from one batch: the same rewards and reply lengths
    for k in (0, 2, 4):
        assert a[k]["rl_reward"] == a[k + 1]["rl_reward"]
        assert a[k]["rl_reply_tokens"] == a[k + 1]["rl_reply_tokens"]
    assert all(0 <= r["rl_clip_frac"] <= 1 for r in a)
    # stopped after step 3, inside batch 1's two steps, and resumed from step 3's checkpoint
    # (the model that sampled batch 1 is gone: the checkpoint holds the batch)
    tree["run"]["name"] = "split"
    split = load_run(write_config(tmp_path / "split.yaml", tree))
    assert Trainer(split, resume="never").fit(stop_after=3)["step"] == 3
    saved = json.loads((split.run_dir() / "checkpoints" / "step_000003" / "state.json").read_text())
    assert saved["objective"]["index"] == 1
    assert Trainer(split).fit()["finished"]
    assert rl_records(split.run_dir()) == rl_records(straight.run_dir())
    wa, wb = weights(straight.run_dir()), weights(split.run_dir())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_flat_groups_teach_nothing(tmp_path):
    # an untrained model never answers: every group's rewards are 0, and without a KL term no
    # weight moves
    tree = rl_trees(tmp_path, reward="exact", kl_coef=0.0)
    tree["train"]["max_steps"] = 2
    cfg = load_run(write_config(tmp_path / "rl.yaml", tree))
    Trainer(cfg, resume="never").fit()
    lines = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    figures = [r for r in map(json.loads, lines) if "rl_reward" in r]
    assert all(r["rl_reward"] == 0 and r["rl_flat_frac"] == 1 for r in figures)
    base, after = weights(tmp_path / "runs" / "sft"), weights(cfg.run_dir())
    assert all(torch.equal(base[k], after[k]) for k in base)


CALLS = {"n": 0}


def huge_then_hang(reply: str, answer: str) -> float:
    """1e308 for step 1's 8 replies (4 × 2), then SIGTERM and a hang in step 2's first call."""
    CALLS["n"] += 1
    if CALLS["n"] == 9:
        os.kill(os.getpid(), signal.SIGTERM)
        hanging_reward(reply, answer)
    return 1e308


def test_huge_rewards_log_a_number_and_sigterm_stops_a_hung_reward_cleanly(tmp_path):
    CALLS["n"] = 0
    tree = rl_trees(tmp_path, reward="test_rl:huge_then_hang", reward_timeout=600)
    tree["checkpoint"] = {"every": 0}
    cfg = load_run(write_config(tmp_path / "rl.yaml", tree))
    result = Trainer(cfg, resume="never").fit()
    assert result["step"] == 1 and not result["finished"]  # step 2 left out, nothing changed
    records = [
        json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["rl_reward"] for r in records if "rl_reward" in r] == [1e308]
    assert ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints").name == "step_000001"


def test_rl_config_errors_name_the_fix(tmp_path, corpus):
    tree = tiny_tree(corpus, tmp_path / "runs")
    tree["rl"] = {"prompts": "p.jsonl"}
    with pytest.raises(ConfigError, match=r"rl needs sft: \{base: RUN\}"):
        load_run(write_config(tmp_path / "a.yaml", tree))
    tree["sft"] = {"base": "runs/base"}
    tree["rl"]["reward"] = "os.system('x')"
    with pytest.raises(ConfigError, match="neither a built-in reward .* module:function"):
        load_run(write_config(tmp_path / "b.yaml", tree))
    for spec in ("os:system", "subprocess:run", "shutil.os:remove"):
        tree["rl"]["reward"] = spec
        with pytest.raises(ConfigError, match="standard library .* my_rewards:score"):
            load_run(write_config(tmp_path / "b.yaml", tree))
    # several processes (distributed.world_size unset: the processes running): under ddp each
    # rank samples its own prompts (tests/test_rl_ranks.py); fsdp is refused with the reason
    tree["rl"]["reward"] = "exact"
    assert load_run(write_config(tmp_path / "two.yaml", tree), world_size=2).rl is not None
    tree["distributed"] = {"strategy": "fsdp"}
    with pytest.raises(ConfigError, match="rl with distributed.strategy=fsdp"):
        load_run(write_config(tmp_path / "fsdp.yaml", tree), world_size=2)


def test_prompts_that_leave_no_room_are_refused(tmp_path):
    from littlelm.train.rl import read_prompts

    class Fmt:
        def encode(self, messages, add_generation_prompt=False):
            return [0] * len(messages[0]["content"])

    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"question": "short", "answer": "1"}\n{"question": "much longer", "answer": "2"}\n'
    )
    assert len(read_prompts(path, Fmt(), 11)) == 2
    with pytest.raises(DataError, match=r"p.jsonl:2 \(11 tokens\).*rl.max_new_tokens"):
        read_prompts(path, Fmt(), 10)
    with pytest.raises(DataError, match="make_rl_example"):
        read_prompts(tmp_path / "none.jsonl", Fmt(), 10)
    path.write_text('{"question": "no answer"}\n')
    with pytest.raises(DataError, match='p.jsonl:1: a prompt row needs an "answer"'):
        read_prompts(path, Fmt(), 10)
