"""Where the step model's CUDA speed is calibrated from: public measurements of eager PyTorch
training (calibration.yaml, each a run file of the same model and its measured tokens/s).

    ratio = predicted step time / measured step time     (per point; > 1: the model is fast)
    CUDA prediction = step model / mean ratio            (for GPUs without a bench of their own)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from pydantic import Field

from littlelm.config import Cfg, read_yaml
from littlelm.plan import speed
from littlelm.plan.catalog import Catalog
from littlelm.plan.shapes import Dims
from littlelm.schema import load_run

POINTS = Path(__file__).with_name("calibration.yaml")
PLANS = Path(__file__).parent.parent / "configs" / "plans"


class Point(Cfg):
    """One published measurement."""

    name: str = Field(..., description="What was measured, in a few words.")
    config: str = Field(..., description="Run file of the same model, in configs/plans/.")
    gpu: str = Field(..., description="Catalog key of the GPU it ran on.")
    overrides: dict[str, float] = Field(
        default_factory=dict, description="Catalog fields of that GPU's variant that differ."
    )
    devices: int = Field(1, description="Data-parallel GPUs.", ge=1)
    recompute: float = Field(0.0, description="Fraction of the forward recomputed.", ge=0, le=1)
    tokens_per_s_per_gpu: float = Field(..., description="Measured speed per GPU.", gt=0)
    source: str = Field(..., description="Where the figure is published.")


@dataclass(frozen=True)
class Calibration:
    ratio: float  # predicted / measured step time (divide predictions' speed by it)
    source: str


def load_points(path: Path = POINTS) -> list[Point]:
    return [Point(**p) for p in read_yaml(path).get("points") or []]


def point_ratio(p: Point, catalog: Catalog) -> float:
    """The step model's tokens/s for the point over the measured tokens/s."""
    cfg = load_run(PLANS / p.config, world_size=1)
    d = replace(Dims.of(cfg), world=p.devices)
    gpu = catalog.gpus[p.gpu].model_copy(update=p.overrides)
    rates = speed.catalog_rates(gpu, catalog, d)
    st = speed.step_time(d, rates, p.devices, p.recompute)
    predicted = d.tokens * d.grad_accum / st.raw
    return predicted / p.tokens_per_s_per_gpu


@cache
def _cuda(catalog_id: int, catalog: Catalog) -> Calibration:
    points = load_points()
    ratios = [point_ratio(p, catalog) for p in points]
    if not ratios:
        return Calibration(1.0, "uncalibrated ceilings")
    mean = sum(ratios) / len(ratios)
    names = "; ".join(f"{p.name} ({r:.2f}x)" for p, r in zip(points, ratios))
    return Calibration(mean, f"calibrated from {names}")


def cuda_calibration(catalog: Catalog) -> Calibration:
    """The mean ratio of the packaged points, computed once per catalog."""
    return _cuda(id(catalog), catalog)
