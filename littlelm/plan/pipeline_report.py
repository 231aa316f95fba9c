"""What `littlelm plan STAGE.yaml STAGE.yaml ...` prints: the choice, one row per GPU kind (its
cheapest count in time), each stage's hours and dollars, the total; `--json` all of it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from littlelm.plan.pipeline import Option, PipelinePlan, StagePlan
from littlelm.progress import human


def _h(hours: float | None) -> str:
    if hours is None:  # a stage that runs nowhere: never printed as a time
        return "-"
    return f"{hours:,.1f} h" if hours >= 1 else f"{hours * 60:,.1f} min"


def _usd(dollars: float | None) -> str:
    if dollars is None:
        return "-"
    return f"${dollars:,.0f}" if dollars >= 100 else f"${dollars:,.2f}"


def _in_time(plan: PipelinePlan, o: Option) -> bool:
    return o.fits and (plan.deadline is None or (o.hours or 0.0) <= plan.deadline)


def best_per_kind(plan: PipelinePlan) -> list[Option]:
    """Each GPU kind's cheapest count in time (else its fastest that fits), cheapest first."""
    best: dict[str, Option] = {}
    for o in plan.options:
        if not o.fits:
            continue
        b = best.get(o.gpu)
        key = (not _in_time(plan, o), o.dollars if _in_time(plan, o) else o.hours)
        if b is None or key < (not _in_time(plan, b), b.dollars if _in_time(plan, b) else b.hours):
            best[o.gpu] = o
    return sorted(best.values(), key=lambda o: (not _in_time(plan, o), o.dollars or 0.0))


def _cell(s: StagePlan) -> str:
    if not s.fits or s.plan is None:
        return "does not fit" if not s.problem else "cannot run"
    mark = " fsdp" if s.strategy == "fsdp" and s.plan.devices > 1 else ""
    mb = "" if s.plan.fits else f" mb {s.plan.best_micro_batch}"
    return f"{_h(s.plan.hours)} {_usd(s.plan.dollars)}{mark}{mb}"


def _option(o: Option) -> str:
    parts = "; ".join(
        f"{s.stage.name} {_h(s.plan.hours)} {_usd(s.plan.dollars)}"
        for s in o.stages
        if s.plan and s.plan.hours is not None
    )
    return f"{o.devices} x {o.gpu}: {_h(o.hours)}, {_usd(o.dollars)} ({parts})"


def print_pipeline(plan: PipelinePlan, console: Console | None = None) -> None:
    console = console or Console(width=140)
    first = plan.options[0].stages if plan.options else []
    chain = " -> ".join(f"{s.stage.name} ({human(s.tokens)} tokens)" for s in first)
    console.print(f"pipeline: {chain}", highlight=False)
    for note in plan.notes:
        console.print(f"  {note} (its base is not trained yet)", highlight=False)
    deadline = f" within {plan.deadline:,g} h" if plan.deadline is not None else ""
    if plan.choice:
        console.print(f"[bold]cheapest{deadline}:[/] {_option(plan.choice)}", highlight=False)
    elif plan.closest:
        console.print(
            f"[bold]no GPU kind and count finishes{deadline}[/]; closest: {_option(plan.closest)}",
            highlight=False,
        )
    else:
        console.print("[bold]no GPU kind and count runs every stage[/]", highlight=False)
    t = Table(title="each GPU kind at its cheapest count in time (else its fastest)")
    for col in ["GPU", *(s.stage.name for s in first), "total", f"in time{deadline}"]:
        t.add_column(col, justify="left" if col == "GPU" else "right")
    for o in best_per_kind(plan):
        t.add_row(
            f"{o.devices} x {o.gpu} (${o.price_per_hour:,.2f}/GPU-h)",
            *(_cell(s) for s in o.stages),
            f"{_h(o.hours)} {_usd(o.dollars)}",
            "yes" if _in_time(plan, o) else "no",
        )
    console.print(t)
    kinds = {o.gpu for o in plan.options}
    runs = {o.gpu for o in plan.options if o.fits}
    if kinds - runs:
        counts = ", ".join(str(n) for n in sorted({o.devices for o in plan.options}))
        console.print(
            f"fit at no count ({counts}): {', '.join(sorted(kinds - runs))}", highlight=False
        )
    console.print(
        "speed: the step model calibrated by published runs (docs/planning.md); time is tokens / "
        "speed per stage (evaluation and checkpoints not included); cost = hours x price x GPUs",
        highlight=False,
    )


def _stage_json(s: StagePlan) -> dict:
    p = s.plan
    return {
        "stage": s.stage.name,
        "fits": s.fits,
        "strategy": s.strategy,
        "tokens": s.tokens,
        "micro_batch": (p.micro_batch if p.fits else p.best_micro_batch) if p else None,
        "needed_gib": p.needed_gib if p else None,
        "tok_s": p.tok_s if p else None,
        "hours": p.hours if p else None,
        "dollars": p.dollars if p else None,
        "speed_source": p.mfu_source if p else None,
        "problem": s.problem or None,
    }


def _option_json(plan: PipelinePlan, o: Option | None) -> dict | None:
    if o is None:
        return None
    return {
        "gpu": o.gpu,
        "devices": o.devices,
        "price_per_hour": o.price_per_hour,
        "fits": o.fits,
        "in_time": _in_time(plan, o),
        "hours": o.hours,
        "dollars": o.dollars,
        "stages": [_stage_json(s) for s in o.stages],
    }


def pipeline_json(plan: PipelinePlan) -> dict:
    return {
        "stages": [
            {"name": s.name, "config": s.path, "planned_from": s.based_on or None}
            for s in plan.stages
        ],
        "deadline_hours": plan.deadline,
        "choice": _option_json(plan, plan.choice),
        "closest": _option_json(plan, plan.closest),
        "options": [_option_json(plan, o) for o in plan.options],
    }
