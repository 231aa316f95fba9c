"""Which components exist: `register_all()` fills every registry (models, optimizers, schedules,
tokenizers, datasets, callbacks), by name, from this one table.

The entry points call it before reading a config: the CLI (`littlelm.cli.main`), the test
suite (tests/conftest.py), the benchmarks and scripts. A program that uses littlelm as a library
need not: the first lookup in an empty registry calls it (littlelm/__init__.py hands it to
`registry.fill_on_first_use`), so this works in a fresh interpreter:

    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    Trainer(load_run("demo")).fit()

Importing a module registers nothing, so what is registered never depends on what happened to
be imported. A new component is added to the table once (a data component to
littlelm/data/components.py, which data-preparation workers call too). This module sits at
the top of the layers (it imports eval/, train/, data/, model/ and optim/), beside the CLI.
"""

from __future__ import annotations

from littlelm.registry import CALLBACKS, DATASETS, MODELS, OPTIMIZERS, SCHEDULES


def register_all() -> None:
    """Register every component (idempotent: a second call changes nothing)."""
    from littlelm.data.build import PreparedShards, ShardsConfig
    from littlelm.data.components import register as register_data
    from littlelm.eval.callback import CoreEval, CoreEvalConfig
    from littlelm.model.gpt import GPT, GPTConfig
    from littlelm.optim import groups, schedule
    from littlelm.train import callbacks, loggers

    MODELS.register("gpt", config=GPTConfig)(GPT)
    OPTIMIZERS.register("adamw", config=groups.AdamWConfig)(groups.build_optimizer)
    OPTIMIZERS.register("muon", config=groups.MuonConfig)(groups.build_optimizer)
    SCHEDULES.register("trapezoidal", config=schedule.TrapezoidalConfig)(schedule.trapezoidal)
    SCHEDULES.register("cosine", config=schedule.CosineConfig)(schedule.cosine)
    SCHEDULES.register("constant", config=schedule.ConstantConfig)(schedule.constant)
    register_data()  # tokenizers and document sources
    DATASETS.register("shards", config=ShardsConfig)(PreparedShards)
    CALLBACKS.register("jsonl", config=callbacks.JSONLConfig)(callbacks.JSONLLogger)
    CALLBACKS.register("sample", config=callbacks.SampleConfig)(callbacks.Sampler)
    CALLBACKS.register("tensorboard", config=loggers.TensorBoardConfig)(loggers.TensorBoardLogger)
    CALLBACKS.register("wandb", config=loggers.WandbConfig)(loggers.WandbLogger)
    CALLBACKS.register("core", config=CoreEvalConfig)(CoreEval)
