"""The plan as rich tables for a terminal, or as one JSON object (`--json`)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from littlelm.plan.accounting import CATEGORIES, FB, OPT
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


def print_plan(plan: Plan, console: Console | None = None, detail: bool = False) -> None:
    """The renter's view first: one table of the GPUs that can run it, cheapest per token
    first, one line for each that cannot (its best remedy), then memory and resume in a few
    lines. `detail` adds the memory categories, the trace check and every remedy."""
    console = console or Console(width=140)
    console.print(summary_line(plan))
    console.print(gpu_table(plan))
    for line in no_fit_lines(plan):
        console.print(line)
    if plan.local is not None:
        console.print(local_table(plan))
    console.print(memory_line(plan))
    console.print(resume_line(plan))
    if not detail:
        console.print("  [dim]--detail: memory by category, trace check, every remedy[/dim]")
        return
    console.print(memory_table(plan))
    for note in plan.notes:
        console.print(f"  [dim]note: {note}[/dim]")
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


def no_fit_lines(plan: Plan) -> list[str]:
    """One line per GPU that fits at no micro-batch: what it needs and the best remedy."""
    out = []
    for p in plan.gpus:
        if p.tok_s is not None:
            continue
        fixes = [r for r in p.remedies if r.fits]
        best = (
            f"fits with {fixes[0].name} ({gib(fixes[0].needed_gib)} GiB)"
            if fixes
            else "no single change makes it fit"
        )
        out.append(
            f"  [red]{p.gpu.name}[/red] ({gib(p.gpu.memory_gib)} GiB) fits at no micro-batch "
            f"({gib(p.needed_gib)} GiB at {p.micro_batch}); {best}"
        )
    return out


def memory_line(plan: Plan) -> str:
    e = plan.memory
    per_rank = plan.per_rank_categories()
    parts = ", ".join(f"{k} {gib(v / GIB)}" for k, v in per_rank.items() if v >= 0.005 * GIB)
    who = "per GPU" + (f" ({plan.dims.strategy}, {plan.devices} GPUs)" if plan.devices > 1 else "")
    return (
        f"memory {who} at micro-batch {plan.dims.micro_batch}: peak "
        f"{gib(plan.per_rank_peak() / GIB)} GiB in the {e.peak_phase}"
        + (f" ({parts} GiB)" if parts else "")  # a tiny model: every category under 5 MiB
    )


def resume_line(plan: Plan) -> str:
    r = plan.resume
    step = plan.per_rank_peak() / GIB
    where = "below" if r["device_gib"] <= step else "[red]above[/red]"
    return (
        f"resume: {gib(r['device_gib'])} GiB per GPU while loading, {where} the step's peak; "
        f"host RAM {gib(r['host_gib'])} GiB per node: the checkpoint memory-mapped once "
        f"({gib(r['host_page_cache_gib'])} GiB of page cache, shared by {r['ranks_per_node']} "
        f"rank(s)) + {gib(r['host_private_gib'])} GiB the ranks copy one tensor at a time"
    )


def local_table(plan: Plan) -> Table:
    lp = plan.local
    t = Table(title=f"this machine: {lp.device}, {lp.precision}", title_justify="left")
    for col in ("tokens/s", "step (s)", "GEMMs", "attention", "elementwise", "optimizer"):
        t.add_column(col, justify="right")
    t.add_column("process memory", justify="right")
    t.add_column("time", justify="right")
    t.add_row(
        f"{lp.tok_s:,.0f}",
        f"{sum(lp.parts.values()):.3f}",
        *(
            f"{lp.parts.get(k, 0.0):.3f}"
            for k in ("GEMMs", "attention", "elementwise", "optimizer")
        ),
        f"{gib(lp.process_peak / GIB)} GiB",
        duration(lp.hours),
    )
    t.caption = f"speed: {lp.source}\nprocess memory: {lp.memory_source}"
    return t


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
    """The plan's memory by category beside the trace and the analytic model of the same step
    (unscaled), with their ratio: the check that the formulas describe the code."""
    e, an, tr = plan.memory, plan.analytic, plan.trace
    t = Table(
        title=f"memory per GPU at micro-batch {plan.dims.micro_batch} (GiB)",
        title_justify="left",
    )
    for col in ("category", "plan", "trace", "analytic", "trace / analytic"):
        t.add_column(col, justify="left" if col == "category" else "right")
    check = plan.trace_check()
    for k in CATEGORIES:
        traced = gib(tr.categories[k] / GIB) if tr else "-"
        a = an.categories[k] / GIB
        t.add_row(k, gib(e.categories[k] / GIB), traced, gib(a), _ratio(check.get(k)))
    for phase in (FB, OPT):
        traced = tr.phases[phase] if tr else None
        t.add_row(
            f"[bold]peak: {phase}[/bold]",
            gib(e.phases[phase] / GIB),
            gib(traced / GIB) if traced is not None else "-",
            gib(an.phases[phase] / GIB),
            _ratio(traced / an.phases[phase] if traced is not None else None),
        )
    t.caption = f"plan: the {e.source}" + (f"; the trace took {tr.seconds:.1f} s" if tr else "")
    return t


def _ratio(r: float | None) -> str:
    if r is None:
        return "-"
    if not math.isfinite(r):
        return "inf"
    flag = "" if abs(r - 1) <= 0.10 else " [red]!"
    return f"{r:.3f}{flag}"


def gpu_table(plan: Plan) -> Table:
    runs = [p for p in plan.gpus if p.tok_s is not None]
    t = Table(title="GPUs that can run it, cheapest per token first", title_justify="left")
    for col, right in (
        ("GPU", False),
        ("needs / has (GiB)", True),
        ("micro-batch (accum)", True),
        ("tokens/s", True),
        ("MFU", True),
        ("time", True),
        ("cost", True),
        ("$/B tokens", True),
    ):
        t.add_column(col, justify="right" if right else "left")
    bought = bool(runs) and runs[0].budget_tokens is not None
    if bought:  # a time or money budget: what it buys on each GPU
        t.add_column("budget buys (tokens / steps)", justify="right")
    for p in runs:
        mb = p.micro_batch if p.fits else p.best_micro_batch
        accum = plan.dims.grad_accum if p.fits else p.best_grad_accum
        t.add_row(
            p.gpu.name + (f" ×{p.devices}" if p.devices > 1 else ""),
            f"{gib(p.needed_gib if p.fits else p.needed_at_best_gib)} / {gib(p.gpu.memory_gib)}",
            f"{mb} ({accum})" + ("" if p.fits else " [yellow]smaller[/yellow]"),
            f"{p.tok_s:,.0f}",
            f"{p.mfu:.0%}",
            duration(p.hours),
            money(p.dollars),
            money(p.dollars_per_btok),
            *([f"{human(p.budget_tokens)} / {human(p.budget_steps)}"] if bought else []),
        )
    sources = sorted({p.mfu_source for p in runs})
    t.caption = (
        f"speed: {'; '.join(sources) or '-'}. Prices: on-demand, dated in littlelm/plan/gpus.yaml"
    )
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
            "plan": _memory_json(plan.memory),
            "trace": _memory_json(tr) if tr else None,
            "analytic": _memory_json(plan.analytic),
        },
        "memory_source": plan.memory.source,
        "trace_scale": d.trace_scale,
        "trace_seconds": tr.seconds if tr else None,
        "trace_over_analytic": plan.trace_check(),
        "resume_gib": plan.resume,
        "memory_per_rank_bytes": plan.per_rank_categories(),
        "local": (
            {k: v for k, v in plan.local.__dict__.items() if k != "rates"} if plan.local else None
        ),
        "notes": plan.notes,
        "gpus": [_gpu_json(p) for p in plan.gpus],
    }


def _memory_json(m) -> dict:
    return {**m.categories, **{f"peak {k}": v for k, v in m.phases.items()}}


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
        "speed_source": p.mfu_source,
        "hours": p.hours,
        "dollars": p.dollars,
        "dollars_per_billion_tokens": p.dollars_per_btok,
        "price_per_hour": p.gpu.price_per_hour,
        "price_date": p.gpu.price_date,
        "remedies": [r.__dict__ for r in p.remedies],
        "measured": p.measured,
    }
