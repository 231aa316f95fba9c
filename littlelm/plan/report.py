"""The plan and bench results as rich tables for a terminal, as one JSON object (`--json`), or
as a chart (`--chart OUT.png`)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from rich.console import Console
from rich.table import Table

from littlelm.errors import LittleLMError
from littlelm.plan import trace as cat
from littlelm.plan.cost import GIB, GpuPlan, MethodPlan
from littlelm.plan.planner import Plan
from littlelm.plan.saves import checkpoint_json, checkpoint_line
from littlelm.plan.trace import CATEGORIES, KV
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


def table(title: str, *columns: str, left: int = 1) -> Table:
    """A table titled on the left; its first `left` columns are text, the rest numbers."""
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i < left else "right")
    return t


def print_plan(plan: Plan, console: Console | None = None, detail: bool = False) -> None:
    """The renter's view first: one table of the GPUs that can run it, cheapest per token
    first, one line for each that cannot (its best remedy), then memory and resume in a few
    lines. `detail` adds the memory categories, the trace check and every remedy."""
    console = console or Console(width=140)
    console.print(summary_line(plan))
    if plan.price_per_hour is not None:
        console.print(price_line(plan))
    console.print(gpu_table(plan))
    for line in no_fit_lines(plan):
        console.print(line)
    if any(p.methods for p in plan.gpus):
        console.print(methods_table(plan))
    if plan.local is not None:
        console.print(local_table(plan))
    console.print(memory_line(plan))
    console.print(resume_line(plan))
    if plan.checkpoints is not None:
        console.print(checkpoint_line(plan.checkpoints))
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


# what a GPU's `needs` adds to the step's tensor peak: the same words in the text and the chart
NEEDS = "needs = tensor peak + allocator margin + CUDA context & workspaces"


def needs_text(p: GpuPlan) -> str:
    """'needs 114.15 GiB = tensor peak 108.18 + allocator margin 5.41 + CUDA context &
    workspaces 0.56' at the configured micro-batch (the resume's spike, where it is higher,
    is part of the tensor peak)."""
    lines = p.lines
    return (
        f"needs {gib(lines['needed'])} GiB = tensor peak {gib(lines['tensor peak'])} + "
        f"allocator margin {gib(lines['allocator margin'])} + CUDA context & workspaces "
        f"{gib(lines['CUDA context & workspaces'])}"
    )


def no_fit_text(p: GpuPlan) -> str:
    """Why a GPU runs it at no micro-batch and its best remedy (the text's line and the chart's
    label say this, word for word)."""
    fixes = [r for r in p.remedies if r.fits]
    best = (
        f"fits with {fixes[0].name} ({gib(fixes[0].needed_gib)} GiB)"
        if fixes
        else "no single change makes it fit"
    )
    # a fine-tuning run: LoRA is named too, the change that most often makes one fit
    # (not when the first remedy is LoRA already: then the next is QLoRA, a further step)
    lora = [r for r in fixes[1:] if r.name.startswith("lora=")]
    if lora and not fixes[0].name.startswith("lora="):
        best += f", or LoRA: {lora[0].name} ({gib(lora[0].needed_gib)} GiB)"
    return f"fits at no micro-batch ({needs_text(p)} at micro-batch {p.micro_batch}); {best}"


def no_fit_lines(plan: Plan) -> list[str]:
    """One line per GPU that fits at no micro-batch: what it needs and the best remedy."""
    return [
        f"  [red]{p.gpu.name}[/red] ({gib(p.gpu.memory_gib)} GiB) {no_fit_text(p)}"
        for p in plan.gpus
        if p.tok_s is None
    ]


def method_cell(m: MethodPlan) -> str:
    """'fits: 71.20 GiB, $1,234/B' / 'micro-batch 2: ...' / 'no: needs 130.12 GiB'."""
    p = m.plan
    if p.tok_s is None:
        return f"[red]no[/red]: needs {gib(p.needed_gib)} GiB"
    assert p.dollars_per_btok is not None, "a GPU with a speed has a cost (cost.plan_gpu)"
    need = p.needed_gib if p.fits else p.needed_at_best_gib
    assert need is not None, "a GPU with a speed runs at some micro-batch"
    where = (
        "[green]fits[/green]" if p.fits else f"[yellow]micro-batch {p.best_micro_batch}[/yellow]"
    )
    return f"{where}: {gib(need)} GiB, {money(p.dollars_per_btok)}/B tok"


def methods_table(plan: Plan) -> Table:
    """Per GPU, whether full fine-tuning, LoRA and QLoRA fit, and their $ per billion tokens
    (at the configured micro-batch, else the largest that fits with the same tokens per step)."""
    runs = [p for p in plan.gpus if p.methods]
    names = [m.method for m in runs[0].methods]
    t = table("fine-tuning: full, LoRA or QLoRA on each GPU", "GPU", *names)
    for p in runs:
        t.add_row(f"{p.gpu.name} ({gib(p.gpu.memory_gib)})", *(method_cell(m) for m in p.methods))
    parts = []
    for m in runs[0].methods:
        how = f"`{m.change}`" if m.change else "as configured"
        parts.append(f"{m.method}: {human(m.trainable)} trained parameters ({how})")
    t.caption = "; ".join(parts) + ". QLoRA needs CUDA and bitsandbytes (the gpu extra)"
    return t


def memory_line(plan: Plan) -> str:
    e = plan.memory
    per_rank, peak = plan.per_rank()
    parts = ", ".join(f"{k} {gib(v / GIB)}" for k, v in per_rank.items() if v >= 0.005 * GIB)
    who = "per GPU" + (f" ({plan.dims.strategy}, {plan.devices} GPUs)" if plan.devices > 1 else "")
    return (
        f"memory {who} at micro-batch {plan.dims.micro_batch}: tensor peak "
        f"{gib(peak / GIB)} GiB in the {e.peak_phase}"
        + (f" ({parts} GiB)" if parts else "")  # a tiny model: every category under 5 MiB
        + f"; a GPU's {NEEDS} (the table's needs)"
    )


def price_line(plan: Plan) -> str:
    """What --price-per-hour priced: the GPUs named (or every one), this machine."""
    others = len(plan.priced) - ("this machine" in plan.priced) < len(plan.gpus)
    per = "GPU-hour" if plan.priced != ["this machine"] else "hour"
    assert plan.price_per_hour is not None, "print_plan prints this line only with a price"
    return (
        f"price: {money(plan.price_per_hour)} per {per} for {plan.price_scope} (--price-per-hour)"
        + (f"; the {'other ' * (per != 'hour')}GPUs at the catalog's prices" if others else "")
    )


def resume_line(plan: Plan) -> str:
    r = plan.resume
    step = plan.per_rank()[1] / GIB
    where = "below" if r["device_gib"] <= step else "[red]above[/red]"
    return (
        f"resume: {gib(r['device_gib'])} GiB per GPU while loading, {where} the step's peak; "
        f"host RAM {gib(r['host_gib'])} GiB per node: the checkpoint memory-mapped once "
        f"({gib(r['host_page_cache_gib'])} GiB of page cache, shared by {r['ranks_per_node']} "
        f"rank(s)) + {gib(r['host_private_gib'])} GiB the ranks copy one tensor at a time"
    )


def local_table(plan: Plan) -> Table:
    lp = plan.local
    assert lp is not None, "print_plan prints this table only for a local plan"
    kinds = ("GEMMs", "attention", "elementwise", "optimizer")
    title = f"this machine: {lp.device}, {lp.precision}"
    prices: tuple[str, ...] = ()  # $/h and cost, with --price-per-hour (which sets both)
    if lp.dollars is not None and lp.price_per_hour is not None:
        prices = (money(lp.price_per_hour), money(lp.dollars))
    cost = ("$/h", "cost") if prices else ()
    t = table(title, "tokens/s", "step (s)", *kinds, "process memory", "time", *cost, left=0)
    t.add_row(
        f"{lp.tok_s:,.0f}",
        f"{sum(lp.parts.values()):.3f}",
        *(f"{lp.parts.get(k, 0.0):.3f}" for k in kinds),
        f"{gib(lp.process_peak / GIB)} GiB",
        duration(lp.hours),
        *prices,
    )
    t.caption = f"speed: {lp.source}\nprocess memory: {lp.memory_source}"
    return t


def summary_line(plan: Plan) -> str:
    d, cfg = plan.dims, plan.cfg
    n = d.n_params
    tokens_step = d.tokens * d.grad_accum * plan.devices
    lora = ""
    if d.lora is not None:  # what a LoRA run trains of its parameters
        lora = f" ({human(d.n_trainable)} trained: {'Q' * d.lora.nf4}LoRA rank {d.lora.rank})"
    shape = f"micro-batch {d.micro_batch} × seq {d.seq_len} × accum {d.grad_accum}"
    g = d.groups
    if g is not None:  # RL: groups of replies, each group its own forward and backward
        tokens_step *= g.count
        rows = "measured in rl.prompts" if g.measured else "the longest model.max_seq_len allows"
        shape = (
            f"RL: {g.count} prompts × {g.size} replies × {g.width} tokens (prompt {g.prompt}, "
            f"{rows}); sampling and scoring not in the speed"
        )
    return (
        f"[bold]{cfg.run.name}[/bold]: {human(n)} parameters{lora}, "
        f"{human(plan.flops_per_token)} FLOPs/token; {shape}"
        + (f" × {plan.devices} GPUs" if plan.devices > 1 else "")
        + f" = {tokens_step:,} tokens/step; {cfg.train.precision}, {d.optimizer.name}; "
        + budget_text(plan)
    )


def budget_text(plan: Plan) -> str:
    b = plan.cfg.train.budget
    if plan.gpus and plan.gpus[0].budget_tokens is not None:  # a time or money budget
        assert b is not None, "budget_tokens is set only under a budget (cost.apply_budget)"
        what = f"{b.hours:g} hours" if b.kind == "hours" else f"${b.dollars:g}"
        return f"budget {what} (the table shows the tokens and steps it buys on each GPU)"
    return f"budget {human(plan.tokens)} tokens"


def memory_table(plan: Plan) -> Table:
    """The plan's memory by category beside the trace and the analytic model of the same step
    (unscaled), with their ratio: the check that the formulas describe the code."""
    e, an, tr = plan.memory, plan.analytic, plan.trace
    title = f"memory per GPU at micro-batch {plan.dims.micro_batch} (GiB)"
    t = table(title, "category", "plan", "trace", "analytic", "trace / analytic")
    check = plan.trace_check()
    for k in CATEGORIES:
        if k == KV and not e.categories[k]:
            continue  # RL's sampling only
        traced = gib(tr.categories[k] / GIB) if tr else "-"
        a = an.categories[k] / GIB
        t.add_row(k, gib(e.categories[k] / GIB), traced, gib(a), _ratio(check.get(k)))
    for phase in e.phases:  # RL's sampling first, then every objective's two
        peak = tr.phases.get(phase) if tr else None
        t.add_row(
            f"[bold]peak: {phase}[/bold]",
            gib(e.phases[phase] / GIB),
            gib(peak / GIB) if peak is not None else "-",
            gib(an.phases[phase] / GIB),
            _ratio(peak / an.phases[phase] if peak is not None else None),
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
    t = table(
        "GPUs that can run it, cheapest per token first",
        *("GPU", "needs / has (GiB)", "micro-batch (accum)", "tokens/s", "MFU", "time"),
        *("$/GPU-h", "cost", "$/B tokens"),
    )
    bought = bool(runs) and runs[0].budget_tokens is not None
    if bought:  # a time or money budget: what it buys on each GPU
        t.add_column("budget buys (tokens / steps)", justify="right")
    for p in runs:
        mb = p.micro_batch if p.fits else p.best_micro_batch
        accum = plan.dims.grad_accum if p.fits else p.best_grad_accum
        need = p.needed_gib if p.fits else p.needed_at_best_gib
        # a GPU with a speed runs at some micro-batch: cost.gpu_plan sets all of these then
        assert need is not None and p.hours is not None and p.mfu is not None
        assert p.dollars is not None and p.dollars_per_btok is not None
        buys = []
        if bought:  # a budget buys tokens and steps on every GPU that runs (cost.apply_budget)
            assert p.budget_tokens is not None and p.budget_steps is not None
            buys = [f"{human(p.budget_tokens)} / {human(p.budget_steps)}"]
        t.add_row(
            p.gpu.name + (f" ×{p.devices}" if p.devices > 1 else ""),
            f"{gib(need)} / {gib(p.gpu.memory_gib)}",
            f"{mb} ({accum})" + ("" if p.fits else " [yellow]smaller[/yellow]"),
            f"{p.tok_s:,.0f}",
            f"{p.mfu:.0%}",
            duration(p.hours),
            money(p.gpu.price_per_hour),
            money(p.dollars),
            money(p.dollars_per_btok),
            *buys,
        )
    sources = sorted({p.mfu_source for p in runs})
    t.caption = f"speed: {'; '.join(sources) or '-'}. Prices: {price_words(plan)}"
    return t


def price_words(plan: Plan) -> str:
    gpus = [n for n in plan.priced if n != "this machine"]
    catalog = "on-demand, dated in littlelm/plan/gpus.yaml"
    if not gpus:
        return catalog
    assert plan.price_per_hour is not None, "GPUs are priced here by --price-per-hour"
    mine = f"{money(plan.price_per_hour)} per GPU-hour (--price-per-hour)"
    return mine if len(gpus) == len(plan.gpus) else f"{', '.join(gpus)} {mine}; others {catalog}"


def remedy_table(plan: Plan) -> Table:
    title = "remedies where it does not fit (at the configured micro-batch unless named)"
    t = table(title, "GPU", "change", "saves (GiB)", "needs (GiB)", "fits", "note", left=2)
    t.columns[4].justify = t.columns[5].justify = "left"  # fits, note
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
        "trainable_parameters": d.n_trainable,
        "lora": d.lora.__dict__ if d.lora else None,
        "flops_per_token": plan.flops_per_token,
        "micro_batch": d.micro_batch,
        "seq_len": d.seq_len,
        "grad_accum": d.grad_accum,
        "devices": plan.devices,
        "precision": plan.cfg.train.precision,
        "optimizer": d.optimizer.name,
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
        "checkpoints": checkpoint_json(plan.checkpoints) if plan.checkpoints else None,
        "memory_per_rank_bytes": plan.per_rank()[0],
        "price_per_hour": plan.price_per_hour,
        "priced": plan.priced,
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
        "price_source": p.gpu.price_source or "catalog",
        "price_date": p.gpu.price_date,
        "needs": needs_text(p),
        "remedies": [r.__dict__ for r in p.remedies],
        "measured": p.measured,
        "methods": [
            {
                "method": m.method,
                "change": m.change,
                "trainable_parameters": m.trainable,
                "fits": m.plan.fits,
                "runs": m.plan.tok_s is not None,
                "needed_gib": m.plan.needed_gib,
                "micro_batch": m.plan.micro_batch if m.plan.fits else m.plan.best_micro_batch,
                "needed_gib_at_micro_batch": (
                    m.plan.needed_gib if m.plan.fits else m.plan.needed_at_best_gib
                ),
                "tokens_per_s": m.plan.tok_s,
                "dollars": m.plan.dollars,
                "dollars_per_billion_tokens": m.plan.dollars_per_btok,
            }
            for m in p.methods
        ],
    }


# ----------------------------------------------------------------------------------------------
# bench's report


def comparison_rows(r: dict) -> list[tuple[str, float | None, float | None, str]]:
    """(what, measured, predicted, unit) rows."""
    g = GIB
    if r["kind"] == "cuda":
        rows = [
            ("peak allocated", r["peak_allocated"] / g, r["predicted_allocated"] / g, "GiB"),
            ("peak reserved", r["peak_reserved"] / g, r["predicted_reserved"] / g, "GiB"),
            ("outside PyTorch (context)", r["outside_pytorch"] / g, None, "GiB"),
        ]
    else:
        peak, rss, predicted = r.get("peak_tensor"), r["peak_rss"], r.get("predicted_rss")
        rows = [
            ("peak tensor memory", peak and peak / g, r["predicted_tensor_peak"] / g, "GiB"),
            ("peak RSS", rss and rss / g, predicted and predicted / g, "GiB"),
            ("host RAM for a resume", None, r["predicted_host_resume"] / g, "GiB"),
        ]
    rows.append(("tokens/s", r["tok_s"], r.get("predicted_tok_s"), ""))
    rows.append(("MFU", r["mfu"], None, ""))
    return rows


def print_bench(r: dict) -> None:
    title = (
        f"bench on {r['device']}: {r['steps']} steps with a save and a resume "
        f"(to step {r['resumed_to_step']}), {r['wall_s']:.1f} s"
    )
    t = table(title, "", "measured", "predicted", "measured / predicted")
    for name, meas, pred, unit in comparison_rows(r):
        ratio = f"{meas / pred:.3f}" if meas is not None and pred else "-"
        t.add_row(name, _fmt(meas, unit), _fmt(pred, unit), ratio)
    console = Console(width=120)
    console.print(t)
    if r["kind"] == "cpu":
        console.print(
            "  predicted tensor peak: the plan's trace (CPU kernels). "
            + (
                "peak RSS covers the bench window."
                if r["rss_peak_is_window"]
                else "peak RSS is the process's lifetime peak (could not reset it)."
            )
        )
    if r.get("speed_ratio"):
        use = (
            "plan calibrates its speed on this device with it: measured step time = "
            f"{r['speed_ratio']:.2f} x the step model's"
        )
    else:  # an RL run's: its sampling is not in the step model, so its time calibrates nothing
        use = "its memory only: an RL step's time, mostly sampling, calibrates no plan"
    console.print(f"  stored: {r['stored']} ({use})")


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "GiB":
        return f"{x:.3f} GiB"
    if x < 1:
        return f"{x:.1%}"
    return f"{x:,.0f}"


# ----------------------------------------------------------------------------------------------
# --chart

# each segment's colour: its index in the run reports' PALETTE (littlelm/report/plots.py)
SEGMENTS: tuple[str, ...] = (
    cat.PARAMS,
    cat.ACT,
    cat.STATE,
    cat.GRADS,
    cat.COPIES,
    cat.LOSS,
    cat.BWD,
    cat.SCRATCH,
)
SEGMENTS += ("CUDA context & workspaces", "allocator margin")


def memory_segments(plan: Plan, gpu_index: int) -> dict[str, float]:
    """GiB per segment of one GPU's bar: what is alive at the peak, then margin and context."""
    p = plan.gpus[gpu_index]
    e = plan.memory
    seg = {k: v / GIB for k, v in e.breakdowns[e.peak_phase].items() if v}
    seg["allocator margin"] = p.lines["allocator margin"]
    seg["CUDA context & workspaces"] = p.lines["CUDA context & workspaces"]
    if p.lines["resume spike"]:
        seg["resume spike"] = p.lines["resume spike"]
    return seg


def plan_chart(plan: Plan, out: str | Path) -> Path:
    """`plan_figure` written to the PNG file `out`."""
    from littlelm.report.plots import save_png

    try:
        return save_png(plan_figure(plan), out)
    except OSError as e:
        raise LittleLMError(f"cannot write the chart to {out}: {e}") from None


def plan_figure(plan: Plan):
    """Memory by category on each GPU against its capacity, and dollars per billion tokens at
    each GPU's price per hour, drawn with the run reports' helpers (littlelm/report/plots.py:
    object API, Agg canvas)."""
    from littlelm.report.plots import new_figure

    fig = new_figure(1, 2, width=12, row_height=0.45 * len(plan.gpus) + 1.6)
    ax_mem, ax_cost = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
    names = [f"{p.gpu.name}\n{money(p.gpu.price_per_hour)}/GPU-h" for p in plan.gpus]
    ys = list(range(len(names)))[::-1]
    _memory_panel(ax_mem, plan, ys)
    _cost_panel(ax_cost, plan, ys)
    ax_mem.set_yticks(ys, names)
    d = plan.dims
    gpus = f" x {plan.devices} GPUs ({d.strategy})" if plan.devices > 1 else ""
    fig.suptitle(
        f"{plan.cfg.run.name}: {d.n_params / 1e9:.3g}B parameters, micro-batch "
        f"{d.micro_batch} x {d.seq_len}{gpus}, {plan.tokens / 1e9:.3g}B tokens"
        + (f"; {price_words(plan)}" if plan.priced else "")
    )
    return fig


def _memory_panel(ax, plan: Plan, ys: list[int]) -> None:
    from littlelm.report.plots import PALETTE

    labelled = set()
    for i, y in enumerate(ys):
        left = 0.0
        for name, size in memory_segments(plan, i).items():
            label = name if name not in labelled else None
            labelled.add(name)
            color = PALETTE[SEGMENTS.index(name)] if name in SEGMENTS else "#444444"
            ax.barh(y, size, left=left, color=color, label=label)
            left += size
        ax.text(left, y, f" needs {gib(left)}", va="center", fontsize=7)
        cap = plan.gpus[i].gpu.memory_gib
        ax.plot([cap, cap], [y - 0.45, y + 0.45], color="black", linewidth=2.5)
    widest = max(
        max(sum(memory_segments(plan, i).values()), p.gpu.memory_gib)
        for i, p in enumerate(plan.gpus)
    )
    ax.set_xlim(0, widest * 1.18)  # room for the "needs" labels
    ax.plot([], [], color="black", linewidth=2.5, label="GPU memory")
    ax.set_xlabel(f"GiB per GPU at the configured micro-batch\n{NEEDS}")
    # outside the axes, below both panels: constrained layout makes room, clear of the x label
    ax.figure.legend(fontsize=7, loc="outside lower center", ncols=6, frameon=False)
    _style(ax)


def _cost_panel(ax, plan: Plan, ys: list[int]) -> None:
    for p, y in zip(plan.gpus, ys):
        runs = p.dollars_per_btok is not None
        if not runs:  # no bar: a run that cannot fit has no cost; the text's words instead
            ax.text(0, y, textwrap.fill(no_fit_text(p), 60), va="center", fontsize=6)
            continue
        ax.barh(
            y,
            p.dollars_per_btok,
            color="#2ca02c" if p.fits else "#ff7f0e",
            hatch="" if p.fits else "//",
            label="fits as configured" if p.fits else "fits at a smaller micro-batch",
        )
        note = "" if p.fits else f" at micro-batch {p.best_micro_batch}"
        ax.text(
            p.dollars_per_btok, y, f" ${p.dollars_per_btok:,.0f}{note}", va="center", fontsize=7
        )
    handles, labels = ax.get_legend_handles_labels()
    keep = dict(zip(labels, handles))  # one entry per colour
    if keep:
        ax.legend(
            keep.values(),
            keep.keys(),
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            frameon=False,
        )
    ax.set_xlabel("USD per billion tokens\nat the price beside each GPU (speed: the step model)")
    _style(ax)


def _style(ax) -> None:
    from littlelm.report.plots import style_axes

    style_axes(ax)
    ax.grid(False, axis="y")
