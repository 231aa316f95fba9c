"""Typed contracts between the parts: registries filled at the entry points, model and optimizer
configs that answer for themselves, one build path, resumability declared on the fields, and a
resolve that leaves its input alone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_tree, write_config
from littlelm.config import to_tree, validate
from littlelm.data.tokenizers import vocab_size_of
from littlelm.errors import ConfigError, DataError
from littlelm.model.protocol import ModelConfig
from littlelm.optim.base import OptimizerConfig
from littlelm.optim.groups import AdamWConfig, MuonConfig
from littlelm.schema import RunConfig, load_run, resolve, resumable
from littlelm.train.build import build, build_model

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_importing_fills_no_table_and_the_first_lookup_fills_it(tiny_config):
    out = fresh_python(
        "import littlelm.schema as s\n"
        "from littlelm.registry import CALLBACKS\n"
        "print(len(CALLBACKS))\n"
        f"print(s.load_run({str(tiny_config)!r}).model.name)\n"  # no register_all() call
        "print(sorted(CALLBACKS))\n"
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert lines[0] == "0"  # nothing registered as a side effect of importing the schema
    assert lines[1] == "gpt"
    assert lines[2] == str(["core", "jsonl", "sample", "tensorboard", "wandb"])  # the first lookup


def test_the_python_api_stands_alone(tiny_config):
    """load_model and Trainer in a fresh interpreter, as a library user calls them (issue 33)."""
    out = fresh_python(
        "from littlelm.schema import load_run\n"
        "from littlelm.train.trainer import Trainer\n"
        f"cfg = load_run({str(tiny_config)!r}, ['train.max_steps=2', 'checkpoint.every=2'])\n"
        "t = Trainer(cfg, resume='never')\n"
        "t.fit()\n"
        "import subprocess, sys\n"  # load_model in yet another fresh interpreter
        "code = 'from littlelm.load import load_model; m, tok, c = load_model(%r); "
        "print(type(m).__name__, c.schedule.name)' % str(t.run_dir)\n"
        "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,"
        " check=True).stdout)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "GPT trapezoidal" in out.stdout


def test_an_empty_table_still_says_how_to_fill_it():
    out = fresh_python(
        "import littlelm.registry as r\n"
        "from littlelm.config import validate\n"
        "from littlelm.schema import RunConfig\n"
        "r.fill_on_first_use(lambda: None)\n"  # as if nothing could be registered
        "try:\n"
        "    validate(RunConfig, {'callbacks': [{'name': 'sample'}]})\n"
        "except Exception as e:\n"
        "    print(e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "register_all()" in out.stdout  # the error names the fix


def test_resolve_returns_a_new_config_and_leaves_its_input(tiny_config, tmp_path, corpus):
    tree = tiny_tree(corpus, tmp_path / "runs", train={"seq_len": None, "batch_tokens": 256})
    cfg = validate(RunConfig, tree)
    before = to_tree(cfg)
    with pytest.raises(ValueError, match="vocab_size"):  # resolving reads no tokenizer
        resolve(cfg, world_size=1)
    out = resolve(cfg, world_size=1, vocab_size=vocab_size_of(cfg.data.tokenizer))
    assert to_tree(cfg) == before  # untouched
    assert cfg.model.vocab_size is None and cfg.train.seq_len is None
    assert cfg.train.grad_accum is None and cfg.distributed.world_size is None
    assert out.model.vocab_size == 256 + 1  # the byte tokenizer's bytes and BOS
    assert (out.train.seq_len, out.train.grad_accum, out.distributed.world_size) == (32, 2, 1)
    assert out.train.max_tokens == 6 * 256
    out.model.n_layer = 99  # the new config shares nothing with the old one
    assert cfg.model.n_layer == 2


def test_resolving_reads_no_file_even_for_a_saved_tokenizer(tmp_path, corpus):
    """A saved tokenizer (a run's newest checkpoint's) is read by load_run, not by resolve."""
    tree = tiny_tree(corpus, tmp_path / "runs")
    tree["data"]["tokenizer"] = {"name": "saved", "path": str(tmp_path / "no-such-run")}
    cfg = validate(RunConfig, tree)
    assert resolve(cfg, world_size=1, vocab_size=300).model.vocab_size == 300
    with pytest.raises(DataError, match="no tokenizer in"):  # load_run is where it is read
        load_run(write_config(tmp_path / "run.yaml", tree))


def test_resumable_is_declared_on_the_fields():
    assert resumable("train.max_steps") and resumable("model.loss")
    assert not resumable("train.batch_tokens") and not resumable("model.d_model")
    # a marked section covers its keys, a component's field can say otherwise
    assert resumable("optimizer.lr", {"optimizer": {"name": "adamw"}})
    assert resumable("optimizer.momentum", {"optimizer": {"name": "muon"}})
    assert not resumable("optimizer.name", {"optimizer": {"name": "adamw"}})
    assert resumable("callbacks[0].every", {"callbacks": [{"name": "sample"}]})
    # a component's keys are looked up in the config the run names (the source's weight only)
    tree = {"data": {"sources": {"web": {"name": "text", "path": "x"}}}}
    assert resumable("data.sources.web.weight", tree)
    assert not resumable("data.sources.web.path", tree)
    assert not resumable("run.seed") and not resumable("grow.parent")


def test_optimizer_configs_answer_for_their_options():
    muon, adamw = MuonConfig(name="muon", adamw_8bit=True), AdamWConfig(name="adamw")
    assert isinstance(muon, OptimizerConfig) and isinstance(adamw, OptimizerConfig)
    t = muon.traits()
    assert (t.name, t.kind("matrix"), t.kind("embedding")) == ("muon", "muon", "adamw")
    assert t.by_kind["muon"].nesterov and t.by_kind["adamw"].eight_bit
    assert t.settings == ("8-bit AdamW",) and t.stand_in is not None
    assert not t.stand_in.by_kind["adamw"].eight_bit  # the trace runs torch's AdamW
    assert {adamw.traits().kind(r) for r in ("matrix", "embedding")} == {"adamw"}
    assert [o for o, _, _ in adamw.traits().lighter] == [
        "optimizer.adamw_8bit=true",
        "optimizer.name=muon",
    ]
    assert (
        muon.momentum_schedule()(0) == pytest.approx(0.85)
        and muon.momentum_schedule()(10_000) == 0.95
    )
    assert adamw.momentum_schedule() is None
    assert not muon.traceable().adamw_8bit and muon.adamw_8bit  # a copy
    assert muon.check_world(1) == [] and "adamw_8bit" in muon.check_world(2)[0]


def test_one_build_path_for_the_trainer_and_the_trace(tiny_config):
    cfg = load_run(
        tiny_config, ["train.master_weights=bf16", "train.activation_checkpointing=true"]
    )
    assert isinstance(cfg.model, ModelConfig)
    torch.manual_seed(0)
    model, optimizer = build(cfg, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.activation_checkpointing
    assert {g["name"] for g in optimizer.param_groups} >= {"matrix/new", "embedding/embedding"}
    torch.manual_seed(0)
    again = build_model(cfg, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_a_model_the_analytic_planner_does_not_cover_is_named(tiny_config):
    from littlelm.plan.dims import Dims

    cfg = load_run(tiny_config)
    object.__setattr__(cfg, "model", ModelConfig(name="other"))
    with pytest.raises(ConfigError, match="knows the gpt model only, not 'other'"):
        Dims.of(cfg)


CONFIG_CLASSES = {"GPTConfig", "MuonConfig", "AdamWConfig", "ModelConfig", "OptimizerConfig"}


def test_no_caller_tests_for_a_concrete_config_class():
    """isinstance(x, MuonConfig) and getattr(cfg.optimizer, "adamw_8bit") are what the contracts
    replace; this keeps them from coming back."""
    found = []
    for path in (ROOT / "littlelm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if node.func.id == "isinstance" and names & CONFIG_CLASSES:
                found.append(f"{path.name}:{node.lineno}")
            if node.func.id not in ("getattr", "hasattr") or len(node.args) < 2:
                continue
            probed, field = ast.unparse(node.args[0]), node.args[1]
            if isinstance(field, ast.Constant) and (
                probed.startswith(("cfg.", "self.cfg.")) or probed in ("oc", "m", "model_cls")
            ):  # a config (or a model class) probed for a named field
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_no_caller_tests_for_an_optimizer_class():
    """The optimizer is one torch.optim.Optimizer whose groups say their kind (optim/optimizer.py):
    outside optim/ nothing asks which optimizer class it holds."""
    found = []
    for path in (ROOT / "littlelm").rglob("*.py"):
        if path.parent.name == "optim":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "type"):
                classes = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
                if any(word in classes for word in ("Optimizer", "Muon", "Adam", "optim.")):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
