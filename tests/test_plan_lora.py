"""LoRA and QLoRA in the planner (issue 48): the analytic model against the FakeTensorMode trace
of the real build and step (the reference, as in test_plan_memory.py), what each method trains,
the NF4 base's sizes, QLoRA's refusal where bitsandbytes cannot run, and `plan`'s full / LoRA /
QLoRA table with LoRA named as the remedy of a fine-tuning run that does not fit."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch
from test_plan_memory import close, config  # the same tiny run and tolerance as the full plans
from torch import nn

from littlelm.errors import ConfigError, DependencyError
from littlelm.model.lora import trainable_count
from littlelm.model.nf4 import NF4Footprint, check_nf4
from littlelm.plan import memory as mem
from littlelm.plan import speed
from littlelm.plan.cost import load_catalog
from littlelm.plan.memory import Dims, nf4_bytes
from littlelm.plan.planner import make_plan
from littlelm.plan.report import plan_json
from littlelm.plan.trace import BWD, CATEGORIES, FB, OPT, trace_step
from littlelm.schema import load_run
from littlelm.train.build import build

# What a `lora:` section changes, across the switches the formulas branch on. The backward's
# temporaries are held to the trace where the formulas model them; where they do not (a frozen
# MLP's backward, a trained lm_head's), the ratio measured is named and the peaks still checked.
CASES = {
    "all linear (the defaults)": ({"lora": {}}, None),
    "attention only, dropout, adamw": (
        {"lora": {"targets": "attention", "dropout": 0.1}, "optimizer": {"name": "adamw"}},
        0.86,  # trace / analytic: the frozen MLP's backward peaks lower than a trained one's
    ),
    "mlp only": ({"lora": {"targets": "mlp"}}, None),
    "by name: q_proj, v_proj, down_proj": (
        {"lora": {"targets": ["q_proj", "v_proj", "down_proj"]}},
        None,
    ),
    "embeddings and norm gains trained": (
        {"lora": {"train_embeddings": True, "train_norms": True}, "model": {"norm_affine": True}},
        1.14,  # trace / analytic: the trained lm_head's gradient beside the top block's
    ),
    "fp32": ({"lora": {}, "train": {"precision": "fp32"}}, None),
    # the chat tokens' rows trained (lora.trainable_tokens: chat): lm_head's weight a copy
    "chat token rows (a BPE tokenizer with the chat tokens)": (
        {"lora": {}, "data": {"tokenizer": {"name": "bpe", "vocab_size": 300}}},
        1.14,  # trace / analytic: the copy's whole gradient beside the top block's, as above
    ),
    "QLoRA: NF4 base (bitsandbytes' tensors, traced as its stand-in)": (
        {"lora": {"quantize": "nf4"}},
        None,
    ),
}


def full_params(d: Dims):
    """The parameters a full run of `d`'s model trains."""
    return [p for p in d.without_lora().params if p.trainable]


@pytest.mark.parametrize("sections, bwd", CASES.values(), ids=CASES.keys())
def test_lora_analytic_agrees_with_trace(tmp_path, corpus, sections, bwd):
    cfg = config(tmp_path, corpus, sections)
    traced = trace_step(cfg)
    d = Dims.of(cfg)
    analytic = mem.estimate(d)
    for k in CATEGORIES:
        t, a = traced.categories[k], analytic.categories[k]
        if k == BWD and bwd is not None:
            assert abs(t / a - bwd) < 0.02, f"{k}: trace/analytic {t / a:.3f}, was {bwd}"
            continue
        assert close(a, t), f"{k}: analytic {a:,} vs trace {t:,}"
    for phase in (FB, OPT):
        t, a = traced.phases[phase], analytic.phases[phase]
        assert close(a, t), f"peak {phase}: analytic {a:,} vs trace {t:,}"
    if not d.lora.train_embeddings:  # the frozen base: gradients and state the adapters' alone
        full = mem.estimate(d.without_lora())
        # the adapters' own share: at this 64-wide model a rank-32 pair is as large as its
        # weight, so "well under the full run's" is the adapters' size over the weights'
        share = sum(p.numel for p in d.trainable) / sum(p.numel for p in full_params(d))
        assert share < 0.75
        assert traced.categories["gradients"] < full.categories["gradients"] * (share + 0.05)
        assert traced.categories["optimizer state"] < full.categories["optimizer state"]


def test_planner_trains_what_the_model_trains(tmp_path, corpus):
    """The planner's parameter list (analytic) against add_lora's wrapped model: the same
    trained count and total, for each target choice."""
    named = {"targets": ["q_proj", "attn.c_proj", "up_proj"]}
    for lora in ({}, {"targets": "attention", "train_norms": True}, {"targets": ["mlp"]}, named):
        cfg = config(tmp_path, corpus, {"lora": lora, "model": {"norm_affine": True}})
        torch.manual_seed(0)
        model, _ = build(cfg, torch.device("cpu"))
        d = Dims.of(cfg)
        assert d.n_trainable == trainable_count(model)
        assert d.n_params == sum(p.numel() for p in model.parameters())


def test_nf4_base_sizes():
    """bitsandbytes' NF4 with double quantization: half a byte a weight, an 8-bit absmax per
    64 and an fp32 one per 256 of those, a 256-entry fp32 code book; the trace's stand-in holds
    exactly those tensors."""
    n = 4096 * 4096
    expected = n // 2 + n // 64 + 4 * (n // 64 // 256) + 4 * 256 + 512  # offset: one block
    assert nf4_bytes(n) == expected
    assert 0.51 < nf4_bytes(n) / n < 0.52
    with torch.device("meta"):
        stand_in = NF4Footprint(nn.Linear(256, 128, bias=False))
    tensors = [*stand_in.parameters(), *stand_in.buffers()]
    assert {t.dtype for t in stand_in.parameters()} == {torch.uint8}
    assert not any(t.requires_grad for t in tensors)
    sizes = sum(-(-t.untyped_storage().nbytes() // 512) * 512 for t in tensors)
    assert sizes == nf4_bytes(256 * 128)


def test_qlora_refused_on_the_cpu(tmp_path, corpus):
    cfg = config(tmp_path, corpus, {"lora": {"quantize": "nf4"}})
    with pytest.raises(ConfigError, match=r"needs a CUDA GPU.*lora.quantize=none"):
        build(cfg, torch.device("cpu"))


def test_qlora_without_bitsandbytes_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes fails
    with pytest.raises(DependencyError, match=r"bitsandbytes.*\.\[gpu\]"):
        check_nf4(torch.device("cuda"))


def test_lora_step_skips_the_frozen_weights_gradients():
    """The step model at 3B: no weight-gradient product for a frozen weight, optimizer work for
    the adapters only; QLoRA adds the dequantization of each NF4 weight, not GEMMs."""
    d = Dims.of(load_run("plans/3b_sft", ["lora={}"]))
    rates = speed.Rates(matmul=1e12, attention=1e12, bandwidth=1e11, launch=0.0)
    full, lora = speed.step_time(d.without_lora(), rates), speed.step_time(d, rates)
    assert lora.parts["GEMMs"] < full.parts["GEMMs"]
    assert lora.parts["optimizer"] < full.parts["optimizer"] / 2
    assert d.lora is not None
    nf4 = speed.step_time(d.with_lora(replace(d.lora, nf4=True)), rates)
    assert nf4.parts["GEMMs"] == lora.parts["GEMMs"]
    assert nf4.parts["elementwise"] != lora.parts["elementwise"]


def test_plan_lists_full_lora_and_qlora_and_names_lora_as_the_remedy():
    """configs/plans/3b_sft.yaml on an A100-80GB: full fine-tuning fits at no micro-batch, LoRA
    and QLoRA do (QLoRA in less); LoRA is a remedy that fits; --json carries the table."""
    cfg = load_run("plans/3b_sft")
    plan = make_plan(cfg, load_catalog(), ["A100-80GB"], trace=False)
    (gpu,) = plan.gpus
    methods = {m.method: m for m in gpu.methods}
    assert list(methods) == ["full", "LoRA", "QLoRA"]
    assert methods["full"].plan.tok_s is None and not methods["full"].change
    assert methods["LoRA"].plan.fits and methods["QLoRA"].plan.fits
    assert methods["QLoRA"].plan.needed_gib < methods["LoRA"].plan.needed_gib < 80
    assert methods["LoRA"].trainable < cfg.model.n_layer * 2e6  # adapters, not 3B
    fixes = [r.name for r in gpu.remedies if r.fits]
    assert "lora={}" in fixes and "lora={quantize: nf4}" in fixes
    row = plan_json(plan)["gpus"][0]["methods"]
    assert [m["method"] for m in row] == ["full", "LoRA", "QLoRA"]
    assert row[1]["dollars_per_billion_tokens"] > 0 and row[0]["tokens_per_s"] is None
