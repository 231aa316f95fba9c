"""The step model (plan/speed.py), its calibration, the local-device plan and the renter's view."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
import torch
from rich.console import Console

from littlelm.cli import main
from littlelm.config import to_tree
from littlelm.hardware import native_bf16
from littlelm.optim.groups import AdamWConfig
from littlelm.plan import speed
from littlelm.plan.calibration import cuda_calibration, fitted_points, load_points, point_ratio
from littlelm.plan.cost import load_catalog, plan_gpu
from littlelm.plan.dims import Dims
from littlelm.plan.planner import CPU_HEAP_MARGIN, make_plan
from littlelm.plan.report import print_plan
from littlelm.plan.speed import (
    device_key,
    measure_rates,
    save_measurement,
)
from littlelm.schema import load_run

SEED_H200_TOK_S = 23_200  # the seed user's 3.12B fp32-AdamW run on an H200 (configs/plans)


SEED_H200_GB = 126  # what it used at micro-batch 8


@pytest.mark.parametrize("compiled", [True, False])  # the seed run did not record it
def test_seed_h200_case_is_predicted_within_ten_percent_from_the_published_calibration(compiled):
    # no figure here is tuned to this case: it is not a calibration point, and the calibration
    # is the published runs of its kind (Hopper, compiled or eager) in calibration.yaml
    cat = load_catalog()
    cfg = load_run("configs/plans/3b_grow.yaml", [f"train.compile={str(compiled).lower()}"])
    plan = make_plan(cfg, cat, ["H200-SXM"], trace=False)
    h200 = plan.gpus[0]
    assert h200.fits and h200.micro_batch == 8
    assert abs(h200.tok_s / SEED_H200_TOK_S - 1) < 0.10, h200.tok_s
    assert abs(h200.needed_gib * 2**30 / 1e9 / SEED_H200_GB - 1) < 0.05, h200.needed_gib
    kind = "compiled hopper" if compiled else "eager hopper"
    assert kind in h200.mfu_source and "torchtitan" in h200.mfu_source


def test_calibration_points_load_and_give_a_plausible_ratio():
    cat = load_catalog()
    points = load_points()
    assert points and all(p.gpu in cat.gpus for p in points)
    ratio = point_ratio(points[0], cat)
    assert 1.0 < ratio < 3.0  # the roofline is optimistic, by less than 3x
    assert fitted_points(cat)[0].ratio == pytest.approx(ratio)
    hopper = [f.ratio for f in fitted_points(cat) if f.arch == "hopper" and f.framework == "eager"]
    expect = float(torch.tensor(hopper).log().mean().exp())
    assert cuda_calibration(cat, cat.gpus["H200-SXM"]).ratio == pytest.approx(expect)


def test_shapes_and_features_move_the_prediction():
    cat = load_catalog()
    cfg = load_run("configs/plans/3b_grow.yaml")
    d = Dims.of(cfg)
    h100 = cat.gpus["H100-SXM"]
    rates = speed.catalog_rates(h100, cat, d)
    base = speed.tokens_per_second(d, rates)
    fp8 = speed.tokens_per_second(replace(d, fp8=True), rates)
    assert fp8 > 1.15 * base  # the big linears run at the fp8 rate
    small = speed.tokens_per_second(d.with_micro_batch(1), rates)
    assert small < base  # per-micro-batch casts, gradient accumulation and launches
    checkpointed = speed.tokens_per_second(replace(d, checkpointing=True), rates)
    assert 0.7 < checkpointed / base < 0.8  # the forward again: about a quarter slower


def test_multi_gpu_speed_pays_for_communication():
    cat = load_catalog()
    d = Dims.of(load_run("configs/plans/3b_grow.yaml"))
    nvlink = speed.catalog_rates(cat.gpus["H100-SXM"], cat, d)
    pcie = replace(nvlink, interconnect=32e9 * 0.8)
    one = speed.tokens_per_second(d, nvlink)
    assert speed.tokens_per_second(d, nvlink, 8) == pytest.approx(8 * one, rel=0.01)
    assert speed.tokens_per_second(d, pcie, 8) < 8 * one * 0.99  # 12.5 GB over PCIe shows
    fsdp = replace(d, strategy="fsdp", world=8, grad_accum=1)
    slow_link = replace(nvlink, interconnect=1e9)
    assert speed.step_time(fsdp, slow_link, 8).parts["communication"] > 1.0


def test_fsdp_plan_shows_per_gpu_memory(tiny_config):
    cfg = load_run(tiny_config, ["distributed.strategy=fsdp"], world_size=8)
    plan = make_plan(cfg, load_catalog(), ["H100-SXM"], devices=8, trace=False)
    per_rank, peak = plan.per_rank()
    assert per_rank["parameters"] < plan.memory.categories["parameters"] / 4
    assert peak < plan.memory.peak
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=140))
    assert "memory per GPU (fsdp, 8 GPUs)" in out.getvalue()


def test_default_plan_output_fits_one_screen(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LITTLELM_CACHE", str(tmp_path / "cache"))  # no other test's benches
    assert main(["plan", "configs/plans/3b_grow.yaml", "--no-trace"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 40
    assert out.index("GPUs that can run it") < out.index("memory per GPU")
    assert "fits at no micro-batch" in out  # the small cards, one line each


def test_no_fit_line_names_the_mildest_remedy_that_fits(tiny_config):
    cat = load_catalog()
    cfg = load_run("configs/plans/3b_grow.yaml")
    a100 = plan_gpu(Dims.of(cfg), cat.gpus["A100-40GB"], cat, 10**9)
    assert a100.tok_s is None and a100.dollars is None  # nothing to price
    fits = [r for r in a100.remedies if r.fits]
    assert fits and a100.remedies[: len(fits)] == fits  # those that fit come first


def test_plan_on_this_cpu_probes_and_uses_a_bench_calibration(
    tiny_config, capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("LITTLELM_CACHE", str(tmp_path / "cache"))  # no other test's benches
    cfg = load_run(tiny_config)
    d = Dims.of(cfg)
    (rates,) = measure_rates([d])
    assert rates.matmul > 1e8 and rates.bandwidth > 1e8 and 0 < rates.launch < 1e-2
    assert main(["plan", str(tiny_config), "--device", "cpu", "--no-trace"]) == 0
    out = capsys.readouterr().out
    assert "this machine" in out and "uncalibrated" in out
    margin = f"heap margin {CPU_HEAP_MARGIN:.2f}"  # where the memory figure comes from
    assert margin in " ".join(out.split())
    key = device_key(torch.device("cpu"))
    # a bench calibrates with the config it ran (one from before benches recorded it: skipped)
    save_measurement({"device": "cpu", "device_key": key, "run": "x", "speed_ratio": 2.0})
    bench = {"device": "cpu", "device_key": key, "run": "y", "speed_ratio": 2.0, "step_s": 1.0}
    save_measurement({**bench, "config": to_tree(cfg.with_precision(native_bf16("cpu")))})
    plan = make_plan(cfg, load_catalog(), ["H100-SXM"], trace=False, local=True)
    assert "calibrated by bench (y; newest" in plan.local.source
    # precision auto: the catalog's GPUs in bf16, this machine in what it computes natively
    assert cfg.train.precision == "auto" and plan.dims.bf16
    assert plan.local.precision == ("bf16" if native_bf16("cpu") else "fp32")
    assert plan.local.tok_s > 0 and plan.local.process_peak > plan.local.tensor_peak


def test_a_bench_here_calibrates_speed_at_its_own_shapes_and_the_heap_margin(
    tiny_config, tmp_path, monkeypatch
):
    # the bench's ratio is re-taken against rates probed now at the bench's shapes (a shared
    # CPU's probe drifts between processes), and its measured RSS growth per tensor byte
    # replaces the default heap margin
    from littlelm.plan import planner

    monkeypatch.setenv("LITTLELM_CACHE", str(tmp_path / "cache"))
    fixed = speed.Rates(matmul=1e10, attention=5e9, bandwidth=1e10, launch=1e-5)
    monkeypatch.setattr(speed, "measure_rates", lambda ds: [fixed] * len(ds))  # exact
    bench_cfg = load_run(tiny_config, ["train.micro_batch_size=2"])  # another shape than the plan's
    bd = Dims.of(bench_cfg)
    modelled = speed.step_time(bd, fixed).raw
    gib = 2**30
    record = {
        "device": "cpu",
        "device_key": device_key(torch.device("cpu")),
        "run": "b",
        "speed_ratio": 9.9,  # its own probe's ratio: not used when the shapes are known
        "step_s": 1.5 * modelled,
        "config": to_tree(bench_cfg),
        "peak_tensor": gib,
        "rss_at_start": gib,
        "peak_rss": gib + 2 * gib,  # the heap grew twice the tensors
        "rss_peak_is_window": True,
    }
    save_measurement(record)
    cfg = load_run(tiny_config)
    plan = make_plan(cfg, load_catalog(), ["H100-SXM"], trace=False, local=True)
    local = plan.local
    assert local.rates.calibration == pytest.approx(1.5)
    here = Dims.of(cfg.with_precision(native_bf16("cpu")))  # what this CPU computes in
    step = 1.5 * speed.step_time(here, fixed).raw
    assert local.tok_s == pytest.approx(here.tokens * here.grad_accum / step)
    assert local.heap_margin == pytest.approx(2.0)
    assert local.process_peak >= 2 * local.tensor_peak  # resident set at start + 2 x tensors
    # a record from a littlelm whose config no longer validates calibrates nothing
    stale = {**record, "config": {"model": {"no_such_field": 1}}, "speed_ratio": 3.0}
    save_measurement({**stale, "time": "2999-01-01T00:00:00"})  # the newest
    rates, used = planner.local_calibration(speed.load_measurements(), record["device_key"], bd)
    assert rates.calibration == pytest.approx(1.5) and [b["run"] for b in used] == ["b"]
    # without a bench: the documented default margin
    assert planner.heap_margin([]) == CPU_HEAP_MARGIN


def test_local_calibration_is_the_median_of_the_newest_benches(tiny_config, monkeypatch):
    # one bench that read slow (a busy moment on a shared CPU) does not move the plan; benches
    # older than the newest LOCAL_BENCHES do not count; a shape is probed once
    from littlelm.plan import planner

    fixed = speed.Rates(matmul=1e10, attention=5e9, bandwidth=1e10, launch=1e-5)
    probes = []
    monkeypatch.setattr(speed, "measure_rates", lambda ds: probes.append(ds) or [fixed] * len(ds))
    cfg = load_run(tiny_config)
    modelled = speed.step_time(Dims.of(cfg), fixed).raw
    gib = 2**30
    key = device_key(torch.device("cpu"))

    def bench(run, ratio, heap):
        return {
            "device_key": key,
            "run": run,
            "speed_ratio": 1.0,
            "step_s": ratio * modelled,
            "config": to_tree(cfg),
            "peak_tensor": gib,
            "rss_at_start": gib,
            "peak_rss": gib + round(heap * gib),
            "rss_peak_is_window": True,
        }

    records = [bench("old", 9.0, 9.0), bench("a", 1.5, 1.2), bench("slow", 1.8, 1.3)]
    records.append(bench("b", 1.45, 1.25))
    assert planner.LOCAL_BENCHES == 3
    target = Dims.of(load_run(tiny_config, ["train.micro_batch_size=2"]))
    rates, used = planner.local_calibration(records, key, target)
    assert rates.calibration == pytest.approx(1.5)
    assert planner.heap_margin(used) == pytest.approx(1.25)
    assert [b["run"] for b in used] == ["a", "slow", "b"]
    # one round of probes: the planned shape with the one shape the three benches ran
    assert [len(ds) for ds in probes] == [2] and probes[0][0] is target
    assert planner.local_calibration(records, "another machine", target)[0].calibration == 1.0


def test_muon_step_costs_bytes_per_parameter_and_newton_schulz_flops(tiny_config):
    d = Dims.of(load_run("demo"))
    assert d.optimizer.name == "muon"
    bytes_, flops = speed.optimizer_work(d)
    # every parameter is read and written a few times: tens of bytes each, not millions
    assert 10 * d.n_params < bytes_ < 200 * d.n_params
    assert flops > 0  # five Newton-Schulz iterations per matrix
    adamw = replace(d, optimizer=AdamWConfig().traits())
    assert speed.optimizer_work(adamw)[1] == 0.0


def test_cpu_probe_rates_the_runs_own_elementwise_work_and_newton_schulz(monkeypatch):
    # the model cut to two blocks is timed: whatever its GEMMs and attention (probed on their
    # own) leave of that time is elementwise work, so a slower model call means a slower
    # elementwise rate and a slower plan; each Newton-Schulz call counts per matrix it timed
    d = Dims.of(load_run("demo").with_precision(True))
    layers = object()
    monkeypatch.setattr(speed, "_model_call", lambda d: layers)
    plans = {}
    for seconds in (0.5, 1.0):
        times = lambda fns, s=seconds: [s if f is layers else 1e-4 for f in fns]  # noqa: E731
        monkeypatch.setattr(speed, "best_of_rounds", times)
        (r,) = measure_rates([d])
        p = speed.step_time(speed._layers_dims(d), r).parts
        assert p["GEMMs"] + p["attention"] + p["elementwise"] == pytest.approx(seconds)
        assert r.newton_schulz == pytest.approx(1e-4 * len(d.matrix_buckets()))
        plans[seconds] = speed.step_time(d, r)
    assert plans[1.0].parts["elementwise"] > 1.9 * plans[0.5].parts["elementwise"]
    assert plans[1.0].parts["GEMMs"] == plans[0.5].parts["GEMMs"]
    # a catalog GPU's rates have neither: its elementwise work runs at its bandwidth
    gpu = speed.catalog_rates(load_catalog().gpus["H200-SXM"], load_catalog(), d)
    assert gpu.elementwise is None and gpu.newton_schulz is None


def test_probe_takes_the_best_of_several_calls_unless_one_call_is_long(monkeypatch):
    from littlelm.plan import speed as probe

    class Clock:  # each call of the probed function takes `dt` seconds of this clock
        now, dt = 0.0, 0.0

        @classmethod
        def perf_counter(cls):
            return cls.now

    def call():
        Clock.now += Clock.dt
        calls.append(1)

    monkeypatch.setattr(probe, "time", Clock)
    calls, Clock.dt = [], 0.001
    probe.best_of_rounds([call], seconds=0.002)  # two calls would fill the window
    assert len(calls) == 1 + probe.MIN_REPEATS  # a warm-up, then the minimum of timed calls
    calls, Clock.dt = [], 0.02
    probe.best_of_rounds([call], seconds=0.01)
    assert len(calls) == 2  # a warm-up and one call longer than the window: enough


def test_probes_are_timed_in_rounds_and_a_shared_shape_once(tiny_config, monkeypatch):
    # a busy spell of a shared machine slows one round of every measurement, not all the
    # repeats of a few; a plan's shapes and a bench's are timed in the same rounds
    from littlelm.plan import speed as probe

    class Clock:  # each call takes a millisecond of this clock
        now = 0.0

        @classmethod
        def perf_counter(cls):
            return cls.now

    def call(name):
        Clock.now += 0.001
        order.append(name)

    order = []
    monkeypatch.setattr(probe, "time", Clock)
    probe.best_of_rounds([lambda: call("a"), lambda: call("b")], seconds=0.002)
    assert order == ["a", "b"] * (1 + probe.MIN_REPEATS)  # warm-ups, then whole rounds
    monkeypatch.undo()
    monkeypatch.setattr(probe, "PROBE_SECONDS", 0.001)  # a quick probe: the plumbing is checked
    d = Dims.of(load_run(tiny_config))
    longer = replace(d, micro_batch=d.micro_batch // 2, seq_len=2 * d.seq_len)  # same tokens
    assert longer.tokens == d.tokens
    a, b = probe.measure_rates([d, longer])
    for g in speed.gemms(d):  # the same GEMM shapes: one measurement serves both
        for product in speed.PRODUCTS:
            assert a.gemm(g, product) == b.gemm(g, product) > 0
    assert a.attention > 0 and b.attention > 0 and a.bandwidth == b.bandwidth
