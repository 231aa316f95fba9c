"""A new optimizer is one file: its config and its group rule (optim/base.py). Lion (Chen et al.,
2023: the sign of an interpolated momentum, one buffer per parameter) is written here in that
file's worth of code; it trains through the Trainer, the planner counts its state from its rule
(within 10% of the trace, as every other optimizer), and the sharding reads its rule too."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import pytest
import torch

from conftest import tiny_tree, write_config
from littlelm.config import named
from littlelm.errors import ConfigError
from littlelm.optim.base import WHOLE, GroupRule, OptimizerTraits
from littlelm.optim.groups import AdamWConfig
from littlelm.optim.optimizer import MuonAdamW
from littlelm.plan import memory as mem
from littlelm.plan.dims import Dims
from littlelm.plan.planner import step_memory
from littlelm.plan.trace import CATEGORIES, trace_step
from littlelm.schema import load_run, resolve
from littlelm.train.trainer import Trainer

# ---- the new optimizer's file ------------------------------------------------------------------


@dataclass(frozen=True)
class LionRule(GroupRule):
    """p <- p·(1 - lr·wd) - lr·sign(β1·m + (1-β1)·g); then m <- β2·m + (1-β2)·g."""

    kind: ClassVar[str] = "lion"
    betas: tuple[float, float] = (0.9, 0.99)

    def group_options(self, fused: bool) -> dict:
        return {"betas": self.betas}

    def update(self, opt, group, keys, params, grads) -> None:
        b1, b2 = group["betas"]
        for key, p, g in zip(keys, params, grads):
            state = opt.state[key]
            if not state:
                state["exp_avg"] = torch.zeros_like(p)
            m = state["exp_avg"]
            p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(torch.lerp(g, m, b1).sign_(), alpha=-group["lr"])
            m.lerp_(g, 1 - b2)

    def state_bytes(self, numel: int, param_bytes: int) -> tuple[int, ...]:
        return (param_bytes * numel,)  # the momentum

    def scratch_bytes(self, numel: int, param_bytes: int, stochastic_rounding: bool):
        return (param_bytes * numel,)  # the interpolation, one tensor at a time

    def traffic(self, param_bytes: int) -> float:
        return param_bytes * 6  # p, g, m read; the interpolation; p, m written


class LionConfig(AdamWConfig):
    """Lion for every parameter, with AdamWConfig's learning rate per role."""

    name: Literal["lion"] = named("lion", resumable=False)  # type: ignore[assignment]
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)

    def own_traits(self) -> OptimizerTraits:
        rule = LionRule(self.betas)
        return OptimizerTraits("lion", (rule,), matrix="lion", other="lion")

    def lighter(self) -> list:
        return []


# ---- its tests -----------------------------------------------------------------------------------


def lion_run(tmp_path, corpus, **sections):
    tree = tiny_tree(corpus, tmp_path / "runs", **sections)
    cfg = load_run(write_config(tmp_path / "run.yaml", tree), ["train.precision=fp32"])
    # the optimizer: section's union lists littlelm's own; a new optimizer joins it in
    # optim/groups.py (OptimizerChoice), which this test stands in for
    return cfg.model_copy(update={"optimizer": LionConfig(scale_lr_by_width=False)})


def test_a_new_optimizer_trains_through_the_trainer(tmp_path, corpus):
    cfg = lion_run(tmp_path, corpus, train={"max_steps": 3}, eval={"every": 0})
    trainer = Trainer(cfg, resume="never")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    result = trainer.fit()
    assert result["finished"] and result["step"] == 3
    opt = trainer.optimizer
    assert {g["kind"] for g in opt.param_groups} == {"lion"}
    assert {g["betas"] for g in opt.param_groups} == {(0.9, 0.99)}
    for name, p in trainer.model.named_parameters():
        assert set(opt.state[p]) == {"exp_avg"}, name
        # its rule stepped every trained tensor (a sign step: lr per element with a gradient)
        assert (p.detach() - before[name]).abs().max() > 0, name


def test_the_planner_counts_a_new_optimizers_state_from_its_rule(tmp_path, corpus):
    """Within 10% of the trace on every category and phase, as test_plan_memory holds for
    AdamW and Muon (before rules, the planner counted any optimizer's state as AdamW's)."""
    cfg = lion_run(
        tmp_path,
        corpus,
        model={"n_layer": 2, "d_model": 64, "n_head": 2, "max_seq_len": 128},
        train={"micro_batch_size": 2, "seq_len": 128, "max_steps": 2},
    )
    traced = trace_step(cfg)
    d = Dims.of(cfg)
    assert d.optimizer.name == "lion"
    analytic = mem.estimate(d)
    for k in CATEGORIES:
        t, a = traced.categories[k], analytic.categories[k]
        assert a == t == 0 or abs(a / t - 1) <= 0.10, f"{k}: analytic {a} vs trace {t}"
    for phase in (mem.FB, mem.OPT):
        t, a = traced.phases[phase], analytic.phases[phase]
        assert abs(a / t - 1) <= 0.10, f"{phase} peak: analytic {a} vs trace {t}"
    # one buffer per parameter: half of AdamW's two
    adamw = mem.optimizer_state_bytes(Dims.of(cfg.model_copy(update={"optimizer": AdamWConfig()})))
    assert mem.optimizer_state_bytes(d) < 0.55 * adamw
    # the plan's own memory is the trace (no stand-in), and ZeRO-1 splits an elementwise rule
    _, memory, _, _ = step_memory(cfg)
    assert memory.categories[mem.STATE] == traced.categories[mem.STATE]
    zero = replace(d, world=4, shard_adamw=True)
    assert mem.optimizer_state_bytes(zero) < 0.3 * mem.optimizer_state_bytes(d)


@dataclass(frozen=True)
class WholeLionRule(LionRule):
    sharding: ClassVar[str] = WHOLE  # as a rule whose state is not elementwise would


class WholeLionConfig(LionConfig):
    def own_traits(self) -> OptimizerTraits:
        return OptimizerTraits("lion", (WholeLionRule(),), matrix="lion", other="lion")


def test_fsdp_refuses_a_rule_that_steps_whole_tensors(tiny_config):
    """Before any work, with the fix (the config check); and in the optimizer itself."""
    cfg = load_run(tiny_config)
    # derived at load for one process: resolved again below for two
    train = cfg.train.model_copy(update={"grad_accum": None, "batch_tokens": None})

    def run(strategy: str):
        dc = cfg.distributed.model_copy(update={"strategy": strategy, "world_size": None})
        return cfg.model_copy(
            update={"optimizer": WholeLionConfig(), "distributed": dc, "train": train}
        )

    with pytest.raises(ConfigError, match="lion groups step whole tensors.*strategy=ddp"):
        resolve(run("fsdp"), world_size=2)
    assert resolve(run("ddp"), world_size=2).distributed.world_size == 2  # replicated there
    p = torch.nn.Parameter(torch.zeros(4, 4))
    group = {"params": [p], "kind": "lion", "lr": 0.1, "weight_decay": 0.0, "betas": (0.9, 0.99)}
    opt = MuonAdamW([group], rules=[WholeLionRule()])
    with pytest.raises(ConfigError, match="steps whole tensors.*distributed.strategy=ddp"):
        opt.shard(fsdp=True, shard_muon=True, shard_adamw=False)
