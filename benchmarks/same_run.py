"""Does a change keep training bitwise the same? Record a short demo run's per-step figures, then
compare another checkout's run to them.

    python benchmarks/same_run.py --record /tmp/before.json      # on the code before the change
    python benchmarks/same_run.py --compare /tmp/before.json     # on the code after it

The run is `littlelm train demo` for --steps steps (default 20) with a smaller micro-batch (so it
takes about a minute on a 2-core CPU), an evaluation and a checkpoint every 10 steps and no
sample callback. It runs through the command line, the interface a refactor must keep, in a
fresh temporary directory, with the interpreter running this script (so PYTHONPATH picks the
checkout). Compared exactly, as floats: each step's loss, gradient norm and lr multiplier, each
evaluation's val loss and bpb, and the parameter count. Prints a table; exits 1 on any
difference. Figures from different machines differ (other kernels): record and compare on one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN_KEYS = ("loss", "grad_norm", "lr_mult")
EVAL_KEYS = ("val_loss", "val_bpb")


def run_demo(steps: int, micro_batch: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="same_run-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "littlelm",
            "train",
            "demo",
            f"train.max_steps={steps}",
            f"train.micro_batch_size={micro_batch}",
            "train.log_every=1",
            "eval.every=10",
            "checkpoint.every=10",
            "callbacks=[]",
            "run.name=same_run",
        ]
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(
                f"the run failed (rc {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        lines = (Path(tmp) / "runs" / "same_run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    start = next(r for r in records if r["kind"] == "start")
    return {
        "git": subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "params": start["params"],
        "train": {
            r["step"]: {k: r[k] for k in TRAIN_KEYS} for r in records if r["kind"] == "train"
        },
        "eval": {r["step"]: {k: r[k] for k in EVAL_KEYS} for r in records if r["kind"] == "eval"},
    }


def compare(before: dict, after: dict) -> int:
    rows, bad = [], 0
    if before["params"] != after["params"]:
        bad += 1
        rows.append(("params", "-", str(before["params"]), str(after["params"]), "DIFFERENT"))
    for kind, keys in (("train", TRAIN_KEYS), ("eval", EVAL_KEYS)):
        steps = sorted(set(before[kind]) | set(after[kind]), key=int)
        for step in steps:
            b, a = before[kind].get(step), after[kind].get(step)
            for key in keys:
                vb = None if b is None else b[key]
                va = None if a is None else a[key]
                same = vb == va
                bad += not same
                rows.append(
                    (kind, str(step), key, f"{vb!r} / {va!r}", "same" if same else "DIFFERENT")
                )
    print(f"before {before['git'][:10]}, after {after['git'][:10]}")
    print("| record | step | figure | before / after | |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    total = len(rows)
    print(
        f"{total - bad} of {total} figures bitwise equal" + ("" if not bad else f"; {bad} differ")
    )
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--record", type=Path, help="write this checkout's figures to this JSON file")
    what.add_argument(
        "--compare", type=Path, help="compare this checkout's figures to this JSON file"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro-batch", type=int, default=4)
    args = parser.parse_args()
    figures = run_demo(args.steps, args.micro_batch)
    # JSON keys are strings: steps are stored as strings on both sides
    figures = json.loads(json.dumps(figures))
    if args.record:
        args.record.write_text(json.dumps(figures, indent=1))
        print(
            f"recorded {len(figures['train'])} steps and {len(figures['eval'])} evaluations to {args.record}"
        )
        return
    sys.exit(compare(json.loads(args.compare.read_text()), figures))


if __name__ == "__main__":
    main()
