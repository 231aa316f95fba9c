"""What a run prints before its usual log cadence: the first steps, the time to the first step,
and a warning when the schedule cannot fit the run."""

from __future__ import annotations

import io
import json

import pytest
from pydantic import TypeAdapter

from littlelm.console import Console, FirstSteps
from littlelm.optim.schedule import ScheduleChoice, schedule_warnings
from littlelm.progress import Progress
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _schedule(name: str = "trapezoidal", **options):
    """A validated schedule section, as the run file would give it."""
    return TypeAdapter(ScheduleChoice).validate_python({"name": name, **options})


def test_first_steps_and_schedule_warning_before_the_first_log_step(tiny_config):
    out = io.StringIO()
    overrides = ["train.max_steps=6", "train.log_every=5", "schedule.warmup_steps=6"]
    cfg = load_run(tiny_config, [*overrides, "eval.every=0", "checkpoint.every=0"])
    Trainer(cfg, resume="never", progress=Progress(out), callbacks=(Console(),)).fit()
    lines = out.getvalue().splitlines()
    text = "\n".join(lines)
    warning = next(i for i, x in enumerate(lines) if x.startswith("warning: schedule.warmup"))
    first = next(i for i, x in enumerate(lines) if "first step after" in x)
    logged = next(i for i, x in enumerate(lines) if x.startswith("step 5/6") and "tok/s" in x)
    assert warning < first < logged
    assert "train.max_steps=6" in lines[warning] and "below 6" in lines[warning]
    assert lines[first].startswith("step 1/6 | loss ")
    assert "step 2/6 | loss" in text and "step 3/6 | loss" in text and "s/step" in text
    assert "step 4/6" not in text  # three steps shown, then the usual cadence
    # the metrics file keeps its cadence: these lines are console only
    records = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    steps = [r["step"] for r in map(json.loads, records) if r.get("kind") == "train"]
    assert steps == [5, 6]


def test_first_step_line_stays_on_a_terminal():
    out = Terminal()
    first = FirstSteps(start_step=10, log_every=5)
    for step in (11, 12, 13, 14):
        if first.wants(step):
            first.show(Progress(out), step, 100, 2.0)
    text = out.getvalue()
    assert "step 11/100 | loss 2.0000 | first step after" in text.split("\n")[0]
    assert "\r\x1b[2Kstep 12/100" in text and "step 13/100" in text and "step 14" not in text
    assert FirstSteps(0, 1).wants(1) and not FirstSteps(0, 1).wants(2)  # log_every=1 prints them


@pytest.mark.parametrize(
    "max_steps, schedule, expected",
    [
        (
            2,
            {"warmup_steps": 10},
            ["warmup_steps=10 >= train.max_steps=2", "without its cooldown", "below 2"],
        ),
        (5, {"name": "cosine", "warmup_steps": 5}, ["never reaches its peak", "its decay"]),
        (3, {"name": "constant", "warmup_steps": 4}, ["never reaches its peak; set"]),
        (
            8,
            {"warmup_steps": 5, "cooldown_frac": 0.5},
            [
                "steps 4-8",
                "drops at once to 0.50x",
                "warmup_steps to at most 4",
                "cooldown_frac to at most 0.38",
            ],
        ),
    ],
)
def test_schedule_that_cannot_fit_warns_with_the_fix(max_steps, schedule, expected):
    (warning,) = schedule_warnings(_schedule(**schedule), max_steps)
    for part in expected:
        assert part in warning, warning


@pytest.mark.parametrize(
    "max_steps, schedule",
    [
        (160, {"warmup_steps": 10, "cooldown_frac": 0.4}),  # the demo as shipped
        (20, {"warmup_steps": 12, "cooldown_frac": 0.4}),  # cooldown from step 12: fits
        (20, {"name": "cosine", "warmup_steps": 19}),
        (5, {"warmup_steps": 0}),
        (5, {"warmup_steps": 4, "cooldown_frac": 0}),
    ],
)
def test_schedule_that_fits_is_quiet(max_steps, schedule):
    assert schedule_warnings(_schedule(**schedule), max_steps) == []
