"""Training to a budget of tokens, hours or dollars (`train.budget`).

    train:
      budget: {hours: 2}                                         # wall-clock of training
      budget: {dollars: 50, price_per_gpu_hour: 2.5, gpus: 8}    # = 2.5 hours on 8 GPUs
      budget: {tokens: 2_000_000_000}                            # = train.max_tokens

The trainer holds one budget object and asks it two things: how far through the run the step
it is taking is (`progress(step)`, 0..1, what the schedule reads) and whether the run is done
(`done(step)`); it also tells it when a session starts, when a step ends and which work between
steps is no step's (`aside("eval")`, `aside("save")`). It knows no seconds, hours or dollars.

`Steps` is a step count known in advance: train.max_steps, or a tokens budget (the schema's
resolve turns it into train.max_steps). `TimeBudget`, a time or money budget, is not: the run does not know how many steps it will take, so the schedule
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
the time it lost, because the rented machine was paid for it. `Budget` (the arithmetic) is pure: times come in as arguments (readings of `now()`), so tests drive it
with a fake clock.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from littlelm.config import Cfg
from littlelm.errors import ConfigError
from littlelm.optim.schedule import step_progress
from littlelm.progress import duration

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


class BudgetConfig(Cfg):
    tokens: int | None = Field(
        None, description="Train on this many tokens (sets train.max_steps).", ge=1
    )
    hours: float | None = Field(
        None,
        description="Train for this many hours of wall-clock (evaluations and saves included); "
        "the schedule's decay ends with the budget.",
        gt=0,
    )
    dollars: float | None = Field(
        None,
        description="Spend this many dollars: hours = dollars / (price_per_gpu_hour × gpus).",
        gt=0,
    )
    price_per_gpu_hour: float | None = Field(
        None, description="Dollars per GPU-hour (needed by a dollars budget).", gt=0
    )
    gpus: int | None = Field(
        None, description="GPUs paid for; null = the run's processes (world size).", ge=1
    )

    @property
    def kind(self) -> str | None:
        set_ = [k for k in ("tokens", "hours", "dollars") if getattr(self, k) is not None]
        return set_[0] if len(set_) == 1 else None

    def seconds(self, world: int = 1) -> float | None:
        """The budget in seconds of wall-clock; None for a tokens budget."""
        if self.hours is not None:
            return self.hours * 3600
        if self.dollars is not None and self.price_per_gpu_hour:
            return self.dollars / (self.price_per_gpu_hour * (self.gpus or world)) * 3600
        return None

    def dollars_for(self, seconds: float, world: int = 1) -> float | None:
        """What `seconds` of the run cost (None without a price)."""
        if not self.price_per_gpu_hour:
            return None
        return seconds / 3600 * self.price_per_gpu_hour * (self.gpus or world)


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
    """Progress through a time budget, from measured speed (pure: times come in as arguments):

    advance(step, now) during each step: its progress (and whether it is the last step);
    stepped(now) after it; note_eval / note_save with the seconds those took."""

    def __init__(
        self,
        seconds: float,
        max_steps: float = math.inf,
        eval_every: int = 0,
        save_every: int = 0,
        end_eval: bool = True,
        end_save: bool = True,
        eval_tokens: int = 0,
        batch_tokens: int = 1,
        agree: Callable = lambda x: x,
    ):
        self.seconds, self.max_steps = seconds, max_steps
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

    def advance(self, step: int, now: float) -> float:
        """The progress of step `step` + 1, decided once per step (it never goes back)."""
        progress, last = self.agree(self.decide(step, now))
        self.progress, self.last = (1.0 if last else max(self.progress, progress)), last
        return self.progress

    def projected_total(self, step: int, now: float) -> int | None:
        n = self.steps_left(now)
        if n is None:
            return None
        total = step + max(0, math.floor(n + 1 - LAST_BELOW) + 1) if not self.finished else step
        return int(min(total, self.max_steps))

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


def restore(budget: Budget, ckpt_state: dict | None, ledger: dict, schedule=None) -> list[str]:
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
            lr = (  # `schedule`: (step, progress) -> lr multiplier, for the note
                f" (lr x{schedule(step, was):.3f} -> x{schedule(step, now_p):.3f})"
                if schedule
                else ""
            )
            notes.append(
                f"train.budget changed ({f'{old:.0f}s' if old is not None else 'spent'} -> "
                f"{budget.seconds:.0f}s, {budget.spent:.0f}s spent): the schedule is refitted to "
                f"the new budget, progress {was:.2f} -> {now_p:.2f}{lr}; it "
                "cools down again before the new end"
            )
        else:
            notes.append(
                f"train.budget changed to {budget.seconds:.0f}s, but {budget.spent:.0f}s are "
                "already spent: nothing is left to train"
            )
    return notes


# ----------------------------------------------------------------------------------------------
# What the trainer holds: one object that says how far the run is and whether it is done


class Steps:
    """A run of a known number of steps: train.max_steps (a tokens budget is resolved into it).
    The interface the trainer uses, with nothing to measure."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps

    def progress(self, step: int) -> float:
        """How far through the run the end of step `step` + 1 is (1 at the last step; an exact
        fraction, optim/schedule.py's step_progress)."""
        return step_progress(step, self.max_steps)

    def done(self, step: int) -> bool:
        return step >= self.max_steps

    def start(self) -> None:
        """A session's first step begins."""

    def stepped(self, step: int) -> None:
        """Step `step` ended."""

    @contextlib.contextmanager
    def aside(self, what: str):
        """Work between steps that is no step's ("eval": an evaluation and its callbacks, "save")."""
        yield

    def record(self, step: int, step_seconds: float) -> dict:
        """What the budget adds to a metrics record (`step_seconds`: the recent seconds per
        step): the time left, `eta_s`."""
        return {"eta_s": (self.max_steps - step) * step_seconds}

    def figures(self) -> dict:
        """What the budget adds to an evaluation's record."""
        return {}

    def total(self, step: int) -> int | str:
        """The run's step count, for `step N/total`."""
        return self.max_steps

    def describe(self) -> str | None:
        """The budget's figures for the progress line (None: nothing beyond the steps)."""
        return None

    def opening(self) -> str | None:
        """The budget at the start of a session, for the console (None: nothing to say)."""
        return None

    def close(self, step: int) -> dict:
        """The session ends: figures for the final record."""
        return {}

    def state_dict(self) -> dict | None:
        return None  # nothing to save: train.max_steps is in the config


class TimeBudget(Steps):
    """A time or money budget: progress from measured speed (`Budget`), the time spent saved in
    checkpoints and in RUN_DIR/budget.json (`Ledger`). `max_steps` is train.max_steps as a cap
    (inf without one) until the budget's last step, then that step."""

    def __init__(self, budget: Budget, ledger: Ledger, cfg: BudgetConfig, world: int):
        super().__init__(budget.max_steps)  # type: ignore[arg-type]  (inf without a cap)
        self.budget, self.ledger, self.cfg, self.world = budget, ledger, cfg, world

    def progress(self, step: int) -> float:
        return self.budget.advance(step, now())

    def start(self) -> None:
        self.budget.start(now())

    def stepped(self, step: int) -> None:
        t = now()
        last = self.budget.stepped(t)
        self.ledger.write(self.budget, step, t, force=last)
        if last:
            self.max_steps = step  # the budget's last step, cooldown done

    @contextlib.contextmanager
    def aside(self, what: str):
        t0 = now()  # the budget's one clock (tests replace it), as its steps are timed
        try:
            yield
        finally:  # evaluations and saves count against the budget, not as step time
            seconds = now() - t0
            (self.budget.note_eval if what == "eval" else self.budget.note_save)(seconds)

    def record(self, step: int, step_seconds: float) -> dict:
        b, t = self.budget, now()
        spent = b.elapsed(t)
        eta = b.seconds - spent
        if math.isfinite(b.max_steps) and b.per_step() is not None:  # a step cap may come first
            eta = min(eta, (b.max_steps - step) * b.per_step() + b.end_reserve())
        return {"eta_s": max(0.0, eta), "budget_spent": spent, "budget_progress": b.progress}

    def figures(self) -> dict:
        return {"budget_spent": self.budget.elapsed(now())}

    def total(self, step: int) -> int | str:
        return self.budget.projected_total(step, now()) or "?"

    def describe(self) -> str:
        """'budget 1m02s/2m00s (52%) $1.23': for the progress line."""
        b, used = self.budget, self.budget.elapsed(now())
        text = f"budget {duration(used)}/{duration(b.seconds)} ({used / b.seconds:.0%})"
        if self.cfg.price_per_gpu_hour:
            text += f" ${self.cfg.dollars_for(used, self.world):.2f}"
        return text

    def opening(self) -> str:
        b = self.budget
        cap = f"; train.max_steps={b.max_steps} stays a cap" if math.isfinite(b.max_steps) else ""
        return f"budget: {b.seconds:.0f}s, {b.spent:.0f}s spent before{cap}"

    def close(self, step: int) -> dict:
        b, t = self.budget, now()
        b.close(t)
        self.ledger.write(b, step, t, force=True)
        final = {"budget_spent": b.spent, "budget_seconds": b.seconds}
        cost = self.cfg.dollars_for(b.spent, self.world)
        if cost is not None:
            final["budget_dollars"] = cost
        return final

    def state_dict(self) -> dict:
        """For the checkpoint: the time spent up to now, progress, measured speeds."""
        return self.budget.state_dict(now())


def round_up(x: float, digits: int = 3) -> float:
    """`x` rounded up to `digits` significant digits (advice must not fall short of its aim)."""
    if x <= 0:
        return x
    unit = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / unit - 1e-9) * unit


def train_further(cfg, run: Steps, step: int, tokens: int) -> tuple[str, str]:
    """(an override that trains a finished run further, what ended it), computed from the work
    done: a time or money budget gets the time already spent and as much again (at least a few
    steps more, and the end's evaluation and save), so following the advice trains even when
    the budget was lowered below the time spent. `cfg`: the RunConfig."""
    b = cfg.train.budget
    kind = b.kind if b is not None else None
    if isinstance(run, TimeBudget):
        t = run.budget
        seconds = t.spent + max(t.spent, 4 * (t.per_step() or 0.0)) + t.end_reserve()
        world = cfg.distributed.world_size or 1
        value = seconds / 3600 if kind == "hours" else b.dollars_for(seconds, world)
        why = f"its budget (train.budget.{kind}={getattr(b, kind):g}) is spent"
        return f"train.budget.{kind}={round_up(value):g}", f"{why} ({t.spent:.0f}s so far)"
    if kind == "tokens":
        why = f"its budget (train.budget.tokens={b.tokens:,}) is spent"
        return f"train.budget.tokens={2 * max(b.tokens, tokens)}", why
    return f"train.max_steps={2 * step}", f"train.max_steps is {run.max_steps}"


def build_budget(
    cfg,
    saved: dict | None,
    *,
    ledger: Path | None,
    agree: Callable,
    val_shards: list,
    flops_per_token: int,
    peak: float,
    device: str,
    say: Callable[[str], None] = print,
) -> Steps:
    """The run's budget (cfg: the RunConfig): its steps, or a time or money budget restored from
    `saved` (the resumed checkpoint's state.json) and the `ledger` file (rank 0; None on the
    others), checked to hold one step at the device's `peak` FLOP/s (a ConfigError before
    anything trains; what the restore changed is said with `say`). `agree` makes every rank
    take rank 0's decisions (Parallel.broadcast_object);
    `val_shards` are what an evaluation reads (up to eval.max_tokens)."""
    t, b = cfg.train, cfg.train.budget
    seconds = b.seconds(cfg.distributed.world_size or 1) if b is not None else None
    if seconds is None:
        return Steps(t.max_steps)
    problem = check_budget_fits(seconds, t.batch_tokens, flops_per_token, peak, device)
    if problem:
        raise ConfigError([problem])
    val = sum(len(sh.tokens) for sh in val_shards)
    budget = Budget(
        seconds,
        max_steps=t.max_steps or math.inf,
        eval_every=cfg.eval.every,
        save_every=cfg.checkpoint.every,
        end_eval=cfg.eval.at_end,
        end_save=cfg.checkpoint.at_end,
        eval_tokens=min(val, cfg.eval.max_tokens or val),
        batch_tokens=t.batch_tokens,
        agree=agree,
    )
    log = Ledger(ledger)
    for note in restore(budget, saved, log.read(), cfg.schedule.build()):
        say(note)
    run = TimeBudget(budget, log, b, cfg.distributed.world_size or 1)
    if budget.finished and saved is not None:
        run.max_steps = saved["step"]
    return run
