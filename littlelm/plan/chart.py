"""`littlelm plan --chart OUT.png`: memory by category on each GPU against its capacity, and
dollars per billion tokens. Drawn with the report's helpers (littlelm/report/plots.py: object
API, Agg canvas, no pyplot state) so the plan's chart looks like the run reports."""

from __future__ import annotations

from pathlib import Path

from littlelm.errors import LittleLMError
from littlelm.plan import memory as mem
from littlelm.plan.cost import GIB
from littlelm.plan.planner import Plan
from littlelm.report.plots import PALETTE, new_figure, save_png, style_axes

COLORS = {
    mem.PARAMS: PALETTE[0],
    mem.GRADS: PALETTE[3],
    mem.STATE: PALETTE[2],
    mem.COPIES: PALETTE[4],
    mem.ACT: PALETTE[1],
    mem.LOSS: PALETTE[5],
    mem.BWD: PALETTE[6],
    mem.SCRATCH: PALETTE[7],
    "allocator margin": PALETTE[9],
    "CUDA context & workspaces": PALETTE[8],
}


def memory_segments(plan: Plan, gpu_index: int) -> dict[str, float]:
    """GiB per segment of one GPU's bar: what is alive at the peak, then margin and context."""
    p = plan.gpus[gpu_index]
    seg = {k: v / GIB for k, v in plan.memory.peak_breakdown().items() if v}
    seg["allocator margin"] = p.lines["allocator margin"]
    seg["CUDA context & workspaces"] = p.lines["CUDA context & workspaces"]
    for extra in ("DDP gradient buckets", "resume spike"):
        if p.lines.get(extra):
            seg[extra] = p.lines[extra]
    return seg


def plan_chart(plan: Plan, out: str | Path) -> Path:
    fig = new_figure(1, 2, width=12, row_height=0.45 * len(plan.gpus) + 1.6)
    ax_mem, ax_cost = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
    names = [p.gpu.name for p in plan.gpus]
    ys = list(range(len(names)))[::-1]
    _memory_panel(ax_mem, plan, ys)
    _cost_panel(ax_cost, plan, ys)
    ax_mem.set_yticks(ys, names)
    fig.suptitle(
        f"{plan.cfg.run.name}: {plan.dims.n_params / 1e9:.3g}B parameters, micro-batch "
        f"{plan.dims.micro_batch} x {plan.dims.seq_len}, {plan.tokens / 1e9:.3g}B tokens"
    )
    try:
        return save_png(fig, out)
    except OSError as e:
        raise LittleLMError(f"cannot write the chart to {out}: {e}") from None


def _memory_panel(ax, plan: Plan, ys: list[int]) -> None:
    labelled = set()
    for i, y in enumerate(ys):
        left = 0.0
        for name, gib in memory_segments(plan, i).items():
            label = name if name not in labelled else None
            labelled.add(name)
            ax.barh(y, gib, left=left, color=COLORS.get(name, "#444444"), label=label)
            left += gib
        cap = plan.gpus[i].gpu.memory_gib
        ax.plot([cap, cap], [y - 0.45, y + 0.45], color="black", linewidth=2.5)
    ax.plot([], [], color="black", linewidth=2.5, label="GPU memory")
    ax.set_xlabel("memory per GPU at the configured micro-batch (GiB)")
    # outside the axes, below both panels: constrained layout makes room, clear of the x label
    ax.figure.legend(fontsize=7, loc="outside lower center", ncols=6, frameon=False)
    _style(ax)


def _cost_panel(ax, plan: Plan, ys: list[int]) -> None:
    for p, y in zip(plan.gpus, ys):
        runs = p.dollars_per_btok is not None
        if not runs:  # no bar: a run that cannot fit has no cost
            ax.text(0, y, " does not fit at any micro-batch", va="center", fontsize=7)
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
    ax.set_xlabel("USD per billion tokens (speed from the step model, plan/speed.py)")
    _style(ax)


def _style(ax) -> None:
    style_axes(ax)
    ax.grid(False, axis="y")
