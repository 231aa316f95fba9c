"""The published runs that calibrate the step model for CUDA GPUs (plan/calibration.py,
calibration.yaml), the leave-one-out check, and the FP8 casts the step model counts."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from littlelm.errors import ConfigError
from littlelm.plan import calibration as cal
from littlelm.plan import speed
from littlelm.plan.cost import Defaults, load_catalog
from littlelm.plan.dims import Dims
from littlelm.schema import load_run


def fake(name: str, arch: str, framework: str, ratio: float) -> cal.Fitted:
    """A point whose step model says `ratio` x its measured 1,000 tok/s."""
    point = cal.Point(
        name=name,
        config="mpt.yaml",
        gpu="H100-SXM",
        framework=framework,
        tokens_per_s_per_gpu=1000.0,
        source="test",
    )
    return cal.Fitted(point, arch, framework, 1000.0 * ratio)


def test_calibration_is_the_geometric_mean_of_the_runs_of_the_same_kind_else_broader():
    pts = [
        fake("a", "hopper", "eager", 1.6),
        fake("b", "hopper", "eager", 1.4),
        fake("c", "ampere", "eager", 1.2),
        fake("d", "hopper", "compiled", 1.3),
    ]
    assert cal.fit(pts, "hopper", "eager").ratio == pytest.approx(math.sqrt(1.6 * 1.4))
    assert cal.fit(pts, "hopper", "eager").source.startswith("2 eager hopper runs: a; b")
    # no eager run on a Blackwell GPU: every eager run; no Megatron run at all: every run
    eager = cal.fit(pts, "blackwell", "eager")
    assert eager.ratio == pytest.approx((1.6 * 1.4 * 1.2) ** (1 / 3))
    assert "none on blackwell" in eager.source
    assert cal.fit(pts, "hopper", "megatron").ratio == pytest.approx(
        (1.6 * 1.4 * 1.2 * 1.3) ** 0.25
    )
    assert cal.fit([], "hopper", "eager").ratio == 1.0


def test_leave_one_out_predicts_each_run_without_it():
    pts = [
        fake("a", "hopper", "eager", 1.6),
        fake("b", "hopper", "eager", 1.4),
        fake("c", "hopper", "eager", 1.5),
        fake("d", "ampere", "eager", 1.2),
    ]
    held = cal.leave_one_out(pts)
    # a: calibrated by b and c; predicted = modelled / that = 1600 / sqrt(1.4 x 1.5)
    assert held[0].calibration.ratio == pytest.approx(math.sqrt(1.4 * 1.5))
    assert held[0].predicted == pytest.approx(1600 / math.sqrt(1.4 * 1.5))
    assert held[0].error == pytest.approx(1.6 / math.sqrt(1.4 * 1.5) - 1)
    # d, the only Ampere run, falls back to every other eager run
    assert held[3].error == pytest.approx(1.2 / (1.6 * 1.4 * 1.5) ** (1 / 3) - 1)
    s = cal.summary(held)
    errors = sorted(abs(h.error) for h in held)
    assert s["median_abs_error"] == pytest.approx((errors[1] + errors[2]) / 2)
    assert s["max_abs_error"] == pytest.approx(errors[-1])


def test_published_runs_cover_the_kinds_and_each_predicts_within_target():
    cat = load_catalog()
    points = cal.load_points()
    assert len(points) >= 6
    assert len({p.gpu for p in points}) >= 4  # GPU kinds
    strategies = {p.dims().strategy for p in points}
    assert strategies == {"ddp", "fsdp"}
    assert any(p.dims().fp8 for p in points) and any(p.devices >= 64 for p in points)
    for p in points:  # each cites where it was read: a URL at a commit, or a paper or report
        assert re.search(r"https://\S+/[0-9a-f]{40}/", p.source), p.name
    held = cal.leave_one_out(cal.fitted_points(cat))
    s = cal.summary(held)
    assert s["median_abs_error"] <= 0.10 and s["max_abs_error"] <= 0.20, [
        (h.fitted.point.name, round(h.error, 3)) for h in held
    ]


def test_a_bad_calibration_file_names_the_file(tmp_path):
    bad = tmp_path / "calibration.yaml"
    bad.write_text("points:\n  - name: x\n    gpu: H100-SXM\n")
    with pytest.raises(ConfigError, match="calibration.yaml"):
        cal.load_points(bad)


def test_fp8_linears_pay_for_casting_their_operands():
    # each FP8 linear reads its input, weight and output gradient twice (amax, scaled cast) and
    # writes them in one byte, and transposes x and dy for the weight gradient
    d = Dims.of(load_run("configs/plans/torchtitan_llama3_8b.yaml").with_precision(True))
    fp8 = replace(d, fp8=True)
    extra = speed.elementwise_bytes(fp8) - speed.elementwise_bytes(d)
    expect = 0.0
    for g in speed.gemms(fp8):
        if g.fp8:
            x, w, dy = g.m * g.k, g.k * g.n, g.m * g.n
            expect += g.count * (5 * (x + w + dy) + 2 * (x + dy))
    assert expect > 0 and extra == pytest.approx(expect)
    assert not any(g.fp8 for g in speed.gemms(d)) and speed.fp8_cast_bytes(d) == 0


def test_every_catalog_figure_names_its_source_or_says_it_is_assumed():
    text = (Path(cal.__file__).with_name("gpus.yaml")).read_text()
    defaults = text[text.index("\ndefaults:") : text.index("\ngpus:")]
    entries = re.findall(r"^  (\w+): [^\n#]*#(.*(?:\n +#.*)*)", defaults, re.M)
    assert {k for k, _ in entries} == set(Defaults.model_fields)  # each default has a comment
    for key, comment in entries:
        assert re.search(r"assumed|arXiv|https://|RESULTS\.md", comment), key
    assert "this project's" not in text  # no measurement that was never made
    for gpu in load_catalog().gpus.values():
        assert gpu.datasheet.startswith("https://") and gpu.arch, gpu.name
