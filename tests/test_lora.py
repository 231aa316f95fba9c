"""LoRA (model/lora.py): wrapping, counts, the function at init, merging, the optimizer's groups,
a LoRA run's checkpoints and resume, loading it merged, its PEFT export, and the refusals."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import judge, make_corpus, tiny_tree, write_config
from littlelm.cli import main
from littlelm.errors import CheckpointError, ConfigError
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.model.lora import (
    LoRAConfig,
    LoRALinear,
    add_lora,
    merge_lora,
    trainable_count,
)
from littlelm.optim.groups import AdamWConfig, MuonConfig
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.trainer import Trainer


def tiny_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, n_layer=2, d_model=32, n_head=2, max_seq_len=16)
    return GPT(GPTConfig(**{**cfg, **kw}))


def perturbed(model: GPT, seed: int = 1) -> GPT:
    """B drawn at random: adapters that have learned something."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.1)
    return model


TOKENS = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))


def test_all_linear_wraps_every_block_linear_and_freezes_the_rest():
    model = add_lora(tiny_gpt(), LoRAConfig(rank=4))
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    # relu2's MLP: c_fc, c_proj; attention: c_q, c_k, c_v, c_proj; lm_head is not a target
    assert len(wrapped) == 2 * 6 and not any(n.startswith("lm_head") for n in wrapped)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)
    # r·(in + out) per linear: attention 4 × (32 + 32), c_fc (32 + 128), mlp c_proj (128 + 32)
    assert trainable_count(model) == 2 * 4 * (4 * 64 + 160 + 160)


def test_targets_by_role_and_full_trained_tensors():
    attn = add_lora(tiny_gpt(), LoRAConfig(rank=2, targets="attention"))
    assert {n.rsplit(".", 1)[-1] for n, m in attn.named_modules() if isinstance(m, LoRALinear)} == {
        "c_q",
        "c_k",
        "c_v",
        "c_proj",
    }
    assert not isinstance(attn.blocks[0].mlp.c_fc, LoRALinear)
    mlp = add_lora(tiny_gpt(mlp="swiglu"), LoRAConfig(rank=2, targets=["mlp"]))
    assert isinstance(mlp.blocks[1].mlp.c_gate, LoRALinear)
    assert not isinstance(mlp.blocks[1].attn.c_q, LoRALinear)
    full = add_lora(
        tiny_gpt(norm_affine=True), LoRAConfig(rank=2, train_embeddings=True, train_norms=True)
    )
    trained = {n for n, p in full.named_parameters() if p.requires_grad}
    assert {"wte.weight", "lm_head.weight", "norm_f.weight", "blocks.0.norm1.weight"} <= trained
    assert not any(n.startswith("value_embeds") or "lambdas" in n for n in trained)


def wrapped_names(model) -> set[str]:
    return {n.split(".", 2)[2] for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def test_targets_by_the_module_names_exports_give_them():
    """peft users name linears as transformers does (q_proj, ...) or as littlelm's export does
    (attn.c_proj: c_proj alone would be both the attention's and the MLP's)."""
    names = add_lora(tiny_gpt(mlp="swiglu"), LoRAConfig(rank=2, targets=["v_proj", "q_proj"]))
    assert wrapped_names(names) == {"attn.c_q", "attn.c_v"}
    mixed = LoRAConfig(rank=2, targets=["gate_proj", "down_proj", "attn.c_proj"])
    assert wrapped_names(add_lora(tiny_gpt(mlp="swiglu"), mixed)) == {
        "mlp.c_gate",
        "mlp.c_proj",
        "attn.c_proj",
    }
    # a group and names together; each block's linears in the block's order, whatever the
    # list's: the same A drawn for the same targets
    torch.manual_seed(0)
    listed = add_lora(
        tiny_gpt(), LoRAConfig(rank=2, targets=["mlp", "k_proj", "o_proj", "q_proj", "v_proj"])
    )
    torch.manual_seed(0)
    grouped = add_lora(tiny_gpt(), LoRAConfig(rank=2, targets="all_linear"))
    assert [n for n, _ in listed.named_parameters()] == [n for n, _ in grouped.named_parameters()]
    for (n, a), (_, b) in zip(listed.named_parameters(), grouped.named_parameters()):
        assert torch.equal(a, b), n


def test_named_targets_the_model_lacks_or_no_model_has_are_refused():
    from littlelm.config import validate
    from littlelm.model.lora import check_lora
    from littlelm.schema import RunConfig, resolve

    with pytest.raises(ConfigError, match=r"\['qproj'\] is not a group or a block linear's name"):
        validate(RunConfig, {"lora": {"targets": ["q_proj", "qproj"]}})
    with pytest.raises(ConfigError, match="lists a target twice"):
        validate(RunConfig, {"lora": {"targets": ["q_proj", "q_proj"]}})
    problems = check_lora(tiny_gpt(), LoRAConfig(targets=["gate_proj", "q_proj"]))  # relu2: no gate
    assert problems and "['gate_proj']: this model's MLP has no such linear" in problems[0]
    assert "mlp.c_fc, mlp.c_proj" in problems[0]
    tiny = {"d_model": 32, "n_head": 2, "n_layer": 2, "max_seq_len": 32, "vocab_size": 50}
    tree = {"model": tiny, "lora": {"rank": 4, "targets": ["gate_proj"]}}
    with pytest.raises(ConfigError, match="gate_proj"):  # at config time, before any data
        resolve(validate(RunConfig, tree))


def test_rslora_scales_by_alpha_over_the_root_of_the_rank():
    assert LoRAConfig(rank=16, alpha=32).scale == 2.0
    assert LoRAConfig(rank=16, alpha=32, use_rslora=True).scale == 8.0
    model = add_lora(tiny_gpt(), LoRAConfig(rank=4, alpha=8, use_rslora=True))
    assert model.blocks[0].attn.c_q.scale == 4.0


def test_fresh_adapters_compute_the_base_exactly_and_merging_keeps_the_function():
    base = tiny_gpt().eval()
    want = base(TOKENS)
    model = add_lora(copy.deepcopy(base), LoRAConfig(rank=4, alpha=8)).eval()
    assert torch.equal(model(TOKENS), want)  # B = 0
    perturbed(model)
    adapted = model(TOKENS)
    assert (adapted - want).abs().max() > 1e-3  # the adapters do something
    merged = merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    torch.testing.assert_close(merged(TOKENS), adapted, atol=1e-5, rtol=0)
    # the merged model is a plain GPT: its state dict loads into a fresh one
    plain = tiny_gpt()
    plain.load_state_dict(merged.state_dict())


def test_adapters_get_adamw_at_lora_lr_and_the_base_no_group():
    for opt in (MuonConfig(), AdamWConfig()):
        model = add_lora(tiny_gpt(), LoRAConfig(rank=4, lr=3e-3))
        groups = opt.build(model).param_groups
        assert [(g["role"], g["kind"], g["lr"]) for g in groups] == [("adapter", "adamw", 3e-3)]
        assert sum(p.numel() for g in groups for p in g["params"]) == trainable_count(model)


def test_config_refusals():
    from littlelm.config import validate
    from littlelm.schema import RunConfig

    # QLoRA is a valid config (planned anywhere); building it without CUDA is refused
    # (tests/test_plan_lora.py::test_qlora_refused_on_the_cpu)
    assert validate(RunConfig, {"lora": {"quantize": "nf4"}}).lora.quantize == "nf4"
    with pytest.raises(ConfigError, match="lists no linears"):
        validate(RunConfig, {"lora": {"targets": []}})
    # a rank above the smallest side of a targeted linear adds parameters, not rank: refused
    tiny = {"d_model": 32, "n_head": 2, "n_layer": 2, "max_seq_len": 32}
    limit = 32  # d_model: c_q, c_k, c_v and c_proj are 32 × 32, the MLP's 32 × 128
    from littlelm.schema import resolve

    tree = {"model": {**tiny, "vocab_size": 50}, "lora": {"rank": limit}}
    with pytest.raises(ConfigError) as no_data:  # this tree has no data: refused for that alone
        resolve(validate(RunConfig, tree))
    assert "lora.rank" not in str(no_data.value)
    tree["lora"]["rank"] = 100000
    with pytest.raises(ConfigError, match=f"lora.rank: 100000 is above {limit}, the smallest"):
        resolve(validate(RunConfig, tree))
    with pytest.raises(ValueError, match="train_norms"):
        from littlelm.model.lora import check_lora

        problems = check_lora(tiny_gpt(), LoRAConfig(train_norms=True))
        raise ValueError(problems[0])


# -- runs ---------------------------------------------------------------------------------------


def base_and_lora(tmp_path: Path, model: dict | None = None, **lora) -> tuple[Path, dict]:
    """A tiny base run (3 steps; `model` features over the tiny defaults) and a LoRA run
    continuing its pretraining (grow: the same shape)."""
    corpus = make_corpus(tmp_path / "corpus.txt")
    base = tiny_tree(corpus, tmp_path / "runs", run={"name": "base"}, model=model or {})
    base["train"]["max_steps"] = 3
    Trainer(load_run(write_config(tmp_path / "base.yaml", base)), resume="never").fit()
    tree = tiny_tree(corpus, tmp_path / "runs", run={"name": "lora"}, model=model or {})
    tree["grow"] = {"parent": str(tmp_path / "runs" / "base")}
    tree["lora"] = {"rank": 4, "lr": 0.01, **lora}
    tree["train"].update(max_steps=6)
    return tmp_path / "runs" / "base", tree


def losses(run_dir: Path) -> list[tuple]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]


def test_lora_run_keeps_adapters_alone_resumes_bitwise_and_loads_merged(tmp_path):
    base_dir, tree = base_and_lora(tmp_path, dropout=0.1, train_embeddings=True)
    tree["train"]["precision"] = "fp32"  # the merge checked at 1e-5 (bf16: test_lora_base.py)
    straight = load_run(write_config(tmp_path / "straight.yaml", tree))
    trainer = Trainer(straight, resume="never")
    assert trainable_count(trainer.model) < trainer.model.param_counts()["total"] // 2
    trainer.fit()
    tree["run"]["name"] = "split"
    split = load_run(write_config(tmp_path / "split.yaml", tree))
    stopped = Trainer(split, resume="never")
    assert stopped.fit(stop_after=4)["step"] == 4
    # a rollback (the loss guard's) puts the checkpoint's adapters back, the base untouched
    at4 = load_file(split.run_dir() / "checkpoints" / "step_000004" / "model.safetensors")
    frozen = {n: p.clone() for n, p in stopped.model.named_parameters() if not p.requires_grad}
    with torch.no_grad():
        for p in stopped.model.parameters():
            if p.requires_grad:
                p.add_(1.0)
    stopped.checkpointer.rollback(stopped.state, stopped.model, stopped.optimizer)
    params = dict(stopped.model.named_parameters())
    assert all(torch.equal(params[k], at4[k]) for k in at4)
    assert all(torch.equal(params[k], v) for k, v in frozen.items())
    Trainer(split).fit()  # resumes from step 3's checkpoint: base, adapters, their moments, RNG
    assert (
        losses(straight.run_dir()) == losses(split.run_dir()) and len(losses(split.run_dir())) == 6
    )
    newest = ckpt.latest_checkpoint(split.run_dir() / "checkpoints")
    saved = load_file(newest / "model.safetensors")
    full = {"wte.weight", "lm_head.weight"}  # train_embeddings: trained in full (untied)
    assert full <= set(saved) and all(".lora_" in k for k in set(saved) - full)
    other = load_file(
        ckpt.latest_checkpoint(straight.run_dir() / "checkpoints") / "model.safetensors"
    )
    assert all(torch.equal(saved[k], other[k]) for k in saved)
    state = json.loads((newest / "state.json").read_text())
    assert Path(state["lora_base"]["path"]).parent.parent == base_dir

    from littlelm.load import load_model

    merged, _, _ = load_model(newest)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    t = Trainer(split)  # the wrapped model, as training computes it
    t.model.eval()
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(merged(x), t.model(x), atol=1e-5, rtol=0)

    # the base changed under the adapters: refused, naming it
    base_ckpt = Path(state["lora_base"]["path"])
    st = json.loads((base_ckpt / "state.json").read_text())
    st["tokens"] += 1
    (base_ckpt / "state.json").write_text(json.dumps(st))
    with pytest.raises(CheckpointError, match="changed since"):
        load_model(newest)


def test_lora_from_random_weights_or_a_grown_model_is_refused(tmp_path):
    _, tree = base_and_lora(tmp_path)
    fresh = copy.deepcopy(tree)
    del fresh["grow"]
    with pytest.raises(ConfigError, match="random weights"):
        Trainer(load_run(write_config(tmp_path / "r.yaml", fresh)), resume="never")
    grown = copy.deepcopy(tree)
    grown["model"]["n_layer"] = 3
    grown["run"]["name"] = "grown"
    with pytest.raises(ConfigError, match="grown"):
        Trainer(load_run(write_config(tmp_path / "g.yaml", grown)), resume="never")
    qlora_fsdp = copy.deepcopy(tree)
    qlora_fsdp["distributed"] = {"strategy": "fsdp"}
    qlora_fsdp["lora"]["quantize"] = "nf4"
    with pytest.raises(ConfigError, match="nf4 with distributed.strategy=fsdp"):
        load_run(write_config(tmp_path / "f.yaml", qlora_fsdp), world_size=2)
    qlora_fsdp["lora"]["quantize"] = "none"  # LoRA itself runs under FSDP (test_lora_fsdp.py)
    load_run(write_config(tmp_path / "f.yaml", qlora_fsdp), world_size=2)


LLAMA = dict(mlp="swiglu", qk_norm=False, softcap=None, residual_scalars=False, value_embeds=False)


@pytest.mark.parametrize(
    "features,targets,rslora",
    [
        ({}, "all_linear", False),
        (LLAMA, ["attention"], False),
        (LLAMA, ["q_proj", "v_proj", "down_proj"], True),
    ],
    ids=["littlelm-remote-code", "llama-attention", "llama-names-rslora"],
)
def test_peft_on_the_exported_base_computes_the_lora_run_and_so_does_the_merged_export(
    tmp_path, features, targets, rslora
):
    """peft, the judge: PeftModel.from_pretrained(base export, DIR/adapter) and
    AutoPeftModelForCausalLM.from_pretrained(DIR/adapter) (the base it names) give littlelm's
    logits of the wrapped model within 1e-4 (fp32); the merged export (DIR) gives them too."""
    peft = judge("peft")
    transformers = judge("transformers")
    from littlelm.interop.hf import export
    from littlelm.load import load_model

    lora = {"targets": targets, "lr": 0.05, "alpha": 4, "use_rslora": rslora}
    base_dir, tree = base_and_lora(tmp_path, features, **lora)
    tree["train"].update(max_steps=3, precision="fp32")  # judged in fp32: the base held in it
    cfg = load_run(write_config(tmp_path / "lora.yaml", tree))
    Trainer(cfg, resume="never").fit()
    assert export(base_dir, tmp_path / "hf_base")["adapter"] is None  # not a LoRA run
    info = export(cfg.run_dir(), tmp_path / "hf_lora")
    assert info["adapter"] == tmp_path / "hf_lora" / "adapter"

    wrapped = Trainer(cfg).model.eval()  # resumed at its end: base + adapters, as trained
    plain, _, _ = load_model(base_dir)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(5))
    auto = transformers.AutoModelForCausalLM
    with torch.no_grad():
        ours = wrapped(ids)
        assert (ours - plain(ids)).abs().max() > 1e-3  # the adapters changed the function
        base_hf = auto.from_pretrained(tmp_path / "hf_base", trust_remote_code=True)
        model = peft.PeftModel.from_pretrained(base_hf.float(), tmp_path / "hf_lora" / "adapter")
        n_adapted = sum(1 for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer))
        assert model.peft_config["default"].use_rslora is rslora
        want = sum(isinstance(m, LoRALinear) for m in wrapped.modules())
        assert n_adapted == want  # each of ours, no more (c_proj is in attention and the MLP)
        theirs = model.eval()(ids).logits
        merged = auto.from_pretrained(tmp_path / "hf_lora", trust_remote_code=True).eval()
        merged_logits = merged(ids).logits
        # the adapter alone names the base exported beside it: peft finds and loads both
        alone = peft.AutoPeftModelForCausalLM.from_pretrained(
            tmp_path / "hf_lora" / "adapter", trust_remote_code=True
        )
        alone_logits = alone.float().eval()(ids).logits
    assert (alone_logits - ours).abs().max().item() < 1e-4
    assert (theirs - ours).abs().max().item() < 1e-4
    assert (merged_logits - ours).abs().max().item() < 1e-4
    assert (merged_logits - theirs).abs().max().item() < 1e-4


def test_a_run_training_embeddings_exports_merged_and_says_why_no_adapter(tmp_path, capsys):

    _, tree = base_and_lora(tmp_path, train_embeddings=True)
    tree["train"]["max_steps"] = 1
    cfg = load_run(write_config(tmp_path / "lora.yaml", tree))
    Trainer(cfg, resume="never").fit()
    assert main(["export", str(cfg.run_dir()), "--out", str(tmp_path / "hf")]) == 0
    assert "no PEFT adapter: lora.train_embeddings" in capsys.readouterr().out
    assert (tmp_path / "hf" / "config.json").is_file() and not (
        tmp_path / "hf" / "adapter"
    ).exists()


def test_lora_on_an_imported_model_loads_in_peft_on_the_model_it_came_from(tmp_path, capsys):
    """A transformers model brought in by `littlelm import`, continued with LoRA from its
    train.yaml: peft puts the exported adapters on the original model directory."""
    peft = judge("peft")
    transformers = judge("transformers")
    import yaml

    from littlelm.interop.hf import export, import_model

    corpus = make_corpus(tmp_path / "corpus.txt")
    base = tiny_tree(corpus, tmp_path / "runs", run={"name": "base"}, model=LLAMA)
    base["train"]["max_steps"] = 2
    Trainer(load_run(write_config(tmp_path / "base.yaml", base)), resume="never").fit()
    export(tmp_path / "runs" / "base", tmp_path / "hf")  # stands for a downloaded model
    import_model(tmp_path / "hf", tmp_path / "runs" / "imported")
    tree = yaml.safe_load((tmp_path / "runs" / "imported" / "train.yaml").read_text())
    tree["data"]["sources"] = {"text": {"name": "text", "path": str(corpus), "split": "paragraph"}}
    tree["run"].update(name="imported-lora", device="cpu")
    tree["train"] = {"micro_batch_size": 4, "seq_len": 32, "max_steps": 3}
    tree["eval"] = {"every": 0, "at_end": False}
    tree["lora"] = {"rank": 4, "lr": 0.05, "targets": ["mlp"]}
    cfg = load_run(write_config(tmp_path / "lora.yaml", tree))
    assert main(["train", str(tmp_path / "lora.yaml")]) == 0
    # d_model 32, MLP 64 (swiglu): r·(32 + 64) for c_gate, c_fc and c_proj, in 2 layers
    assert "lora: 2,304 trainable parameters" in capsys.readouterr().out
    export(cfg.run_dir(), tmp_path / "hf_lora")
    wrapped = Trainer(cfg).model.eval()
    original = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = original(ids).logits
        model = peft.PeftModel.from_pretrained(original, tmp_path / "hf_lora" / "adapter")
        ours, theirs = wrapped(ids), model.eval()(ids).logits
    assert (ours - before).abs().max() > 1e-3
    assert (theirs - ours).abs().max().item() < 1e-4


def test_gguf_of_a_lora_run_is_the_merged_model(tmp_path):
    """`export --gguf` writes the merged model: transformers' GGUF reader computes littlelm's
    merged logits (fp32 weights)."""
    judge("gguf")
    transformers = judge("transformers")
    from littlelm.interop.hf import export
    from littlelm.load import load_model

    corpus = make_corpus(tmp_path / "corpus.txt")
    base = tiny_tree(corpus, tmp_path / "runs", run={"name": "base"}, model=LLAMA)
    base["data"]["tokenizer"] = {"name": "bpe", "vocab_size": 300, "train_chars": 5000}
    base["train"]["max_steps"] = 2
    Trainer(load_run(write_config(tmp_path / "base.yaml", base)), resume="never").fit()
    tree = tiny_tree(corpus, tmp_path / "runs", run={"name": "lora"}, model=LLAMA)
    tree["data"]["tokenizer"] = {"name": "saved", "path": str(tmp_path / "runs" / "base")}
    tree["grow"] = {"parent": str(tmp_path / "runs" / "base"), "continue_data": False}
    tree["lora"] = {"rank": 4, "lr": 0.05}
    tree["train"]["max_steps"] = 2
    cfg = load_run(write_config(tmp_path / "lora.yaml", tree))
    Trainer(cfg, resume="never").fit()
    out = tmp_path / "gguf" / "lora.gguf"
    export(cfg.run_dir(), None, gguf=out, gguf_type="f32")
    merged, tok, _ = load_model(cfg.run_dir())
    plain, _, _ = load_model(tmp_path / "runs" / "base")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name).eval()
    ids = torch.randint(0, tok.vocab_size, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ours = merged(ids)
        assert (ours - plain(ids)).abs().max() > 1e-3
        assert (hf(ids).logits - ours).abs().max().item() < 1e-4


def test_a_run_starts_from_a_lora_run_as_its_merged_model(tmp_path):
    """grow.parent (and so sft.base, RL's and DPO's reference) naming a LoRA run: its base with
    the adapters merged in, as every verb reads it (the checkpoint holds the adapters alone)."""
    from littlelm.load import load_model

    _, tree = base_and_lora(tmp_path)
    tree["train"]["max_steps"] = 2
    lora_run = load_run(write_config(tmp_path / "lora.yaml", tree))
    Trainer(lora_run, resume="never").fit()
    merged, _, _ = load_model(lora_run.run_dir())
    child = copy.deepcopy(tree)
    del child["lora"]
    child["run"]["name"] = "child"
    child["grow"] = {"parent": str(lora_run.run_dir())}
    trainer = Trainer(load_run(write_config(tmp_path / "child.yaml", child)), resume="never")
    want, vocab = merged.state_dict(), merged.cfg.vocab  # padding rows past it: each run's own
    got = trainer.model.state_dict()
    rows = {k: vocab if k in ("wte.weight", "lm_head.weight") else None for k in want}
    assert all(torch.equal(got[k][: rows[k]], v[: rows[k]]) for k, v in want.items())


def test_the_base_is_found_from_any_directory_and_a_same_size_edit_is_refused(
    tmp_path, monkeypatch
):
    """The base is recorded absolute (an older run's relative path is read from the directory
    it started in), and with its full hash: 1,024 values changed inside the base's weights, size,
    header and mtime kept, are refused."""
    from littlelm.load import load_model

    _, tree = base_and_lora(tmp_path)
    tree["train"]["max_steps"] = 2
    tree["run"]["out_dir"], tree["grow"]["parent"] = "runs", "runs/base"
    monkeypatch.chdir(tmp_path)
    run = load_run(write_config(tmp_path / "lora.yaml", tree))
    Trainer(run, resume="never").fit()
    newest = ckpt.latest_checkpoint(tmp_path / "runs" / "lora" / "checkpoints")
    state_file = newest / "state.json"
    state = json.loads(state_file.read_text())
    base = Path(state["lora_base"]["path"])
    assert base.is_absolute() and base.parent.parent == tmp_path / "runs" / "base"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    merged, _, _ = load_model(newest)
    # a run written before: its base relative to where it started (tmp_path)
    state["lora_base"]["path"] = str(base.relative_to(tmp_path))
    state_file.write_text(json.dumps(state))
    again, _, _ = load_model(newest)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in merged.state_dict().items())
    state["config"]["run"]["out_dir"] = str(tmp_path / "runs")  # START cannot be told
    state_file.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="relative to the directory that run started in"):
        load_model(newest)
    state["lora_base"]["path"] = str(base)
    state_file.write_text(json.dumps(state))
    # 1,024 fp32 values changed in place: the same size, header and mtime
    weights = base / "model.safetensors"
    before = weights.stat()
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start : start + 4096] = bytes(4096)
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(CheckpointError, match="changed since .*hashes differently"):
        load_model(newest)
    monkeypatch.chdir(tmp_path)  # where the run's config's relative paths are
    with pytest.raises(CheckpointError, match="changed since"):
        Trainer(run)  # nor does a resume train on it
