"""The training loop.

    trainer = Trainer(load_run("configs/demo.yaml"))
    trainer.fit()

One optimizer step = `grad_accum` micro-batches of forward + backward under autocast, then
gradient clipping, the optimizer and the schedule. Around it: progress and metrics every
`log_every` steps, validation (loss and bits per byte) every `eval.every`, checkpoints every
`checkpoint.every`, callbacks at each hook. A run directory holds the resolved config, the
metrics, samples and checkpoints; a new Trainer on the same directory resumes from the newest
complete checkpoint unless told otherwise.

Reliability lives in helpers (docs/reliability.md): train/resume.py picks and checks the
checkpoint to resume from, train/guard.py judges each step's loss, train/signals.py turns
SIGTERM/SIGINT into a clean stop, train/runlock.py keeps one trainer per run directory, and
train/runstate.py holds the Trainer's save, resume and rollback methods (a mixin).

Under torchrun every rank runs this same loop on its own slice of the data; `self.parallel`
(train/distributed.py) does the rest: DDP or FSDP2 wrapping, no gradient sync during
accumulation, sharded optimizers, rank-0-only output, and checkpoints that are whole (one file
set, readable at any world size).
"""

from __future__ import annotations

import contextlib
import io
import math
import signal
import time
from pathlib import Path

import torch

from littlelm.config import flatten, to_tree
from littlelm.data.build import build_data
from littlelm.data.loader import Batch, DataExhausted, LoaderSnapshot, Prefetcher
from littlelm.errors import ConfigError, TrainingError
from littlelm.eval.bpb import evaluate_loss
from littlelm.optim.groups import MuonConfig, group_table
from littlelm.optim.schedule import build_schedule, momentum_warmup
from littlelm.optim.schedule_check import schedule_warnings
from littlelm.registry import MODELS, OPTIMIZERS
from littlelm.schema import RunConfig
from littlelm.train import checkpoint as ckpt
from littlelm.train.callbacks import Callback, JSONLLogger, build_callback
from littlelm.train.device import (
    autocast,
    peak_flops,
    pick_device,
    synchronize,
    tune_cpu_allocator,
)
from littlelm.train.distributed import Parallel
from littlelm.train.guard import LossGuard, Verdict
from littlelm.train.progress import FirstSteps, Progress, progress_line
from littlelm.train.runlock import RunLock
from littlelm.train.runstate import RunState
from littlelm.train.signals import StopSignals
from littlelm.train.step import apply_update, micro_step, seed_everything

# dtype of the parameters, their gradients and the optimizer state (train.master_weights)
PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Trainer(RunState):
    def __init__(
        self,
        cfg: RunConfig,
        resume: str = "auto",
        progress: Progress | None = None,
        parallel: Parallel | None = None,
    ):
        self.cfg = cfg
        self.parallel = parallel or Parallel.single(cfg.distributed)
        self.progress = progress or Progress()
        self.run_dir = cfg.run_dir()
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.device = self.parallel.device(pick_device(cfg.run.device))
        self._check_world(cfg)
        model_cls = MODELS.get(cfg.model.name)
        if hasattr(model_cls, "check_device"):
            model_cls.check_device(cfg.model, self.device)
        if self.device.type == "cpu":
            tune_cpu_allocator()
        seed_everything(cfg.run.seed)
        t = cfg.train
        self.max_steps: int = t.max_steps
        # Callbacks first: a missing optional package (wandb, tensorboard) fails before data prep.
        self.callbacks: list[Callback] = [
            JSONLLogger(),
            *(build_callback(c) for c in cfg.callbacks),
        ]
        # data preparation shows progress on rank 0 only (the other ranks find it cached)
        progress = self.progress if self.is_main else Progress(io.StringIO())
        self.data = self.parallel.in_turns(lambda: build_data(cfg.data, self.log, progress))
        if self.data.tokenizer.vocab_size != cfg.model.vocab_size:
            raise ConfigError(
                [
                    f"model.vocab_size {cfg.model.vocab_size} differs from the tokenizer's "
                    f"{self.data.tokenizer.vocab_size}; leave model.vocab_size null"
                ]
            )
        self.model = model_cls(cfg.model).to(self.device, PARAM_DTYPES[t.master_weights])
        self.model.activation_checkpointing = t.activation_checkpointing
        self.guard = LossGuard(cfg.guard)
        self.stop = StopSignals()
        self.last_checkpoint: Path | None = None  # what a rollback reloads
        self.saved_step: int | None = None  # step of the newest checkpoint in ckpt_dir
        self.save_failures = 0
        self.rollback_pending = False
        self._agreed_stop: str | None = None  # see `stopping`
        loaded = self._load_weights(resume)
        grown = None
        if cfg.grow is not None and (loaded is None or loaded.state["step"] == 0):
            grown = self._grow_from_parent()
        self.parallel.shard_model(self.model, t.precision)
        self.optimizer = self.parallel.shard_optimizer(self._build_optimizer())
        self.schedule = build_schedule(cfg.schedule)
        self.loader = self._make_loader(self.parallel.rank, self.parallel.world)
        self.loader_state: LoaderSnapshot = self.loader.snapshot()
        self.token_bytes = torch.from_numpy(self.data.tokenizer.token_bytes()).to(self.device)
        self.flops_per_token = self.model.flops_per_token(t.seq_len)
        self.peak = peak_flops(self.device) * self.parallel.world
        self.step, self.tokens, self.train_time = 0, 0, 0.0
        self._norm_sum = torch.zeros((), device=self.device)  # grad norms since the last record
        self.last_eval: dict = {}
        if loaded is not None:
            self._resume(loaded)
        if grown is not None and grown.loader_state is not None:
            self._continue_parent_data(grown.path)
        self.forward = self.parallel.wrap(self.model)
        if t.compile:
            self.forward = torch.compile(self.forward)

    # ------------------------------------------------------------------------------------------
    # Helpers

    @property
    def is_main(self) -> bool:
        """True on the process that prints and writes files (rank 0, or the only one)."""
        return self.parallel.is_main

    def log(self, text: str) -> None:
        if self.is_main:
            self.progress.message(text)

    def _my_callbacks(self) -> list[Callback]:
        """Every callback on rank 0; on the others, under FSDP, those that call the model."""
        if self.is_main:
            return self.callbacks
        fsdp = self.parallel.strategy == "fsdp"
        return [cb for cb in self.callbacks if fsdp and cb.runs_model]

    def _make_loader(self, rank: int, world: int):
        t = self.cfg.train
        return self.data.loader(
            self.cfg.data, t.micro_batch_size, t.seq_len, self.cfg.run.seed, rank, world
        )

    def _check_world(self, cfg: RunConfig) -> None:
        assert cfg.distributed.world_size in (None, self.parallel.world), (
            "resolve the config with the session's world size (load_run(..., world_size=...))"
        )
        self.parallel.agree_config(flatten(to_tree(cfg)))

    def autocast(self):
        return autocast(self.device, self.cfg.train.precision)

    def _build_optimizer(self):
        build = OPTIMIZERS.get(self.cfg.optimizer.name)
        return build(self.model, self.cfg.optimizer, self.cfg.train.stochastic_rounding)

    def _set_lr(self) -> float:
        mult = self.schedule(self.step, self.max_steps)
        for g in self.optimizer.param_groups:
            g["lr"] = g["base_lr"] * mult
        oc = self.cfg.optimizer
        if isinstance(oc, MuonConfig):
            m = momentum_warmup(self.step, oc.momentum_start, oc.momentum, oc.momentum_warmup_steps)
            for g in self.optimizer.muon_groups():
                g["momentum"] = m
        return mult

    # ------------------------------------------------------------------------------------------
    # The loop

    def fit(self, stop_after: int | None = None) -> dict:
        """Train to max_steps (or `stop_after` more steps, then checkpoint: used by tests and
        benchmarks to simulate an interruption). Returns the final metrics. Holds the run
        directory's lock throughout; SIGTERM/SIGINT stop it cleanly after a save."""
        with self._session():
            return self._fit(stop_after)

    @contextlib.contextmanager
    def _session(self):
        with contextlib.ExitStack() as stack:
            # rank 0 holds the run lock and tidies the run directory; the others learn whether
            # it could (a run directory in use stops every rank with the same error)
            self.parallel.on_main(lambda: self._lock_run_dir(stack))
            stack.enter_context(self.stop)
            try:
                yield
            except KeyboardInterrupt:
                newest = ckpt.latest_checkpoint(self.ckpt_dir, warn=False)
                self.log(f"aborted at step {self.step} without saving; newest checkpoint: {newest}")
                raise

    def _lock_run_dir(self, stack: contextlib.ExitStack) -> None:
        stack.enter_context(RunLock(self.run_dir))
        for note in ckpt.clean_incomplete(self.ckpt_dir):
            self.log(note)

    @property
    def stopping(self) -> str | None:
        """The signal that stops the run, agreed by every rank: under torchrun a signal counts
        from the step after it reached any rank (each step shares it), so all stop together."""
        return self.stop.requested if self.parallel.world == 1 else self._agreed_stop

    def _fit(self, stop_after: int | None) -> dict:
        if self.step >= self.max_steps:
            return self._already_finished()
        self._write_run_files()
        self._print_summary()
        self.log(
            f"data mixture ({self.cfg.train.max_tokens:,} training tokens):\n"
            + "\n".join(self.data.mixture_plan(self.cfg.train.max_tokens))
        )
        if self.step:
            self.log(f"data realised so far: {self.loader_state.report()}")
        for cb in self._my_callbacks():
            cb.on_train_start(self)
        for problem in schedule_warnings(self.cfg.schedule, self.max_steps):
            self.log(f"warning: {problem}")
        first = FirstSteps(self.step, self.cfg.train.log_every)  # shown before the log cadence
        end = self.max_steps if stop_after is None else min(self.max_steps, self.step + stop_after)
        batches = Prefetcher(self.loader, self.cfg.data.prefetch)
        window = {"step": self.step, "tokens": self.tokens, "train_time": self.train_time}
        loss_sum = torch.zeros((), device=self.device)
        try:
            while self.step < end and not self.stopping:
                step_loss = self.train_step(batches)
                loss_sum += step_loss
                if self.rollback_pending:
                    self._rollback()
                    window.update(step=self.step, tokens=self.tokens, train_time=self.train_time)
                    loss_sum.zero_()
                    continue
                if self.is_main and first.wants(self.step):
                    first.show(self.progress, self.step, self.max_steps, step_loss.item())
                metrics = {"step": self.step, "tokens": self.tokens, "lr_mult": self.lr_mult}
                if self.step % self.cfg.train.log_every == 0 or self.step == end:
                    metrics.update(self._log_metrics(loss_sum, window))
                    loss_sum.zero_()
                for cb in self._my_callbacks():
                    cb.on_step_end(self, metrics)
                if (
                    self.cfg.eval.every
                    and self.step % self.cfg.eval.every == 0
                    and self.step < self.max_steps
                    and not self.stopping
                ):
                    self.evaluate()
                if (
                    self.cfg.checkpoint.every
                    and self.step % self.cfg.checkpoint.every == 0
                    and self.step < end
                ):
                    self.save()
        except DataExhausted as e:
            self.log(f"stopping: {e}")
        finally:
            batches.close()
        return self._finish(end)

    def train_step(self, batches) -> torch.Tensor:
        """One optimizer step; returns the mean micro-batch loss (a detached tensor)."""
        t0 = time.perf_counter()
        self.lr_mult = self._set_lr()
        accum = self.cfg.train.grad_accum
        total = torch.zeros((), device=self.device)
        for i in range(accum):
            batch: Batch = next(batches)
            x = batch.x.to(self.device, non_blocking=True)
            y = batch.y.to(self.device, non_blocking=True)
            with self.parallel.no_sync(skip=i < accum - 1):  # DDP: all-reduce on the last only
                total += micro_step(self.forward, x, y, accum, self.autocast())
        self.loader_state = batch.state
        loss = total / accum
        verdict = Verdict.OK

        def accept(norm: torch.Tensor) -> bool:
            nonlocal verdict
            verdict = self._judge(loss, norm)
            return verdict is Verdict.OK

        norm = apply_update(self.model, self.optimizer, self.cfg.train.grad_clip, accept)
        if verdict is Verdict.OK:
            self._norm_sum += norm
        self.step += 1
        self.tokens += self.cfg.train.batch_tokens
        synchronize(self.device)
        self.train_time += time.perf_counter() - t0
        if verdict is not Verdict.OK:
            self._skipped(verdict)
            return torch.zeros((), device=self.device)
        return loss

    def _judge(self, loss: torch.Tensor, norm: torch.Tensor) -> Verdict:
        """The loss guard's verdict on this step (one host sync for both numbers). Under torchrun
        it judges the numbers every rank shares (Parallel.agree_step: the mean loss, non-finite
        if any rank's is), and learns whether any rank received a stop signal, so every rank
        skips, rolls back, stops and exits at the same step."""
        if self.parallel.world > 1:
            signum = signal.Signals[self.stop.requested].value if self.stop.requested else 0
            value, norm_value, agreed = self.parallel.agree_step(loss, norm, signum)
            if agreed and self._agreed_stop is None:
                self._agreed_stop = signal.Signals(agreed).name
        elif not self.guard.cfg.enabled:
            return Verdict.OK
        else:
            value, norm_value = torch.stack([loss.float(), norm.float().to(loss.device)]).tolist()
        return self.guard.verdict(value, norm_value) if self.guard.cfg.enabled else Verdict.OK

    def _skipped(self, verdict: Verdict) -> None:
        g = self.guard
        self.log(
            f"step {self.step}: update skipped, {g.reason} "
            f"({g.in_a_row} in a row; {g.cfg.on_persistent} after {g.cfg.max_consecutive})"
        )
        if verdict is Verdict.ROLLBACK:
            self.rollback_pending = True
        elif verdict is Verdict.STOP:
            raise TrainingError(self.guard.stop_message(self.step, self.last_checkpoint))

    def _log_metrics(self, loss_sum: torch.Tensor, window: dict) -> dict:
        steps = max(1, self.step - window["step"])
        busy = max(1e-9, self.train_time - window["train_time"])
        tok_s = (self.tokens - window["tokens"]) / busy
        skipped = self.guard.take_window()
        loss_sum = self.parallel.mean(loss_sum)  # over every rank's micro-batches
        loss = loss_sum.item() / (steps - skipped) if steps > skipped else math.nan
        left = (self.max_steps - self.step) * self.cfg.train.batch_tokens / max(tok_s, 1e-9)
        mfu = tok_s * self.flops_per_token / self.peak if math.isfinite(self.peak) else None
        grad_norm = self._norm_sum.item() / (steps - skipped) if steps > skipped else math.nan
        self._norm_sum.zero_()
        m = {
            "loss": loss,
            "grad_norm": grad_norm,
            "tok_per_s": tok_s,
            "mfu": mfu,
            "train_time": self.train_time,
            "eta_s": left,
            "mix": self.loader_state.proportions(),
            "crop_rate": self.loader_state.crop_rate(),
            **({"skipped": skipped} if skipped else {}),  # present only when there were skips
        }
        if self.is_main:
            self.progress.update(
                progress_line({"step": self.step, "lr_mult": self.lr_mult, **m}, self.max_steps)
            )
        window.update(tokens=self.tokens, train_time=self.train_time, step=self.step)
        return m

    def evaluate(self) -> dict:
        c = self.cfg
        batches = self.data.val_batches(
            c.eval.batch_size or c.train.micro_batch_size,
            c.train.seq_len,
            c.eval.max_tokens,
        )
        t0 = time.perf_counter()
        m = evaluate_loss(self.model, batches, self.token_bytes, self.device, self.autocast())
        m.update(
            step=self.step,
            tokens=self.tokens,
            train_time=self.train_time,
            eval_time=time.perf_counter() - t0,
        )
        self.log(
            f"eval step {self.step}: val loss {m['val_loss']:.4f} | val bpb {m['val_bpb']:.4f} "
            f"| {m['val_tokens']:,} tokens | train time {self.train_time:.1f}s"
        )
        self.last_eval = m
        for cb in self._my_callbacks():
            cb.on_eval(self, m)
        return m

    def _finish(self, end: int) -> dict:
        done = self.step >= self.max_steps
        if done and self.cfg.eval.at_end:
            self.evaluate()
        if (self.cfg.checkpoint.at_end or not done) and self.saved_step != self.step:
            self.save(final=True)
        final = {
            "step": self.step,
            "tokens": self.tokens,
            "train_time": self.train_time,
            "finished": done,
            **{k: v for k, v in self.last_eval.items() if k.startswith("val_")},
            "mix": self.loader_state.proportions(),
            "crop_rate": self.loader_state.crop_rate(),
            **self._fault_summary(),
        }
        self.log(f"data realised: {self.loader_state.report()}")
        if self.stopping:
            self.log(
                f"stopped by {self.stopping} at step {self.step}; newest checkpoint: "
                f"{self.last_checkpoint}. Run the same command to resume"
            )
        if done:
            for cb in self._my_callbacks():
                cb.on_train_end(self, final)
            self.log(
                f"done: {self.step} steps, {self.tokens:,} tokens, {self.train_time:.1f}s training"
                + (f", final val bpb {final['val_bpb']:.4f}" if "val_bpb" in final else "")
            )
        return final

    def _already_finished(self) -> dict:
        """A run resumed at or past max_steps: nothing to train, so nothing is written (no
        second evaluation, end record or checkpoint)."""
        self.log(
            f"run {self.cfg.run.name!r} has already finished: {self.last_checkpoint} is at step "
            f"{self.step} and train.max_steps is {self.max_steps}; nothing to do. To train "
            f"further, raise train.max_steps (e.g. add train.max_steps={2 * self.step} to the "
            "command); to start over, pick another run.name"
        )
        return {
            "step": self.step,
            "tokens": self.tokens,
            "train_time": self.train_time,
            "finished": True,
            "already_finished": True,
            **self._fault_summary(),
        }

    def _fault_summary(self) -> dict:
        out = {
            "skipped_steps": self.guard.skipped_total,
            "rollbacks": self.guard.rollbacks,
            "save_failures": self.save_failures,
        }
        if self.stopping:
            out["stopped_by"] = self.stopping
        return out

    def _print_summary(self) -> None:
        if not self.is_main:
            return
        from rich.console import Console
        from rich.table import Table

        counts = self.model.param_counts()
        c = self.cfg
        self.log(
            f"model: {counts['total']:,} parameters ({counts['non_embedding']:,} non-embedding), "
            f"{self.flops_per_token / 1e6:.1f} MFLOPs/token at seq {c.train.seq_len}; "
            f"device {self.device}, {c.train.precision}; batch {c.train.batch_tokens:,} tokens "
            f"= {c.train.micro_batch_size} × {c.train.seq_len} × {c.train.grad_accum} accum"
            f"{f' × {self.parallel.world} ranks ({self.parallel.strategy})' if self.parallel.world > 1 else ''}; "
            f"{self.max_steps} steps"
        )
        self.log(f"speed: {speed_summary(c)}; MFU against {self.peak / 1e12:.3g} TFLOP/s")
        table = Table(title="parameter groups", title_justify="left")
        for col in ("group", "tensors", "parameters", "optimizer", "lr"):
            table.add_column(
                col, justify="right" if col in ("tensors", "parameters", "lr") else "left"
            )
        for name, n, numel, opt, lr in group_table(self.optimizer.specs):
            table.add_row(name, str(n), f"{numel:,}", opt, f"{lr:.3g}")
        if self.progress._open:
            self.progress.message("")
        Console(**self.progress.console_options()).print(table)


def speed_summary(cfg: RunConfig) -> str:
    """The speed and memory settings in force, in one line."""
    t, m = cfg.train, cfg.model
    parts = [f"{t.precision} compute", f"{t.master_weights} weights"]
    if t.stochastic_rounding:
        parts.append("stochastic rounding")
    loss = getattr(m, "loss", None)
    if loss:
        parts.append(
            f"{loss} loss" + (f" ({m.loss_chunk} rows/chunk)" if loss == "chunked" else "")
        )
    if getattr(m, "fp8", False):
        parts.append(f"fp8 (layers >= {m.fp8_min_dim} wide, {m.fp8_grad_dtype} gradients)")
    if getattr(cfg.optimizer, "adamw_8bit", False):
        parts.append("8-bit AdamW")
    if t.activation_checkpointing:
        parts.append("activation checkpointing")
    if t.compile:
        parts.append("torch.compile")
    return ", ".join(parts)
