"""In-context-learning evaluation during training (CORE or any task subset), as a callback.

    callbacks:
      - {name: core, every: 500, bundle: ~/.cache/littlelm/eval_bundle, max_per_task: 500}
      - {name: core, every: 250, bundle: path/to/tasks, tasks: [siqa, logi_qa]}

Each evaluation appends a `{"kind": "icl", ...}` record to metrics.jsonl: the mean centered
score, `core` when it is the full CORE, and per task (nested by label) the accuracy, centered
score and share of prompts cut to fit the context; the TensorBoard and W&B loggers get the same
numbers as `eval/...`. After the last step it prints the per-task table. Validation loss and
bits per byte stay with the `eval:` section, on their own interval.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from littlelm.config import named
from littlelm.train.callbacks import Callback, CallbackConfig, JSONLLogger

if TYPE_CHECKING:
    from littlelm.eval.core import SuiteResult
    from littlelm.train.trainer import Trainer


class CoreEvalConfig(CallbackConfig):
    """Scores the model on CORE (or any task list) at intervals; table at the end."""

    name: Literal["core"] = named("core")
    every: int = Field(0, description="Steps between evaluations; 0 = only at the end.", ge=0)
    at_end: bool = Field(True, description="Evaluate after the last step.")
    bundle: str | None = Field(
        None,
        description="Task directory (CORE bundle or one with tasks.yaml); null = the fetched bundle.",
    )
    tasks: list[str] | None = Field(None, description="Task labels to run; null = all listed.")
    task_file: str | None = Field(None, description="Task list YAML; null = the directory's.")
    max_per_task: int | None = Field(
        500, description="Items scored per task (fixed shuffle); null = all.", ge=1
    )
    truncation: Literal["crop", "drop_shots"] = Field(
        "crop", description="Fit long prompts by cropping after BOS, or by dropping examples."
    )
    batch_tokens: int = Field(16384, description="Tokens per forward pass.", ge=1)
    warn_share: float = Field(
        0.01,
        description="Warn when more than this share (0-1) of a task's prompts were cut.",
        ge=0,
        le=1,
    )

    def build(self) -> CoreEval:
        return CoreEval(self)


class CoreEval(Callback):
    runs_model = True  # under FSDP every rank takes part in the forward passes

    def __init__(self, cfg: CoreEvalConfig):
        self.cfg = cfg
        self.last: SuiteResult | None = None
        self.last_step = -1

    def on_train_start(self, trainer: Trainer) -> None:
        from littlelm.eval.core import load_suite
        from littlelm.eval.run import tasks_and_data

        # read and check every task file now, so a wrong path fails before any training step
        tasks, data_dir = tasks_and_data(self.cfg.bundle, self.cfg.task_file, self.cfg.tasks)
        self.suite = load_suite(tasks, data_dir)

    def on_step_end(self, trainer: Trainer, metrics: dict) -> None:
        c = self.cfg
        if c.every and trainer.step % c.every == 0 and trainer.step < trainer.max_steps:
            self.evaluate(trainer)

    def on_train_end(self, trainer: Trainer, metrics: dict) -> None:
        if self.cfg.at_end and self.last_step != trainer.step:
            self.evaluate(trainer)
        if self.last is not None:
            from littlelm.eval.core import format_table

            trainer.log(
                f"in-context evaluation at step {self.last_step}:\n{format_table(self.last)}"
            )

    def evaluate(self, trainer: Trainer) -> SuiteResult:
        from littlelm.eval.core import EvalOptions, evaluate_suite

        c = self.cfg
        opts = EvalOptions(c.max_per_task, c.truncation, c.batch_tokens, c.warn_share)
        t0 = time.perf_counter()
        with trainer.autocast:
            suite = evaluate_suite(
                trainer.model, trainer.data.tokenizer, self.suite, opts, trainer.log
            )
        record = suite_record(suite, trainer.step, trainer.tokens, time.perf_counter() - t0)
        trainer.log(
            f"icl eval step {trainer.step}: mean centered {suite.mean_centered:.4f} over "
            f"{len(suite.tasks)} task(s) in {record['eval_time']:.1f}s"
        )
        publish(trainer, record)
        self.last, self.last_step = suite, trainer.step
        return suite


def publish(trainer: Trainer, record: dict) -> None:
    """To metrics.jsonl, and to TensorBoard / W&B (as eval/<field>) when those loggers run
    (rank 0 only under torchrun)."""
    from littlelm.train.loggers import TensorBoardLogger, WandbLogger

    if not trainer.is_main:
        return
    for cb in trainer.callbacks:
        if isinstance(cb, JSONLLogger):
            cb.write(record)
        elif isinstance(cb, (TensorBoardLogger, WandbLogger)):
            cb.on_eval(trainer, {k: v for k, v in record.items() if k != "kind"})


def suite_record(suite: SuiteResult, step: int, tokens: int, seconds: float) -> dict:
    """The metrics.jsonl record of one evaluation."""
    rec = {
        "kind": "icl",
        "step": step,
        "tokens": tokens,
        "mean_centered": suite.mean_centered,
        "core": suite.mean_centered if suite.is_core else None,
        "eval_time": seconds,
    }
    rec["task_acc"] = {t.label: t.accuracy for t in suite.tasks}
    rec["task_centered"] = {t.label: t.centered for t in suite.tasks}
    rec["task_truncated_share"] = {t.label: t.truncation.share for t in suite.tasks}
    return rec
