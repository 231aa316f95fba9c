"""Does `littlelm plan --device cpu` predict what `littlelm bench` measures on this machine?

    python benchmarks/plan_check.py              # three shapes of the demo, then the table
    python benchmarks/plan_check.py --steps 6    # more bench steps per shape

Each shape runs in a fresh process, one after another: the local plan before any training,
uncalibrated (rates probed here) and calibrated by the demo's bench (as `plan` is once a bench
has run here; the benches of the user's cache are not read), then `littlelm bench` on the shape
(real steps, a save and a resume; stored in the bench cache like any bench, so a later `plan
--device cpu` here is calibrated by the last of them).
The demo's calibrated figure is taken after its own bench (in-sample, marked *). Columns:
predicted tokens/s, measured tokens/s, and predicted and measured peak process memory (resident
set; the calibrated prediction uses the heap margin the demo's bench measured).
Acceptance (issue 21): calibrated speed within 10%, memory within 15%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = {
    "demo": [],
    "wide": ["model.d_model=512", "model.n_head=8", "train.micro_batch_size=8"],
    "long": ["train.seq_len=1024", "model.max_seq_len=1024", "train.micro_batch_size=8"],
}


def one(name: str, steps: int, out_dir: str, calibration: str | None) -> dict:
    """Plan (uncalibrated, calibrated), then bench, one shape in this process."""
    from littlelm.components import register_all
    from littlelm.hardware import native_bf16
    from littlelm.plan.bench import current_rss, run_bench
    from littlelm.plan.planner import local_plan
    from littlelm.plan.shapes import Dims
    from littlelm.schema import load_run

    register_all()  # an entry point: fill the registries before reading a config
    over = [*SHAPES[name], f"run.name=plan_check_{name}", f"run.out_dir={out_dir}"]
    cfg = load_run("demo", over)
    d = Dims.of(cfg.with_precision(native_bf16("cpu")))  # what bench (the Trainer) computes in
    tokens = cfg.train.max_tokens
    base = current_rss()  # the process before training (the in-sample plan comes after it)
    uncal = local_plan(d, tokens, [], 0.0, base)
    earlier = [json.loads(Path(calibration).read_text())] if calibration else []
    cal = local_plan(d, tokens, earlier, 0.0, base) if earlier else None
    bench = run_bench(cfg, steps=steps)
    if cal is None:  # the first shape: calibrated by its own bench
        cal = local_plan(d, tokens, [bench], 0.0, base)
    grown = (bench["peak_rss"] or 0) - (bench["rss_at_start"] or 0)
    return {
        "name": name,
        "in_sample": not earlier,
        "uncal_tok_s": uncal.tok_s,
        "cal_tok_s": cal.tok_s,
        "uncal_rss": uncal.process_peak,
        "cal_rss": cal.process_peak,
        "measured_tok_s": bench["tok_s"],
        "measured_rss": bench["peak_rss"],
        "heap_margin": grown / bench["peak_tensor"] if bench.get("peak_tensor") else None,
        "bench": bench,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="bench steps before and after resume")
    ap.add_argument("--one", choices=sorted(SHAPES), help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    ap.add_argument("--calibration", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.out_dir, args.calibration)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        first = os.path.join(tmp, "calibration.json")  # the demo's bench record
        for name in SHAPES:
            cmd = [sys.executable, __file__, "--one", name, "--steps", str(args.steps)]
            cmd += ["--out-dir", tmp] + (["--calibration", first] if rows else [])
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"error: {name} failed:\n{done.stderr[-3000:]}")  # say why, not just rc
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            if len(rows) == 1:
                with open(first, "w") as f:
                    json.dump(rows[0]["bench"], f)
    g = 2**30
    print(
        "| shape | tok/s predicted, uncal. / calibrated | measured | calibrated / measured "
        "| RSS GiB predicted, uncal. / calibrated | measured | calibrated / measured "
        "| heap margin measured |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        star = "*" if r["in_sample"] else ""
        print(
            f"| {r['name']} | {r['uncal_tok_s']:,.0f} / {r['cal_tok_s']:,.0f}{star} "
            f"| {r['measured_tok_s']:,.0f} | {r['cal_tok_s'] / r['measured_tok_s']:.3f}{star} "
            f"| {r['uncal_rss'] / g:.2f} / {r['cal_rss'] / g:.2f}{star} "
            f"| {r['measured_rss'] / g:.2f} | {r['cal_rss'] / r['measured_rss']:.3f}{star} "
            f"| {r['heap_margin']:.2f} |"
        )
    print("* in-sample: the demo's calibration is its own bench")


if __name__ == "__main__":
    main()
