"""LoRA's frozen base as peft users hold it: in the training precision (one bf16 copy, not fp32
plus autocast's bf16 one), and the objectives' frozen reference as the model with its adapters
off (one set of base weights), both computing what the older layouts computed."""

from __future__ import annotations

import copy

import pytest
import torch
from test_dpo import dpo_tree, records, reversal_pairs, write_jsonl
from test_lora import base_and_lora, losses
from test_lora_objectives import LORA
from test_rl import rl_records, rl_trees

from conftest import write_config
from littlelm.load import load_model
from littlelm.model.lora import LoRALinear
from littlelm.schema import load_run
from littlelm.train import transform
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.trainer import Trainer


def frozen_linears(model: torch.nn.Module) -> list[torch.dtype]:
    return [m.base.weight.dtype for m in model.modules() if isinstance(m, LoRALinear)]


def test_bf16_run_holds_its_frozen_base_in_bf16_and_trains_as_with_fp32(tmp_path):
    _, tree = base_and_lora(tmp_path, dropout=0.1)
    tree["train"]["precision"] = "bf16"  # pinned: `auto` is either on a CPU
    runs = {}
    for held in ("auto", "fp32"):
        t = copy.deepcopy(tree)
        t["run"]["name"] = f"held-{held}"
        t["lora"]["base_precision"] = held
        trainer = Trainer(load_run(write_config(tmp_path / f"{held}.yaml", t)), resume="never")
        want = torch.bfloat16 if held == "auto" else torch.float32
        assert set(frozen_linears(trainer.model)) == {want}
        adapters = [p for p in trainer.model.parameters() if p.requires_grad]
        assert adapters and all(p.dtype == torch.float32 for p in adapters)  # master weights
        trainer.fit()
        runs[held] = trainer
    # autocast rounds an fp32 weight to the same bf16 copy at every matmul: the same run
    a, b = (losses(r.cfg.run_dir()) for r in runs.values())
    assert a == b and len(a) == 6

    # the merged export (fp32 merge from the base checkpoint) against the adapter model, both
    # computing in bf16 as the run did. Tolerance: the merge may round W + s·B A to bf16 where
    # the run rounded W and B A apart, so the two differ by bf16 rounding, no more: the merged
    # model is held to twice the run's own distance from the exact (fp32) function
    run = runs["auto"]
    merged, _, _ = load_model(ckpt.latest_checkpoint(run.cfg.run_dir() / "checkpoints"))
    run.model.eval()
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        exact = merged(x)  # fp32 weights, no autocast
        with run.autocast:
            trained, exported = run.model(x), merged(x)
    assert not torch.equal(trained, exact)  # the run did compute in bf16
    run_err = (trained - exact).abs().max()
    assert (exported - trained).abs().max() <= 2 * run_err
    # outside autocast the bf16-held base still runs (in bf16, as trained), output in fp32
    with torch.no_grad():
        assert run.model(x).dtype == torch.float32


def dpo_lora_tree(tmp_path) -> dict:
    from test_chat import sft_trees

    base, sft = sft_trees(tmp_path)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", reversal_pairs(80))
    tree = dpo_tree(tmp_path, base, sft["model"], pairs)
    tree["lora"] = dict(LORA)
    tree["train"].update(max_steps=3, precision="fp32")
    tree["eval"] = {"every": 0, "at_end": False}
    return tree


def copy_reference(monkeypatch):
    """LoRA's reference as before: a second model read from the base checkpoint."""
    monkeypatch.setattr(transform.LoRA, "reference", lambda self, model, copy: copy())


def test_lora_dpo_reference_is_the_model_with_adapters_off(tmp_path, monkeypatch):
    tree = dpo_lora_tree(tmp_path)
    run = Trainer(load_run(write_config(tmp_path / "a.yaml", tree)), resume="never")
    ref = run.objective.reference
    assert isinstance(ref, transform.AdaptersOff) and not list(ref.parameters())  # no copy
    with torch.no_grad():  # adapters that moved: the policy is no longer the base
        for name, p in run.model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    x = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert not torch.equal(run.model(x), ref(x))
        assert all(m.enabled for m in run.model.modules() if isinstance(m, LoRALinear))
    # the copy-reference (a second model from the base checkpoint) computes the same, bitwise
    copy_reference(monkeypatch)
    second = run.objective.setting.reference()
    assert not isinstance(second, transform.AdaptersOff)
    with torch.no_grad():
        assert torch.equal(second(x), ref(x))


@pytest.mark.parametrize("objective", ["dpo", "rl"])
def test_lora_losses_unchanged_against_a_copy_reference(tmp_path, monkeypatch, objective):
    if objective == "dpo":
        tree = dpo_lora_tree(tmp_path)
        figures = lambda d: [  # noqa: E731
            (r["step"], r["loss"], r["reward_margin"]) for r in records(d) if "loss" in r
        ]
    else:
        tree = rl_trees(tmp_path)
        tree["lora"] = dict(LORA)
        tree["train"].update(max_steps=3, precision="fp32")
        figures = rl_records
    tree["run"]["name"] = "off"
    off = load_run(write_config(tmp_path / "off.yaml", tree))
    assert Trainer(off, resume="never").fit()["finished"]
    copy_reference(monkeypatch)
    tree["run"]["name"] = "copy"
    copied = load_run(write_config(tmp_path / "copy.yaml", tree))
    assert Trainer(copied, resume="never").fit()["finished"]
    got = figures(off.run_dir())
    assert got and got == figures(copied.run_dir())
