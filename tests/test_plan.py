"""littlelm plan: catalog, fit, micro-batch search, costs, remedies, report, chart, CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from littlelm.cli import main
from littlelm.errors import ConfigError
from littlelm.plan import memory as mem
from littlelm.plan import speed
from littlelm.plan.calibration import cuda_calibration
from littlelm.plan.cost import (
    largest_fitting,
    load_catalog,
    micro_batch_options,
    needed_gib,
    plan_gpu,
    remedies,
)
from littlelm.plan.dims import Dims
from littlelm.plan.planner import make_plan
from littlelm.plan.speed import (
    save_measurement,
    speed_calibrations,
    workload_key,
)
from littlelm.schema import load_run

GROW = "plans/3b_grow"


def test_packaged_catalog_has_the_issue_gpus():
    names = set(load_catalog().gpus)
    assert {
        "A100-40GB",
        "A100-80GB",
        "H100-SXM",
        "H100-PCIe",
        "H100-NVL",
        "H200-SXM",
        "H200-NVL",
        "B200",
        "L40S",
        "RTX-4090",
        "RTX-5090",
        "MI300X",
    } <= names
    for g in load_catalog().gpus.values():
        assert g.price_date and g.price_per_hour > 0 and g.bf16_tflops > g.fp32_tflops


def test_user_catalog_overrides_and_adds(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(
        "defaults: {allocator_margin: 0.1}\n"
        "gpus:\n"
        "  H100-SXM: {price_per_hour: 1.99, price_date: 2026-11-01}\n"
        "  MyCard: {memory_gib: 10, bf16_tflops: 50, fp32_tflops: 5, bandwidth_gbs: 500,\n"
        "           price_per_hour: 0.2, price_date: 2026-11, mfu: 0.3}\n"
    )
    cat = load_catalog([f])
    assert cat.gpus["H100-SXM"].price_per_hour == 1.99
    assert cat.gpus["H100-SXM"].price_date == "2026-11-01"
    assert cat.gpus["H100-SXM"].bf16_tflops == 989  # untouched fields stay
    assert cat.gpus["MyCard"].memory_gib == 10 and cat.defaults.allocator_margin == 0.1


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpus:\n  New: {memory_gib: 10}\n", "gpus.New.bf16_tflops"),
        ("gpus:\n  H100-SXM: {memroy_gib: 10}\n", "memroy_gib"),
        ("gpus:\n  H100-SXM: {mfu: 1.5}\n", "gpus.H100-SXM.mfu"),
        ("gpus: [1, 2\n", "malformed YAML"),
        ("gpu: {}\n", "only `defaults:` and `gpus:`"),
    ],
)
def test_bad_catalog_files_are_clear_errors(tmp_path, text, expected):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_catalog([f])


def test_unknown_gpu_names_the_catalog():
    with pytest.raises(ConfigError, match=r"unknown GPU H100-SMX.*did you mean 'H100-SXM'"):
        load_catalog().select(["H100-SMX"])


def test_identify_prefers_the_most_specific_name():
    cat = load_catalog()
    assert cat.identify("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert cat.identify("NVIDIA H200 NVL").name == "H200-NVL"
    assert cat.identify("NVIDIA H200").name == "H200-SXM"
    assert cat.identify("NVIDIA GeForce RTX 4090").name == "RTX-4090"
    assert cat.identify("Tesla T4") is None


def test_3b_grow_verdict():
    """The issue's story: fp32 AdamW at micro-batch 8 does not fit an 80 GB A100 and fits an
    H200 with room to spare; the A100 runs it at a smaller micro-batch."""
    cfg = load_run(GROW)
    d = Dims.of(cfg)
    assert 3.0e9 < d.n_params < 3.2e9
    plan = make_plan(cfg, load_catalog(), ["A100-80GB", "H200-SXM"], trace=False)
    by = {p.gpu.name: p for p in plan.gpus}
    a100, h200 = by["A100-80GB"], by["H200-SXM"]
    assert not a100.fits and a100.needed_gib > 79.1
    assert h200.fits and h200.headroom_gib > 5
    assert a100.best_micro_batch is not None and a100.best_micro_batch < 8
    names = [r.name for r in a100.remedies]
    assert f"train.micro_batch_size={a100.best_micro_batch}" in names
    assert any(r.fits for r in a100.remedies)
    assert plan.gpus[0].fits  # fitting GPUs come first
    by_name = {r.name: r for r in a100.remedies}
    # each speed switch that lowers memory is offered with its saving and exact override
    for override in (
        "optimizer.adamw_8bit=true",
        "train.master_weights=bf16",
        "train.activation_checkpointing=true",
    ):
        assert any(n.startswith(override) for n in by_name), override
    eight = by_name["optimizer.adamw_8bit=true"]
    assert not eight.fits and eight.saving_gib > 15  # 6 of AdamW's 8 bytes per parameter
    combo = [r for n, r in by_name.items() if n.startswith("optimizer.adamw_8bit=true train.")]
    assert combo and combo[0].fits  # 8-bit AdamW alone is not enough; with a smaller batch it is
    assert any(n.startswith("distributed.strategy=fsdp on ") for n in by_name)


def test_plain_loss_gets_the_chunked_remedy(tiny_config):
    cfg = load_run(tiny_config, ["model.loss=plain"])
    cat = load_catalog()
    gpu = cat.gpus["H100-SXM"].model_copy(update={"memory_gib": 0.01})
    names = [r.name for r in remedies(Dims.of(cfg), gpu, cat)]
    assert "model.loss=chunked" in names
    assert "model.loss=chunked" not in [
        r.name for r in remedies(Dims.of(load_run(tiny_config)), gpu, cat)
    ]


def test_trace_runs_cuda_only_optimizers_as_adamw(tiny_config):
    """8-bit AdamW is CUDA-only: the plan traces torch's AdamW and compares it with the
    analytic model of what it traced, while the prediction counts 8-bit state."""
    cfg = load_run(tiny_config, ["optimizer.name=adamw", "optimizer.adamw_8bit=true"])
    plan = make_plan(cfg, load_catalog(), ["H100-SXM"])
    assert all(r is None or abs(r - 1) < 0.1 for r in plan.trace_check().values())
    assert any("adamw_8bit" in n for n in plan.notes)


def test_micro_batch_search_keeps_tokens_per_step(tiny_config):
    cfg = load_run(tiny_config, ["train.batch_tokens=768"])  # 6 sequences of 128? no: of 32
    d = Dims.of(cfg)
    options = micro_batch_options(d)
    seqs = d.micro_batch * d.grad_accum
    assert all(seqs % m == 0 for m in options) and options[-1] == seqs
    cat = load_catalog()
    gpu = cat.gpus["H100-SXM"].model_copy(update={"memory_gib": 1.0})
    need = [needed_gib(d.with_micro_batch(m), gpu, cat) for m in options]
    assert need == sorted(need)  # more sequences per micro-batch, more memory
    gpu.memory_gib = (need[0] + need[1]) / 2
    assert largest_fitting(d, gpu, cat) == options[0]


def test_costs_follow_the_step_model_price_and_tokens(tiny_config):
    cfg = load_run(tiny_config)
    d = Dims.of(cfg)
    cat = load_catalog()
    g = cat.gpus["H100-SXM"]
    p = plan_gpu(d, g, cat, tokens=10**9)
    rates = speed.catalog_rates(g, cat, d)
    ratio = cuda_calibration(cat, g, d.compile).ratio  # compiled on CUDA by default
    expect = d.tokens * d.grad_accum / (speed.step_time(d, rates).raw * ratio)
    assert p.tok_s == pytest.approx(expect) and "torchtitan" in p.mfu_source
    assert p.dollars == pytest.approx(p.hours * g.price_per_hour)
    assert p.dollars_per_btok == pytest.approx(p.dollars)  # one billion tokens
    two = plan_gpu(d, g, cat, tokens=10**9, devices=2)
    assert 1.0 < two.tok_s / p.tok_s < 2.0  # the gradient all-reduce is not free
    assert two.needed_gib == pytest.approx(p.needed_gib)  # same Dims: nothing sharded
    fixed = g.model_copy(update={"mfu": 0.3})  # a catalog mfu replaces the step model
    assert plan_gpu(d, fixed, cat, 10**9).tok_s == pytest.approx(
        0.3 * g.bf16_tflops * 1e12 / d_flops(d)
    )


def test_per_rank_memory_follows_the_distributed_strategy(tiny_config):
    """The memory one GPU needs under littlelm's ddp (gradients in DDP's buckets, sharded Muon,
    optionally ZeRO-1 AdamW) and fsdp, against one process with the same micro-batch."""
    cat = load_catalog()
    g = cat.gpus["H100-SXM"]
    one = Dims.of(load_run(tiny_config, ["train.batch_tokens=1024"]))
    state = {}
    for name, extra in {
        "ddp": [],
        "replicated": ["distributed.shard_muon=false"],
        "zero1": ["distributed.shard_adamw=true"],
        "fsdp": ["distributed.strategy=fsdp"],
    }.items():
        cfg = load_run(tiny_config, ["train.batch_tokens=2048", *extra], world_size=2)
        d = Dims.of(cfg)
        assert (d.world, d.micro_batch, d.grad_accum) == (2, one.micro_batch, one.grad_accum)
        state[name] = mem.optimizer_state_bytes(d)
        need = plan_gpu(d, g, cat, tokens=10**9, devices=2).needed_gib
        assert need <= plan_gpu(one, g, cat, tokens=10**9).needed_gib + 1e-9, name
    whole = mem.optimizer_state_bytes(one)
    assert state["replicated"] == state["fsdp"] == whole  # fsdp divides in fsdp_per_gpu
    muon = sum(mem.block_bytes(4 * p.numel) for p in one.params if one.matrix_param(p))
    owned = sum(mem.block_bytes(4 * math.prod(s)) * -(-n // 2) for _, s, n in one.matrix_buckets())
    assert state["ddp"] == whole - muon + owned and owned < muon
    assert state["zero1"] < state["ddp"]


def test_data_parallel_keeps_per_device_accumulation(tiny_config):
    cfg = load_run(tiny_config, ["train.batch_tokens=1024"], world_size=2)
    d = Dims.of(cfg)
    assert d.micro_batch * d.grad_accum * d.seq_len * 2 == 1024  # per device x 2 devices


def d_flops(d):
    from littlelm.model.gpt import flops_per_token

    return flops_per_token(d.model, d.seq_len)


def test_a_bench_on_a_gpu_calibrates_every_workload_there(tiny_config, tmp_path):
    cfg = load_run(tiny_config)
    cat = load_catalog()
    before = {p.gpu.name: p for p in make_plan(cfg, cat, ["H100-SXM"], trace=False).gpus}
    record = {"device": "NVIDIA H100 80GB HBM3", "gpu": "H100-SXM", "mfu": 0.31}
    memory = {"micro_batch": 4, "peak_reserved": 3 * 2**30, "outside_pytorch": 2**29}
    older = {"time": "2026-12-01T10:00:00", "speed_ratio": 2.0}
    save_measurement({**record, **memory, "workload": workload_key(cfg), **older})
    newest = {"time": "2026-12-01T11:00:00", "speed_ratio": 4.0}  # another workload, newer
    save_measurement({**record, "workload": "another model", **newest})
    plan = make_plan(cfg, cat, ["H100-SXM", "A100-80GB"], trace=False)
    by = {p.gpu.name: p for p in plan.gpus}
    d = Dims.of(cfg)
    raw = speed.step_time(d, speed.catalog_rates(cat.gpus["H100-SXM"], cat, d)).raw
    assert by["H100-SXM"].tok_s == pytest.approx(d.tokens * d.grad_accum / (raw * 4.0))
    assert by["H100-SXM"].tok_s < before["H100-SXM"].tok_s
    assert "bench on this GPU" in by["H100-SXM"].mfu_source
    assert "torchtitan" in by["A100-80GB"].mfu_source and by["A100-80GB"].measured is None
    assert by["H100-SXM"].measured["peak_reserved"] == 3 * 2**30
    assert speed_calibrations([], gpu="H100-SXM") == []


def test_cli_plan_json(tiny_config, capsys):
    assert main(["plan", str(tiny_config), "--json", "--gpu", "H100-SXM", "--tokens", "1e9"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 10**9 and out["gpus"][0]["gpu"] == "H100-SXM"
    mem = out["memory_bytes"]
    assert set(mem["trace"]) == set(mem["analytic"]) == set(mem["plan"])
    assert mem["plan"] == mem["trace"] and out["memory_source"].startswith("trace")
    assert all(r is None or abs(r - 1) < 0.1 for r in out["trace_over_analytic"].values())
    assert out["gpus"][0]["fits"] is True and out["gpus"][0]["headroom_gib"] > 70


def test_cli_plan_table_and_chart(tiny_config, tmp_path, capsys):
    chart = tmp_path / "plan.png"
    assert main(["plan", str(tiny_config), "--chart", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "cheapest per token first" in out and "A100-80GB" in out
    assert "trace / analytic" not in out  # the detail is on request
    assert main(["plan", str(tiny_config), "--detail", "--no-trace"]) == 0
    assert "memory per GPU" in capsys.readouterr().out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plan_errors(tiny_config, capsys):
    assert main(["plan", str(tiny_config), "--gpu", "Z100"]) == 2
    assert "unknown GPU Z100" in capsys.readouterr().err
    assert main(["plan", str(tiny_config), "--gpus", "/nonexistent.yaml"]) == 2
    assert "GPU catalog file not found" in capsys.readouterr().err
    assert main(["plan", str(tiny_config), "--tokens", "0"]) == 2
    assert "--tokens. Must be >= 1" in capsys.readouterr().err


def test_resume_host_ram_counts_the_mapped_checkpoint_once_per_node():
    """Ranks memory-map the same checkpoint: the page cache holds it once per node, and each
    rank owns only the tensor it is copying (not a whole copy per rank, as before)."""
    cfg = load_run("configs/plans/3b_grow.yaml")
    one, eight = (
        make_plan(cfg, load_catalog(), ["H200-SXM"], devices=n, trace=False).resume for n in (1, 8)
    )
    ckpt_gib = one["device_gib"]  # weights + optimizer state
    assert one["host_page_cache_gib"] == eight["host_page_cache_gib"] == pytest.approx(ckpt_gib)
    assert eight["host_private_gib"] == pytest.approx(8 * one["host_private_gib"])
    assert one["host_private_gib"] < 0.05 * ckpt_gib  # one tensor, not the checkpoint
    assert eight["host_gib"] < 1.2 * ckpt_gib  # was 8 x the checkpoint


def test_plan_answers_huge_batches_and_sequences_by_the_analytic_model(tiny_config):
    """A micro-batch too long to trace (its loss chunks are traced one by one) is planned by
    the analytic model, said so; a billion sequences per step are searched by their divisors
    up to the square root, not one by one."""
    long = load_run(tiny_config, ["train.seq_len=100000", "model.max_seq_len=100000"])
    with pytest.warns(UserWarning, match="analytic estimate only"):
        plan = make_plan(long, load_catalog(), ["H100-SXM"])
    assert plan.trace is None and plan.memory.source == "analytic model"
    d = Dims.of(load_run(tiny_config))
    huge = replace(d, micro_batch=1, grad_accum=10**9)
    options = micro_batch_options(huge)
    assert len(options) == 100 and options[:4] == [1, 2, 4, 5] and options[-1] == 10**9


HOSTILE = {  # each config the schema accepts: planned or refused, with bounded work
    "seq 1e9 beyond max_seq_len": (["train.seq_len=1000000000"], 2),
    "seq 1e9": (["train.seq_len=1000000000", "model.max_seq_len=1000000000"], 0),
    "seq 100000": (["train.seq_len=100000", "model.max_seq_len=100000"], 0),
    "micro-batch 1e9": (["train.micro_batch_size=1000000000"], 0),
    "grad accumulation 1e9": (["train.grad_accum=1000000000"], 0),
}


@pytest.mark.parametrize(
    "device", [pytest.param([], id="gpus"), pytest.param(["--device", "cpu"], id="and this cpu")]
)
@pytest.mark.parametrize("overrides,rc", HOSTILE.values(), ids=HOSTILE.keys())
def test_plan_answers_or_refuses_hostile_sizes_with_bounded_work(
    tiny_config, capsys, monkeypatch, overrides, rc, device
):
    """`littlelm plan` (the CLI's main, every catalog GPU, the local CPU too) gives a plan
    (rc 0) or a config error naming the fix (rc 2, no traceback), and what it runs is bounded
    whatever the sizes: the trace only of a step within its caps (else the analytic model), CPU
    probes only at capped shapes, and a fit search that evaluates each micro-batch option at
    most once per remedy and GPU. (How long it takes: benchmarks/plan_hostile.py.)"""
    from littlelm.plan import cost, planner
    from littlelm.plan.planner import TRACE_MAX_CHUNKS, TRACE_MAX_LAYERS

    traced, probed, fits = [], [], []
    real_trace, real_needed = planner.trace_step, cost.needed_gib

    def trace(cfg, *a, **k):
        traced.append(cfg)
        return real_trace(cfg, *a, **k)

    def needed(d, *a, **k):
        fits.append(d.micro_batch)
        return real_needed(d, *a, **k)

    fixed = speed.Rates(matmul=1e10, attention=5e9, bandwidth=1e10, launch=1e-5)
    probes = lambda ds: probed.extend(map(speed.probe_dims, ds)) or [fixed] * len(ds)  # noqa: E731
    monkeypatch.setattr(planner, "trace_step", trace)
    monkeypatch.setattr(cost, "needed_gib", needed)
    monkeypatch.setattr(speed, "measure_rates", probes)
    got = main(["plan", str(tiny_config), *overrides, *device, "--json"])
    out, err = capsys.readouterr()
    assert got == rc, err
    assert "Traceback" not in out + err
    if rc != 0:
        assert "train.seq_len 1000000000 exceeds model.max_seq_len" in err
        assert "lower one or raise the other" in err
        return
    plan = json.loads(out)
    assert plan["gpus"] and all(g["needed_gib"] > 0 for g in plan["gpus"])
    assert (plan["local"] is not None) == bool(device)
    for cfg in traced:
        rows = cfg.train.micro_batch_size * cfg.train.seq_len
        assert rows / (cfg.model.loss_rows_per_pass() or rows) <= TRACE_MAX_CHUNKS
        assert cfg.model.n_layer <= TRACE_MAX_LAYERS
    assert all(
        p.seq_len <= speed.PROBE_MAX_SEQ and p.micro_batch * p.seq_len <= speed.PROBE_MAX_ROWS
        for p in probed
    )
    assert bool(probed) == bool(device)
    d = Dims.of(load_run(tiny_config, overrides))
    options = len(micro_batch_options(d))
    changes = len(cost.config_changes(d)) + len(cost.FSDP_SIZES) + 2
    assert len(fits) <= len(plan["gpus"]) * changes * (options + 1)


# --price-per-hour: what the user pays sets the cost, shown in the table, the chart and --json


def test_price_per_hour_prices_the_named_gpus_in_table_and_json(tiny_config, capsys):
    args = ["plan", str(tiny_config), "--gpu", "H100-SXM", "--gpu", "A100-80GB", "--no-trace"]
    assert main([*args, "--price-per-hour", "1.99", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["price_per_hour"] == 1.99 and out["priced"] == ["H100-SXM", "A100-80GB"]
    for g in out["gpus"]:
        assert g["price_per_hour"] == 1.99 and g["price_source"] == "--price-per-hour"
        assert g["dollars"] == pytest.approx(g["hours"] * 1.99)
        assert g["dollars_per_billion_tokens"] == pytest.approx(
            1.99 / (g["tokens_per_s"] * 3600) * 1e9
        )
    assert main([*args, "--price-per-hour", "1.99"]) == 0
    text = capsys.readouterr().out
    assert "price: $1.99 per GPU-hour for H100-SXM, A100-80GB (--price-per-hour)" in text
    assert "$/GPU-h" in text and text.count("$1.99") >= 3  # the header and each GPU's row
    catalog = load_catalog().gpus["H100-SXM"].price_per_hour
    assert main(args) == 0  # without it: the catalog's price, printed in the table
    assert f"${catalog:.2f}" in capsys.readouterr().out


def test_price_per_hour_without_gpu_prices_every_gpu_and_the_chart_shows_it(tiny_config):
    from littlelm.plan.report import plan_figure

    plan = make_plan(load_run(tiny_config), load_catalog(), trace=False, price_per_hour=0.5)
    assert plan.price_scope == "every catalog GPU" and len(plan.priced) == len(plan.gpus) > 3
    assert all(p.gpu.price_per_hour == 0.5 for p in plan.gpus)
    fig = plan_figure(plan)
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks and all(t.endswith("$0.50/GPU-h") for t in ticks)
    assert "$0.50 per GPU-hour (--price-per-hour)" in fig._suptitle.get_text()
    catalog = make_plan(load_run(tiny_config), load_catalog(), ["H100-SXM"], trace=False)
    price = catalog.gpus[0].gpu.price_per_hour
    ticks = [t.get_text() for t in plan_figure(catalog).axes[0].get_yticklabels()]
    assert ticks == [f"H100-SXM\n${price:.2f}/GPU-h"]


def test_price_per_hour_with_device_cpu_prices_this_machine(tiny_config, capsys, monkeypatch):
    fixed = speed.Rates(matmul=1e10, attention=5e9, bandwidth=1e10, launch=1e-5)
    monkeypatch.setattr(speed, "measure_rates", lambda ds: [fixed] * len(ds))  # no probes
    args = ["plan", str(tiny_config), "--device", "cpu", "--no-trace", "--price-per-hour", "0.25"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    local = out["local"]
    assert local["price_per_hour"] == 0.25 and local["dollars"] == pytest.approx(
        local["hours"] * 0.25
    )
    assert out["priced"] == ["this machine"]  # the GPUs keep the catalog's prices
    h100 = next(g for g in out["gpus"] if g["gpu"] == "H100-SXM")
    assert h100["price_per_hour"] == load_catalog().gpus["H100-SXM"].price_per_hour
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "price: $0.25 per hour for this machine (--price-per-hour)" in text
    assert "$/h" in text and "$0.25" in text


def test_plan_says_what_lies_between_peak_and_needs_in_the_same_words_in_text_and_chart(
    capsys,
):
    """The table's `needs` is the tensor peak + allocator margin + CUDA context; the chart's
    label for a GPU that fits at no micro-batch is the text's line, remedy included; a
    multi-GPU chart's title names the GPU count."""
    from littlelm.plan.report import NEEDS, memory_line, no_fit_lines, no_fit_text, plan_figure

    plan = make_plan(load_run(GROW), load_catalog(), ["A100-40GB", "H200-SXM"], trace=False)
    a100 = next(p for p in plan.gpus if p.gpu.name == "A100-40GB")
    assert a100.tok_s is None  # fits at no micro-batch
    lines = a100.lines
    assert lines["needed"] == pytest.approx(
        lines["tensor peak"] + lines["allocator margin"] + lines["CUDA context & workspaces"]
    )
    words = no_fit_text(a100)
    assert f"needs {lines['needed']:,.2f} GiB = tensor peak {lines['tensor peak']:,.2f}" in words
    assert "fits with train.master_weights=bf16" in words
    assert any(words in line for line in no_fit_lines(plan))
    assert NEEDS in memory_line(plan)
    fig = plan_figure(plan)
    cost_texts = [t.get_text().replace("\n", " ") for t in fig.axes[1].texts]
    assert words in cost_texts  # not "does not fit at any micro-batch"
    assert NEEDS in fig.axes[0].get_xlabel()
    eight = make_plan(load_run(GROW), load_catalog(), ["H200-SXM"], devices=8, trace=False)
    assert "x 8 GPUs" in plan_figure(eight)._suptitle.get_text()
