"""Hugging Face export/import (littlelm/interop/hf.py): logits in both directions, greedy tokens,
round trips, training and growing an imported model, and every refusal."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from conftest import judge
from littlelm.cli import main
from littlelm.config import to_tree, validate
from littlelm.data.tokenizer import ByteTokenizer
from littlelm.interop.hf import export, import_model
from littlelm.interop.hf_tokenizer import export_tokenizer
from littlelm.load import load_model
from littlelm.model.generate import generate
from littlelm.model.gpt import GPT
from littlelm.schema import RunConfig
from littlelm.train.checkpoint import files as ckpt

transformers = pytest.importorskip("transformers")
TOL = 1e-4
VOCAB = 257  # the byte tokenizer's

FEATURES = {
    "llama": dict(
        mlp="swiglu", qk_norm=False, softcap=None, residual_scalars=False, value_embeds=False
    ),
    "qwen3": dict(
        mlp="swiglu",
        qk_norm=True,
        softcap=None,
        residual_scalars=False,
        value_embeds=False,
        n_kv_head=2,
        tie_embeddings=True,
    ),
    "qwen2": dict(
        mlp="swiglu",
        qk_norm=False,
        qkv_bias=True,
        softcap=None,
        residual_scalars=False,
        value_embeds=False,
        n_kv_head=2,
    ),
    "bias_qk_norm": dict(qkv_bias=True),
    "demo_defaults": dict(),
    "gqa_ve_softcap": dict(n_kv_head=2, mlp="swiglu", qk_norm=False),
}
CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "bias_qk_norm": "LittleLMForCausalLM",
    "demo_defaults": "LittleLMForCausalLM",
    "gqa_ve_softcap": "LittleLMForCausalLM",
}


class _NoOpt:
    def state_dict(self):
        return {}


def make_checkpoint(root: Path, seed: int = 0, tok=None, **model) -> tuple[Path, GPT]:
    """A littlelm checkpoint of a tiny GPT whose every weight is random (no identity blocks),
    with the byte tokenizer or `tok`."""
    tok = tok or ByteTokenizer()
    tree = {
        "model": {
            "name": "gpt",
            "vocab_size": tok.vocab_size,
            "n_layer": 3,
            "d_model": 32,
            "n_head": 4,
            "max_seq_len": 96,
            **model,
        },
        "data": {"tokenizer": {"name": "byte"}},
    }
    cfg = validate(RunConfig, tree)
    torch.manual_seed(seed)
    m = GPT(cfg.model)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.2))
    state = {"tokens": 0, "tokenizer": tok.fingerprint, "config": to_tree(cfg)}
    path = ckpt.save_checkpoint(root / "checkpoints", 7, m, _NoOpt(), state, {}, tok)
    return path, m.eval()


def hf_load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()


@pytest.mark.parametrize("name", list(FEATURES))
def test_export_computes_littlelm_logits_and_greedy_tokens(tmp_path, name):
    path, model = make_checkpoint(tmp_path / "run", **FEATURES[name])
    info = export(path, tmp_path / "hf")
    hf = hf_load(tmp_path / "hf")
    assert type(hf).__name__ == CLASSES[name]
    assert (info["arch"] == "littlelm") == (CLASSES[name] == "LittleLMForCausalLM")
    assert (tmp_path / "hf" / "modeling_littlelm.py").is_file() == (info["arch"] == "littlelm")
    ids = torch.randint(0, VOCAB, (2, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert theirs.shape == ours.shape
    assert (ours - theirs).abs().max().item() < TOL
    prompt = [256, *b"def f(x):"]
    with torch.no_grad():
        want = generate(model, prompt, 32, 0.0, None, 0, None)
        got = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
    want = want[: want.index(256) + 1] if 256 in want else want  # transformers stops at BOS = EOS
    assert got[0, len(prompt) :].tolist() == want


def test_export_shards_and_writes_a_loadable_tokenizer(tmp_path):
    path, model = make_checkpoint(tmp_path / "run", **FEATURES["llama"])
    export(path, tmp_path / "hf", max_shard_size="30KB")
    out = tmp_path / "hf"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 256
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "naïve café 🙂\n"
    assert tok(text)["input_ids"] == [256, *text.encode()]  # BOS first, then one id per byte
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    ids = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        assert (model(ids) - hf_load(out)(ids).logits).abs().max() < TOL


def _same_tensors(a: dict, b: dict, rows: int | None = None) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = (a[k][:rows], b[k][:rows]) if k in ("wte.weight", "lm_head.weight") else (a[k], b[k])
        assert torch.equal(x, y), k


@pytest.mark.parametrize(
    "features",
    [
        dict(FEATURES["llama"], norm_affine=True, embed_norm=False, n_kv_head=2),
        dict(FEATURES["qwen3"], norm_affine=True, embed_norm=False, qk_norm_affine=True),
        dict(FEATURES["qwen2"], norm_affine=True, embed_norm=False),
        FEATURES["demo_defaults"],
        FEATURES["bias_qk_norm"],
    ],
    ids=["llama", "qwen3", "qwen2", "remote", "remote_biases"],
)
def test_round_trip_gives_bitwise_equal_weights(tmp_path, features):
    path, model = make_checkpoint(tmp_path / "run", **features)
    export(path, tmp_path / "hf")
    info = import_model(tmp_path / "hf", tmp_path / "back")
    back, _, _ = load_model(info["checkpoint"])
    # exports cut the vocabulary padding rows of wte and lm_head (import pads with zeros)
    _same_tensors(ckpt.model_tensors(model), ckpt.model_tensors(back), VOCAB)


def test_round_trip_of_default_norms_keeps_the_function(tmp_path):
    """Gain-less norms and the embedding norm become ones and a normalised table: not the same
    tensors, the same logits."""
    path, model = make_checkpoint(tmp_path / "run", **FEATURES["qwen3"])
    export(path, tmp_path / "hf")
    back, _, _ = load_model(import_model(tmp_path / "hf", tmp_path / "back")["checkpoint"])
    ids = torch.randint(0, VOCAB, (2, 50))
    with torch.no_grad():
        assert (model(ids) - back(ids)).abs().max() < TOL


# ------------------------------------------------------------------------------------------------
# Import of models built with transformers


def _randomize(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(
                torch.randn(p.shape, generator=g) * (0.2 if p.dim() > 1 else 0.3) + (p.dim() == 1)
            )


def save_hf(kind: str, out: Path, **extra) -> torch.nn.Module:
    """A tiny random Llama, Mistral, Qwen2 or Qwen3 saved with save_pretrained and a byte-level
    tokenizer.json."""
    common = dict(
        vocab_size=300,  # more rows than the tokenizer has tokens, as real checkpoints do
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        **{"bos_token_id": 256, **extra},
    )
    if kind == "llama":
        cfg = transformers.LlamaConfig(rope_theta=50000.0, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "mistral":
        cfg = transformers.MistralConfig(**{"sliding_window": None, **common})
        model = transformers.MistralForCausalLM(cfg)
    elif kind == "qwen2":  # Qwen2 / Qwen2.5: q/k/v biases, tied like Qwen2.5-0.5B
        cfg = transformers.Qwen2Config(tie_word_embeddings=True, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(head_dim=16, tie_word_embeddings=True, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    _randomize(model, 3)
    model.eval().save_pretrained(out)
    export_tokenizer(ByteTokenizer(), out)
    return model


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3"])
def test_import_reproduces_transformers_logits(tmp_path, kind):
    hf = save_hf(kind, tmp_path / "hf")
    info = import_model(tmp_path / "hf", tmp_path / "run")
    assert info["arch"] == kind
    model, tok, _ = load_model(info["checkpoint"])
    # the 43 rows no token reaches become littlelm's vocabulary padding (never predicted)
    assert tok.bos_id == 256 and model.cfg.vocab_size == VOCAB and model.cfg.padded_vocab == 300
    ids = torch.randint(0, VOCAB, (2, 60))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits[..., :VOCAB]).abs().max() < TOL


def test_a_sliding_window_is_imported_as_the_context(tmp_path, capsys):
    hf = save_hf("mistral", tmp_path / "hf", sliding_window=64)
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    assert "context: 64 tokens, its sliding window" in capsys.readouterr().out
    model, _, _ = load_model(tmp_path / "run")
    assert model.cfg.max_seq_len == 64
    ids = torch.randint(0, VOCAB, (2, 64))
    with torch.no_grad():  # 64 tokens: the window covers them all, full attention is exact
        assert (model(ids) - hf(ids).logits[..., :VOCAB]).abs().max() < TOL


def test_import_of_a_sharded_checkpoint(tmp_path):
    hf = save_hf("llama", tmp_path / "hf")
    hf.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    (tmp_path / "hf" / "model.safetensors").unlink(missing_ok=True)
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    model, _, _ = load_model(import_model(tmp_path / "hf", tmp_path / "run")["checkpoint"])
    ids = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits[..., :VOCAB]).abs().max() < TOL


def test_imported_model_trains_and_grows(tmp_path, corpus, capsys, monkeypatch):
    # the CPU's peak FLOP/s only labels MFU; its one-off probe takes minutes on a busy machine
    monkeypatch.setattr("littlelm.train.device.probe_matmul", lambda *a, **k: 1e12)
    save_hf("qwen3", tmp_path / "hf")
    info = import_model(tmp_path / "hf", tmp_path / "imp")
    run_file = tmp_path / "imp" / "train.yaml"
    over = [
        "data.sources.main.name=text",
        f"data.sources.main.path={corpus}",
        "data.sources.main.split=paragraph",
        "run.device=cpu",
        "train.max_steps=2",
        "train.micro_batch_size=2",
        "train.seq_len=32",
        "eval.every=0",
        "eval.max_tokens=128",
        "data.val_fraction=0.1",
        "checkpoint.every=0",
    ]
    capsys.readouterr()
    assert main(["train", str(run_file), *over]) == 0
    said = capsys.readouterr().out  # a plain continuation: nothing about growth
    assert "starting from the weights of" in said and "the same shape" in said
    assert "grown from" not in said and "new blocks" not in said
    metrics = tmp_path / "imp-train" / "metrics.jsonl"
    losses = [json.loads(line).get("loss") for line in metrics.read_text().splitlines()]
    losses = [x for x in losses if x is not None]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    # grow: two new layers interleaved; `littlelm grow` checks the function and prints the gap
    grow = ["--to", str(run_file), "model.n_layer=4", *over]
    assert main(["grow", str(info["checkpoint"]), *grow]) == 0
    said = capsys.readouterr().out
    assert "max |Δlogit|" in said and "grown from" in said and "new blocks at layers [" in said


@pytest.mark.slow
def test_continuing_an_imported_model_does_not_damage_it(tmp_path, monkeypatch):
    """A model trained here, exported, imported back and continued with the train.yaml that
    import writes: val loss does not rise over the first 20 steps (issue 33 item 3; with the
    from-scratch lrs it rose from 0.81 to 6.3 in 2 steps)."""
    from conftest import make_corpus, tiny_tree, write_config
    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    monkeypatch.setattr("littlelm.train.device.probe_matmul", lambda *a, **k: 1e12)
    corpus = make_corpus(tmp_path / "corpus.txt", docs=400)
    tree = tiny_tree(
        corpus,
        tmp_path / "runs",
        model={**FEATURES["llama"], "d_model": 64, "n_head": 4},  # exports as stock Llama
        train={"max_steps": 150, "log_every": 50},
        eval={"every": 0},
        checkpoint={"every": 0},
        schedule={"warmup_steps": 10},
    )
    tree["optimizer"] = {"name": "muon"}  # the from-scratch defaults, width-scaled
    parent = Trainer(load_run(write_config(tmp_path / "parent.yaml", tree)), resume="never")
    parent.fit()
    export(parent.run_dir, tmp_path / "hf")
    import_model(tmp_path / "hf", tmp_path / "imp")
    over = [
        "data.sources.main.name=text",
        f"data.sources.main.path={corpus}",
        "data.sources.main.split=paragraph",
        "run.device=cpu",
        "train.max_steps=20",
        "train.micro_batch_size=4",
        "train.seq_len=32",
        "eval.every=2",
        "checkpoint.every=0",
    ]
    cont = Trainer(load_run(tmp_path / "imp" / "train.yaml", over), resume="never")
    callbacks, cont.callbacks = cont.callbacks, []  # no metrics file before the start
    start = cont.evaluate()["val_loss"]  # the imported weights, before any step
    cont.callbacks = callbacks
    cont.fit()
    rows = [json.loads(x) for x in (cont.run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) >= 10
    assert max(val) <= start, (start, val)


def test_the_import_recipe_trains_on_the_whole_text_and_says_when_crop_drops_most(
    tmp_path, capsys, monkeypatch
):
    """The documented `import -> train` recipe splits a .txt file into paragraphs: a validation
    set and every token trained; a file read as one document under crop packing is warned
    about at start, naming the fix (issue 33 item 4)."""
    monkeypatch.setattr("littlelm.train.device.probe_matmul", lambda *a, **k: 1e12)
    corpus = tmp_path / "corpus.txt"  # 2,000 paragraphs of 40-90 characters: one file
    corpus.write_text(
        "\n\n".join(
            f"paragraph {i}: " + "the model reads a token " * (1 + i % 3) for i in range(2000)
        )
    )
    save_hf("llama", tmp_path / "hf")
    import_model(tmp_path / "hf", tmp_path / "imp")
    run_file = tmp_path / "imp" / "train.yaml"
    recipe = next(x for x in run_file.read_text().splitlines() if "littlelm train" in x)
    assert "data.sources.main.split=paragraph" in recipe
    common = ["run.device=cpu", "train.max_steps=1", "train.micro_batch_size=2"]
    common += ["train.seq_len=127", "eval.max_tokens=256", "checkpoint.every=0"]
    words = recipe.split("littlelm train", 1)[1].split()[1:]  # the recipe's overrides
    words = [w.replace("corpus.txt", str(corpus)) for w in words]
    assert main(["train", str(run_file), *words, *common]) == 0
    out = capsys.readouterr().out
    assert "crop packing" not in out and "no validation loss" not in out
    assert "eval step 1: val loss" in out
    one_doc = [f"data.sources.main.path={corpus}", "data.sources.main.name=text"]
    one_doc += ["data.sources.main.long_docs=crop", "run.name=one-doc", "eval.every=0"]
    assert main(["train", str(run_file), *one_doc, *common, "eval.at_end=false"]) == 0
    out = capsys.readouterr().out
    assert "warning: crop packing (long_docs: crop) trains on a small part" in out
    assert "data.sources.main.long_docs=split" in out and "split=paragraph" in out


# ------------------------------------------------------------------------------------------------
# Refusals: a clear error naming the fix, nothing written


def _refused(tmp_path, src: Path, capsys, *words: str) -> None:
    out = tmp_path / "refused"
    capsys.readouterr()  # drop the progress bars of save_pretrained
    assert main(["import", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    for w in words:
        assert w in err
    assert not out.exists()
    assert not list(tmp_path.glob(".refused.tmp-*"))


def test_import_refusals(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(tmp_path, empty, capsys, "no config.json", "save_pretrained")

    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    _refused(tmp_path, gpt2, capsys, "unsupported architecture 'gpt2'", "llama")

    scaled = tmp_path / "scaled"
    save_hf("llama", scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    (scaled / "config.json").write_text(json.dumps(cfg))
    _refused(tmp_path, scaled, capsys, "RoPE scaling 'llama3'", "without rope scaling")

    wrong = tmp_path / "wrong"
    save_hf("llama", wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (wrong / "config.json").write_text(json.dumps(cfg))
    _refused(tmp_path, wrong, capsys, "mlp.up_proj.weight is (96, 48)", "save_pretrained")

    biased = tmp_path / "biased"
    save_hf("llama", biased, attention_bias=True)  # Llama's attention_bias: o_proj's too
    _refused(tmp_path, biased, capsys, "output projection", "model.qkv_bias")

    notok = tmp_path / "notok"
    save_hf("llama", notok)
    (notok / "tokenizer.json").unlink()
    _refused(tmp_path, notok, capsys, "no tokenizer.json", "AutoTokenizer")


def test_export_refusals(tmp_path, capsys):
    path, _ = make_checkpoint(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(path), "--out", str(out)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    export(path, tmp_path / "hf")  # a Hugging Face directory: pointed at `littlelm import`
    assert main(["export", str(tmp_path / "hf"), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "Hugging Face model directory" in err and "littlelm import" in err
    assert not (tmp_path / "y").exists()


def test_export_help_shows_defaults_and_whole_sentences(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    assert main(["export", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "split into shards with an index [default: 5GB]" in text
    assert "littlelm import" in text and "examples:" in text


def test_export_cli_says_which_class_and_why(tmp_path, capsys):
    make_checkpoint(tmp_path / "run", **FEATURES["qwen3"])
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "as qwen3" in out and "Qwen3ForCausalLM" in out
    shutil.rmtree(tmp_path / "hf")


# ------------------------------------------------------------------------------------------------
# lm-evaluation-harness through the adapter, against littlelm's own harness


def _greedy_char(model, context: str) -> int:
    with torch.no_grad():
        return int(model(torch.tensor([[256, *context.encode()]]))[0, -1].argmax())


def _tasks(model, root: Path) -> tuple[list[dict], list[dict]]:
    """A multiple-choice task (choices of distinct first letters and lengths, so that a mean
    over the choice's tokens is lm_eval's acc_norm) and a language-modeling task where half
    the continuations are the model's own greedy next character (so its accuracy is 0.5)."""
    import random

    rng = random.Random(0)
    words = ["apple", "banana", "kiwi", "cherry", "date", "elderberry", "fig", "guava"]
    mc = [
        {"query": f"Q{i}: which fruit?", "choices": rng.sample(words, 4), "gold": i % 4}
        for i in range(16)
    ]
    hits, misses, i = [], [], 0
    while len(hits) < 6 or len(misses) < 6:
        context = f"{i} plus {i * 7 % 13} is"
        c = _greedy_char(model, context)
        if 33 <= c < 127 and len(hits) < 6:
            hits.append({"context": context, "continuation": chr(c)})
        elif len(misses) < 6:
            other = 33 + (c + 1) % 94 if 33 <= c < 127 else 65
            misses.append({"context": context, "continuation": chr(other)})
        i += 1
    return mc, hits + misses


LM_EVAL_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files: {{test: {file}}}
  cache_dir: {cache}
test_split: test
output_type: {output}
doc_to_text: "{{{{{text}}}}}"
{target}
target_delimiter: ""
metric_list: [{metrics}]
"""


def test_lm_eval_scores_equal_littlelm_harness(tmp_path, capfd, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)  # outside any git repository: lm_eval asks git for a hash
    from littlelm.eval.core import EvalOptions, evaluate_suite, load_suite
    from littlelm.eval.tasks import load_task_list

    _, model = make_checkpoint(tmp_path / "run", **FEATURES["demo_defaults"])
    mc, lm = _tasks(model, tmp_path)
    ours = tmp_path / "ours"
    ours.mkdir()
    for name, rows in (("mc", mc), ("lm", lm)):
        (ours / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = "tasks:\n" + "".join(
        f"  - {{label: {n}, dataset_uri: {n}.jsonl, icl_task_type: {k}, num_fewshot: 0, "
        f"continuation_delimiter: '', random_baseline: 0}}\n"
        for n, k in (("mc", "multiple_choice"), ("lm", "language_modeling"))
    )
    (ours / "tasks.yaml").write_text(spec)
    suite = evaluate_suite(
        model, ByteTokenizer(), load_suite(load_task_list(ours / "tasks.yaml"), ours), EvalOptions()
    )
    want = {t.label: t.accuracy for t in suite.tasks}
    assert want["lm"] == 0.5 and 0 < want["mc"] < 1  # the check below can fail

    theirs = tmp_path / "lm_eval_tasks"
    theirs.mkdir()
    cache = tmp_path / "hf_datasets"
    for name, text, output, target, metrics in (
        (
            "mc",
            "query",
            "multiple_choice",
            "doc_to_choice: choices\ndoc_to_target: gold",
            "{metric: acc}, {metric: acc_norm}",
        ),
        ("lm", "context", "loglikelihood", "doc_to_target: continuation", "{metric: acc}"),
    ):
        (theirs / f"{name}.yaml").write_text(
            LM_EVAL_TASK.format(
                name=f"littlelm_test_{name}",
                file=ours / f"{name}.jsonl",
                cache=cache,
                output=output,
                text=text,
                target=target,
                metrics=metrics,
            )
        )
    argv = ["eval", str(tmp_path / "run"), "--harness", "littlelm_test_mc,littlelm_test_lm"]
    out = tmp_path / "harness.json"
    assert main([*argv, "--include", str(theirs), "--precision", "fp32", "--out", str(out)]) == 0
    got = json.loads(out.read_text())["results"]
    assert got["littlelm_test_lm"]["acc,none"] == pytest.approx(want["lm"], abs=1e-9)
    # littlelm picks the lowest mean loss per token; with one byte per character that is acc_norm
    assert got["littlelm_test_mc"]["acc_norm,none"] == pytest.approx(want["mc"], abs=1e-9)
    out, err = capfd.readouterr()  # file descriptors: what git itself would print too
    assert "littlelm_test_mc" in out
    assert "fatal" not in err  # git's "fatal: not a git repository" is not shown


def test_harness_errors_name_the_fix(tmp_path, capsys, monkeypatch):
    path, _ = make_checkpoint(tmp_path / "run")
    assert main(["eval", str(path), "--harness", "x", "--include", str(tmp_path / "none")]) == 2
    assert "not a directory of lm_eval task YAML" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    assert main(["eval", str(path), "--harness", "hellaswag"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'littlelm[harness]'" in err and "Traceback" not in err


def test_harness_offline_fails_fast_naming_include(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    import lm_eval.tasks

    path, _ = make_checkpoint(tmp_path / "run")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the hub unreachable: refused
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    indexed = []
    real = lm_eval.tasks.TaskManager
    monkeypatch.setattr(
        lm_eval.tasks, "TaskManager", lambda *a, **k: indexed.append(k) or real(*a, **k)
    )
    assert main(["eval", str(path), "--harness", "hellaswag"]) == 2
    err = capsys.readouterr().err
    assert "cannot be reached" in err and "--include DIR" in err and "Traceback" not in err
    assert indexed == []  # before indexing lm_eval's 14,000 built-in tasks: fast
    # a local task in --include needs no hub and is not refused (test above scores one)


# ------------------------------------------------------------------------------------------------
# Tokenizers other than bytes: BPE as it is, tiktoken converted; both must give littlelm's ids

TOK_TEXT = "héllo wörld ✓ — naïve café 日本語 def f(x):\n    return x  \n"


def _same_ids_in_transformers(tok, out: Path) -> None:
    export_tokenizer(tok, out)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs(TOK_TEXT)["input_ids"] == [tok.bos_id, *tok.encode(TOK_TEXT)]
    assert theirs.decode(theirs(TOK_TEXT)["input_ids"], skip_special_tokens=True) == TOK_TEXT


def test_bpe_tokenizer_exports_with_the_same_ids(tmp_path):
    from littlelm.data.tokenizer import BPEConfig, BPETokenizer

    texts = [TOK_TEXT * 3, "the quick brown fox jumps over the lazy dog " * 20] * 20
    tok = BPETokenizer.train(BPEConfig(name="bpe", vocab_size=320, train_chars=20_000), iter(texts))
    _same_ids_in_transformers(tok, tmp_path)


def test_control_token_text_is_text_in_littlelm_and_with_split_special_tokens(tmp_path):
    """A user's text holding "<|end|>" or "<|bos|>" (pasted from a log, an attack): littlelm's
    encode keeps it text; transformers' default call turns it into the control tokens, and
    `split_special_tokens=True` gives littlelm's ids (what docs/interop.md tells users)."""
    from littlelm.data.tokenizer import BPEConfig, BPETokenizer

    texts = [TOK_TEXT * 3, "the quick brown fox jumps over the lazy dog " * 20] * 20
    tok = BPETokenizer.train(BPEConfig(name="bpe", vocab_size=320, train_chars=20_000), iter(texts))
    export_tokenizer(tok, tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "say <|end|> then <|bos|><|user|>hi"
    ours = tok.encode(text)
    assert tok.special_id("<|end|>") not in ours and tok.bos_id not in ours
    split = theirs(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert split == ours
    default = theirs(text, add_special_tokens=False)["input_ids"]
    assert tok.special_id("<|end|>") in default and tok.bos_id in default  # the control tokens


def test_tiktoken_tokenizer_is_converted_with_the_same_ids(tmp_path):
    from conftest import SHARED
    from littlelm.data.tiktoken_tokenizer import TiktokenConfig, TiktokenTokenizer

    ranks = SHARED / "data" / "tokenizers" / "gpt2.tiktoken"
    if not ranks.is_file():
        pytest.skip("shared gpt2.tiktoken not present")
    cfg = TiktokenConfig(name="tiktoken", encoding="gpt2", file=str(ranks))
    _same_ids_in_transformers(TiktokenTokenizer.from_config(cfg), tmp_path)


# ------------------------------------------------------------------------------------------------
# Exports load as the docs show: no remote-code prompt, one BOS, a pad token (issue 33 items 2, 5)


@pytest.mark.parametrize("name", ["llama", "demo_defaults"])
def test_documented_loading_asks_nothing_and_batches(tmp_path, name):
    import subprocess

    path, model = make_checkpoint(tmp_path / "run", **FEATURES[name])
    info = export(path, tmp_path / "hf")
    remote = ", trust_remote_code=True" if info["arch"] == "littlelm" else ""
    code = (  # the README's lines, in a fresh interpreter with no terminal to answer a prompt
        "from transformers import AutoTokenizer\n"
        f"tok = AutoTokenizer.from_pretrained({str(tmp_path / 'hf')!r}{remote})\n"
        "print(tok('def ')['input_ids'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "custom code" not in done.stdout + done.stderr
    assert done.stdout.split("\n")[-2] == str([256, *b"def "])

    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert tok("a", "b")["input_ids"] == [256, *b"ab"]  # a pair is one document: one BOS
    hf = hf_load(tmp_path / "hf")
    prompts = ["def f(x):", "x = 1"]
    batch = tok(prompts, padding=True, return_tensors="pt")  # no pad_token set by hand
    assert tok.pad_token_id == 256 and batch["input_ids"][1, 0] == 256  # padded on the left
    with torch.no_grad():
        together = hf.generate(**batch, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    for row, prompt in zip(together, prompts):
        ids = [256, *prompt.encode()]
        with torch.no_grad():
            alone = generate(model, ids, 12, 0.0, None, 0, None)
        assert row[-12:].tolist() == alone  # littlelm's own greedy tokens


# ------------------------------------------------------------------------------------------------
# GGUF (llama.cpp's format), written with the gguf package; read back by the gguf reader and by
# transformers' GGUF loader, which undoes llama.cpp's conventions (issue 33 item 1)


def _small_bpe():
    from littlelm.data.tokenizer import BPEConfig, BPETokenizer

    texts = [TOK_TEXT * 3, "the quick brown fox jumps over the lazy dog " * 20] * 20
    return BPETokenizer.train(
        BPEConfig(name="bpe", vocab_size=320, train_chars=20_000), iter(texts)
    )


GGUF_FEATURES = {
    "llama": FEATURES["llama"],
    "qwen2": FEATURES["qwen2"],
    # transformers' GGUF reader takes Qwen3's default head_dim (128), not attention.key_length
    "qwen3": dict(FEATURES["qwen3"], d_model=64, n_head=2, n_kv_head=1, head_size=128),
}


@pytest.mark.parametrize("name", list(GGUF_FEATURES))
def test_gguf_export_reads_back_with_littlelm_logits_and_ids(tmp_path, name, capsys):
    gguf = pytest.importorskip("gguf")
    tok = _small_bpe()
    path, model = make_checkpoint(tmp_path / "run", tok=tok, **GGUF_FEATURES[name])
    out = tmp_path / "gguf" / "model.gguf"
    out.parent.mkdir()
    assert main(["export", str(path), "--gguf", str(out), "--gguf-type", "f32"]) == 0
    assert f"wrote {out} ({name}, f32)" in capsys.readouterr().out

    fields = gguf.GGUFReader(str(out)).fields
    value = lambda key: fields[key].contents()  # noqa: E731
    assert value("general.architecture") == name
    assert value("tokenizer.ggml.model") == "gpt2"
    assert value("tokenizer.ggml.pre") == "gpt-2"  # llama.cpp's name for littlelm's regex
    assert value("tokenizer.ggml.add_bos_token") is True
    assert value("tokenizer.ggml.add_sep_token") is False  # no BOS appended after a prompt
    assert value("tokenizer.ggml.bos_token_id") == tok.bos_id
    assert len(value("tokenizer.ggml.tokens")) == tok.vocab_size

    hf = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name)
    ids = torch.randint(0, tok.vocab_size, (2, 60), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(ids) - hf.eval()(ids).logits).abs().max() < TOL
    theirs = transformers.AutoTokenizer.from_pretrained(out.parent, gguf_file=out.name)
    assert theirs(TOK_TEXT)["input_ids"] == [tok.bos_id, *tok.encode(TOK_TEXT)]  # one BOS


def test_gguf_refusals_name_the_way_out(tmp_path, capsys):
    pytest.importorskip("gguf")
    path, _ = make_checkpoint(tmp_path / "run")  # the demo's features: no llama.cpp architecture
    assert main(["export", str(path), "--gguf", str(tmp_path / "a.gguf")]) == 2
    err = capsys.readouterr().err
    assert "no GGUF form" in err and "model.mlp=swiglu" in err
    path, _ = make_checkpoint(tmp_path / "run2", **FEATURES["llama"])  # the byte tokenizer
    assert main(["export", str(path), "--gguf", str(tmp_path / "b.gguf")]) == 2
    assert "no BPE merges" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*.tmp-*"))
    assert main(["export", str(path)]) == 2
    assert "give --out DIR" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(GGUF_FEATURES))
def test_gguf_runs_in_llama_cpp_with_littlelm_ids_and_greedy_tokens(tmp_path, name):
    """llama.cpp itself, through llama-cpp-python 0.3.36 (built from its sdist by
    scripts/setup-llama-cpp.sh, which CI runs; the dev extra does not install it: it compiles
    llama.cpp, ~5 min on 2 cores)."""
    llama_cpp = judge("llama_cpp")  # required in CI (.ci/run builds it)
    tok = _small_bpe()
    path, model = make_checkpoint(tmp_path / "run", tok=tok, **GGUF_FEATURES[name])
    out = tmp_path / "model.gguf"
    export(path, None, gguf=out, gguf_type="f32")
    llm = llama_cpp.Llama(str(out), n_ctx=96, verbose=False, logits_all=False)
    prompt = "def f(x): naïve"
    ids = llm.tokenize(prompt.encode())  # add_bos from the file
    assert ids == [tok.bos_id, *tok.encode(prompt)]  # one BOS, no separator after the prompt
    with torch.no_grad():
        want = generate(model, ids, 24, 0.0, None, 0, None)
    got = []
    for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        got.append(t)
        if len(got) == 24 or t == tok.bos_id:
            break
    want = want[: want.index(tok.bos_id) + 1] if tok.bos_id in want else want
    assert got == want


def save_llama_tokenizer(out: Path, adds_bos: bool) -> None:
    """A byte-level tokenizer as Llama-like checkpoints have it: <s> = 0 (BOS), </s> = 1 (EOS),
    then the 256 bytes; with or without a post-processor that puts <s> first."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {"<s>": 0, "</s>": 1} | {ch: 2 + b for b, ch in bytes_to_unicode().items()}
    raw = Tokenizer(models.BPE(vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    if adds_bos:
        raw.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 0)]
        )
    raw.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("adds_bos", [False, True], ids=["no BOS", "BOS first"])
def test_import_export_round_trip_keeps_the_tokenizers_eos_and_bos_rule(tmp_path, capsys, adds_bos):
    """A Llama whose eos is </s> = 1 came back with eos <s> = 0 and a BOS put before every text;
    the round trip keeps eos and the BOS rule, in tokenizer_config.json, config.json and
    generation_config.json (checked by transformers), and import says what training does."""
    save_hf("llama", tmp_path / "hf", bos_token_id=0, eos_token_id=1)
    save_llama_tokenizer(tmp_path / "hf", adds_bos)
    before = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    said = capsys.readouterr().out
    assert (
        "tokenizer: eos </s> (1), " + ("BOS <s> (0) put before" if adds_bos else "no BOS") in said
    )
    if not adds_bos:
        assert "littlelm's training starts each document with <s> (0)" in said
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "back")]) == 0
    after = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert (after.eos_token, after.eos_token_id) == ("</s>", 1) == (before.eos_token, 1)
    for text in ("a", "Hello, world", PROBE_TEXT):
        assert after(text).input_ids == before(text).input_ids
    assert (after("a").input_ids[0] == 0) == adds_bos
    config = transformers.AutoConfig.from_pretrained(tmp_path / "back")
    gen = transformers.GenerationConfig.from_pretrained(tmp_path / "back")
    assert config.eos_token_id == gen.eos_token_id == 1 and config.bos_token_id == 0


PROBE_TEXT = "def f(x):\n\treturn x**2  # naïve café"
