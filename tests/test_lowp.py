"""bf16 master weights: stochastic rounding, the stochastic-rounding optimizers, 8-bit AdamW's
errors, and the train-section checks."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import tiny_tree, write_config
from littlelm.console import Console
from littlelm.errors import ConfigError
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.optim.groups import AdamWConfig, MuonConfig, build_optimizer
from littlelm.optim.lowp import stochastic_round_
from littlelm.optim.optimizer import MuonAdamW
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased():
    torch.manual_seed(0)
    value = 1.0 + 0.3 * 2**-7  # 30% of the way from 1.0 to the next bf16 number (1 + 2^-7)
    src = torch.full((200_000,), value)
    dst = torch.empty(200_000, dtype=torch.bfloat16)
    stochastic_round_(dst, src.clone())
    assert set(dst.float().unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert dst.float().mean().item() == pytest.approx(value, abs=2e-5)  # round-to-nearest: 1.0
    exact = torch.tensor([0.5, -3.0, 1.0 + 2**-7])
    out = torch.empty(3, dtype=torch.bfloat16)
    assert torch.equal(stochastic_round_(out, exact.clone()).float(), exact)  # no noise on exact


def grads_like(p: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)).to(p.dtype)


def stochastic_adamw(p: torch.nn.Parameter, lr: float, weight_decay: float) -> MuonAdamW:
    """The optimizer's AdamW path with stochastic rounding, over one parameter."""
    group = {"params": [p], "kind": "adamw", "lr": lr, "betas": (0.9, 0.95), "eps": 1e-8}
    return MuonAdamW([{**group, "weight_decay": weight_decay, "fused": False}], True)


def test_stochastic_adamw_tracks_torch_adamw():
    torch.manual_seed(0)
    start = torch.randn(64, 64).bfloat16()
    ours = torch.nn.Parameter(start.clone())
    ref = torch.nn.Parameter(start.float())
    opt_ours = stochastic_adamw(ours, lr=1e-2, weight_decay=0.1)
    opt_ref = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for s in range(10):
        ours.grad, ref.grad = grads_like(ours, s), grads_like(ref, s).float()
        opt_ours.step()
        opt_ref.step()
    assert ours.dtype == torch.bfloat16
    # ten roundings, each off by under one bf16 step (2^-7 relative) and unbiased: a random
    # walk of about sqrt(10)/sqrt(6) ≈ 1.3 steps rms, and no drift on average
    step = 2.0 ** (ref.detach().abs().clamp(min=1e-2).log2().floor() - 7)
    diff = ours.float() - ref.detach()
    assert (diff / step).square().mean().sqrt() < 2.0
    moved = (ref.detach() - start.float()).abs().mean()
    assert diff.mean().abs() < 0.01 * moved


def test_small_updates_survive_with_stochastic_rounding_and_vanish_without():
    """An update of 1/10 of a bf16 step: round-to-nearest loses it, stochastic rounding keeps it
    on average."""
    torch.manual_seed(0)
    lr = 0.1 * 2**-8  # the bf16 step just below 1.0 is 2^-8; Adam's step is lr·sign(g) at t=1
    results = {}
    for name in ("nearest", "stochastic"):
        p = torch.nn.Parameter(torch.full((100_000,), 0.75, dtype=torch.bfloat16))
        if name == "nearest":
            opt = torch.optim.AdamW([p], lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        else:
            opt = stochastic_adamw(p, lr=lr, weight_decay=0.0)
        for _ in range(20):
            p.grad = torch.ones_like(p)
            opt.step()
        results[name] = 0.75 - p.float().mean().item()
    assert results["nearest"] == 0.0
    assert results["stochastic"] == pytest.approx(20 * lr, rel=0.05)


def test_muon_with_stochastic_rounding_applies_updates_on_average():
    torch.manual_seed(0)
    start = torch.randn(128, 128).bfloat16()
    moves = {}
    for sr in (False, True):
        p = torch.nn.Parameter(start.clone())
        group = {"params": [p], "kind": "muon", "lr": 1e-4, "weight_decay": 0.0}
        opt = MuonAdamW([{**group, "momentum": 0.95, "nesterov": True, "ns_steps": 5}], sr)
        p.grad = grads_like(p, 0)
        opt.step()
        moves[sr] = (p.float() - start.float()).abs().mean().item()
    assert moves[True] > 3 * moves[False]  # most updates are below half a bf16 step


def tiny_model() -> GPT:
    return GPT(GPTConfig(vocab_size=100, n_layer=2, d_model=32, n_head=4, max_seq_len=16))


def test_8bit_adamw_needs_cuda_and_excludes_stochastic_rounding():
    with pytest.raises(ConfigError, match="adamw_8bit needs a CUDA device"):
        build_optimizer(tiny_model(), AdamWConfig(adamw_8bit=True))
    with pytest.raises(ConfigError, match="cannot be combined"):
        build_optimizer(tiny_model(), MuonConfig(adamw_8bit=True), stochastic_rounding=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_8bit_adamw_on_cuda():
    pytest.importorskip("bitsandbytes")
    model = tiny_model().cuda()
    opt = build_optimizer(model, MuonConfig(adamw_8bit=True))
    idx = torch.zeros(1, 8, dtype=torch.long, device="cuda")
    model(idx, idx).backward()
    opt.step()  # bitsandbytes steps the AdamW groups and keeps its state in our optimizer's
    assert sum("state1" in s for s in opt.state.values()) == sum(
        len(g["params"]) for g in opt.param_groups if g["kind"] == "adamw"
    )
    opt.load_state_dict(opt.state_dict())
    opt.step()


def test_train_section_checks(tiny_config):
    with pytest.raises(ConfigError, match="master_weights=bf16 needs train.precision=bf16"):
        load_run(tiny_config, ["train.master_weights=bf16", "train.precision=fp32"])
    with pytest.raises(ConfigError, match="stochastic_rounding only applies to bf16"):
        load_run(tiny_config, ["train.stochastic_rounding=true"])
    with pytest.raises(ConfigError, match="model.loss=liger runs on CUDA only"):
        Trainer(load_run(tiny_config, ["model.loss=liger"]), resume="never")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_every_speed_feature_at_once_trains(tmp_path, corpus, optimizer, capsys):
    """bf16 weights + stochastic rounding + checkpointing + FP8 + plain loss, then resumed with
    checkpointing off, the chunked loss and e5m2 FP8 gradients (all allowed to change on
    resume)."""
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        model={"fp8": True, "fp8_min_dim": 16, "loss": "plain"},
        optimizer={"name": optimizer, "lr": 3e-3} if optimizer == "adamw" else {"name": optimizer},
        train={
            "master_weights": "bf16",
            "stochastic_rounding": True,
            "activation_checkpointing": True,
        },
    )
    cfg = load_run(write_config(tmp_path / "all.yaml", tree))
    trainer = Trainer(cfg, resume="never", callbacks=(Console(),))  # the CLI's output
    first = trainer.fit(stop_after=3)
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    out = capsys.readouterr().out
    assert "bf16 weights, stochastic rounding, plain loss" in out and "MFU" in out
    assert "fp8 (layers >= 16 wide, e4m3 gradients)" in out
    lines = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["kind"] == "train"]
    assert all(r["mfu"] > 0 and math.isfinite(r["loss"]) for r in train)
    resumed = load_run(
        write_config(tmp_path / "all.yaml", tree),
        ["train.activation_checkpointing=false", "model.loss=chunked", "model.fp8_grad_dtype=e5m2"],
    )
    result = Trainer(resumed).fit()
    assert result["finished"] and result["step"] == 6
    assert first["step"] == 3
