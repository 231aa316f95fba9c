"""How well do the published runs of littlelm/plan/calibration.yaml predict each other?

    python benchmarks/calibration_loo.py          # the leave-one-out table (markdown), seconds
    python benchmarks/calibration_loo.py --json   # the same as one JSON document

Each run is predicted by the step model (plan/speed.py) on its GPU's datasheet, divided by a
calibration fitted without it: the geometric mean ratio of the other runs of its kind (GPU
architecture and framework; plan/calibration.py). Prints |error| per run, the median and the
largest, then the seed's 3.1B run on an H200 (23,200 tok/s measured, not a calibration point)
planned as compiled and as eager: its compile setting was not recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from littlelm.components import register_all  # noqa: E402
from littlelm.plan import calibration as cal  # noqa: E402
from littlelm.plan.cost import load_catalog  # noqa: E402
from littlelm.plan.planner import make_plan  # noqa: E402
from littlelm.schema import load_run  # noqa: E402

SEED_TOK_S = 23_200  # the seed user's 3.12B fp32-AdamW run on one H200 (configs/plans/3b_grow)


def seed_check(catalog) -> dict[str, float]:
    out = {}
    for label, compile_ in (("compiled", "true"), ("eager", "false")):
        cfg = load_run(ROOT / "configs/plans/3b_grow.yaml", [f"train.compile={compile_}"])
        p = make_plan(cfg, catalog, ["H200-SXM"], trace=False).gpus[0]
        out[label] = p.tok_s
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    register_all()
    catalog = load_catalog()
    held = cal.leave_one_out(cal.fitted_points(catalog))
    summary = cal.summary(held)
    seed = seed_check(catalog)
    if args.json:
        rows = [
            {
                "name": h.fitted.point.name,
                "gpu": h.fitted.point.gpu,
                "devices": h.fitted.point.devices,
                "framework": h.fitted.framework,
                "measured": h.fitted.point.tokens_per_s_per_gpu,
                "modelled": h.fitted.modelled,
                "ratio": h.fitted.ratio,
                "calibration": h.calibration.ratio,
                "calibrated_by": h.calibration.source,
                "predicted": h.predicted,
                "error": h.error,
                "source": h.fitted.point.source,
            }
            for h in held
        ]
        print(json.dumps({"runs": rows, **summary, "seed_h200": seed}, indent=1))
        return 0
    print(
        "| run | GPU x n | framework | measured tok/s/GPU | step model | ratio | "
        "calibration without it | predicted | error |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for h in held:
        f, p = h.fitted, h.fitted.point
        kind = h.calibration.source.split(":")[0]
        print(
            f"| {p.name} | {p.gpu} x {p.devices} | {f.framework} | {p.tokens_per_s_per_gpu:,.0f} "
            f"| {f.modelled:,.0f} | {f.ratio:.2f} | {h.calibration.ratio:.2f} ({kind}) "
            f"| {h.predicted:,.0f} | {h.error:+.1%} |"
        )
    print(
        f"\nmedian |error| {summary['median_abs_error']:.1%}, "
        f"largest {summary['max_abs_error']:.1%} over {len(held)} runs"
    )
    for label, tok_s in seed.items():
        print(
            f"seed 3.1B on an H200, planned {label}: {tok_s:,.0f} tok/s against {SEED_TOK_S:,} "
            f"measured ({tok_s / SEED_TOK_S - 1:+.1%})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
