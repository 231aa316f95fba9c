"""LoRA under FSDP2 (several processes, `distributed.strategy: fsdp`): the frozen base sharded like
any parameter, the adapters and the chat tokens' rows trained, the reference the model with its
adapters off. Tested on LoRA-DPO, which exercises all three: it trains what the same run under
DDP trains, its checkpoints keep the adapters alone, and it resumes bitwise."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import run_procs

from conftest import write_config

pytestmark = pytest.mark.slow
LORA = {"rank": 4, "alpha": 8, "lr": 3e-2}  # a lr that moves a tiny model in a few steps


def losses(run: Path) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"}


def adapters(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / f"checkpoints/step_{step:06d}/model.safetensors")


def train(config: Path, cwd: Path, *overrides: str) -> str:
    cmd = [sys.executable, "-m", "littlelm", "train", str(config), "--nproc", "2", *overrides]
    return run_procs(cmd, cwd, timeout=240)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """LoRA-DPO from a tiny chat base (BPE with the chat tokens, whose rows LoRA trains), in
    fp32, 4 steps, checkpoints at 2 and 4: under DDP and under FSDP, 2 processes each."""
    from test_chat import sft_trees
    from test_dpo import dpo_tree, reversal_pairs, write_jsonl

    tmp = tmp_path_factory.mktemp("lora-fsdp")
    base, sft = sft_trees(tmp)
    pairs = write_jsonl(tmp / "pairs.jsonl", reversal_pairs(80))
    tree = dpo_tree(tmp, base, sft["model"], pairs)
    tree["lora"] = LORA
    tree["train"].update(max_steps=4, precision="fp32")
    tree["eval"] = {"every": 0, "at_end": False}
    tree["checkpoint"] = {"every": 2, "keep_last": 3, "async_save": False}
    tree["distributed"] = {"timeout_s": 60}
    config = write_config(tmp / "run.yaml", tree)
    out = {"config": config, "dir": tmp}
    for strategy in ("ddp", "fsdp"):
        train(config, tmp, f"run.name={strategy}", f"distributed.strategy={strategy}")
        out[strategy] = tmp / "runs" / strategy
    return out


def test_lora_under_fsdp_trains_what_ddp_trains(runs):
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    assert list(losses(fsdp)) == [1, 2, 3, 4]
    torch.testing.assert_close(losses(fsdp), losses(ddp))  # fp32: the same sums, other order
    a, b = adapters(fsdp, 4), adapters(ddp, 4)
    # the checkpoint keeps the adapters and the chat tokens' rows alone, gathered whole
    assert a.keys() == b.keys() and all("lora_" in k or k.endswith(".delta") for k in a)
    assert any(k.endswith("lora_B") and v.abs().sum() > 0 for k, v in a.items())  # they moved
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)
    resolved = (fsdp / "config.yaml").read_text()
    assert "strategy: fsdp" in resolved and "world_size: 2" in resolved


def test_lora_under_fsdp_resumes_bitwise(runs, tmp_path):
    """From the step-2 checkpoint (its adapters loaded into the sharded model, the optimizer's
    sharded state restored) the run makes the very losses and adapters it made straight."""
    again = tmp_path / "runs" / "fsdp"
    shutil.copytree(runs["fsdp"], again)
    shutil.rmtree(again / "checkpoints" / "step_000004")
    train(runs["config"], tmp_path, "run.name=fsdp", f"run.out_dir={tmp_path / 'runs'}",
          "distributed.strategy=fsdp")  # fmt: skip
    assert losses(again) == losses(runs["fsdp"])
    a, b = adapters(again, 4), adapters(runs["fsdp"], 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
