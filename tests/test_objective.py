"""The objective (train/objective.py): a component the config picks, so the trainer names none,
and a new one is its own file plus a field in the schema; here a toy one, added by the test."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import torch

import littlelm
from conftest import tiny_tree, write_config
from littlelm.schema import RunConfig, load_run
from littlelm.train.objective import ObjectiveConfig, Setting
from littlelm.train.step import LanguageModelLoss
from littlelm.train.trainer import Trainer

TRAINER = Path(littlelm.__file__).parent / "train" / "trainer.py"
# what would name an objective (or LoRA, a model transform): its section, module or class
OBJECTIVE_WORDS = re.compile(r"(^|_)(dpo|rl|sft|lora)($|_)|DPO|^RL|LanguageModelLoss|LoRA")


def names_in(tree: ast.AST) -> set[str]:
    """Every identifier the code uses: names, attributes, imported modules and names, args."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            out |= {*(node.module or "").split("."), *(a.name for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {p for a in node.names for p in a.name.split(".")}
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def test_the_trainer_names_no_objective_nor_lora():
    named = sorted(n for n in names_in(ast.parse(TRAINER.read_text())) if OBJECTIVE_WORDS.search(n))
    assert not named, (
        f"train/trainer.py names objectives or LoRA: {named}; ask self.objective or "
        "self.transform instead"
    )


class ToyConfig(ObjectiveConfig):
    """A test's objective: the language-model loss times `scale`, with a figure of its own."""

    scale: float = 2.0

    def build(self, setting: Setting) -> ToyObjective:
        return ToyObjective(setting, self.scale)


class ToyObjective(LanguageModelLoss):
    def __init__(self, setting: Setting, scale: float):
        super().__init__(setting)
        self.scale, self.calls = scale, 0

    def loss_of(self, forward):
        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return forward(x, y) * self.scale

        return loss

    def metrics(self) -> dict[str, float]:
        out, self.calls = {"toy_micro_batches": float(self.calls)}, 0
        return out

    def validate(self) -> dict:
        return {"val_toy": self.scale, **super().validate()}


class ToyRun(RunConfig):
    """The run config with one more objective section: what a new objective adds to schema.py."""

    toy: ToyConfig | None = None


def records(cfg: RunConfig) -> list[dict]:
    lines = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_new_objective_is_its_config_and_class_and_the_trainer_runs_it(tmp_path, tiny_config):
    overrides = ["train.max_steps=2", "train.log_every=1", "eval.every=0", "eval.at_end=true"]
    plain = load_run(tiny_config, [*overrides, "run.name=plain"])
    Trainer(plain, resume="never").fit()
    base = load_run(tiny_config, [*overrides, "run.name=toy"])
    toy = ToyRun.model_validate({**dict(base), "toy": ToyConfig(scale=2.0)})
    trainer = Trainer(toy, resume="never")
    assert isinstance(trainer.objective, ToyObjective)
    trainer.fit()
    got, want = records(toy), records(plain)
    train = [r for r in got if r["kind"] == "train"]
    accum = toy.train.grad_accum
    assert [r["toy_micro_batches"] for r in train] == [accum, accum]
    # the first step's loss is the same model's on the same rows, times the toy's scale
    first_plain = next(r for r in want if r["kind"] == "train")
    assert train[0]["loss"] == 2.0 * first_plain["loss"]
    evals = [r for r in got if "val_toy" in r]
    assert evals and evals[-1]["val_toy"] == 2.0 and "val_loss" in evals[-1]


def test_a_finished_trainer_is_freed_by_del_alone(tmp_path, corpus):
    """No reference cycle through the objective: the setting's reference closure once held the
    trainer (trainer -> objective -> setting -> closure -> trainer), so a process running
    several trainers (a sweep, a bench) kept each until gc ran. The first trainer of a process
    is built and collected first: torch's lazy import of torch._dynamo in the first optimizer
    keeps a traceback cycle holding its caller's frames, which is torch's, not ours."""
    import gc
    import shutil
    import weakref

    cfg = load_run(
        write_config(
            tmp_path / "c.yaml", tiny_tree(corpus, tmp_path / "runs", train={"max_steps": 2})
        )
    )
    warm = Trainer(cfg, resume="never")
    warm.fit()
    del warm
    gc.collect()
    shutil.rmtree(tmp_path / "runs")
    gc.disable()
    try:
        trainer = Trainer(cfg, resume="never")
        trainer.fit()
        alive = weakref.ref(trainer)
        del trainer
        assert alive() is None, "a reference cycle holds the trainer"
    finally:
        gc.enable()
