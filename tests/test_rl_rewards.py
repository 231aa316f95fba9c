"""RL's batched reward form (TRL's reward_funcs: f(prompts, completions, **columns) ->
list[float], train/rewards.py): detected or declared, called once per step with the rows' other
columns, equal to the pair form's run, and a hung one stops the run with its checkpoint kept."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from test_rl import rl_records, rl_trees, weights

from conftest import write_config
from littlelm.errors import ConfigError, TrainingError
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.rewards import reward_function, score_batch
from littlelm.train.trainer import Trainer

SEEN: list[dict] = []


def batched_parity(prompts, completions, answer, **kwargs) -> list[float]:
    """test_rl's parity_reward in TRL's batched form, noting what it was given."""
    SEEN.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
    return [float(len(c[0]["content"]) % 2) for c in completions]


def completions_only(completions, **kwargs) -> list[float]:
    return [0.0] * len(completions)


def strict(prompts, completions, answer) -> list[float]:
    return [0.0] * len(completions)


def positional_pair(reply, answer):
    return 0.0


def hangs_at_second_step(prompts, completions, **kwargs) -> list[float]:
    SEEN.append({})
    while len(SEEN) > 1:  # only the timeout gets out of it
        time.sleep(0.01)
    return [0.0] * len(completions)


def test_the_form_is_detected_by_a_completions_parameter_or_declared():
    assert reward_function("test_rl_rewards:batched_parity", "auto", ("answer",))[1] == "batched"
    assert reward_function("test_rl_rewards:completions_only", "auto", ("answer", "x"))[1] == (
        "batched"
    )
    assert reward_function("test_rl_rewards:positional_pair")[1] == "pair"
    assert reward_function("exact")[1] == "pair"
    # declared batched, but it cannot take the keywords: named before the first call
    with pytest.raises(ConfigError, match=r"batched form.*prompts, completions, answer.*kwargs"):
        reward_function("test_rl_rewards:positional_pair", "batched", ("answer",))
    # a batched function that does not take a column the rows have
    with pytest.raises(ConfigError, match="level"):
        reward_function("test_rl_rewards:strict", "auto", ("answer", "level"))
    with pytest.raises(ConfigError, match="built-in reward of the pair form"):
        reward_function("exact", "batched")


def test_a_batched_call_is_checked_and_timed():
    got = score_batch(batched_parity, "f", [[]] * 2, ["ab", "a"], {"answer": ["1", "2"]})
    assert got == [0.0, 1.0]
    with pytest.raises(TrainingError, match="returned 1 values for 2 completions.*reward_form"):
        score_batch(lambda **kw: [1.0], "f", [[]] * 2, ["a", "b"], {})
    with pytest.raises(TrainingError, match="returned 0.5 for 2"):
        score_batch(lambda **kw: 0.5, "f", [[]] * 2, ["a", "b"], {})
    with pytest.raises(TrainingError, match="returned nan.*finite number"):
        score_batch(lambda **kw: [float("nan")] * 2, "f", [[]] * 2, ["a", "b"], {})
    SEEN.clear()
    SEEN.append({})  # the next call hangs
    with pytest.raises(TrainingError, match=r"'mod:f' did not return within rl.reward_timeout = "):
        score_batch(hangs_at_second_step, "mod:f", [[]], ["a"], {}, timeout=0.2)


@pytest.mark.slow
def test_a_batched_reward_trains_as_its_pair_form_and_gets_every_column(tmp_path):
    tree = rl_trees(tmp_path)
    tree["train"]["max_steps"] = 2
    pair = load_run(write_config(tmp_path / "pair.yaml", tree))
    Trainer(pair, resume="never").fit()
    # the same prompts with one more column, scored by the batched form
    prompts = tmp_path / "prompts2.jsonl"
    rows = [json.loads(x) for x in Path(tree["rl"]["prompts"]).read_text().splitlines()]
    prompts.write_text(
        "".join(json.dumps({**r, "level": i % 3}) + "\n" for i, r in enumerate(rows))
    )
    tree["rl"].update(prompts=str(prompts), reward="test_rl_rewards:batched_parity")
    tree["run"]["name"] = "batched"
    batched = load_run(write_config(tmp_path / "batched.yaml", tree))
    SEEN.clear()
    Trainer(batched, resume="never").fit()
    assert rl_records(batched.run_dir()) == rl_records(pair.run_dir())
    wa, wb = weights(pair.run_dir()), weights(batched.run_dir())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert len(SEEN) == 2  # one call per step, with every reply of the step (2 prompts x 4)
    call = SEEN[0]
    assert len(call["completions"]) == len(call["answer"]) == len(call["level"]) == 8
    assert call["prompts"][0][-1]["role"] == "user" and call["completions"][0][0]["role"] == (
        "assistant"
    )
    by_question = {r["question"]: r for r in rows}
    for prompt, answer in zip(call["prompts"], call["answer"]):
        assert by_question[prompt[-1]["content"]]["answer"] == answer


@pytest.mark.slow
def test_a_hung_batched_reward_stops_the_run_naming_it_and_keeps_the_checkpoint(tmp_path):
    tree = rl_trees(tmp_path, reward="test_rl_rewards:hangs_at_second_step", reward_timeout=0.5)
    tree["checkpoint"] = {"every": 1}
    cfg = load_run(write_config(tmp_path / "rl.yaml", tree))
    SEEN.clear()
    with pytest.raises(TrainingError, match="hangs_at_second_step.*raise rl.reward_timeout"):
        Trainer(cfg, resume="never").fit()
    newest = ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints")
    assert newest.name == "step_000001"
    assert ckpt.load_checkpoint(newest).state["step"] == 1
