"""Does `littlelm plan --device cpu` predict what `littlelm bench` measures on this machine?

    python benchmarks/plan_check.py              # three shapes of the demo, then the table
    python benchmarks/plan_check.py --steps 6    # more bench steps per shape

For each shape, in a fresh process: the plan's prediction for this CPU (its rates probed here at
the run's shapes, before any training), then `littlelm bench` (real steps, a save and a resume).
Columns: predicted tokens/s uncalibrated, and calibrated by the first shape's bench (what `plan`
does once a bench has run here); measured tokens/s; predicted and measured peak process memory
(resident set). The acceptance is within 10% (speed, calibrated) and 15% (memory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

SHAPES = {
    "demo": [],
    "wide": ["model.d_model=512", "model.n_head=8", "train.micro_batch_size=8"],
    "long": ["train.seq_len=1024", "model.max_seq_len=1024", "train.micro_batch_size=8"],
}


def one(name: str, steps: int, out_dir: str) -> dict:
    """Plan, then bench, one shape in this process (printed as JSON)."""
    from littlelm.components import register_all
    from littlelm.hardware import native_bf16
    from littlelm.plan import speed
    from littlelm.plan.bench import run_bench
    from littlelm.plan.catalog import load_catalog
    from littlelm.plan.planner import make_plan
    from littlelm.plan.shapes import Dims
    from littlelm.schema import load_run

    register_all()  # an entry point: fill the registries before reading a config
    over = [*SHAPES[name], f"run.name=plan_check_{name}", f"run.out_dir={out_dir}"]
    cfg = load_run("demo", over)
    plan = make_plan(cfg, load_catalog(), ["H100-SXM"], trace=False, local=True)
    d = Dims.of(cfg.with_precision(native_bf16("cpu")))  # what bench (the Trainer) computes in
    # uncalibrated: the rates probed here, without any earlier bench's ratio
    modelled = speed.step_time(d, plan.local.rates).raw
    bench = run_bench(cfg, steps=steps)
    return {
        "name": name,
        "predicted_tok_s": d.tokens * d.grad_accum / modelled,
        "predicted_rss": plan.local.process_peak,
        "measured_tok_s": bench["tok_s"],
        "measured_rss": bench["peak_rss"],
        "speed_ratio": bench["speed_ratio"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="bench steps before and after resume")
    ap.add_argument("--one", choices=sorted(SHAPES), help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.out_dir)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in SHAPES:
            cmd = [sys.executable, __file__, "--one", name, "--steps", str(args.steps)]
            done = subprocess.run([*cmd, "--out-dir", tmp], capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"error: {name} failed:\n{done.stderr[-3000:]}")  # say why, not just rc
            out = done.stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    first = rows[0]["speed_ratio"]  # measured / modelled step time of the first shape
    print(
        "| shape | predicted tok/s (uncal.) | calibrated by demo | measured tok/s "
        "| calibrated / measured | predicted RSS GiB | measured RSS GiB | ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cal = r["predicted_tok_s"] / first
        mem_ratio = r["predicted_rss"] / r["measured_rss"] if r["measured_rss"] else float("nan")
        print(
            f"| {r['name']} | {r['predicted_tok_s']:,.0f} | {cal:,.0f} | {r['measured_tok_s']:,.0f} "
            f"| {cal / r['measured_tok_s']:.3f} | {r['predicted_rss'] / 2**30:.2f} "
            f"| {r['measured_rss'] / 2**30:.2f} | {mem_ratio:.3f} |"
        )


if __name__ == "__main__":
    main()
