"""PNG charts from plain data, with matplotlib's object API (no pyplot, no global state).

    fig = line_figure("Loss", [Panel("loss (nats/token)", [Line("demo", x, y)])],
                      xlabel="tokens seen (millions)")
    save_png(fig, "loss.png")

Everything here takes lists of numbers and strings, not run directories, so any command can
draw with it (the report today; the planner's memory and cost charts can use `new_figure`,
`style_axes` and `save_png` the same way). Every axis gets a label with its unit: `line_figure`
refuses a panel without one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

PALETTE = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
]
LINESTYLES = ["-", "--", ":", "-."]
DPI = 110


@dataclass
class Line:
    label: str
    x: Sequence[float] | np.ndarray
    y: Sequence[float] | np.ndarray
    color: str | None = None
    style: str = "-"
    marker: str | None = None


@dataclass
class Panel:
    ylabel: str  # with its unit in parentheses: "loss (nats/token)"
    lines: list[Line]
    title: str = ""
    log_y: bool = False
    ylim: tuple[float | None, float | None] | None = None
    notes: list[str] = field(default_factory=list)  # small text in the corner


def new_figure(rows: int, cols: int, width: float = 9.0, row_height: float = 3.4) -> Figure:
    fig = Figure(figsize=(width, row_height * rows + 0.6), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def style_axes(ax: Axes) -> None:
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=9)


def save_png(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, format="png", dpi=DPI)
    return path


def token_scale(max_tokens: float) -> tuple[float, str]:
    """(divisor, word) to show token counts readably: 2.4e6 -> (1e6, 'millions')."""
    for div, word in ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands")):
        if max_tokens >= div:
            return div, word
    return 1.0, ""


def line_figure(
    title: str,
    panels: list[Panel],
    xlabel: str,
    top_axis: tuple[str, Callable, Callable] | None = None,
    cols: int = 1,
) -> Figure:
    """One panel per row (or `cols` per row), sharing the x axis.

    top_axis: (label, forward, inverse) adds a second x scale on top (e.g. optimizer steps)."""
    assert panels, "a figure needs at least one panel"
    for p in panels:
        assert p.ylabel.endswith(")") and "(" in p.ylabel, f"y label without a unit: {p.ylabel}"
    rows = math.ceil(len(panels) / cols)
    fig = new_figure(rows, cols, width=9.0 if cols == 1 else 5.0 * cols)
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        draw_panel(ax, panel)
    if all(min(line.x, default=0) >= 0 for p in panels for line in p.lines):
        # each panel fixed its own range; the shared axis must cover every panel's points
        axes[0].autoscale(axis="x")
        axes[0].set_xlim(left=0)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[: len(panels)]):
        if i >= len(panels) - cols:  # the bottom panel of each column
            ax.set_xlabel(xlabel)
            ax.tick_params(labelbottom=True)
    if top_axis is not None:
        label, forward, inverse = top_axis
        for ax in axes[: min(cols, len(panels))]:
            top = ax.secondary_xaxis("top", functions=(forward, inverse))
            top.set_xlabel(label, fontsize=9)
            top.tick_params(labelsize=8)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig


PLAIN = FuncFormatter(lambda v, _: f"{v:g}")


def log_axis(ax: Axes, lines: list[Line]) -> None:
    """Log y axis with plain numbers (0.5, 2, 5) instead of 5×10⁻¹; 2 and 5 labelled too when
    the data spans under three decades, so a short range still has readable ticks."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN)
    values = [v for line in lines for v in line.y if v > 0 and math.isfinite(v)]
    narrow = bool(values) and max(values) / min(values) < 1e3
    ax.yaxis.set_minor_locator(LogLocator(subs=(2, 5) if narrow else ()))
    ax.yaxis.set_minor_formatter(PLAIN if narrow else NullFormatter())


def lone_points(y: Sequence[float] | np.ndarray) -> bool:
    """True when some finite value has no finite neighbour (a series of one logged point, or
    one between gaps): a line alone draws nothing there, so such a series gets markers."""
    ok = np.pad(np.isfinite(np.asarray(y, dtype=float)), 1)  # False beyond both ends
    return bool(np.any(ok[1:-1] & ~ok[:-2] & ~ok[2:]))


def draw_panel(ax: Axes, panel: Panel) -> None:
    style_axes(ax)
    for line in panel.lines:
        ax.plot(
            line.x,
            line.y,
            label=line.label,
            color=line.color,
            linestyle=line.style,
            marker=line.marker or ("o" if lone_points(line.y) else None),
            markersize=4,
            linewidth=1.6,
        )
    if panel.log_y:
        log_axis(ax, panel.lines)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    if all(min(line.x, default=0) >= 0 for line in panel.lines):
        ax.set_xlim(left=0)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.set_ylabel(panel.ylabel, fontsize=9)
    if panel.title:
        ax.set_title(panel.title, fontsize=10, loc="left")
    if len(panel.lines) > 1:
        ax.legend(fontsize=8, frameon=False)
    for i, note in enumerate(panel.notes):
        ax.text(
            0.99,
            0.97 - 0.08 * i,
            note,
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="#555555",
        )
