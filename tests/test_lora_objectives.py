"""LoRA with the other objectives: DPO and RL train adapters on a frozen base (the normal case
for preference tuning and RL on a large model), against the same frozen reference as a full run,
and resume bitwise (their checkpoints keep the adapters alone)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file
from test_dpo import dpo_tree, records, reversal_pairs, write_jsonl
from test_rl import rl_records, rl_trees

from conftest import write_config
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.trainer import Trainer

LORA = {"rank": 4, "alpha": 8, "lr": 3e-2}  # a lr that moves a tiny model in a few steps


def trained(run_dir) -> dict[str, torch.Tensor]:
    return load_file(ckpt.latest_checkpoint(run_dir / "checkpoints") / "model.safetensors")


def straight_and_split(tmp_path, tree: dict, stop_after: int):
    """The run of `tree` in one go, and again stopped after `stop_after` steps and resumed."""
    straight = load_run(write_config(tmp_path / "straight.yaml", tree))
    assert Trainer(straight, resume="never").fit()["finished"]
    tree["run"]["name"] = "split"
    split = load_run(write_config(tmp_path / "split.yaml", tree))
    assert Trainer(split, resume="never").fit(stop_after=stop_after)["step"] == stop_after
    assert Trainer(split).fit()["finished"]
    return straight.run_dir(), split.run_dir()


def test_lora_dpo_trains_the_adapters_alone_and_resumes_bitwise(tmp_path):
    from test_chat import sft_trees

    base, sft = sft_trees(tmp_path)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", reversal_pairs(80))
    tree = dpo_tree(tmp_path, base, sft["model"], pairs)
    tree["lora"] = LORA
    tree["train"]["max_steps"] = 4
    tree["eval"] = {"every": 0, "at_end": False}
    tree["checkpoint"] = {"every": 2}
    a, b = straight_and_split(tmp_path, tree, 2)
    steps = [r for r in records(a) if "loss" in r]
    # adapters start at B = 0: the policy is the base, the reference (up to rounding)
    assert abs(steps[0]["reward_margin"]) < 1e-3
    keys = ("step", "loss", "reward_margin", "logps_chosen", "logps_rejected")
    assert [[r[k] for k in keys] for r in steps] == [
        [r[k] for k in keys] for r in records(b) if "loss" in r
    ]
    wa, wb = trained(a), trained(b)
    # the checkpoint keeps the adapters and the chat tokens' rows (lora.trainable_tokens) alone
    assert wa and all("lora_" in k or k.endswith(".delta") for k in wa)
    assert any(k.endswith("lora_B") and v.abs().sum() > 0 for k, v in wa.items())  # they moved
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_lora_rl_trains_the_adapters_alone_and_resumes_bitwise(tmp_path):
    tree = rl_trees(tmp_path)
    tree["lora"] = LORA
    a, b = straight_and_split(tmp_path, tree, 2)
    got = rl_records(a)
    assert [r[0] for r in got] == [1, 2, 3, 4]
    assert got[0][3] < 1e-6 < got[-1][3]  # KL: 0 while B = 0, then the adapters move off
    assert rl_records(b) == got
    wa, wb = trained(a), trained(b)
    assert wa and all("lora_" in k or k.endswith(".delta") for k in wa)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_rl_samples_without_the_adapters_dropout(tmp_path):
    """Replies come from the model itself: sampling runs it in eval mode, so LoRA's dropout draws
    nothing from the global RNG (whose state differs across ranks: a 2-rank resume, which
    restores one state, would draw other replies on rank 1)."""
    tree = rl_trees(tmp_path)
    tree["lora"] = {**LORA, "dropout": 0.5}
    trainer = Trainer(load_run(write_config(tmp_path / "rl.yaml", tree)), resume="never")
    objective = trainer.objective
    assert trainer.model.training
    before = torch.get_rng_state()
    objective.sample(0)
    assert torch.equal(torch.get_rng_state(), before) and trainer.model.training
