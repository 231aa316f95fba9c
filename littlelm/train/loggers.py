"""Metric loggers for the tools people already use: TensorBoard and Weights & Biases.

    callbacks:
      - {name: tensorboard}                         # RUN_DIR/tensorboard; `tensorboard --logdir runs`
      - {name: wandb, project: my-lm, mode: offline}

Both are optional extras (`pip install -e '.[logging]'` in a clone), imported only when configured;
a missing package stops the run before data preparation with the command that installs it.
They log what `metrics.jsonl` gets (which is always written): every numeric field of each train
record as `train/<field>` and of each evaluation as `eval/<field>`, against the optimizer step.
Nested fields (per-source proportions, per-task scores) become `train/<field>.<key>`. Any number
of loggers can be configured at once.
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from littlelm.config import dump_yaml, named, to_tree
from littlelm.errors import DependencyError
from littlelm.extras import require
from littlelm.train.callbacks import Callback, CallbackConfig, numeric_fields

if TYPE_CHECKING:
    from littlelm.train.trainer import Trainer


def scalars(metrics: dict, prefix: str) -> dict[str, float]:
    """{'step': 5, 'loss': 2.0, 'mix': {'a': 0.5}} -> {'train/loss': 2.0, 'train/mix.a': 0.5}."""
    return {
        f"{prefix}/{key}": value
        for key, value in numeric_fields(metrics).items()
        if key not in ("step", "time")
    }


class TensorBoardConfig(CallbackConfig):
    """Writes train and eval metrics as TensorBoard event files."""

    name: Literal["tensorboard"] = named("tensorboard")
    log_dir: str | None = Field(
        None, description="Directory of the event files; null = RUN_DIR/tensorboard."
    )
    flush_secs: float = Field(
        30, description="Seconds between writes of buffered events to disk.", gt=0
    )

    def build(self) -> TensorBoardLogger:
        return TensorBoardLogger(self)


class TensorBoardLogger(Callback):
    def __init__(self, cfg: TensorBoardConfig):
        self.cfg = cfg
        self.module = require(
            "torch.utils.tensorboard", "logging", "the tensorboard callback", "tensorboard"
        )
        self.writer = None

    def on_train_start(self, trainer: Trainer) -> None:
        log_dir = Path(self.cfg.log_dir) if self.cfg.log_dir else trainer.run_dir / "tensorboard"
        # purge_step: a resumed run hides the events an interrupted one wrote after its checkpoint.
        self.writer = self.module.SummaryWriter(
            str(log_dir),
            purge_step=trainer.step + 1 if trainer.step else None,
            flush_secs=self.cfg.flush_secs,
        )
        if trainer.step == 0:
            config = "\n".join("    " + line for line in dump_yaml(trainer.cfg).splitlines())
            self.writer.add_text("config", config, 0)  # indented: shown as code

    def _add(self, metrics: dict, prefix: str, step: int) -> None:
        assert self.writer is not None, "on_train_start was not called"
        for tag, value in scalars(metrics, prefix).items():
            self.writer.add_scalar(tag, value, step)

    def on_step_end(self, trainer: Trainer, metrics: dict) -> None:
        if "loss" in metrics:
            self._add(metrics, "train", trainer.step)

    def on_eval(self, trainer: Trainer, metrics: dict) -> None:
        self._add(metrics, "eval", trainer.step)
        self.writer.flush()

    def on_checkpoint(self, trainer: Trainer, path: Path) -> None:
        self.writer.flush()

    def on_train_end(self, trainer: Trainer, metrics: dict) -> None:
        self.writer.close()


class WandbConfig(CallbackConfig):
    """Logs train and eval metrics and the resolved config to Weights & Biases."""

    name: Literal["wandb"] = named("wandb")
    project: str = Field("littlelm", description="W&B project the run goes to.")
    entity: str | None = Field(None, description="W&B team or user; null = your default entity.")
    run_name: str | None = Field(None, description="Name shown in W&B; null = run.name.")
    group: str | None = Field(None, description="W&B group, to view related runs together.")
    tags: list[str] = Field(default_factory=list, description="W&B tags of the run.")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description="online, offline (write locally; `wandb sync` later) or disabled; "
        "null = WANDB_MODE, else online. WANDB_MODE, when set, wins.",
    )

    def build(self) -> WandbLogger:
        return WandbLogger(self)


class WandbLogger(Callback):
    def __init__(self, cfg: WandbConfig):
        self.cfg = cfg
        self.wandb = require("wandb", "logging", "the wandb callback")
        self.run = None

    def mode(self) -> str | None:
        """WANDB_MODE (the machine's choice, e.g. no network) wins over the config's mode."""
        return os.environ.get("WANDB_MODE") or self.cfg.mode

    def on_train_start(self, trainer: Trainer) -> None:
        c = self.cfg
        kwargs = {
            "project": c.project,
            "entity": c.entity,
            "name": c.run_name or trainer.cfg.run.name,
            "group": c.group,
            "tags": c.tags or None,
            "config": to_tree(trainer.cfg),
            "dir": str(trainer.run_dir),
            "id": run_id(trainer.run_dir),  # the same W&B run across resumes
            "resume": "allow",
        }
        if self.mode():
            kwargs["mode"] = self.mode()
        try:
            self.run = self.wandb.init(**kwargs)
        except Exception as e:  # wandb raises several kinds (no API key, no network, ...)
            raise DependencyError(
                f"wandb could not start a run: {e}; {start_fix(self.mode())}"
            ) from e
        # Steps may repeat after a resume; plotting against our own `step` keeps them in place.
        self.run.define_metric("step")
        self.run.define_metric("train/*", step_metric="step")
        self.run.define_metric("eval/*", step_metric="step")

    def _log(self, metrics: dict, prefix: str, step: int) -> None:
        assert self.run is not None, "on_train_start was not called"
        self.run.log({"step": step, **scalars(metrics, prefix)})

    def on_step_end(self, trainer: Trainer, metrics: dict) -> None:
        if "loss" in metrics:
            self._log(metrics, "train", trainer.step)

    def on_eval(self, trainer: Trainer, metrics: dict) -> None:
        self._log(metrics, "eval", trainer.step)

    def on_train_end(self, trainer: Trainer, metrics: dict) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.run.summary[key] = value
        self.run.finish()


def start_fix(mode: str | None) -> str:
    """What to do when wandb.init fails: going offline helps only a run that was not already."""
    if mode == "offline":
        return (
            "the run was already offline, so the cause is this machine's setup, not the "
            "network: check the wandb install (`wandb --version`) and that RUN_DIR/wandb is "
            "writable, or set mode: disabled (or remove the wandb callback)"
        )
    return (
        "run `wandb login`, or set mode: offline in the wandb callback (or WANDB_MODE=offline) "
        "and `wandb sync` the run later"
    )


def run_id(run_dir: Path) -> str:
    """The W&B run id of this run directory, made once and kept in RUN_DIR/wandb/littlelm_run_id."""
    path = run_dir / "wandb" / "littlelm_run_id"
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    rid = uuid.uuid4().hex[:12]
    path.write_text(rid + "\n")
    return rid
