"""The plan as rich tables for a terminal, or as one JSON object (`--json`)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from littlelm.plan import memory as mem
from littlelm.plan.accounting import CATEGORIES
from littlelm.plan.cost import GIB, GpuPlan
from littlelm.plan.planner import Plan
from littlelm.progress import human


def gib(x: float) -> str:
    return f"{x:,.2f}"


def money(x: float) -> str:
    return f"${x:,.2f}" if x < 100 else f"${x:,.0f}"


def duration(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"


def print_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console(width=140)
    console.print(summary_line(plan))
    console.print(memory_table(plan))
    for note in plan.notes:
        console.print(f"  [dim]note: {note}[/dim]")
    r = plan.resume
    step = plan.estimate.peak / GIB
    where = "below" if r["device_gib"] <= step else "[red]above[/red]"
    console.print(
        f"resume: the GPU holds {gib(r['device_gib'])} GiB while loading (weights + optimizer "
        f"state, copied one tensor at a time from host RAM), {where} the step's peak of "
        f"{gib(step)} GiB; host RAM needs {gib(r['host_gib'])} GiB for the checkpoint"
    )
    console.print(gpu_table(plan))
    for p in plan.gpus:
        if p.measured:
            m = p.measured
            console.print(
                f"  {p.gpu.name}: bench measured {gib(m['peak_reserved'] / GIB)} GiB reserved "
                f"(+ {gib(m['outside_pytorch'] / GIB)} outside PyTorch) on {m['time'][:10]}; "
                f"predicted {gib(p.needed_gib)} GiB in all"
            )
    if any(not p.fits for p in plan.gpus):
        console.print(remedy_table(plan))


def summary_line(plan: Plan) -> str:
    d, cfg = plan.dims, plan.cfg
    n = d.n_params
    tokens_step = d.tokens * d.grad_accum * plan.devices
    return (
        f"[bold]{cfg.run.name}[/bold]: {human(n)} parameters, "
        f"{human(plan.flops_per_token)} FLOPs/token; micro-batch {d.micro_batch} × seq "
        f"{d.seq_len} × accum {d.grad_accum}"
        + (f" × {plan.devices} GPUs" if plan.devices > 1 else "")
        + f" = {tokens_step:,} tokens/step; {cfg.train.precision}, {d.optimizer}; "
        + budget_text(plan)
    )


def budget_text(plan: Plan) -> str:
    b = plan.cfg.train.budget
    if plan.gpus and plan.gpus[0].budget_tokens is not None:  # a time or money budget
        what = f"{b.hours:g} hours" if b.kind == "hours" else f"${b.dollars:g}"
        return f"budget {what} (the table shows the tokens and steps it buys on each GPU)"
    return f"budget {human(plan.tokens)} tokens"


def memory_table(plan: Plan) -> Table:
    e, ec, tr = plan.estimate, plan.cpu_estimate, plan.trace
    t = Table(
        title=f"memory per GPU at micro-batch {plan.dims.micro_batch} (GiB)",
        title_justify="left",
    )
    t.add_column("category")
    t.add_column("predicted (CUDA)", justify="right")
    t.add_column("analytic (CPU kernels)", justify="right")
    t.add_column("trace (CPU kernels)", justify="right")
    t.add_column("trace / analytic", justify="right")
    check = plan.trace_check()
    for k in CATEGORIES:
        ratio = check.get(k)
        t.add_row(
            k,
            gib(e.categories[k] / GIB),
            gib(ec.categories[k] / GIB),
            gib(tr.categories[k] / GIB) if tr else "-",
            _ratio(ratio),
        )
    for phase in (mem.FB, mem.OPT):
        traced = tr.phases[phase].total / GIB if tr and phase in tr.phases else None
        ratio = traced / (ec.phases[phase] / GIB) if traced is not None else None
        t.add_row(
            f"[bold]peak: {phase}[/bold]",
            gib(e.phases[phase] / GIB),
            gib(ec.phases[phase] / GIB),
            gib(traced) if traced is not None else "-",
            _ratio(ratio),
        )
    if tr:
        t.caption = f"trace took {tr.seconds:.1f} s"
    return t


def _ratio(r: float | None) -> str:
    if r is None:
        return "-"
    if not math.isfinite(r):
        return "inf"
    flag = "" if abs(r - 1) <= 0.10 else " [red]!"
    return f"{r:.3f}{flag}"


def gpu_table(plan: Plan) -> Table:
    t = Table(title="GPUs, cheapest first", title_justify="left")
    for col, right in (
        ("GPU", False),
        ("memory", True),
        ("needed", True),
        ("headroom", True),
        ("fits", False),
        ("max micro-batch (accum)", True),
        ("tokens/s", True),
        ("MFU", True),
        ("time", True),
        ("cost", True),
        ("$/B tokens", True),
    ):
        t.add_column(col, justify="right" if right else "left")
    bought = bool(plan.gpus) and plan.gpus[0].budget_tokens is not None
    if bought:  # a time or money budget: what it buys on each GPU
        t.add_column("budget buys (tokens / steps)", justify="right")
    for p in plan.gpus:
        best = f"{p.best_micro_batch} ({p.best_grad_accum})" if p.best_micro_batch else "none"
        t.add_row(
            p.gpu.name + (f" ×{p.devices}" if p.devices > 1 else ""),
            gib(p.gpu.memory_gib),
            gib(p.needed_gib),
            gib(p.headroom_gib),
            "[green]yes[/green]" if p.fits else "[red]no[/red]",
            best,
            f"{p.tok_s:,.0f}",
            f"{p.mfu:.0%} {p.mfu_source}",
            duration(p.hours),
            money(p.dollars),
            money(p.dollars_per_btok),
            *([f"{human(p.budget_tokens)} / {human(p.budget_steps)}"] if bought else []),
        )
    t.caption = "prices: typical on-demand, dated in the catalog (littlelm/plan/gpus.yaml)"
    return t


def remedy_table(plan: Plan) -> Table:
    t = Table(
        title="remedies where it does not fit (at the configured micro-batch unless named)",
        title_justify="left",
    )
    for col in ("GPU", "change", "saves (GiB)", "needs (GiB)", "fits", "note"):
        t.add_column(col, justify="right" if "GiB" in col else "left")
    for p in plan.gpus:
        if p.fits:
            continue
        for i, r in enumerate(p.remedies):
            t.add_row(
                f"{p.gpu.name} ({gib(p.gpu.memory_gib)})" if i == 0 else "",
                r.name,
                gib(r.saving_gib),
                gib(r.needed_gib),
                "[green]yes[/green]" if r.fits else "no",
                r.note,
            )
        t.add_section()
    return t


def plan_json(plan: Plan) -> dict:
    d = plan.dims
    tr = plan.trace
    return {
        "run": plan.cfg.run.name,
        "parameters": d.n_params,
        "flops_per_token": plan.flops_per_token,
        "micro_batch": d.micro_batch,
        "seq_len": d.seq_len,
        "grad_accum": d.grad_accum,
        "devices": plan.devices,
        "precision": plan.cfg.train.precision,
        "optimizer": d.optimizer,
        "tokens": plan.tokens,
        "memory_bytes": {
            "predicted_cuda": {**plan.estimate.categories, **_phases(plan.estimate.phases)},
            "analytic_cpu_kernels": {
                **plan.cpu_estimate.categories,
                **_phases(plan.cpu_estimate.phases),
            },
            "trace_cpu_kernels": (
                {**tr.categories, **_phases({k: v.total for k, v in tr.phases.items()})}
                if tr
                else None
            ),
        },
        "trace_seconds": tr.seconds if tr else None,
        "trace_over_analytic": plan.trace_check(),
        "resume_gib": plan.resume,
        "notes": plan.notes,
        "gpus": [_gpu_json(p) for p in plan.gpus],
    }


def _phases(phases: dict) -> dict:
    return {f"peak {k}": v for k, v in phases.items()}


def _gpu_json(p: GpuPlan) -> dict:
    return {
        "gpu": p.gpu.name,
        "devices": p.devices,
        "memory_gib": p.gpu.memory_gib,
        "needed_gib": p.needed_gib,
        "headroom_gib": p.headroom_gib,
        "fits": p.fits,
        "budget_gib": p.lines,
        "max_micro_batch": p.best_micro_batch,
        "grad_accum_at_max": p.best_grad_accum,
        "tokens_per_s": p.tok_s,
        **(
            {"budget_tokens": p.budget_tokens, "budget_steps": p.budget_steps}
            if p.budget_tokens is not None
            else {}
        ),
        "mfu": p.mfu,
        "mfu_source": p.mfu_source,
        "hours": p.hours,
        "dollars": p.dollars,
        "dollars_per_billion_tokens": p.dollars_per_btok,
        "price_per_hour": p.gpu.price_per_hour,
        "price_date": p.gpu.price_date,
        "remedies": [r.__dict__ for r in p.remedies],
        "measured": p.measured,
    }
