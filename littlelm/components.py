"""Fills the one open table of components, the trainer's callbacks (littlelm/registry.py says
why it is open); every other component is a union in the schema.

The entry points call `register_all()` before reading a config: the CLI (`littlelm.cli.main`),
the test suite (tests/conftest.py), the benchmarks and scripts. A program that uses littlelm as
a library need not: the first lookup calls it (littlelm/__init__.py hands it to
`registry.fill_on_first_use`), so this works in a fresh interpreter:

    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    Trainer(load_run("demo")).fit()

This module sits at the top of the layers (it imports eval/ and train/), beside the CLI.
"""

from __future__ import annotations

from littlelm.registry import register_callback


def register_all() -> None:
    """Register every callback (idempotent: a second call changes nothing)."""
    from littlelm.eval.callback import CoreEvalConfig
    from littlelm.train import callbacks, loggers

    for cls in (
        callbacks.JSONLConfig,
        callbacks.SampleConfig,
        loggers.TensorBoardConfig,
        loggers.WandbConfig,
        CoreEvalConfig,
    ):
        register_callback(cls)
