"""The training loop.

    trainer = Trainer(load_run("configs/demo.yaml"))
    trainer.fit()

One optimizer step (`train_step`, read top to bottom): `grad_accum` micro-batches of forward +
backward under autocast, gradient clipping, the loss guard's verdict, the schedule's learning
rates at the budget's progress, then the update (left out when the guard says so). The loop
(`_fit`) acts on the verdict (report a skip, roll back to the last checkpoint, stop), then
records metrics every `log_every` steps, validates every `eval.every`, checkpoints every
`checkpoint.every` and calls the callbacks at each hook, until the budget (train/budget.py)
says the run is done. `__init__` builds everything in one numbered sequence whose order
matters; each step says why.

What a run carries from step to step is one object, `self.state` (train/checkpoint/state.py);
`self.checkpointer` (train/checkpoint/save_restore.py) saves it with the weights and optimizer state and
restores it on resume and rollback. The trainer prints only what happened (resumed, skipped,
rolled back); what `littlelm train` shows around it is the CLI's console (littlelm/console.py),
a callback. Under torchrun every rank runs this same loop on its own slice of the data;
`self.parallel` (train/distributed.py) does the rest (docs/distributed.md).
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from littlelm.config import flatten, to_tree
from littlelm.data.loader import DataExhausted, Prefetcher, StopWaiting
from littlelm.errors import CheckpointError, TrainingError
from littlelm.optim.schedule import GroupSchedule
from littlelm.progress import Progress
from littlelm.train import device as dev
from littlelm.train.budget import Steps, build_budget
from littlelm.train.build import (
    build_data,
    build_model,
    build_objective,
    build_transform,
    optimizer_for,
    steps_from_epochs,
)
from littlelm.train.callbacks import Callback, JSONLLogger, complete_end_record
from littlelm.train.checkpoint.rundir import check_run_dir
from littlelm.train.checkpoint.save_restore import Checkpointer
from littlelm.train.checkpoint.state import TrainState, Window
from littlelm.train.checkpoint.writer import BackgroundSaves, SaveStuck, background_saves
from littlelm.train.distributed import Parallel
from littlelm.train.growth import base_copy, complete_growth, grow_at_start
from littlelm.train.guard import Collapse, LossGuard, Verdict
from littlelm.train.objective import Setting, StepInterrupted
from littlelm.train.signals import StopSignals
from littlelm.train.step import grad_norm, seed_everything, synchronize, update

if TYPE_CHECKING:  # the schema composes train/'s sections, so train/ names it for types only
    from littlelm.schema import RunConfig


class Step(NamedTuple):
    """What one optimizer step hands the loop."""

    loss: torch.Tensor  # mean micro-batch loss (detached, on the device)
    grad_norm: torch.Tensor  # before clipping
    verdict: Verdict  # the loss guard's: was the update applied, and what next
    lr_mult: float  # the schedule's multiplier at this step


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        resume: str = "auto",
        progress: Progress | None = None,
        parallel: Parallel | None = None,
        callbacks: tuple[Callback, ...] = (),
    ):
        """`progress` receives the trainer's notes (resumed, skipped, rolled back, ...);
        `callbacks` come before those of the config (the CLI's console: littlelm/console.py)."""
        self.cfg = cfg
        self.parallel = parallel or Parallel.single(cfg.distributed)
        self.progress = progress or Progress()
        self.run_dir = cfg.run_dir()
        check_run_dir(self.run_dir)  # before any work: a non-empty directory must be a run
        self.device = self.parallel.device(dev.pick_device(cfg.run.device))
        # `precision: auto` becomes bf16 or fp32 for this device before anything reads it, so
        # the checkpoints record what the run computed in (littlelm/hardware.py)
        requested = cfg.train.precision
        # and a grown run's shape from its parent checkpoint (train/growth.py), read here
        self.cfg = cfg = complete_growth(dev.with_precision(cfg, self.device))
        self.auto_fp32 = requested == "auto" and cfg.train.precision == "fp32"  # said at start
        self.stop = StopSignals()
        self.last_eval: dict = {}
        self.last_loss: torch.Tensor | None = None  # the last step's loss (on the device)
        self.saves: BackgroundSaves | None = None  # background checkpoint writes (fit decides)
        # 1. process: every rank has this config and the device can run the model, checked
        #    before any work; then seeded, before anything draws from the RNG (model init)
        self._setup_process()
        # 1b. resume: a resume that will be refused (config, --resume never or PATH over newer
        #     checkpoints) is refused before any data preparation or tokenizer training
        Checkpointer.refuse_early(cfg, self.run_dir, resume)
        # 2. callbacks: a missing optional package (wandb, tensorboard) fails before data prep
        self.callbacks = [*callbacks, JSONLLogger(), *(c.build() for c in cfg.callbacks)]
        # 3. data: the tokenizer sets the model's vocabulary; checkpoints record its fingerprint
        progress = self.progress if self.is_main else Progress(io.StringIO())  # rank 0 shows it
        self.data = self.parallel.in_turns(lambda: build_data(cfg, self.log, progress))
        # train.epochs becomes steps now that the data's size is known (train/build.py)
        self.cfg = cfg = steps_from_epochs(cfg, self.data, self.log)
        # what the run does to its model besides training it (train/transform.py: LoRA's
        # adapters on a frozen base), which checkpoints keep and load through
        self.transform = build_transform(cfg, self.data.tokenizer)
        self.checkpointer = Checkpointer(
            cfg,
            self.parallel,
            self.data.tokenizer,
            self.run_dir,
            self.data.fingerprint(cfg.data),
            self.transform,
        )
        # 4. model: whole (unsharded), in train.master_weights' dtype, from the seeded RNG
        model = build_model(cfg, self.device)
        assert isinstance(model, torch.nn.Module)  # every model is one (model/protocol.py)
        self.model = model  # typed as both: LanguageModel's members and nn.Module's
        # 5. load: a resumed run's weights go in whole, before sharding splits the tensors
        resumed = self.checkpointer.load(resume, self.model)
        self.cfg = cfg = self.checkpointer.cfg  # with a changed default's old value kept
        resumed_step: int | None = resumed.loaded.state["step"] if resumed is not None else None
        # 6. grow: a fresh grown run copies its parent's weights (same reason) and tags origins
        grown = grow_at_start(self.model, cfg, resumed_step, self.data, self.transform)
        if grown is not None:
            self.log(grown.summary())
        # 6b. transform: a fresh run's (LoRA's adapters) goes on the weights copied in 6 (a
        #     resumed one's went on in 5, with the checkpoint's weights), before the sharding
        #     and the optimizer see the parameters
        if resumed is None:
            self.transform.start(self.model, grown)
        # 7. shard: FSDP replaces the parameters by DTensors, which the optimizer must hold
        self.parallel.shard_model(self.model, cfg.train.precision)
        # 8. optimizer: parameter groups from the sharded parameters and their origin tags, a
        #    grown run's from 6, a resumed one's from its checkpoint
        origin = grown.origin if grown is not None else resumed.loaded.origin if resumed else None
        optimizer = optimizer_for(cfg, self.model, origin=origin)
        self.optimizer = self.parallel.shard_optimizer(optimizer)
        # 9. loader and state: this rank's slice of the data, and the run at step 0
        self.loader = self._make_loader(self.parallel.rank, self.parallel.world)
        self.state = TrainState(self.loader.snapshot(), LossGuard(cfg.guard))
        vocab = cfg.model.vocab_size
        assert vocab is not None, "resolved by load_run"
        self.state.guard.collapse = Collapse(vocab, cfg.guard.collapse_steps)
        # 10. measure: FLOPs per token and peak FLOP/s (a CPU's first probe draws its random
        #     matrices from a generator of its own: a probe or a cached peak trains the same)
        self.flops_per_token = self.model.flops_per_token(cfg.train.seq_len)
        self.peak = dev.peak_flops(self.device, precision=cfg.train.precision) * self.parallel.world
        # 11. resume: optimizer moments, RNG, counters, guard and data position, into the
        #     optimizer and loader of 8-9 (or a grown run's parent's data position)
        loaders = (self.loader, self._make_loader)  # this rank's, and one for any rank
        self.checkpointer.resume(self.state, resumed, grown, self.optimizer, *loaders)
        for line in resumed.describe(self.state, self.parallel.world) if resumed else ():
            self.log(line)
        # 12. budget: how far the run is and whether it is done (train/budget.py); a time or
        #     money budget checks it holds one step at the peak of 10 and takes the time already
        #     spent from the checkpoint of 11 (or the run's ledger); the schedule reads it
        self.state.budget = build_budget(
            cfg,
            resumed.loaded.state if resumed is not None else None,
            ledger=self.run_dir / "budget.json" if self.is_main else None,
            agree=self.parallel.broadcast_object,
            val_shards=self.data.val_shards,
            flops_per_token=self.flops_per_token,
            peak=self.peak,
            device=self.device.type,
            say=self.log,  # a changed budget refits the schedule, and says so
        )
        # the lrs at (step, progress), times a grown run's factor per origin; Muon's momentum
        origins = (cfg.grow and cfg.grow.lr_multipliers) or {}  # sft: one lr per role
        momentum = cfg.optimizer.momentum_schedule()
        self.schedule = GroupSchedule(cfg.schedule.build(), origins, momentum)
        # bf16 autocast or nothing: one context (reusable) for every step and evaluation
        self.autocast = dev.autocast(self.device, cfg.train.precision)
        # 13. wrap: DDP and torch.compile around the finished model; checkpoints, evaluation
        #     and sampling use the bare `self.model`
        forward = self.parallel.wrap(self.model)
        self.forward = torch.compile(forward) if cfg.train.compiles(self.device) else forward
        # 14. objective (train/objective.py): what a step minimises, chosen by the config (the
        #     language-model loss, DPO, RL, ...), with what it keeps resident (a frozen
        #     reference: the run's base, read last so that nothing above draws after it)
        # locals, not `self`: a closure over the trainer would make a cycle (trainer ->
        # objective -> setting -> closure), freed only when gc runs, not at `del trainer`
        fingerprint, device, model = self.data.tokenizer.fingerprint, self.device, self.model
        transform = self.transform  # the reference: LoRA's adapters off, else a base copy
        self.objective = build_objective(
            cfg,
            Setting(
                cfg,
                self.model,
                self.device,
                self.autocast,
                self.data,
                self.parallel,
                reference=lambda: transform.reference(
                    model, lambda: base_copy(cfg, device, fingerprint)
                ),
            ),
        )
        # 15. the objective's own state (RL's sampled batch), kept in each checkpoint from now
        self.state.objective = self.objective
        if resumed is not None:
            note = self.checkpointer.restore_objective(self.state, resumed.loaded.state)
            if note:
                self.log(note)

    # ---- construction steps (in the order __init__ calls them) --------------------------------

    def _setup_process(self) -> None:
        cfg = self.cfg
        assert cfg.distributed.world_size in (None, self.parallel.world), (
            "resolve the config with the session's world size (load_run(..., world_size=...))"
        )
        self.parallel.agree_config(flatten(to_tree(cfg)))
        cfg.model.check_device(self.device)
        if self.device.type == "cpu":
            dev.tune_cpu_allocator()
        seed_everything(cfg.run.seed)

    def _make_loader(self, rank: int, world: int):
        t = self.cfg.train
        return self.data.loader(
            self.cfg.data, t.micro_batch_size, t.seq_len, self.cfg.run.seed, rank, world
        )

    @property
    def is_main(self) -> bool:
        """True on the process that prints and writes files (rank 0, or the only one)."""
        return self.parallel.is_main

    @property
    def step(self) -> int:  # read-only: `self.state` holds the run's counters
        return self.state.step

    @property
    def tokens(self) -> int:
        return self.state.tokens

    @property
    def budget(self) -> Steps:
        """How far the run is (train/budget.py), set by __init__'s step 12."""
        assert self.state.budget is not None, "Trainer.__init__ sets it before any step"
        return self.state.budget

    @property
    def max_steps(self) -> float:
        """The run's steps: train.max_steps, inf under a time budget until its last step."""
        return self.budget.max_steps

    def log(self, text: str) -> None:
        if self.is_main:
            self.progress.message(text)

    def _my_callbacks(self) -> list[Callback]:
        """Every callback on rank 0; on the others, under FSDP, those that call the model."""
        if self.is_main:
            return self.callbacks
        fsdp = self.parallel.strategy == "fsdp"
        return [cb for cb in self.callbacks if fsdp and cb.runs_model]

    # ------------------------------------------------------------------------------------------
    # The loop

    def fit(self, stop_after: int | None = None) -> dict:
        """Train to max_steps (or `stop_after` more steps, then checkpoint: used by tests and
        benchmarks to simulate an interruption). Returns the final metrics. Holds the run
        directory's lock throughout; SIGTERM/SIGINT stop it cleanly after a save."""
        with self.checkpointer.session(self.state, self.stop, self.log):
            try:
                return self._fit(stop_after)
            except (Exception, KeyboardInterrupt) as e:  # a background save in flight
                if self.saves is not None:
                    self.saves.close(self.log, e)
                raise

    @property
    def stopping(self) -> str | None:
        """The signal that stops the run, agreed by every rank: under torchrun a signal counts
        from the step after it reached any rank (each step shares it), so all stop together."""
        return self.stop.requested if self.parallel.world == 1 else self.stop.agreed

    def _fit(self, stop_after: int | None) -> dict:
        s, c, budget = self.state, self.cfg, self.budget
        if budget.done(s.step):  # resumed at its end
            return self._already_finished()
        self.checkpointer.write_config()
        self.saves, note = background_saves(
            self.checkpointer, self.parallel, self.model, self.optimizer
        )
        self.log(note)
        for cb in self._my_callbacks():
            cb.on_train_start(self)
        stop_at = math.inf if stop_after is None else s.step + stop_after
        batches = Prefetcher(self.loader, c.data.prefetch, lambda: self.stop.requested)
        window = Window.starting_at(s, self.device)
        budget.start()
        try:
            while not budget.done(s.step) and s.step < stop_at and not self.stopping:
                step = self.train_step(batches)
                budget.stepped(s.step)
                last = budget.done(s.step) or s.step >= stop_at
                if step.verdict is Verdict.OK:
                    window.add(step.loss, step.grad_norm)
                else:  # no update: say why; a STOP verdict ends the run
                    self.log(s.guard.skip_note(s.step))
                    if step.verdict is Verdict.STOP:
                        if self.saves is not None:  # the message names the newest checkpoint
                            self._settle_save(wait=True)
                        raise TrainingError(s.guard.stop_message(s.step, s.last_checkpoint))
                if step.verdict is Verdict.ROLLBACK:
                    self._rollback()  # to the last checkpoint; the data moves on
                    window.restart(s)  # the steps since the checkpoint are abandoned
                    continue
                self.last_loss = step.loss
                metrics = {"step": s.step, "tokens": s.tokens, "lr_mult": step.lr_mult}
                if s.step % c.train.log_every == 0 or last:
                    metrics.update(self._log_metrics(window))
                for cb in self._my_callbacks():
                    cb.on_step_end(self, metrics)
                if self.saves is not None:  # a background save: a slow one said, a done one kept
                    self._watch_save(settle=s.step % c.train.log_every == 0)
                if self._due(c.eval.every) and not budget.done(s.step) and not self.stopping:
                    self.evaluate()
                if self._due(c.checkpoint.every) and not last:
                    with budget.aside("save"):  # saves count against a time budget
                        self.save()
        except DataExhausted as e:
            self.log(f"stopping: {e}")
        except StopWaiting as e:  # the step waiting for its batch is left out; nothing changed
            self.log(
                f"{e}: stopped while waiting for the next batch; step {s.step + 1} is left out"
            )
        except StepInterrupted as e:  # before the step's gradients (RL: scoring): nothing changed
            self.log(f"{e}: stopped before step {s.step + 1}'s update; it is left out")
        finally:
            batches.close()
        return self._finish()

    def _due(self, every: int) -> bool:
        """True at the steps that are multiples of `every` (0: never)."""
        return bool(every) and self.state.step % every == 0

    def train_step(self, batches) -> Step:
        """One optimizer step, top to bottom. A step the guard rejects still consumes its batch
        and moves the counters and the schedule on; only the update is left out."""
        t0 = time.perf_counter()
        s, t = self.state, self.cfg.train
        batch_tokens = t.batch_tokens
        assert batch_tokens, "load_run derives it"
        # forward and backward (the objective's): gradients accumulate in .grad; `trained`:
        # the targets counted; the loader's position after the batches it took
        loss, trained, loader = self.objective.forward_backward(s.step, batches, self.forward)
        if loader is not None:
            s.loader = loader
        # clip: measure the gradient norm (before clipping) and clip to train.grad_clip
        norm = grad_norm(self.model.parameters(), t.grad_clip)
        # the loss guard's verdict on this step's loss and norm (one host sync)
        verdict = self._judge(loss, norm)
        # schedule: this step's learning rates (and Muon momentum) at the budget's progress
        lr_mult = self.schedule.set(self.optimizer, s.step, self.budget.progress(s.step))
        # update, unless the guard left it out; the gradients are freed either way
        update(self.optimizer, apply=verdict is Verdict.OK)
        s.step += 1
        # a masked loss (conversations, RL's replies) counts the targets it trained on (all ranks)
        masked = self.objective.counts_targets
        s.tokens += self.parallel.total(trained, self.device) if masked else batch_tokens
        synchronize(self.device)  # the step's time includes the device's work
        s.train_time += time.perf_counter() - t0
        return Step(loss, norm, verdict, lr_mult)

    def _judge(self, loss: torch.Tensor, norm: torch.Tensor) -> Verdict:
        """The loss guard's verdict on this step (one host sync for both numbers). Under torchrun
        every rank judges the same numbers and learns whether any rank received a stop signal
        (StopSignals.share), so every rank skips, rolls back, stops and exits at the same step."""
        guard = self.state.guard
        if self.parallel.world > 1:
            value, norm_value = self.stop.share(self.parallel, loss, norm)
        elif not guard.cfg.enabled:
            return Verdict.OK
        else:
            value, norm_value = torch.stack([loss.float(), norm.float().to(loss.device)]).tolist()
        return guard.verdict(value, norm_value) if guard.cfg.enabled else Verdict.OK

    def _rollback(self) -> None:
        """Reload the last checkpoint; the data moves on (train/guard.py explains)."""
        if self.saves is not None:  # the newest checkpoint, whatever the writer's pace
            self._settle_save(wait=True)
        info = self.checkpointer.rollback(self.state, self.model, self.optimizer)
        self.log(self.state.guard.rollback_note(info))
        for cb in self._my_callbacks():
            cb.on_rollback(self, info)

    def _log_metrics(self, window: Window) -> dict:
        """The record of the steps since the last one; starts a new window."""
        s = self.state
        per_step = window.seconds_per_step(s)  # before the record starts a new window
        rows = self.cfg.train.batch_tokens  # MFU counts every row token, also those not trained
        assert rows is not None, "load_run derives it"
        m = window.record(s, self.parallel.mean, self.flops_per_token, self.peak, rows)
        if self.device.type == "cpu" and (m.get("mfu") or 0) > 1:  # the probe read low
            achieved = self.peak * m["mfu"]
            self.log(
                f"note: this run computes {achieved / 1e9:,.1f} GFLOP/s, above the CPU peak "
                f"probed at start ({self.peak / 1e9:,.1f}); MFU is measured against what it "
                "reaches from now on (kept in $LITTLELM_CACHE/cpu_peak.json for later runs)"
            )
            world = self.parallel.world
            dev.raise_cpu_peak(
                achieved / world, dev.auto_precision(self.cfg.train.precision, "cpu")
            )
            self.peak, m["mfu"] = achieved, 1.0
        m.update(self.objective.metrics())  # its figures since the last record (DPO's, RL's)
        return {**m, **self.budget.record(s.step, per_step), **s.data_figures()}

    def save(self, final: bool = False) -> Path | None:
        """Checkpoint now. A failed periodic save stops the run, or with
        checkpoint.on_save_error=continue is reported and skipped; a final save always raises.
        With background saves (checkpoint/writer.py) a periodic save returns None once started
        (or skipped); the final one waits for the write, within checkpoint.save_wait_seconds."""
        if self.saves is not None:
            return self._save_background(final)
        try:  # a failure (disk full) raises the same CheckpointError on every rank
            path = self.checkpointer.save(self.state, self.model, self.optimizer)
        except CheckpointError as e:
            self._save_failed(e, final)
            return None
        self._saved(path)
        return path

    def _save_failed(self, e: CheckpointError, final: bool) -> None:
        if final or isinstance(e, SaveStuck) or self.cfg.checkpoint.on_save_error == "stop":
            raise e
        self.state.save_failures += 1
        self.log(f"warning: {e}\ntraining goes on (checkpoint.on_save_error is continue)")

    def _saved(self, path: Path) -> None:
        for cb in self._my_callbacks():
            cb.on_checkpoint(self, path)

    def _save_background(self, final: bool) -> Path | None:
        saves: BackgroundSaves = self.saves  # type: ignore[assignment]  # the caller checked
        self._settle_save(wait=final)  # a final save: the one in flight first
        if final and self.state.saved_step == self.state.step:
            return self.state.last_checkpoint
        started = saves.start(self.state, self.model, self.optimizer, self.log)
        if started and final:
            return self._settle_save(wait=True, final=True)
        return None

    def _settle_save(self, wait: bool, final: bool = False) -> Path | None:
        """The background save's outcome, on every rank (train/checkpoint/writer.py); a failure
        handled as a failed save (`final`: the final one's), one stuck past the wait raised."""
        assert self.saves is not None
        try:
            path = self.saves.settle(self.state, wait=wait)
        except CheckpointError as e:
            self._save_failed(e, final)
            return None
        if path is not None:
            self._saved(path)
        return path

    def _watch_save(self, settle: bool) -> None:
        """Each step: a background save past checkpoint.slow_after_minutes is said (rank 0,
        reads no file); at the steps that log (a collective under torchrun) its outcome."""
        assert self.saves is not None
        note = self.saves.slow_note()
        if note:
            self.log(note)
        if settle:
            self._settle_save(wait=False)

    def evaluate(self) -> dict:
        c, s = self.cfg, self.state
        if not self.data.can_evaluate(c.train.seq_len):  # no held-out window: said at start
            return {}
        with self.budget.aside("eval"):  # the evaluation and its callbacks (samples) take this long
            t0 = time.perf_counter()
            m = self.objective.validate()  # the objective's held-out figures
            m.update(step=s.step, tokens=s.tokens, train_time=s.train_time)
            m.update(eval_time=time.perf_counter() - t0, **self.budget.figures())
            self.last_eval = m
            for cb in self._my_callbacks():
                cb.on_eval(self, m)
        return m

    def _finish(self) -> dict:
        s = self.state
        done = self.budget.done(s.step)
        if done and self.cfg.eval.at_end:
            self.evaluate()
        if self.saves is not None:  # the end waits for a background save (bounded)
            self._settle_save(wait=True)
        if (self.cfg.checkpoint.at_end or not done) and s.saved_step != s.step:
            self.save(final=True)
        final = {
            **self.state.counters(self.stopping),
            "finished": done,
            **{k: v for k, v in self.last_eval.items() if k.startswith("val_")},
            **s.data_figures(),
        }
        final.update(self.budget.close(s.step))  # the final evaluation and save count too
        if done:
            for cb in self._my_callbacks():
                cb.on_train_end(self, final)
        return final

    def _already_finished(self) -> dict:
        """A run resumed at its end: nothing to train, so nothing is written (no second
        evaluation or checkpoint), except the end record when a kill left it out."""
        summary = {**self.state.counters(self.stopping), "finished": True}
        if self.is_main and complete_end_record(self.run_dir / "metrics.jsonl", summary):
            self.log(
                "metrics.jsonl had no end record (the run stopped between its final checkpoint "
                "and that write): appended it from the checkpoint"
            )
        return {**summary, "already_finished": True}
