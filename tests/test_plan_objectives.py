"""The planner plans each objective from the trace of its own step (plan/trace.py runs the
objective the trainer builds): benchmarks/lora_plan_check.py --objectives cut down to one tiny
shape, the analytic model within 10% of the trace for SFT, DPO and each under LoRA, and DPO's
frozen reference and pair rows in the plan."""

from __future__ import annotations

import pytest
from conftest import load_benchmark
from test_plan_memory import config

from littlelm.plan import memory as mem
from littlelm.plan.memory import Dims
from littlelm.plan.trace import REF, trace_step
from littlelm.schema import load_run

check = load_benchmark("lora_plan_check.py")


@pytest.mark.parametrize("objective", check.OBJECTIVES)
def test_each_objective_is_planned_within_ten_percent_of_its_trace(tmp_path, corpus, objective):
    config(tmp_path, corpus, {})  # writes the tiny run
    _, analytic, traced = check.compare(str(tmp_path / "run.yaml"), check.OBJECTIVES[objective])
    assert abs(analytic / traced - 1) <= 0.10, f"{objective}: {analytic:,} vs {traced:,}"


def test_dpo_holds_its_reference_and_two_rows_a_pair(tmp_path, corpus):
    """DPO's step holds a frozen copy of the base and computes on 2·B rows: its peak is above
    SFT's by more than the copy; under LoRA the reference is the model itself (no copy)."""
    config(tmp_path, corpus, {})  # writes the tiny run
    path = str(tmp_path / "run.yaml")
    peaks = {}
    for name in ("SFT", "DPO", "LoRA-DPO"):
        cfg = load_run(path, check.OBJECTIVES[name])
        traced, analytic = trace_step(cfg), mem.estimate(Dims.of(cfg.with_precision(True)))
        peaks[name] = traced
        assert traced.categories[REF] == analytic.categories[REF]
    params = peaks["SFT"].categories["parameters"]
    assert peaks["DPO"].categories[REF] >= params  # the base's weights again
    assert peaks["LoRA-DPO"].categories[REF] == 0  # adapters off: the same weights
    assert peaks["DPO"].peak > peaks["SFT"].peak + params
