"""train.budget: the budget logic on a fake clock, schedules driven by progress, config checks,
and the trainer on a tiny run (train/budget.py)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from conftest import tiny_tree, write_config
from littlelm.console import Console
from littlelm.errors import ConfigError
from littlelm.optim import schedule as sch
from littlelm.schema import load_run
from littlelm.train import budget as bg
from littlelm.train.trainer import Trainer

TRAP = dict(warmup_steps=3, cooldown_frac=0.4, floor=0.05)


def make_budget(seconds, **kw) -> bg.Budget:
    opts = dict(eval_every=10, save_every=25, eval_tokens=0, batch_tokens=1)
    opts.update(kw)
    return bg.Budget(seconds, **opts)


def simulate(b: bg.Budget, step_s=1.0, eval_s=2.0, save_s=0.5, now=0.0, step=0, stop_at=None):
    """Drive `b` as the trainer does, on a fake clock; returns (mults, times, step, now)."""
    mults, times = [], []
    b.start(now)
    while stop_at is None or now < stop_at:
        mults.append(sch.trapezoidal(step, b.advance(step, now), **TRAP))
        now += step_s * (3 if step == 0 else 1)  # the first step warms up
        step += 1
        last = b.stepped(now)
        times.append(now)
        if last:
            now += eval_s + save_s  # the final evaluation and save
            b.close(now)
            break
        if step % b.eval_every == 0:
            now += eval_s
            b.note_eval(eval_s)
        if step % b.save_every == 0:
            now += save_s
            b.note_save(save_s)
    return mults, times, step, now


def test_trapezoidal_follows_progress():
    f = sch.trapezoidal
    assert f(0, 0.0, **TRAP) == pytest.approx(1 / 3)  # warmup counts steps
    assert f(10, 0.59, **TRAP) == 1.0  # before the cooldown
    assert f(10, 0.8, **TRAP) == pytest.approx(1 + (0.05 - 1) * 0.5)
    floor = 1 + (0.05 - 1)  # the floor, as the cooldown's line reaches it (0.05 + 4e-17)
    assert f(10, 1.0, **TRAP) == floor and f(1, 1.0, **TRAP) == floor  # the last step
    assert sch.cosine(5, 1.0, warmup_steps=2, floor=0.1) == 0.1
    assert sch.cosine(5, 0.5, warmup_steps=2) == pytest.approx(0.5)
    assert sch.constant(5, 1.0) == 1.0


@pytest.mark.parametrize(
    "schedule",
    [
        {"name": "trapezoidal", "warmup_steps": 10, "cooldown_frac": 0.4, "floor": 0.1},
        {"name": "trapezoidal", "warmup_steps": 3, "cooldown_frac": 0.3},
        {"name": "cosine", "warmup_steps": 10, "floor": 0.05},  # the case the two forms split on
        {"name": "constant", "warmup_steps": 5},
    ],
)
def test_a_budget_run_and_a_step_run_follow_one_curve(schedule):
    """One schedule form for both kinds of run: a time budget whose steps take exactly
    1/total of it gets the multipliers of the run bounded at `total` steps."""
    from pydantic import TypeAdapter

    cfg = TypeAdapter(sch.ScheduleChoice).validate_python(schedule)
    fn, total = cfg.build(), 100
    by_steps = [fn(s, sch.step_progress(s, total)) for s in range(total)]
    b = bg.Budget(float(total), end_eval=False, end_save=False)
    by_budget, now = [], 0.0
    b.start(now)
    while not b.finished:
        step = len(by_budget)
        by_budget.append(fn(step, b.advance(step, now)))
        now += 1.0
        b.stepped(now)
    assert len(by_budget) == total
    assert by_budget == pytest.approx(by_steps, rel=1e-12, abs=1e-12)


def test_time_budget_ends_on_time_with_the_cooldown_done():
    b = make_budget(300.0)
    mults, times, _, end = simulate(b)
    assert end == pytest.approx(300.0, abs=1.5)  # within a step and a half of the budget
    assert b.spent == pytest.approx(end) and b.finished
    assert mults[-1] == pytest.approx(TRAP["floor"]) and min(mults[:-1]) > TRAP["floor"]
    # the cooldown starts when the projected time left is cooldown_frac of the budget
    first_cool = next(i for i, m in enumerate(mults) if i >= 3 and m < 1.0)
    assert times[first_cool - 1] == pytest.approx(0.6 * 300, abs=4)
    assert all(a >= b_ for a, b_ in itertools.pairwise(mults[3:]))  # never rises


def test_dollar_budget_ends_where_the_equal_hours_budget_does():
    hours = bg.BudgetConfig(hours=0.05)
    dollars = bg.BudgetConfig(dollars=0.6, price_per_gpu_hour=1.5, gpus=8)  # 0.6 / 12 $/h
    assert dollars.seconds() == pytest.approx(hours.seconds()) == 180
    assert dollars.dollars_for(180) == pytest.approx(0.6)
    a = simulate(make_budget(hours.seconds()))
    b = simulate(make_budget(dollars.seconds()))
    assert a[0] == pytest.approx(b[0]) and a[2] == b[2] and a[3] == pytest.approx(b[3])
    assert bg.BudgetConfig(dollars=3, price_per_gpu_hour=1.5).seconds(world=2) == 3600


def test_resumed_budget_counts_the_time_before_the_crash():
    first = make_budget(200.0)
    simulate(first, stop_at=90.0)
    state = {"budget": first.state_dict()}  # as the checkpoint holds it
    lost = first.spent + 7.0  # the run went on after its checkpoint, and the ledger saw it
    second = make_budget(200.0)
    bg.restore(second, state, {"spent": lost})
    assert second.spent == lost and second.prior_step == pytest.approx(1.0)
    mults, _, _, end = simulate(second, now=1000.0, step=80)
    assert second.spent == pytest.approx(200.0, abs=1.5) and mults[-1] == pytest.approx(
        TRAP["floor"]
    )
    assert end - 1000.0 == pytest.approx(200.0 - lost, abs=1.5)
    stale = make_budget(200.0)
    bg.restore(stale, state, {"spent": 1.0})  # an older ledger never lowers the figure
    assert stale.spent == first.spent


def test_step_cap_and_speed_change():
    b = make_budget(1000.0, max_steps=20)
    mults, _, steps, _ = simulate(b)
    assert steps == 20 and mults[-1] == pytest.approx(TRAP["floor"])  # the cap came first
    slow = make_budget(100.0)  # the machine slows down half-way: still ends on time
    simulate(slow, stop_at=50.0)
    _, _, _, end = simulate(slow, step_s=2.0, now=slow.spent)
    assert end == pytest.approx(100.0, abs=3.0)


def test_ledger_roundtrip(tmp_path):
    b = make_budget(50.0)
    simulate(b, stop_at=10.0)
    ledger = bg.Ledger(tmp_path / "budget.json")
    ledger.write(b, 9, 12.0, force=True)
    assert ledger.read()["spent"] == pytest.approx(b.spent + (12.0 - b.mark))
    ledger.write(b, 10, 13.0)  # within LEDGER_EVERY of the last write: skipped
    assert ledger.read()["step"] == 9
    (tmp_path / "budget.json").write_text("{torn")
    assert ledger.read() == {}


def budget_cfg(tmp_path, corpus, budget, **train):
    tree = tiny_tree(corpus, tmp_path / "runs", train={"max_steps": None, **train})
    tree["train"]["budget"] = budget
    return write_config(tmp_path / "b.yaml", tree)


@pytest.mark.parametrize(
    "budget,message",
    [
        ({}, "set exactly one of tokens, hours or dollars"),
        ({"hours": 1, "tokens": 1000}, "(got tokens and hours)"),
        ({"dollars": 5}, "needs train.budget.price_per_gpu_hour"),
        ({"tokens": 100}, "less than one step's batch of 128 tokens"),
        ({"hours": -1}, "greater than 0"),
    ],
)
def test_bad_budgets_are_clear(tmp_path, corpus, budget, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_run(budget_cfg(tmp_path, corpus, budget))


def test_tokens_budget_sets_the_steps_and_max_steps_caps(tmp_path, corpus):
    assert load_run(budget_cfg(tmp_path, corpus, {"tokens": 1000})).train.max_steps == 7
    capped = load_run(budget_cfg(tmp_path, corpus, {"tokens": 1000}, max_steps=4))
    assert capped.train.max_steps == 4
    timed = load_run(budget_cfg(tmp_path, corpus, {"hours": 1}))
    assert timed.train.max_steps is None and timed.train.max_tokens is None


def test_budget_too_small_for_one_step_fails_before_training(tmp_path, corpus):
    assert bg.check_budget_fits(1.0, 8192, 40_000_000, 1e12) is None
    assert "less than one step takes" in bg.check_budget_fits(0.1, 8192, 40_000_000, 1e12)
    cfg = load_run(budget_cfg(tmp_path, corpus, {"hours": 1e-12}))
    with pytest.raises(ConfigError, match="less than one step takes"):
        Trainer(cfg, resume="never")
    assert not (cfg.run_dir() / "metrics.jsonl").exists()


class FakeClock:
    """Each reading is `tick` seconds after the previous one (a step reads it about 3 times)."""

    def __init__(self, tick: float):
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def test_trainer_follows_a_time_budget_and_resumes_it(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setattr(bg, "now", FakeClock(1.0))
    path = budget_cfg(tmp_path, corpus, {"hours": 40 / 3600}, log_every=1)
    cfg = load_run(path)
    run = cfg.run_dir()
    Trainer(cfg, resume="never").fit(stop_after=2)  # an interruption after two steps
    saved = json.loads(next((run / "checkpoints").glob("step_*/state.json")).read_text())
    assert saved["budget"]["spent"] > 0 and not saved["budget"]["finished"]
    result = Trainer(load_run(path)).fit()
    assert result["finished"] and result["budget_spent"] >= saved["budget"]["spent"]
    assert 35 <= result["budget_spent"] <= 45  # the fake clock's 40 s, within a step
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["kind"] == "train"]
    assert train[-1]["lr_mult"] == 0.0  # the tiny config's trapezoidal floor: cooldown done
    assert all("budget_spent" in r for r in train)
    assert json.loads((run / "budget.json").read_text())["finished"]
    capsys.readouterr()
    console = Console()
    trainer = Trainer(load_run(path), callbacks=(console,))
    again = trainer.fit()  # a finished budget run does nothing more
    assert again.get("already_finished") and again["step"] == result["step"]
    console.report(trainer, again)
    out = capsys.readouterr().out  # and names the budget to raise, not train.max_steps
    assert "its budget (train.budget.hours=0.0111111) is spent" in out
    assert "add train.budget.hours=" in out and "max_steps=" not in out


def advised(out: str) -> str:
    """The override a finished run's message advises ("add KEY=VALUE to the command")."""
    return re.search(r"add (\S+=\S+) to the command", out).group(1)


def test_following_the_advice_of_a_finished_budget_run_trains(
    tmp_path, corpus, monkeypatch, capsys
):
    """A finished run whose budget was lowered below the time it spent: the advice is
    computed from the time spent, and followed (twice) it trains further each time. (It was
    twice the lowered budget, still below the time spent: followed twice, nothing trained.)"""
    monkeypatch.setattr(bg, "now", FakeClock(1.0))
    path = budget_cfg(tmp_path, corpus, {"hours": 20 / 3600}, log_every=1)
    first = Trainer(load_run(path)).fit()
    assert first["finished"] and first["budget_spent"] > 10
    override, step = "train.budget.hours=0.001", first["step"]  # 3.6 s: below the time spent
    trained = 0
    for _ in range(4):  # lowered: advice; followed: trains; again: advice; followed: trains
        capsys.readouterr()
        console = Console()
        trainer = Trainer(load_run(path, [override]), callbacks=(console,))
        result = trainer.fit()
        console.report(trainer, result)
        out = capsys.readouterr().out
        if result.get("already_finished"):  # the lowered budget; then the advice, followed
            assert "is spent" in out
            override = advised(out)
            continue
        assert result["finished"] and result["step"] > step, out  # it trained further
        step, trained = result["step"], trained + 1
    assert trained == 2


def test_advice_rounds_up():
    assert bg.round_up(0.0111111) == pytest.approx(0.0112)
    assert bg.round_up(14.2) == pytest.approx(14.2) and bg.round_up(14.21) == pytest.approx(14.3)


def test_plan_shows_what_a_budget_buys_on_each_gpu(tiny_config):
    from littlelm.plan.cost import load_catalog
    from littlelm.plan.planner import make_plan

    over = ["train.max_steps=null", "train.budget.price_per_gpu_hour=1"]
    hours = make_plan(
        load_run(tiny_config, [*over, "train.budget.hours=2"]),
        load_catalog([]),
        ["H100-SXM", "RTX-4090"],
        trace=False,
    )
    for p in hours.gpus:
        assert p.hours == 2 and p.budget_tokens == int(p.tok_s * 7200)
        assert p.budget_steps == p.budget_tokens // 128
    dollars = make_plan(
        load_run(tiny_config, [*over, "train.budget.dollars=10"]),
        load_catalog([]),
        ["H100-SXM"],
        trace=False,
    )
    p = dollars.gpus[0]
    assert p.dollars == pytest.approx(10) and p.hours == pytest.approx(10 / p.gpu.price_per_hour)


def test_speed_follows_a_machine_that_speeds_up():
    """A contended start (7.4 s/step) then a quiet machine (4 s/step): the projection uses the
    recent speed. A mean over 32 steps still said 5.6 s/step here, and a 2-minute demo budget
    ended at 87% of its time."""
    b = make_budget(120)
    t = 0.0
    b.start(t)
    for dt in [7.4] * 10 + [4.0] * 8:
        t += dt
        b.stepped(t)
    assert b.step_s == 4.0
    b.stepped(t + 30.0)  # one stall does not move the median
    assert b.step_s == 4.0


# Issue 36 items 1-4: changed budgets, a stale ledger, the ETA


def test_raised_budget_trains_on_and_refits_the_schedule():
    first = make_budget(100.0)
    simulate(first)
    assert first.finished
    state = {"step": 90, "budget": first.state_dict()}
    same = make_budget(100.0)
    assert bg.restore(same, state, {}) == [] and same.finished  # the same budget: done
    raised = make_budget(200.0)
    notes = bg.restore(raised, state, {})
    assert not raised.finished and raised.progress == 0.0  # item 1: it trains further
    assert "changed (100s -> 200s" in notes[0] and "refitted to the new budget" in notes[0]
    assert "progress 1.00 -> 0.5" in notes[0]
    mults, _, _, _ = simulate(raised, now=1000.0, step=90)
    assert raised.finished and raised.spent == pytest.approx(200.0, abs=1.5)
    assert mults[0] > mults[-1] == pytest.approx(TRAP["floor"])  # back above the floor, cooled
    legacy = {"step": 90, "budget": {k: v for k, v in first.state_dict().items() if k != "seconds"}}
    from_before = make_budget(200.0)  # a checkpoint written before budgets recorded their seconds
    bg.restore(from_before, legacy, {})
    assert not from_before.finished


def test_budget_raised_during_the_cooldown_refits_the_lr():
    """Item 2: stopped at progress 0.91 of 30 s and resumed with 120 s, the lr stayed at its
    cooldown value for most of the new budget; it returns to the plateau at once."""
    first = make_budget(30.0, eval_every=1000, save_every=1000)
    simulate(first, step_s=0.25, stop_at=26.0)
    assert 0.85 < first.progress < 0.95
    resumed = make_budget(120.0, eval_every=1000, save_every=1000)
    sched = lambda s, p: sch.trapezoidal(s, p, **TRAP)  # noqa: E731
    notes = bg.restore(resumed, {"step": 100, "budget": first.state_dict()}, {}, sched)
    assert "30s -> 120s" in notes[0] and "-> x1.000)" in notes[0]
    mults, times, _, _ = simulate(resumed, step_s=0.25, now=0.0, step=100)
    assert mults[0] == 1.0  # the plateau again, not x0.2
    cool = next(i for i, m in enumerate(mults) if m < 1.0)
    assert first.spent + times[cool - 1] == pytest.approx(0.6 * 120, abs=2)  # the new cooldown


def test_stale_ledger_without_checkpoints_is_ignored():
    """Item 3: budget.json left after the checkpoints were deleted made the same command train
    one step at lr 0 and say done."""
    old = make_budget(40.0)
    simulate(old)
    ledger = {"step": 60, **old.state_dict()}
    fresh = make_budget(40.0)
    notes = bg.restore(fresh, None, ledger)
    assert fresh.spent == 0.0 and not fresh.finished
    assert "belongs to checkpoints that are gone" in notes[0]
    mults, _, steps, _ = simulate(fresh)
    assert steps > 20 and max(mults) == 1.0
    older = make_budget(40.0)  # a ledger older than the checkpoint is not counted either
    bg.restore(older, {"step": 70, "budget": {"spent": 5.0}}, {"step": 60, "spent": 30.0})
    assert older.spent == 5.0


def test_eta_of_a_step_cap_before_a_huge_budget():
    """Item 4: the ETA showed 999999999h59m when train.max_steps ended the run first."""
    b = make_budget(3.6e12, max_steps=20)
    simulate(b, stop_at=5.0)
    rb = bg.TimeBudget(b, bg.Ledger(None), bg.BudgetConfig(hours=1e9), 1)
    m = rb.record(5, 1.0)
    assert m["eta_s"] < 60  # 15 steps of about 1 s, plus the end's evaluation


def test_trainer_raised_budget_and_stale_ledger(tmp_path, corpus, monkeypatch, capsys):
    """Items 1 and 3 through the trainer: a finished run given twice the budget trains on (the
    message's advice works); with its checkpoints deleted, budget.json does not make a 1-step
    lr-0 run."""
    import shutil

    monkeypatch.setattr(bg, "now", FakeClock(1.0))
    path = budget_cfg(tmp_path, corpus, {"hours": 20 / 3600}, log_every=1)
    first = Trainer(load_run(path)).fit()
    assert first["finished"]
    capsys.readouterr()
    more = Trainer(load_run(path, ["train.budget.hours=0.0111111"])).fit()
    assert not more.get("already_finished") and more["step"] > first["step"] and more["finished"]
    assert "the schedule is refitted to the new budget" in capsys.readouterr().out
    run = load_run(path).run_dir()
    shutil.rmtree(run / "checkpoints")
    assert (run / "budget.json").is_file()
    again = Trainer(load_run(path)).fit()
    # a fresh run of the same budget on the same (fake) clock: as many steps as the first
    assert again["step"] == first["step"] > 1
    assert "belongs to checkpoints that are gone" in capsys.readouterr().out
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["lr_mult"] for r in lines if r["kind"] == "train") == 1.0


def test_evaluations_and_saves_are_timed_by_the_budgets_clock(monkeypatch):
    """Steps were timed by the budget's clock and evaluations by the wall clock: under a test's
    fake clock a loaded machine's slow evaluation ate the budget, and a trainer test ended its
    run early (5 steps where it expects more) when the suite ran beside two busy loops."""
    import time

    monkeypatch.setattr(bg, "now", FakeClock(1.0))
    b = make_budget(100.0)
    run = bg.TimeBudget(b, bg.Ledger(None), bg.BudgetConfig(hours=1), 1)
    for what in ("eval", "save"):
        with run.aside(what):
            time.sleep(0.2)  # real time the budget's clock does not see
    assert b.eval_s == 1.0 and b.save_s == 1.0  # one tick of its clock each
