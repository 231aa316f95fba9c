"""Callbacks: code that runs at fixed points of training, picked by name in `callbacks:`.

    callbacks:
      - {name: sample, every: 500, prompt: "def ", max_tokens: 200}

A callback subclasses `Callback` and overrides the hooks it needs. The trainer always adds the
JSONL metrics logger; TensorBoard and Weights & Biases loggers live in `train/loggers.py`. Under
torchrun callbacks run on rank 0 only, except those that call the model (`runs_model = True`),
which under FSDP run on every rank (a forward pass needs them all) and write only where
`trainer.is_main`.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field

from littlelm.config import ComponentConfig, named

if TYPE_CHECKING:
    import torch

    from littlelm.model.protocol import LanguageModel
    from littlelm.schema import RunConfig


class TrainerView(Protocol):
    """What a callback may read from the trainer that calls it (train/trainer.py's Trainer; a
    protocol here, because the trainer imports this module and must not be imported back)."""

    cfg: RunConfig
    run_dir: Path
    device: torch.device
    model: LanguageModel
    optimizer: Any
    data: Any  # data/build.py's Data: the tokenizer and the validation batches
    callbacks: list[Callback]
    step: int
    tokens: int
    max_steps: int
    flops_per_token: int
    peak: float  # the devices' peak FLOP/s

    @property
    def is_main(self) -> bool: ...

    def log(self, text: str) -> None: ...

    def autocast(self): ...


class Callback:
    runs_model = False  # True: calls the model, so under FSDP it must run on every rank

    def on_train_start(self, trainer: TrainerView) -> None:
        pass

    def on_step_end(self, trainer: TrainerView, metrics: dict) -> None:
        """After every optimizer step; `metrics` has step, tokens, lr and (on log steps) loss."""

    def on_eval(self, trainer: TrainerView, metrics: dict) -> None:
        pass

    def on_checkpoint(self, trainer: TrainerView, path: Path) -> None:
        pass

    def on_rollback(self, trainer: TrainerView, info: dict) -> None:
        """After the loss guard rolled the run back; info has step (the checkpoint's),
        failed_at, reason, rollbacks and checkpoint."""

    def on_train_end(self, trainer: TrainerView, metrics: dict) -> None:
        pass


class CallbackConfig(ComponentConfig):
    """Base of a callback's config (the `callbacks:` list): it builds the callback."""

    def build(self) -> Callback:
        raise NotImplementedError(f"{type(self).__name__} builds no callback")


class JSONLConfig(CallbackConfig):
    """Appends every logged step and evaluation to RUN_DIR/metrics.jsonl (always on)."""

    name: Literal["jsonl"] = named("jsonl")

    def build(self) -> JSONLLogger:
        return JSONLLogger(self)


class JSONLLogger(Callback):
    """Appends every logged step and evaluation to RUN_DIR/metrics.jsonl (always on)."""

    def __init__(self, cfg: JSONLConfig | None = None):
        self.path: Path | None = None
        self.failed = False

    def on_train_start(self, trainer: TrainerView) -> None:
        self.path = trainer.run_dir / "metrics.jsonl"
        truncate_metrics(self.path, trainer.step)
        self.write({"kind": "start", **run_facts(trainer)})

    def write(self, record: dict) -> None:
        """Append a record (of any kind: e.g. the `core` callback's `icl` records)."""
        assert self.path is not None
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()
        }
        clean["time"] = round(time.time(), 3)  # wall clock: the report measures sessions with it
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(clean) + "\n")
        except OSError as e:  # a full disk must not end a run; checkpoints report it loudly
            if not self.failed:
                warnings.warn(
                    f"cannot append to {self.path} ({e}); metrics are being lost", stacklevel=2
                )
            self.failed = True

    def on_step_end(self, trainer: TrainerView, metrics: dict) -> None:
        if "loss" in metrics:
            self.write({"kind": "train", **metrics})

    def on_eval(self, trainer: TrainerView, metrics: dict) -> None:
        self.write({"kind": "eval", **metrics})

    def on_train_end(self, trainer: TrainerView, metrics: dict) -> None:
        self.write({"kind": "end", **metrics})

    def on_rollback(self, trainer: TrainerView, info: dict) -> None:
        """The records after the checkpoint describe abandoned weights: drop them, note why."""
        assert self.path is not None
        truncate_metrics(self.path, info["step"])
        self.write({"kind": "rollback", **info})


def numeric_fields(record: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics record, nested ones flattened: {'mix': {'a': 0.5}} -> {'mix.a': 0.5}.

    Booleans, strings and None (how metrics.jsonl stores a non-finite value) are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(numeric_fields(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def run_facts(trainer: TrainerView) -> dict:
    """What a report needs to know about a (re)started run that the config does not say."""
    import torch

    peak = trainer.peak
    return {
        "step": trainer.step,
        "tokens": trainer.tokens,
        "max_steps": trainer.max_steps,
        "params": trainer.model.param_counts(),
        "flops_per_token": trainer.flops_per_token,
        "device": str(trainer.device),
        "device_name": torch.cuda.get_device_name(trainer.device)
        if trainer.device.type == "cuda"
        else trainer.device.type,
        "peak_flops": peak if math.isfinite(peak) else None,
        "precision": trainer.cfg.train.precision,  # what the peak is of (auto made concrete)
        "torch": torch.__version__,
        **grown_from(trainer),
    }


def grown_from(trainer: TrainerView) -> dict:
    """A grown run's starting point on its parent's step and token axes (train/growth.py), so
    that a report comparing it with its parent continues the parent's curves."""
    from littlelm.train.growth import lineage_start

    grow = trainer.cfg.starts_from()
    start = lineage_start(grow.parent) if grow is not None else None
    return {"grown_from": start} if start is not None else {}


def complete_end_record(path: Path, summary: dict) -> bool:
    """A finished run whose metrics lack their end record (it was killed between its final save
    and that write): append one from `summary` (the checkpoint's step, tokens and time) and the
    last evaluation of that step. Returns whether it wrote one."""
    if not path.is_file():
        return False
    last_eval: dict = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the kill
        if not isinstance(rec, dict):
            continue
        if rec.get("kind") == "end":
            return False
        if rec.get("kind") == "eval" and rec.get("step") == summary.get("step"):
            last_eval = {k: v for k, v in rec.items() if k.startswith("val_")}
    logger = JSONLLogger()
    logger.path = path
    logger.write({"kind": "end", **summary, **last_eval, "completed_on_resume": True})
    return not logger.failed


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records of steps after `step` (left by a run that died after its last checkpoint)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if rec.get("step", 0) <= step and rec.get("kind") != "end":
            keep.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)


class SampleConfig(CallbackConfig):
    """Prints (and logs to RUN_DIR/samples.txt) a generated continuation of a prompt."""

    name: Literal["sample"] = named("sample")
    every: int = Field(0, description="Steps between samples; 0 = only at the end.", ge=0)
    at_end: bool = Field(True, description="Sample after the last step.")
    prompt: str = Field("", description="Text the sample continues (after BOS).")
    max_tokens: int = Field(128, description="Tokens to generate.", ge=1)
    temperature: float = Field(0.8, description="Sampling temperature; 0 = greedy.", ge=0)
    top_k: int | None = Field(
        50, description="Sample among the k likeliest tokens; null = all.", ge=1
    )
    seed: int = Field(0, description="Seed of the sampling generator.")

    def build(self) -> Sampler:
        return Sampler(self)


class Sampler(Callback):
    """Prints (and logs to RUN_DIR/samples.txt) a generated continuation of a prompt."""

    runs_model = True

    def __init__(self, cfg: SampleConfig):
        self.cfg = cfg

    def on_step_end(self, trainer: TrainerView, metrics: dict) -> None:
        if (
            self.cfg.every
            and trainer.step % self.cfg.every == 0
            and trainer.step < trainer.max_steps
        ):
            self.sample(trainer)

    def on_train_end(self, trainer: TrainerView, metrics: dict) -> None:
        if self.cfg.at_end:
            self.sample(trainer)

    def sample(self, trainer: TrainerView) -> str:
        from littlelm.model.generate import generate

        tok, c = trainer.data.tokenizer, self.cfg
        model = trainer.model
        was_training = model.training
        model.eval()
        with trainer.autocast:
            ids = generate(
                model,
                [tok.bos_id, *tok.encode(c.prompt)],
                c.max_tokens,
                c.temperature,
                c.top_k,
                c.seed,
                tok.bos_id,
            )
        model.train(was_training)
        text = c.prompt + tok.decode(ids)
        trainer.log(f"--- sample at step {trainer.step} ---\n{text}\n---")
        if trainer.is_main:
            with open(trainer.run_dir / "samples.txt", "a") as f:
                f.write(f"=== step {trainer.step}\n{text}\n")
        return text
