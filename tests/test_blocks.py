"""model/blocks.py is the one description of the MLP variants: a variant added there (and, for a
stock export, its weight mapping in interop/arch.py) is built by the model, counted by the
planner, grown by growth and exported to transformers (remote code and stock) and refused by
GGUF, with no other file changed. The toy variant below is added by the test, as a newcomer
would add it to blocks.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from littlelm.data.tokenizer import ByteTokenizer
from littlelm.errors import CheckpointError
from littlelm.interop import arch as A
from littlelm.interop.hf import hf_form, write_hf_dir
from littlelm.model import blocks
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.model.grow import (
    check_growable,
    grow_into,
    grown_value_embed_layers,
    layer_map,
    logit_gap,
)
from littlelm.optim.groups import MuonConfig
from littlelm.plan import dims, memory, speed

MUON = MuonConfig().traits()  # the default optimizer's group kinds, as the planner reads them

transformers = pytest.importorskip("transformers")

# What a newcomer writes into model/blocks.py's MLPS: GeGLU, a gated MLP with tanh-GELU
TOY = """
MLPS["geglu"] = MLPSpec(
    title="GeGLU",
    inputs=("c_fc", "c_gate"),
    act=lambda ops, proj: F.gelu(proj("c_gate"), approximate="tanh") * proj("c_fc"),
    width=2 / 3,
    saved=4,
    backward=3,
    passes=3,
)
"""
# ... and, for a stock export, into interop/arch.py's STOCK_MLP: Llama's MLP computes it with
# hidden_act gelu_pytorch_tanh
TOY_STOCK = A.StockMLP(
    "gelu_pytorch_tanh", {"c_gate": "gate_proj", "c_fc": "up_proj", "c_proj": "down_proj"}
)
LLAMA = dict(qk_norm=False, softcap=None, residual_scalars=False, value_embeds=False)
VOCAB = 257  # the byte tokenizer's


@pytest.fixture
def geglu(monkeypatch):
    """The toy variant registered as if it were written in blocks.py and arch.py."""
    namespace = {**vars(blocks), "MLPS": {}}
    exec(TOY, namespace)
    monkeypatch.setitem(blocks.MLPS, "geglu", namespace["MLPS"]["geglu"])
    monkeypatch.setitem(A.STOCK_MLP, "geglu", TOY_STOCK)
    return "geglu"


def config(mlp: str, **kw) -> GPTConfig:
    base = dict(name="gpt", vocab_size=VOCAB, n_layer=2, d_model=64, n_head=4, max_seq_len=32)
    # GPTConfig.mlp's Literal lists the variants written in blocks.py; the toy bypasses it
    return GPTConfig(**{**base, **kw}).model_copy(update={"mlp": mlp})


def random_model(cfg: GPTConfig, seed: int = 0) -> GPT:
    """Every weight random: a fresh model's zero c_proj would hide the MLP."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.2))
    return model.eval()


def test_the_model_builds_and_trains_a_new_variant(geglu):
    cfg = config(geglu)
    assert cfg.hidden == 192  # 2/3 of 4 x 64, the variant's width
    model = random_model(cfg)
    mlp = model.blocks[0].mlp
    assert [n for n, _ in mlp.named_parameters()] == [
        "c_fc.weight",
        "c_gate.weight",
        "c_proj.weight",
    ]
    x = torch.randn(2, 5, 64)
    want = mlp.c_proj(F.gelu(mlp.c_gate(x), approximate="tanh") * mlp.c_fc(x))
    assert torch.equal(mlp(x, model.kernels), want)
    model.train()
    ids = torch.randint(0, VOCAB, (2, 16))
    loss = model(ids, ids)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("mlp", ["relu2", "swiglu", "geglu"])
def test_the_planner_counts_what_the_model_builds(geglu, mlp):
    cfg = config(mlp)
    model = GPT(cfg)
    params, buffers = dims.model_tensors(cfg)
    built = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert {p.name: p.shape for p in params} == built
    # FLOPs: 6 per weight of every matrix the model multiplies by, plus attention's
    matrices = sum(p.numel() for n, p in model.named_parameters() if model.role(n) == "matrix")
    attention = 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * 32
    head = model.lm_head.weight.numel()
    assert model.flops_per_token(32) == 6 * (matrices + head) + attention
    spec = blocks.MLPS[mlp]
    d = dims.Dims(cfg, 2, 32, 1, True, MUON, params, buffers)
    # the variant's own figures move memory and speed, by its hidden width
    assert memory.mlp_activation_bytes(d) == spec.saved * 2 * cfg.hidden
    mlp_in = [g for g in speed.gemms(d) if g.name.startswith("mlp") and g.k == cfg.d_model]
    assert [(g.k, g.n) for g in mlp_in] == [(64, len(spec.inputs) * cfg.hidden)]
    wider = d.model.model_copy(update={"mlp_hidden": cfg.hidden + 64})
    dw = dims.Dims(wider, 2, 32, 1, True, MUON, *dims.model_tensors(wider))
    per_layer = memory.layer_activation_bytes(dw, 0) - memory.layer_activation_bytes(d, 0)
    assert per_layer == spec.saved * 2 * 64
    extra = speed.elementwise_bytes(dw) - speed.elementwise_bytes(d)
    moved = 64 * d.tokens * 2 * cfg.n_layer * (1 + speed.BACKWARD_FACTOR) * spec.passes
    grads_and_casts = (dw.n_params - d.n_params) * (4 * 2 + 2 + 6)
    assert math.isclose(extra, moved + grads_and_casts)


def test_growth_widens_a_new_variant_exactly(geglu):
    parent = random_model(config(geglu, n_layer=2))
    child_cfg = config(geglu, n_layer=3, mlp_hidden=256)
    layers = layer_map("end", 2, 3)
    ve = grown_value_embed_layers(parent.cfg, child_cfg, layers)
    child_cfg = child_cfg.model_copy(update={"value_embed_layers": ve})
    assert (
        child_cfg.hidden > parent.cfg.hidden and check_growable(parent.cfg, child_cfg, layers) == []
    )
    torch.manual_seed(1)
    child = GPT(child_cfg).eval()
    grow_into(child, parent.state_dict(), parent.cfg, layers)
    gap, scale = logit_gap(parent, child, torch.randint(0, VOCAB, (2, 16)))
    assert gap < 1e-4 * max(1.0, scale)


def test_remote_code_export_reads_the_variant_from_blocks_py(geglu, tmp_path):
    model = random_model(config(geglu))  # the demo's features: littlelm's modeling file
    tok = ByteTokenizer()
    arch, _, cfg, tensors = hf_form(model, tok)
    assert arch == "littlelm" and cfg["mlp"] == "geglu"
    write_hf_dir(tmp_path / "hf", tok, tensors, cfg, arch, "5GB")
    shipped = tmp_path / "hf" / "blocks.py"
    assert shipped.read_text() == Path(blocks.__file__).read_text()
    with shipped.open("a") as f:  # the variant, as it would be written in blocks.py
        f.write(TOY)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids), hf.eval()(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_stock_export_follows_the_weight_mapping_and_gguf_refuses(geglu, tmp_path):
    model = random_model(config(geglu, **LLAMA))
    tok = ByteTokenizer()
    arch, _, cfg, tensors = hf_form(model, tok)
    assert arch == "llama" and cfg["hidden_act"] == "gelu_pytorch_tanh"
    assert "model.layers.1.mlp.gate_proj.weight" in tensors
    write_hf_dir(tmp_path / "hf", tok, tensors, cfg, arch, "5GB")
    assert not (tmp_path / "hf" / "blocks.py").exists()
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids), hf.eval()(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    # import reads the variant back from hidden_act
    assert A.check_importable(cfg, "hf") == "llama" and A.stock_mlp(cfg) == "geglu"
    pytest.importorskip("gguf")
    from littlelm.interop.gguf_export import write_gguf

    with pytest.raises(CheckpointError, match="gates with gelu_pytorch_tanh"):
        write_gguf(model, tok, tensors, arch, tmp_path / "m.gguf", "f16")


# The norm is described once too (blocks.Norm and its costs): both models build their norms
# from it, and the planner reads its costs from blocks.py at call time, so a change there moves
# the plan with no other file touched.


def test_both_models_norm_with_blocks_norm(tmp_path):
    from littlelm.model.modeling_littlelm import LittleLMForCausalLM

    model = random_model(config("relu2", norm_affine=True, qk_norm_affine=True))
    names = ("norm1", "norm2", "norm_f", "q_norm", "k_norm")
    norms = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in names]
    assert len(norms) == 2 * 4 + 1 and all(type(m) is blocks.Norm for m in norms)
    x = torch.randn(3, 7, 64, dtype=torch.bfloat16)
    gain = model.norm_f.weight
    ours = model.norm_f(x, model.kernels, torch.float32)  # littlelm's CPU kernel
    plain = model.norm_f(x, blocks.TorchOps, torch.float32)  # what the transformers model runs
    want = F.rms_norm(x.float(), (64,), eps=torch.finfo(torch.bfloat16).eps) * gain
    assert torch.allclose(ours, want, atol=1e-6) and torch.allclose(plain, want, atol=1e-6)
    tok = ByteTokenizer()
    arch, _, cfg, tensors = hf_form(model, tok)
    write_hf_dir(tmp_path / "hf", tok, tensors, cfg, arch, "5GB")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert type(hf).__name__ == LittleLMForCausalLM.__name__
    hf_norms = [m for n, m in hf.named_modules() if n.endswith(("norm1", "norm2", "norm_f"))]
    assert len(hf_norms) == 2 * 2 + 1 and all(type(m).__name__ == "Norm" for m in hf_norms)


def test_the_planner_reads_the_norms_costs_from_blocks(monkeypatch):
    cfg = config("relu2", qk_norm=True)
    d = dims.Dims(cfg, 2, 32, 1, True, MUON, *dims.model_tensors(cfg))
    layer, total, moved = (
        memory.layer_activation_bytes(d, 0),
        memory.activation_bytes(d),
        speed.elementwise_bytes(d),
    )
    monkeypatch.setattr(blocks, "NORM_KEEPS", blocks.NORM_KEEPS + 4)  # a norm keeping 4 B more
    monkeypatch.setattr(blocks, "NORM_PASSES", blocks.NORM_PASSES + 1)  # and one more pass
    heads = cfg.n_head + cfg.kv_heads  # qk-norm normalises each head's row
    assert memory.layer_activation_bytes(d, 0) - layer == 4 * (2 + heads)
    # every layer's two norms and qk-norm rows, plus the embedding's and norm_f's, per token
    assert memory.activation_bytes(d) - total == 4 * (cfg.n_layer * (2 + heads) + 2) * d.tokens
    qk = heads * cfg.head_dim
    per_pass = d.tokens * d.act_bytes * cfg.n_layer * (1 + speed.BACKWARD_FACTOR)
    assert math.isclose(speed.elementwise_bytes(d) - moved, (2 * cfg.d_model + qk) * per_pass)


def test_a_norm_other_than_the_stock_classes_exports_with_remote_code(monkeypatch):
    cfg = config("swiglu", **LLAMA)
    assert A.export_arch(cfg)[0] == "llama"
    monkeypatch.setattr(blocks, "NORM_TITLE", "LayerNorm")  # as if blocks.Norm were changed
    arch, why = A.export_arch(cfg)
    assert arch == "littlelm" and "the LayerNorm norm" in why
