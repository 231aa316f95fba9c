"""A 4-variant sweep of the demo at equal budget, SIGKILLed once and resumed.

    python benchmarks/sweep.py [--minutes 1] [--out /tmp/sweep-bench]

Runs `littlelm sweep demo --set train.seq_len=256,512 --set model.n_layer=4,6 --budget 1m`,
SIGKILLs the sweep process while its third variant trains (that variant gets SIGTERM from the
kernel, saves and stops), runs the same command again and checks: the two finished variants are
skipped (not trained again: their metrics files are unchanged), the third resumes from its
checkpoint, all four finish, and the comparison table and plots are written. Prints the table,
each variant's training time against the budget, and the checks. About 4 x (minutes + start-up).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SETS = ["--set", "train.seq_len=256,512", "--set", "model.n_layer=4,6"]


def sweep_cmd(out: Path, minutes: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "littlelm",
        "sweep",
        "demo",
        f"run.out_dir={out}",
        "checkpoint.every=10",
        *SETS,
        "--budget",
        f"{minutes * 60:g}s",
        "--name",
        "bench",
        "--price-per-hour",
        "0.5",  # an illustrative price for the cost column and the dollar axis
    ]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def third_half_way(out: Path, sweep_dir: Path, budget: float) -> bool:
    """Two variants finished and the third has spent half its budget and saved a checkpoint."""
    if (out / "first.log").read_text().count(": finished") < 2:
        return False
    third = json.loads((sweep_dir / "sweep.json").read_text())["variants"][2]["name"]
    try:
        spent = json.loads((sweep_dir / third / "budget.json").read_text())["spent"]
    except (OSError, ValueError, KeyError):
        return False
    return spent >= budget / 2 and any((sweep_dir / third / "checkpoints").glob("step_*"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--out", default="/tmp/sweep-bench")
    args = p.parse_args()
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty; pass another --out")
    out.mkdir(parents=True, exist_ok=True)
    sweep_dir = out / "bench"
    first_log = open(out / "first.log", "w")  # noqa: SIM115
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = sweep_cmd(out, args.minutes)
    proc = subprocess.Popen(cmd, stdout=first_log, stderr=subprocess.STDOUT, env=env)
    while not third_half_way(out, sweep_dir, args.minutes * 60):
        if proc.poll() is not None:
            raise SystemExit(f"the sweep ended before the kill; see {out / 'first.log'}")
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(5)  # the orphaned variant saves on SIGTERM and exits
    variants = [v["name"] for v in json.loads((sweep_dir / "sweep.json").read_text())["variants"]]
    before = {v: digest(sweep_dir / v / "metrics.jsonl") for v in variants}
    second = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (out / "second.log").write_text(second.stdout + second.stderr)
    print(second.stdout[-4000:])
    skipped = [v for v in variants if f"variant {v}: already finished, skipped" in second.stdout]
    resumed = [
        v
        for v in variants
        if "resumed from" in (sweep_dir / "logs" / f"{v}.log").read_text(errors="replace")
    ]
    untouched = [v for v in skipped if digest(sweep_dir / v / "metrics.jsonl") == before[v]]
    pngs = sorted(p.name for p in (sweep_dir / "report").glob("*.png"))
    print(f"{'variant':<28} {'training s':>10} {'budget s':>8} {'ratio':>6}")
    for v in variants:
        recs = [json.loads(x) for x in (sweep_dir / v / "metrics.jsonl").read_text().splitlines()]
        end = [r for r in recs if r["kind"] == "end"]
        s = end[-1]["budget_spent"] if end else float("nan")
        budget = args.minutes * 60
        print(f"{v:<28} {s:>10.1f} {budget:>8.0f} {s / budget:>6.3f}")
    checks = {
        "second run exit 0": second.returncode == 0,
        "2 finished variants skipped": len(skipped) == 2,
        "skipped variants not retrained (metrics unchanged)": len(untouched) == 2,
        "killed variant resumed from its checkpoint": len(resumed) >= 1,
        "comparison.md written": (sweep_dir / "report" / "comparison.md").is_file(),
        "plots written": pngs == ["loss_vs_dollars.png", "loss_vs_time.png", "loss_vs_tokens.png"],
    }
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
