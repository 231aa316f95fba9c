"""What `littlelm train` prints: the CLI's view of a run, a callback the CLI hands the trainer.

    console = Console()
    result = Trainer(cfg, callbacks=[console]).fit()
    console.report(trainer, result)          # done, stopped (how to resume), already finished

At the start: the model, batch and speed settings, the parameter groups, the budget and the data
mixture, and the schedule's warnings; then the first steps of the session (the time to the first
step, then a few steps with their times), the progress line every `train.log_every` steps and a
line per evaluation; at the end, what the run did and what to type next. The trainer itself
prints only what happened (resumed, skipped, rolled back); the advice lives here. Under torchrun
callbacks run on rank 0 only, so one process prints.
"""

from __future__ import annotations

import math
import time

import torch

from littlelm.model.kernels import run_backend
from littlelm.model.lora import trainable_count
from littlelm.optim.schedule import schedule_warnings
from littlelm.progress import Progress, duration, human
from littlelm.schema import RunConfig
from littlelm.train.budget import train_further
from littlelm.train.callbacks import Callback, TrainerView
from littlelm.train.growth import group_rows
from littlelm.train.trainer import Trainer


class Console(Callback):
    """The console output of a run, written to the trainer's `progress` (its notes go there too)."""

    # the CLI hands this callback to a Trainer, whose progress and state it reads (a TrainerView
    # has neither)
    def on_train_start(self, trainer: TrainerView) -> None:
        assert isinstance(trainer, Trainer), "the console is the CLI's, for a Trainer"
        self.progress: Progress = trainer.progress
        self.first = FirstSteps(trainer.step, trainer.cfg.train.log_every)
        self.warned = False  # the objective's warning said in full once, then tagged on the line
        self.summary(trainer)
        opening = trainer.budget.opening()
        if opening:
            self.say(opening)
        max_tokens = trainer.cfg.train.max_tokens
        if max_tokens:  # a time budget does not know its tokens in advance
            mix = "\n".join(trainer.data.mixture_plan(max_tokens))
            self.say(f"data mixture ({max_tokens:,} training tokens):\n{mix}")
        if trainer.step:
            self.say(f"data realised so far: {trainer.state.loader.report()}")
        if math.isfinite(trainer.max_steps):  # a time budget sets the steps as it goes
            steps = int(trainer.max_steps)  # finite: a whole number of steps
            for problem in schedule_warnings(trainer.cfg.schedule, steps):
                self.say(f"warning: {problem}")

    def on_step_end(self, trainer: TrainerView, m: dict) -> None:
        assert isinstance(trainer, Trainer), "the console is the CLI's, for a Trainer"
        step, budget = trainer.step, trainer.budget
        if self.first.wants(step):  # the first steps, before the log cadence
            assert trainer.last_loss is not None
            self.first.show(self.progress, step, trainer.max_steps, trainer.last_loss.item())
        if "loss" in m:  # a log step
            warning = trainer.objective.warning(m)
            if warning and not self.warned:
                self.say(f"warning at step {step}: {warning}")
                self.warned = True
            line = {**m, "budget": budget.describe(), "warning": warning}
            self.progress.update(progress_line(line, budget.total(step)))

    def on_eval(self, trainer: TrainerView, m: dict) -> None:
        assert isinstance(trainer, Trainer), "the console is the CLI's, for a Trainer"
        line = trainer.objective.validation_line(m)  # each objective's figures
        self.say(f"eval step {m['step']}: {line} | train time {m['train_time']:.1f}s")
        warning = trainer.objective.warning(m)
        if warning:
            self.say(f"warning on the held-out data at step {m['step']}: {warning}")

    def say(self, text: str) -> None:
        self.progress.message(text)

    # ------------------------------------------------------------------------------------------

    def summary(self, tr: Trainer) -> None:
        """The model, the batch, the speed settings and the parameter groups."""
        from rich.console import Console as RichConsole
        from rich.table import Table

        counts, c, world = tr.model.param_counts(), tr.cfg, tr.parallel.world
        ranks = f" × {world} ranks ({tr.parallel.strategy})" if world > 1 else ""
        steps = (
            f"{tr.max_steps} steps" if math.isfinite(tr.max_steps) else "steps set by the budget"
        )
        self.say(
            f"model: {counts['total']:,} parameters ({counts['non_embedding']:,} non-embedding), "
            f"{tr.flops_per_token / 1e6:.1f} MFLOPs/token at seq {c.train.seq_len}; "
            f"device {tr.device}, {c.train.precision}; batch {c.train.batch_tokens:,} tokens "
            f"= {c.train.micro_batch_size} × {c.train.seq_len} × {c.train.grad_accum} accum"
            f"{ranks}; {steps}"
        )
        self.say(f"speed: {speed_summary(c, tr.device)}; MFU against {tr.peak / 1e12:.3g} TFLOP/s")
        if c.lora is not None:  # what trains: the adapters (+ any full-trained tensors)
            n, lo = trainable_count(tr.model), c.lora
            self.say(
                f"lora: {n:,} trainable parameters ({n / counts['total']:.2%} of the model), "
                f"rank {lo.rank} on {lo.describe()} linears, alpha {lo.alpha:g}"
                f"{' (rsLoRA: alpha / sqrt(rank))' if lo.use_rslora else ''}; "
                "the base is frozen"
            )
        if tr.auto_fp32:
            self.say(
                f"precision auto -> fp32: this device ({tr.device.type}) has no native bf16 "
                "arithmetic, so bf16 would be emulated and slower than fp32 (train.precision=bf16 "
                "forces it)"
            )
        table = Table(title="parameter groups", title_justify="left")
        for col in ("group", "tensors", "parameters", "optimizer", "lr"):
            table.add_column(col, justify="left" if col in ("group", "optimizer") else "right")
        for name, n, numel, opt, lr in group_rows(tr.optimizer.param_groups, c.starts_from()):
            table.add_row(name, str(n), f"{numel:,}", opt, lr)
        if self.progress._open:
            self.progress.message("")
        RichConsole(**self.progress.console_options()).print(table)

    def report(self, tr: Trainer, result: dict) -> None:
        """The end of `fit`: what the run did, and what to type next."""
        if not tr.is_main:
            return
        self.progress = tr.progress
        s = tr.state
        if result.get("already_finished"):
            self.say(already_finished(tr))
            return
        if "budget_seconds" in result:
            self.say(budget_used(result))
        self.say(f"data realised: {s.loader.report()}")
        if result.get("stopped_by"):
            self.say(
                f"stopped by {result['stopped_by']} at step {s.step}; newest checkpoint: "
                f"{s.last_checkpoint}. Run the same command to resume"
            )
        if result["finished"]:
            val = f", final val bpb {result['val_bpb']:.4f}" if "val_bpb" in result else ""
            self.say(
                f"done: {s.step} steps, {s.tokens:,} tokens, {s.train_time:.1f}s training{val}"
            )


def already_finished(tr: Trainer) -> str:
    """A run resumed at its end: what stopped it, and how to train further."""
    s = tr.state
    more, why = train_further(tr.cfg, tr.budget, s.step, s.tokens)
    return (
        f"run {tr.cfg.run.name!r} has already finished: {s.last_checkpoint} is at step "
        f"{s.step} and {why}; nothing to do. To train further, raise it (e.g. add {more} "
        "to the command); to start over, pick another run.name"
    )


def budget_used(result: dict) -> str:
    spent, seconds = result["budget_spent"], result["budget_seconds"]
    cost = result.get("budget_dollars")
    return f"budget: {spent:.1f}s of {seconds:.1f}s used ({spent / seconds:.1%})" + (
        f", ${cost:.2f}" if cost is not None else ""
    )


def speed_summary(cfg: RunConfig, device: torch.device | str = "cpu") -> str:
    """The speed and memory settings in force on `device`, in one line."""
    t, m = cfg.train, cfg.model
    backend = run_backend(m, device)
    parts = [f"{backend.name} backend ({backend.kernels})"]
    parts += [f"{t.precision} compute", f"{t.master_weights} weights"]
    if t.stochastic_rounding:
        parts.append("stochastic rounding")
    parts += m.speed_settings(device)
    parts += cfg.optimizer.traits().settings
    if t.activation_checkpointing:
        parts.append("activation checkpointing")
    if t.compiles(device):
        parts.append("torch.compile")
    return ", ".join(parts)


def progress_line(m: dict, max_steps: int | str) -> str:
    parts = [
        f"step {m['step']}/{max_steps}",
        f"loss {m['loss']:.4f}",
        f"lr×{m['lr_mult']:.3f}",
        f"{human(m['tok_per_s'])} tok/s",
    ]
    if m.get("grad_norm") is not None:
        parts.insert(2, f"gnorm {m['grad_norm']:.3g}")
    if m.get("mfu") is not None:
        parts.append(f"MFU {100 * m['mfu']:.1f}%")
    parts.append(f"ETA {duration(m['eta_s'])}")
    if m.get("budget"):  # a time or money budget: spent so far (train/budget.py)
        parts.append(m["budget"])
    if m.get("warning"):  # the objective's, said in full the first time (Console.on_step_end)
        parts.append(f"warning: {m['warning'].what}")
    return " | ".join(parts)


class FirstSteps:
    """The first steps of a session, shown before the first `log_every` step: the time from the
    start of the loop to the first step (data loading, warm-up and compilation fall in it), then
    each of the next few steps with its time, so a slow start shows life instead of silence."""

    def __init__(self, start_step: int, log_every: int, count: int = 3):
        self.start, self.log_every, self.count = start_step, log_every, count
        self.last = time.perf_counter()

    def wants(self, step: int) -> bool:
        """True for the session's first step, and for the next ones up to `count` that are not
        log steps (those print the usual line)."""
        n = step - self.start
        return n == 1 or (n <= self.count and step % self.log_every != 0)

    def show(self, progress: Progress, step: int, max_steps: int | float, loss: float) -> None:
        """The first step as a line of its own (it stays on a terminal), the next in place."""
        now = time.perf_counter()
        took, self.last = now - self.last, now
        if step - self.start == 1:
            progress.message(
                f"step {step}/{max_steps} | loss {loss:.4f} | first step after {took:.1f}s "
                "(data loading, warm-up and compilation included)"
            )
        else:
            progress.update(f"step {step}/{max_steps} | loss {loss:.4f} | {took:.2f}s/step")
