"""Training to a budget of tokens, hours or dollars (`train.budget`).

    train:
      budget: {hours: 2}                                         # wall-clock of training
      budget: {dollars: 50, price_per_gpu_hour: 2.5, gpus: 8}    # = 2.5 hours on 8 GPUs
      budget: {tokens: 2_000_000_000}                            # = train.max_tokens

A tokens budget is a step count known in advance (the schema's resolve turns it into train.max_steps).
A time or money budget is not: the run does not know how many steps it will take, so the schedule
asks "how far through the run are we" and `Budget` answers from measured speed. Before each step
it projects the steps left (seconds left, less the final evaluation and save, divided by the
measured seconds per step with periodic evaluations and saves spread over the steps between
them); the step is the last when fewer than 1.5 remain, and progress is the share of the budget's
time the end of this step reaches. So the schedule's decay phase (a trapezoidal cooldown) starts
when the projected time left equals its fraction of the budget, and the last step runs at the
schedule's final value.

Time counts from the first step of each session to its end (evaluations, saves and callbacks
included; process start-up and data preparation not). It is saved in every checkpoint and, every
few seconds, in RUN_DIR/budget.json: a run killed between checkpoints and resumed still counts
the time it lost, because the rented machine was paid for it. Everything here but `Ledger` and
`build_budget` is pure: times come in as arguments (readings of `now()`), so tests drive it
with a fake clock.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from littlelm.errors import ConfigError
from littlelm.optim.schedule import Schedule, build_schedule
from littlelm.progress import duration
from littlelm.sections import BudgetConfig

# step times whose median is the speed: recent ones, as a shared machine's speed drifts (a mean
# of 32 kept a 2-minute demo budget on a contended CPU's slow start, 7.4 s/step against the 4
# of its last steps, and it ended at 87% of its time); the median ignores one-off stalls
WINDOW = 8
LAST_BELOW = 1.5  # a step is the last when fewer than this many projected steps fit
LEDGER_EVERY = 5.0  # seconds between writes of RUN_DIR/budget.json
# The CPU's "peak" comes from a short matmul probe in the run's precision, which a busy shared
# machine can read far below what training reaches, so on a CPU the check that a budget holds
# one step only catches nonsense.
# A CUDA peak comes from a table.
PEAK_SLACK = {"cpu": 1000.0}
EVAL_FORWARD_SHARE = 1 / 3  # an eval token costs about a third of a training token (no backward)


def now() -> float:
    """The clock a budget counts by (a module function, so tests can replace it)."""
    return time.perf_counter()


def check_budget_fits(
    seconds: float, batch_tokens: int, flops_per_token: int, peak: float, device: str = "cuda"
) -> str | None:
    """A problem when `seconds` cannot hold one step even at the device's peak FLOP/s."""
    if not math.isfinite(peak) or peak <= 0:
        return None
    fastest = batch_tokens * flops_per_token / (peak * PEAK_SLACK.get(device, 1.0))
    if seconds < fastest:
        return (
            f"train.budget is {seconds:.3g} s, less than one step takes even at this device's "
            f"peak ({fastest:.3g} s for {batch_tokens:,} tokens); raise the budget"
        )
    return None


class Budget:
    """Progress through a time budget, from measured speed. Driven by the trainer:

    multiplier(step, now) before each step: the lr multiplier (and whether it is the last step);
    stepped(now, step_seconds) after it; note_eval / note_save with the seconds those took."""

    def __init__(
        self,
        seconds: float,
        schedule: Schedule,
        max_steps: float = math.inf,
        eval_every: int = 0,
        save_every: int = 0,
        end_eval: bool = True,
        end_save: bool = True,
        eval_tokens: int = 0,
        batch_tokens: int = 1,
        agree: Callable = lambda x: x,
    ):
        self.seconds, self.schedule, self.max_steps = seconds, schedule, max_steps
        self.eval_every, self.save_every = eval_every, save_every
        self.end_eval, self.end_save = end_eval, end_save
        self.eval_tokens, self.batch_tokens = eval_tokens, batch_tokens
        self.agree = agree  # several processes: rank 0's decision (Parallel.broadcast_object)
        self.spent = 0.0  # seconds, every session, up to `mark`
        self.progress = 0.0  # schedule progress reached (never goes back)
        self.finished = False
        self.last = False  # the step being taken is the last
        self.step_times: deque[float] = deque(maxlen=WINDOW)
        self.prior_step: float | None = None  # seconds per step measured by an earlier session
        self.eval_s: float | None = None
        self.save_s: float | None = None
        self.mark: float | None = None  # clock reading up to which `spent` counts
        self.overhead = 0.0  # eval and save seconds noted since `mark`
        self.session_steps = 0

    # -- measurements ---------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """The session's first step begins: time counts from here."""
        self.mark, self.overhead, self.session_steps = now, 0.0, 0
        self.step_times.clear()

    def elapsed(self, now: float) -> float:
        return self.spent + (now - self.mark if self.mark is not None else 0.0)

    def stepped(self, now: float) -> bool:
        """A step ended at `now`; True when it was the last."""
        dt = now - self.mark
        self.spent += dt
        self.session_steps += 1
        if self.session_steps > 1 or not self.step_times:  # the first may hold warm-up work
            self.step_times.append(max(0.0, dt - self.overhead))
        if self.session_steps == 2 and len(self.step_times) == 2:
            self.step_times.popleft()  # drop the warm-up step once a normal one is measured
        self.mark, self.overhead = now, 0.0
        if self.last:
            self.finished = True
        return self.last

    def note_eval(self, seconds: float) -> None:
        self.eval_s, self.overhead = seconds, self.overhead + seconds

    def note_save(self, seconds: float) -> None:
        self.save_s, self.overhead = seconds, self.overhead + seconds

    def close(self, now: float) -> None:
        """The session ends (after the final evaluation and save): count the tail."""
        if self.mark is not None:
            self.spent += now - self.mark
            self.mark = now

    # -- projections ----------------------------------------------------------------------------

    @property
    def step_s(self) -> float | None:
        """Measured seconds per step (evaluations and saves excluded)."""
        if self.step_times:
            return statistics.median(self.step_times)
        return self.prior_step

    def eval_cost(self) -> float:
        """Seconds one evaluation takes: measured, else guessed from the training speed."""
        if self.eval_s is not None:
            return self.eval_s
        if self.step_s is None:
            return 0.0
        return self.eval_tokens / self.batch_tokens * self.step_s * EVAL_FORWARD_SHARE

    def per_step(self) -> float | None:
        """Seconds per step with periodic evaluations and saves spread over their interval."""
        if self.step_s is None:
            return None
        s = self.step_s
        if self.eval_every:
            s += self.eval_cost() / self.eval_every
        if self.save_every and self.save_s:
            s += self.save_s / self.save_every
        return s

    def end_reserve(self) -> float:
        """Seconds the final evaluation and save will take after the last step."""
        return (self.eval_cost() if self.end_eval else 0.0) + (
            (self.save_s or 0.0) if self.end_save else 0.0
        )

    def steps_left(self, now: float) -> float | None:
        """Projected steps that still fit in the budget (None before any speed is known)."""
        per = self.per_step()
        if per is None:
            return None
        left = self.seconds - self.elapsed(now) - self.end_reserve()
        return left / max(per, 1e-9)

    def decide(self, step: int, now: float) -> tuple[float, bool]:
        """(progress at the end of step `step` + 1, whether it is the last): pure arithmetic."""
        if step + 1 >= self.max_steps:
            return 1.0, True
        n = self.steps_left(now)
        if n is None:  # nothing measured yet: the first step of a fresh run
            return 0.0, self.seconds <= 0
        if n < LAST_BELOW:
            return 1.0, True
        loop = max(1e-9, self.seconds - self.end_reserve())
        p = (self.elapsed(now) + self.per_step()) / loop
        p = max(p, (step + 1) / self.max_steps)  # a step cap may be further along
        return min(p, 1.0 - 1e-9), False

    def multiplier(self, step: int, now: float) -> float:
        """The lr multiplier of step `step` + 1 (its progress never goes back)."""
        progress, last = self.agree(self.decide(step, now))
        self.progress, self.last = (1.0 if last else max(self.progress, progress)), last
        return self.schedule(step, self.progress)

    def projected_total(self, step: int, now: float) -> int | None:
        n = self.steps_left(now)
        if n is None:
            return None
        total = step + max(0, math.floor(n + 1 - LAST_BELOW) + 1) if not self.finished else step
        return int(min(total, self.max_steps))

    def summary(self, now: float, world: int = 1, cfg: BudgetConfig | None = None) -> str:
        """'budget 1m02s of 2m00s (52%), ends in ~58s': for the progress line."""
        used = self.elapsed(now)
        text = f"budget {duration(used)}/{duration(self.seconds)} ({used / self.seconds:.0%})"
        if cfg is not None and cfg.price_per_gpu_hour:
            text += f" ${cfg.dollars_for(used, world):.2f}"
        return text

    # -- checkpoint -----------------------------------------------------------------------------

    def state_dict(self, now: float | None = None) -> dict:
        return {
            "seconds": self.seconds,  # the budget this state was spent under (a resume compares)
            "spent": self.elapsed(now) if now is not None else self.spent,
            "progress": self.progress,
            "finished": self.finished,
            "step_s": self.step_s,
            "eval_s": self.eval_s,
            "save_s": self.save_s,
        }

    def load_state_dict(self, state: dict) -> None:
        self.spent = float(state.get("spent", 0.0))
        self.progress = float(state.get("progress", 0.0))
        self.finished = bool(state.get("finished", False))
        self.prior_step = state.get("step_s")
        self.eval_s, self.save_s = state.get("eval_s"), state.get("save_s")


class Ledger:
    """RUN_DIR/budget.json: the time spent, written every few seconds (atomically), so time lost
    after the last checkpoint still counts when the run resumes."""

    def __init__(self, path: Path | None):
        self.path, self.written = path, -math.inf

    def read(self) -> dict:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # a torn or unreadable ledger: the checkpoint's figure stands

    def write(self, budget: Budget, step: int, now: float, force: bool = False) -> None:
        if self.path is None or (not force and now - self.written < LEDGER_EVERY):
            return
        self.written = now
        tmp = self.path.with_suffix(".json.tmp")
        try:
            tmp.write_text(json.dumps({"step": step, **budget.state_dict(now)}))
            tmp.replace(self.path)
        except OSError:
            pass  # a full disk must not stop training; checkpoints still carry the figure


def restore(budget: Budget, ckpt_state: dict | None, ledger: dict) -> list[str]:
    """The checkpoint's budget state, with the time spent raised to the ledger's when the ledger
    saw more (the run went on after its last checkpoint before it was killed). The ledger belongs
    to the checkpoints it counts: without a checkpoint (they were deleted, or none was written)
    it is stale and ignored, as is one older than the checkpoint. A budget that differs from the
    one the checkpoint ran under refits the schedule to it: a raised budget trains on (a finished
    run too), its progress recomputed from the time spent. Returns notes for the log."""
    saved = (ckpt_state or {}).get("budget", {})
    budget.load_state_dict(saved)
    notes = []
    step = (ckpt_state or {}).get("step", 0)
    if ckpt_state is None and ledger:
        notes.append(
            f"budget.json (spent {ledger.get('spent', 0):.0f}s to step {ledger.get('step', '?')}) "
            "belongs to checkpoints that are gone: not counted, this run starts its budget afresh"
        )
    elif ledger.get("step", step) >= step:
        if ledger.get("spent", 0.0) > budget.spent:
            budget.spent = float(ledger["spent"])
        if budget.prior_step is None:
            budget.prior_step = ledger.get("step_s")
    old = saved.get("seconds")
    changed = old is not None and abs(old - budget.seconds) > 1e-9
    left = budget.steps_left(0.0)  # `mark` is unset: the time spent so far
    room = left >= LAST_BELOW if left is not None else budget.spent < budget.seconds
    if budget.finished and old is None and room:
        changed = True  # a checkpoint from before the budget was recorded: raised, it seems
    if changed:
        was = budget.progress
        budget.finished = not room
        if room:  # from here progress is the share of the new budget's time, never going back
            budget.progress = 0.0
            now_p = min(1.0, budget.spent / max(1e-9, budget.seconds - budget.end_reserve()))
            notes.append(
                f"train.budget changed ({f'{old:.0f}s' if old is not None else 'spent'} -> "
                f"{budget.seconds:.0f}s, {budget.spent:.0f}s spent): the schedule is refitted to "
                f"the new budget, progress {was:.2f} -> {now_p:.2f} (lr x"
                f"{budget.schedule(step, was):.3f} -> x{budget.schedule(step, now_p):.3f}); it "
                "cools down again before the new end"
            )
        else:
            notes.append(
                f"train.budget changed to {budget.seconds:.0f}s, but {budget.spent:.0f}s are "
                "already spent: nothing is left to train"
            )
    return notes


def build_budget(cfg, run_dir: Path | None, agree: Callable, eval_tokens: int) -> Budget | None:
    """The Budget of a run with a time or money budget (None otherwise)."""
    b = cfg.train.budget
    seconds = b.seconds(cfg.distributed.world_size or 1) if b is not None else None
    if seconds is None:
        return None
    return Budget(
        seconds,
        build_schedule(cfg.schedule),
        max_steps=cfg.train.max_steps or math.inf,
        eval_every=cfg.eval.every,
        save_every=cfg.checkpoint.every,
        end_eval=cfg.eval.at_end,
        end_save=cfg.checkpoint.at_end,
        eval_tokens=eval_tokens,
        batch_tokens=cfg.train.batch_tokens,
        agree=agree,
    )


class RunBudget:
    """What the trainer holds for a time or money budget: the Budget, its ledger, and the text and
    metrics it adds to the progress line, metrics.jsonl and the end of the run."""

    def __init__(self, budget: Budget, ledger: Ledger, cfg: BudgetConfig, world: int):
        self.budget, self.ledger, self.cfg, self.world = budget, ledger, cfg, world

    @classmethod
    def for_trainer(cls, tr, loaded_state: dict | None) -> RunBudget | None:
        """Build (None without a time or money budget), check it holds one step at the device's
        peak (a ConfigError before anything trains) and restore the time already spent."""
        val = sum(len(sh.tokens) for sh in tr.data.val_shards)
        val = min(val, tr.cfg.eval.max_tokens or val)
        budget = build_budget(tr.cfg, tr.run_dir, tr.parallel.broadcast_object, val)
        if budget is None:
            return None
        t = tr.cfg.train
        problem = check_budget_fits(
            budget.seconds, t.batch_tokens, tr.flops_per_token, tr.peak, tr.device.type
        )
        if problem:
            raise ConfigError([problem])
        ledger = Ledger(tr.run_dir / "budget.json" if tr.is_main else None)
        for note in restore(budget, loaded_state, ledger.read()):
            tr.log(note)
        cap = f"; train.max_steps={t.max_steps} stays a cap" if t.max_steps else ""
        tr.log(f"budget: {budget.seconds:.0f}s, {budget.spent:.0f}s spent before{cap}")
        return cls(budget, ledger, t.budget, tr.parallel.world)

    @property
    def finished(self) -> bool:
        return self.budget.finished

    def multiplier(self, step: int) -> float:
        return self.budget.multiplier(step, now())

    def start(self) -> None:
        self.budget.start(now())

    def stepped(self, step: int) -> bool:
        """Count the step's time; True when it was the budget's last."""
        t = now()
        last = self.budget.stepped(t)
        self.ledger.write(self.budget, step, t, force=last)
        return last

    def note_eval(self, seconds: float) -> None:
        self.budget.note_eval(seconds)

    def note_save(self, seconds: float) -> None:
        self.budget.note_save(seconds)

    def spent(self) -> float:
        return self.budget.elapsed(now())

    def state_dict(self) -> dict:
        """For the checkpoint: the time spent up to now, progress, measured speeds."""
        return self.budget.state_dict(now())

    def log_metrics(self, step: int, m: dict) -> tuple[str, int | str]:
        """Add budget_spent, budget_progress and the budget's eta_s to `m`; returns the progress
        line's budget text and its projected step count."""
        t = now()
        b = self.budget
        eta = b.seconds - b.elapsed(t)
        if math.isfinite(b.max_steps) and b.per_step() is not None:  # a step cap may come first
            eta = min(eta, (b.max_steps - step) * b.per_step() + b.end_reserve())
        m.update(eta_s=max(0.0, eta), budget_spent=b.elapsed(t))
        m["budget_progress"] = b.progress
        return b.summary(t, self.world, self.cfg), b.projected_total(step, t) or "?"

    def close(self, step: int, final: dict) -> str:
        """The session ends: count its tail, add the budget's figures to `final`; a log line."""
        t = now()
        b = self.budget
        b.close(t)
        self.ledger.write(b, step, t, force=True)
        final.update(budget_spent=b.spent, budget_seconds=b.seconds)
        cost = self.cfg.dollars_for(b.spent, self.world)
        if cost is not None:
            final["budget_dollars"] = cost
        return f"budget: {b.spent:.1f}s of {b.seconds:.1f}s used ({b.spent / b.seconds:.1%})" + (
            f", ${cost:.2f}" if cost is not None else ""
        )
