"""The analytic memory model against the FakeTensorMode trace of the real builders and step."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_tree, write_config
from littlelm.plan import memory as mem
from littlelm.plan.shapes import Dims, param_shapes
from littlelm.plan.trace import trace_step
from littlelm.registry import MODELS
from littlelm.schema import load_run

# Five configs across the features the formulas branch on. Each is small enough to trace in
# about a second, with enough tokens per micro-batch (2 x 128) that per-token terms dominate.
FEATURES = {
    "default: relu2, value embeds, qk-norm, softcap, muon": {},
    "gqa + swiglu, adamw, no softcap": {
        "model": {"n_head": 4, "n_kv_head": 2, "mlp": "swiglu", "softcap": None},
        "optimizer": {"name": "adamw"},
    },
    "llama-style: swiglu, no value embeds / scalars / qk-norm": {
        "model": {
            "mlp": "swiglu",
            "value_embeds": False,
            "residual_scalars": False,
            "qk_norm": False,
            "softcap": None,
        },
    },
    "fp32, relu2, gqa, tied embeddings": {
        "model": {"n_head": 4, "n_kv_head": 1, "tie_embeddings": True},
        "train": {"precision": "fp32"},
    },
    "norm gains, grad accumulation 2": {
        "model": {"norm_affine": True, "n_layer": 3},
        "train": {"batch_tokens": 512},
    },
}


def config(tmp_path, corpus, sections: dict):
    base = {
        "model": {"n_layer": 2, "d_model": 64, "n_head": 2, "max_seq_len": 128},
        "train": {"micro_batch_size": 2, "seq_len": 128, "max_steps": 2},
    }
    tree = tiny_tree(corpus, tmp_path / "runs", **base)
    for key, value in sections.items():
        tree.setdefault(key, {}).update(value)
    return load_run(write_config(tmp_path / "run.yaml", tree))


def close(a: float, b: float, tol: float = 0.10) -> bool:
    return a == b == 0 or (b > 0 and abs(a / b - 1) <= tol)


STALE = pytest.mark.xfail(
    strict=True,
    reason="issue 8 changed the step (chunked loss, hand-written ops, one q/k/v matmul, fused AdamW); plan/memory.py still counts the old step and overestimates (follow-up)",
)


@STALE
@pytest.mark.parametrize("sections", FEATURES.values(), ids=FEATURES.keys())
def test_analytic_agrees_with_trace(tmp_path, corpus, sections):
    cfg = config(tmp_path, corpus, sections)
    traced = trace_step(cfg)
    analytic = mem.estimate(Dims.of(cfg), "cpu")
    for k in mem.CATEGORIES:
        t, a = traced.categories[k], analytic.categories[k]
        assert close(a, t), f"{k}: analytic {a} vs trace {t}"
    for phase in (mem.FB, mem.OPT):
        t, a = traced.phases[phase].total, analytic.phases[phase]
        assert close(a, t), f"{phase} peak: analytic {a} vs trace {t}"


def test_trace_sees_the_step_it_claims(tmp_path, corpus):
    """Sanity of the trace itself: fp32 AdamW state is exactly 2 x fp32 parameters (+ one
    step counter per tensor), gradients exist, bf16 copies are half the matmul weights."""
    cfg = config(tmp_path, corpus, {"optimizer": {"name": "adamw"}})
    c = trace_step(cfg).categories
    n_tensors = len(param_shapes(cfg.model))
    assert c["optimizer state"] == 2 * c["gradients"] + 512 * n_tensors
    assert c["gradients"] > 0 and c["activations"] > 0 and c["logits & loss"] > 0
    assert 0 < c["weight copies"] < c["parameters"]


def test_param_shapes_mirror_the_model(tmp_path, corpus):
    for sections in FEATURES.values():
        cfg = config(tmp_path, corpus, sections)
        with torch.device("meta"):
            model = MODELS.get("gpt")(cfg.model)
        built = {n: tuple(p.shape) for n, p in model.named_parameters()}
        assert {p.name: p.shape for p in param_shapes(cfg.model)} == built


def test_cuda_and_cpu_kernels_differ_only_where_documented(tmp_path, corpus):
    """Activations: equal for SwiGLU; relu² keeps an fp32 copy on CUDA (autocast runs pow in
    fp32); norms with gains keep x/rms on the CPU. Backward: CUDA's fused RMSNorm backward is
    smaller than the CPU's chain of fp32 ops."""
    d = Dims.of(config(tmp_path, corpus, {"model": {"mlp": "swiglu"}}))
    assert mem.activation_bytes(d, "cuda") == mem.activation_bytes(d, "cpu")
    relu2 = Dims.of(config(tmp_path, corpus, {}))
    h, L, N = relu2.model.hidden, relu2.model.n_layer, relu2.tokens
    extra = mem.activation_bytes(relu2, "cuda") - mem.activation_bytes(relu2, "cpu")
    assert extra == 4 * h * L * N
    fp32 = Dims.of(config(tmp_path, corpus, {"train": {"precision": "fp32"}}))
    assert mem.activation_bytes(fp32, "cuda") == mem.activation_bytes(fp32, "cpu")
    gains = Dims.of(config(tmp_path, corpus, {"model": {"norm_affine": True, "mlp": "swiglu"}}))
    assert mem.activation_bytes(gains, "cuda") < mem.activation_bytes(gains, "cpu")
    assert mem.norm_backward_bytes(d, "cuda") < mem.norm_backward_bytes(d, "cpu")


def test_memory_grows_with_micro_batch_and_accumulation_keeps_tokens(tmp_path, corpus):
    cfg = config(tmp_path, corpus, {"train": {"batch_tokens": 1024}})
    d = Dims.of(cfg)
    assert d.grad_accum == 4
    smaller = d.with_micro_batch(1)
    assert smaller.grad_accum == 8 and smaller.tokens * smaller.grad_accum == 1024
    assert mem.estimate(smaller).peak < mem.estimate(d).peak


def test_optimizer_state_per_parameter(tmp_path, corpus):
    """AdamW: 8 bytes per parameter; Muon: 4 for matrices, 8 for the rest."""
    adam = Dims.of(config(tmp_path, corpus, {"optimizer": {"name": "adamw"}}))
    muon = Dims.of(config(tmp_path, corpus, {}))
    n, matrices = adam.n_params, adam.numel("matrix")
    assert abs(mem.optimizer_state_bytes(adam) - 8 * n) < 0.05 * 8 * n
    expected = 4 * matrices + 8 * (n - matrices)
    assert abs(mem.optimizer_state_bytes(muon) - expected) < 0.05 * expected
