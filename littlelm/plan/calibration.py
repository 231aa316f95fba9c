"""What calibrates the step model (plan/speed.py) for a GPU without a bench of its own: published
training runs (calibration.yaml), each a model shape, a GPU, a count, a precision, a
parallelism and the tokens/s it measured.

The step model is a roofline: real training loses time between kernels, in kernels below their
ceiling and in what a framework does not fuse. A point's ratio is the step model's tokens/s for
it over the measured tokens/s. Runs of one kind lose alike, so a plan is divided by the
geometric mean of the ratios of its own kind:

    kind = (the GPU's architecture, the framework: eager PyTorch, torch.compile, Megatron/TE)

falling back to the same framework on any architecture, then to every point, where no point
of the kind exists. The architectures differ (an A100 reaches a larger share of its datasheet
peak than a Hopper GPU: 1.15-1.22 against 1.4-1.7 over the same eager frameworks), and so do
the frameworks (Megatron's fused kernels lose least). `leave_one_out` predicts each point from
a calibration fitted without it: benchmarks/calibration_loo.py prints the table.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from littlelm.config import Cfg, read_yaml
from littlelm.errors import ConfigError
from littlelm.plan import speed
from littlelm.plan.dims import Dims
from littlelm.schema import load_run

POINTS = Path(__file__).with_name("calibration.yaml")
PLANS = Path(__file__).parent.parent / "configs" / "plans"

Framework = Literal["eager", "compiled", "megatron"]


class Point(Cfg):
    """One published measurement."""

    name: str = Field(..., description="What was measured, in a few words.")
    config: str = Field(..., description="Run file of the model's family, in configs/plans/.")
    set: list[str] = Field(
        default_factory=list, description="Overrides (key=value) that give the run's shape."
    )
    gpu: str = Field(..., description="Catalog key of the GPU it ran on.")
    overrides: dict[str, float] = Field(
        default_factory=dict, description="Catalog fields of that GPU's variant that differ."
    )
    devices: int = Field(1, description="Data-parallel GPUs.", ge=1)
    recompute: float = Field(0.0, description="Fraction of the forward recomputed.", ge=0, le=1)
    framework: Framework = Field(..., description="eager, compiled (torch.compile) or megatron.")
    tokens_per_s_per_gpu: float = Field(..., description="Measured speed per GPU.", gt=0)
    source: str = Field(..., description="Where the figure is published (URL, commit, table).")

    @field_validator("set", mode="before")
    @classmethod
    def _strings(cls, v):
        return [str(x) for x in v] if isinstance(v, list) else v

    def dims(self) -> Dims:
        """The run as the step model sees it, with this point's GPU count."""
        cfg = load_run(PLANS / self.config, self.set, world_size=1).with_precision(True)
        return replace(Dims.of(cfg), world=self.devices)


@dataclass(frozen=True)
class Calibration:
    ratio: float  # predicted / measured step time (divide predictions' speed by it)
    source: str


@dataclass(frozen=True)
class Fitted:
    """A point with the step model's prediction for it (before calibration)."""

    point: Point
    arch: str
    framework: str
    modelled: float  # tokens/s per GPU, uncalibrated

    @property
    def ratio(self) -> float:
        return self.modelled / self.point.tokens_per_s_per_gpu


def load_points(path: Path = POINTS) -> list[Point]:
    try:
        return [Point(**p) for p in read_yaml(path).get("points") or []]
    except (TypeError, ValueError) as e:
        raise ConfigError([f"{path}: {e}"]) from None


def modelled(p: Point, catalog) -> float:
    """The step model's tokens/s per GPU for the point, uncalibrated."""
    d = p.dims()
    gpu = catalog.gpus[p.gpu].model_copy(update=p.overrides)
    st = speed.step_time(d, speed.catalog_rates(gpu, catalog, d), p.devices, p.recompute)
    return d.tokens * d.grad_accum / st.raw


def point_ratio(p: Point, catalog) -> float:
    """The step model's tokens/s for the point over the measured tokens/s."""
    return modelled(p, catalog) / p.tokens_per_s_per_gpu


@cache  # per catalog (hashed by identity)
def fitted_points(catalog) -> tuple[Fitted, ...]:
    return tuple(
        Fitted(p, catalog.gpus[p.gpu].arch, p.framework, modelled(p, catalog))
        for p in load_points()
    )


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def fit(points: list[Fitted] | tuple[Fitted, ...], arch: str, framework: str) -> Calibration:
    """The geometric mean ratio of the points of this kind (architecture and framework), else
    of this framework, else of all; the source names what it rests on."""
    tiers = (
        (
            [f for f in points if f.arch == arch and f.framework == framework],
            f"{framework} {arch}",
            "",
        ),
        ([f for f in points if f.framework == framework], framework, f" (none on {arch or 'it'})"),
        (list(points), "published", f" (none {framework})"),
    )
    for chosen, kind, why in tiers:
        if chosen:
            names = "; ".join(f.point.name for f in chosen)
            n = len(chosen)
            ratio = geomean([f.ratio for f in chosen])
            return Calibration(ratio, f"{n} {kind} run{'s' * (n > 1)}{why}: {names}")
    return Calibration(1.0, "uncalibrated ceilings")


def cuda_calibration(catalog, gpu, compiled: bool = False) -> Calibration:
    """What divides a CUDA plan on `gpu` (a catalog entry) without a bench of its own."""
    return fit(fitted_points(catalog), gpu.arch, "compiled" if compiled else "eager")


@dataclass(frozen=True)
class Held:
    """One point predicted by a calibration fitted without it."""

    fitted: Fitted
    calibration: Calibration

    @property
    def predicted(self) -> float:
        return self.fitted.modelled / self.calibration.ratio

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted / self.fitted.point.tokens_per_s_per_gpu - 1


def leave_one_out(points: list[Fitted] | tuple[Fitted, ...]) -> list[Held]:
    out = []
    for i, f in enumerate(points):
        rest = [g for j, g in enumerate(points) if j != i]
        out.append(Held(f, fit(rest, f.arch, f.framework)))
    return out


def summary(held: list[Held]) -> dict[str, float]:
    errors = [abs(h.error) for h in held]
    return {"median_abs_error": statistics.median(errors), "max_abs_error": max(errors)}
