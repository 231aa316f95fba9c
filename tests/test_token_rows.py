"""LoRA's trained token rows (lora.trainable_tokens; model/token_rows.py): the function at the
start, which rows train, the merge, adapters off, a run's checkpoints and resume, and PEFT's
trainable tokens judging the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import judge, make_corpus, tiny_tree, write_config
from littlelm.data.chat import CHAT_TOKENS
from littlelm.errors import ConfigError
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.model.lora import LoRAConfig, adapters_off, add_lora, merge_lora
from littlelm.model.token_rows import TokenRows
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.trainer import Trainer

IDS = [3, 7]
TOKENS = torch.tensor([[1, 3, 5, 7, 9, 3, 2, 7]])


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, n_layer=2, d_model=32, n_head=2, max_seq_len=16)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_rows_start_as_the_base_train_alone_and_merge_exactly(tied):
    base = tiny(tie_embeddings=tied)
    model = tiny(tie_embeddings=tied)
    add_lora(model, LoRAConfig(rank=2), token_ids=IDS)
    with torch.no_grad():
        assert torch.equal(model(TOKENS), base(TOKENS))  # fresh rows: the base exactly
    trained = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    rows = {n: c for n, c in trained.items() if n.endswith(".delta")}
    # the embedding's rows, and lm_head's own unless it is the embedding
    assert rows == ({"wte.delta": 64} if tied else {"wte.delta": 64, "lm_head.delta": 64})
    assert not any(p.requires_grad for n, p in model.named_parameters() if "frozen" in n)

    loss = model(TOKENS[:, :-1], TOKENS[:, 1:])  # the rows get gradients through both uses
    loss.backward()
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in rows)
    with torch.no_grad():
        for n in rows:
            model.get_parameter(n).add_(0.5)
        wrapped = model(TOKENS)
        with adapters_off(model):  # the reference: the base's matrices
            assert torch.equal(model(TOKENS), base(TOKENS))
    merge_lora(model)
    assert not any(isinstance(m, TokenRows) for m in model.modules())
    assert (model.lm_head.weight is model.wte.weight) is tied
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), wrapped, atol=1e-6, rtol=0)
    changed = (model.wte.weight != base.wte.weight).any(1).nonzero().flatten().tolist()
    assert changed == IDS  # the rest of the vocabulary is the base's, bitwise


def chat_corpus(path: Path) -> Path:
    """Chat conversations for an SFT run (a BPE tokenizer trained on them has the chat tokens)."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{a}+{b}"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(12)
        for b in range(12)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def base_and_lora(tmp_path: Path, model: dict | None = None, **lora) -> tuple[Path, dict]:
    """A tiny base run with a BPE tokenizer holding the chat tokens (`model` features over the
    tiny defaults), then a LoRA SFT tree on it."""
    corpus = make_corpus(tmp_path / "corpus.txt")
    base = tiny_tree(corpus, tmp_path / "runs", run={"name": "base"}, model=model or {})
    base["data"]["tokenizer"] = {"name": "bpe", "vocab_size": 300}
    base["train"]["max_steps"] = 3
    Trainer(load_run(write_config(tmp_path / "base.yaml", base)), resume="never").fit()
    base_dir = tmp_path / "runs" / "base"
    chats = chat_corpus(tmp_path / "chats.jsonl")
    tree = tiny_tree(corpus, tmp_path / "runs", run={"name": "lora"}, model=model or {})
    tree["data"] = {
        "tokenizer": {"name": "saved", "path": str(base_dir)},
        "sources": {"chat": {"name": "chat", "dataset": str(chats)}},
        "val_fraction": 0.1,
    }
    tree["model"]["vocab_size"] = None
    tree["sft"] = {"base": str(base_dir)}
    tree["lora"] = {"rank": 4, "lr": 0.01, **lora}
    tree["train"].update(max_steps=6, precision="fp32")
    return base_dir, tree


def test_a_lora_run_trains_the_chat_rows_keeps_them_and_resumes_bitwise(tmp_path):
    from littlelm.data.tokenizers import load_tokenizer
    from littlelm.load import load_model

    base_dir, tree = base_and_lora(tmp_path)
    straight = load_run(write_config(tmp_path / "straight.yaml", tree))
    Trainer(straight, resume="never").fit()
    tree["run"]["name"] = "split"
    split = load_run(write_config(tmp_path / "split.yaml", tree))
    assert Trainer(split, resume="never").fit(stop_after=4)["step"] == 4
    Trainer(split).fit()  # from step 3's checkpoint: the rows and their moments too
    newest = ckpt.latest_checkpoint(split.run_dir() / "checkpoints")
    other = ckpt.latest_checkpoint(straight.run_dir() / "checkpoints")
    saved, want = load_file(newest / "model.safetensors"), load_file(other / "model.safetensors")
    assert {"wte.delta", "lm_head.delta"} <= set(saved)
    assert all(torch.equal(saved[k], want[k]) for k in want)

    tok = load_tokenizer(newest / "tokenizer")
    chat_ids = sorted(tok.special_id(t) for t in CHAT_TOKENS)
    assert json.loads((newest / "state.json").read_text())["lora_tokens"] == chat_ids
    merged, _, _ = load_model(newest)
    plain, _, _ = load_model(base_dir)
    for name in ("wte", "lm_head"):
        diff = getattr(merged, name).weight != getattr(plain, name).weight
        changed = diff.any(1).nonzero().flatten().tolist()
        # the chat rows alone (those the conversations use: no system message, no gradient)
        assert changed and set(changed) <= set(chat_ids), (name, changed, chat_ids)

    tree["run"]["name"] = "none"
    tree["lora"]["trainable_tokens"] = "none"  # today's LoRA: the matrices stay the base's
    none = load_run(write_config(tmp_path / "none.yaml", tree))
    Trainer(none, resume="never").fit()
    kept = load_file(ckpt.latest_checkpoint(none.run_dir() / "checkpoints") / "model.safetensors")
    assert not any(k.endswith(".delta") for k in kept)

    tree["run"]["name"] = "bad"
    tree["lora"]["trainable_tokens"] = [1, 10_000]
    with pytest.raises(ConfigError, match="10000.*not a token id"):
        Trainer(load_run(write_config(tmp_path / "bad.yaml", tree)), resume="never")


LLAMA = dict(mlp="swiglu", qk_norm=False, softcap=None, residual_scalars=False, value_embeds=False)


@pytest.mark.parametrize(
    "features",
    [{}, LLAMA, {**LLAMA, "tie_embeddings": True}],
    ids=["littlelm-remote-code", "llama", "llama-tied"],
)
def test_peft_trainable_tokens_load_the_exported_rows(tmp_path, features):
    """peft, the judge: the adapter (LoRA + trainable_token_indices) on the exported base gives
    the LoRA run's logits, and AutoPeftModelForCausalLM finds the base it names."""
    peft = judge("peft")
    from littlelm.interop.hf import export

    _, tree = base_and_lora(tmp_path, features)
    tree["train"]["max_steps"] = 3
    cfg = load_run(write_config(tmp_path / "lora.yaml", tree))
    Trainer(cfg, resume="never").fit()
    info = export(cfg.run_dir(), tmp_path / "hf")
    adapter = tmp_path / "hf" / "adapter"
    assert info["adapter"] == adapter
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["trainable_token_indices"]
    wrapped = Trainer(cfg).model.eval()
    ids = torch.randint(0, 280, (2, 12), generator=torch.Generator().manual_seed(5))
    ids[:, 3] = json.loads(
        (ckpt.latest_checkpoint(cfg.run_dir() / "checkpoints") / "state.json").read_text()
    )["lora_tokens"][0]  # a trained row read in the input too
    with torch.no_grad():
        ours = wrapped(ids)
        model = peft.AutoPeftModelForCausalLM.from_pretrained(adapter, trust_remote_code=True)
        theirs = model.float().eval()(ids).logits
    assert (theirs - ours).abs().max().item() < 1e-4


# a Llama-shaped export normalises an embed_norm model's table once (interop/hf.py), so a row
# peft moved has no counterpart in such a model (refused: below); without embed_norm it is exact
@pytest.mark.parametrize(
    "features",
    [{}, {**LLAMA, "embed_norm": False}, LLAMA],
    ids=["littlelm-remote-code", "llama", "llama-embed-norm-refused"],
)
def test_a_run_continues_from_a_peft_adapter_directory(tmp_path, features):
    """lora.init_from: an adapter peft saved itself (its adapters and trainable tokens moved
    away from ours first) is where the run starts: at step 0 its logits are peft's on the
    exported base (1e-5, fp32); then it trains and resumes from its own checkpoint (not the
    adapter again); an adapter of another rank is refused."""
    peft = judge("peft")
    from littlelm.interop.hf import export

    _, tree = base_and_lora(tmp_path, features)
    tree["train"]["max_steps"] = 2
    first = load_run(write_config(tmp_path / "first.yaml", tree))
    Trainer(first, resume="never").fit()
    export(first.run_dir(), tmp_path / "hf")
    model = peft.AutoPeftModelForCausalLM.from_pretrained(
        tmp_path / "hf" / "adapter", trust_remote_code=True, is_trainable=True
    ).float()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "trainable_tokens_delta" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(tmp_path / "theirs")  # peft's own files
    chat = json.loads(
        (ckpt.latest_checkpoint(first.run_dir() / "checkpoints") / "state.json").read_text()
    )["lora_tokens"]
    ids = torch.randint(5, 280, (2, 12), generator=g)
    ids[:, 2], ids[:, 7] = chat[1], chat[-1]  # trained rows read in the input
    with torch.no_grad():
        theirs = model.eval()(ids).logits

    tree["run"]["name"] = "continued"
    tree["lora"]["init_from"] = str(tmp_path / "theirs")
    cfg = load_run(write_config(tmp_path / "continued.yaml", tree))
    if features.get("embed_norm", True) and features:  # a Llama export of an embed_norm model
        with pytest.raises(ConfigError, match="model.embed_norm"):
            Trainer(cfg, resume="never")
        return
    trainer = Trainer(cfg, resume="never")
    with torch.no_grad():
        ours = trainer.model.eval()(ids)
    assert (ours - theirs).abs().max().item() < 1e-5
    assert trainer.fit()["finished"]
    with torch.no_grad():
        trained = trainer.model.eval()(ids)
    # a resume starts from the checkpoint, not from the adapter directory again
    tree["train"]["max_steps"] = 4
    more = Trainer(load_run(write_config(tmp_path / "more.yaml", tree)))
    assert more.step == 2
    with torch.no_grad():
        torch.testing.assert_close(more.model.eval()(ids), trained, atol=0, rtol=0)
    assert more.fit()["finished"] and more.step == 4

    tree["run"]["name"] = "other-rank"
    tree["lora"]["rank"] = 8
    with pytest.raises(ConfigError, match="lora.rank: 4"):
        Trainer(load_run(write_config(tmp_path / "bad.yaml", tree)), resume="never")


def test_a_peft_adapter_that_does_not_fit_is_refused_naming_the_fix(tmp_path):
    """lora.init_from's refusals, each a problem naming its file or key (the Trainer raises
    them as a ConfigError): no files, another PEFT method, other targets, other token rows."""
    import safetensors.torch

    from littlelm.model.peft_adapter import load_peft_adapter

    model = tiny(embed_norm=False)  # a Llama export's rows come back as they are (below)
    cfg = LoRAConfig(rank=2, targets=["q_proj"])
    add_lora(model, cfg, token_ids=IDS)
    [missing] = load_peft_adapter(model, cfg, tmp_path / "nothing")
    assert "adapter_config.json is missing" in missing

    def adapter(config: dict, tensors: dict):
        d = tmp_path / f"a{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps(config))
        safetensors.torch.save_file(tensors, str(d / "adapter_model.safetensors"))
        return d

    def pair(i: int, name: str) -> dict:
        key = f"base_model.model.model.layers.{i}.self_attn.{name}"
        return {
            f"{key}.lora_A.weight": torch.zeros(2, 32),
            f"{key}.lora_B.weight": torch.zeros(32, 2),
        }

    ours = {"r": 2, "lora_alpha": cfg.alpha, "trainable_token_indices": {"embed_tokens": IDS}}
    rows = {
        f"base_model.model.{m}.token_adapter.trainable_tokens_delta": torch.zeros(2, 32)
        for m in ("model.embed_tokens", "lm_head")
    }
    fits = adapter(ours, {**pair(0, "q_proj"), **pair(1, "q_proj"), **rows})
    assert load_peft_adapter(model, cfg, fits) == []  # the same shape: loaded
    normed = tiny()  # model.embed_norm: a stock export's table was normalised once
    add_lora(normed, cfg, token_ids=IDS)
    assert any("model.embed_norm" in p for p in load_peft_adapter(normed, cfg, fits))
    ia3 = adapter({**ours, "peft_type": "IA3"}, {**pair(0, "q_proj"), **pair(1, "q_proj"), **rows})
    assert any("IA3 adapter, not LoRA" in p for p in load_peft_adapter(model, cfg, ia3))
    other = adapter(ours, {**pair(0, "v_proj"), **pair(1, "v_proj"), **rows})
    assert any("set lora.targets: ['attn.c_v']" in p for p in load_peft_adapter(model, cfg, other))
    tokens = adapter(
        {**ours, "trainable_token_indices": {"embed_tokens": [5, 9]}},
        {**pair(0, "q_proj"), **pair(1, "q_proj"), **rows},
    )
    assert any("lora.trainable_tokens: [5, 9]" in p for p in load_peft_adapter(model, cfg, tokens))
