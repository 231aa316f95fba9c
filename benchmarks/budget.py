"""Train the demo to a wall-clock budget and check that it ends on time with its cooldown done.

    python benchmarks/budget.py [--minutes 2] [--runs 3] [--kill-at 0.5] [--out /tmp/budget-bench]

1. `--runs` times: `littlelm train demo train.budget.hours=MINUTES/60` in a fresh run
   directory. The training time is what the run itself counted (the end record's budget_spent,
   evaluations and saves included) and, checked from outside, the span from the session's start
   record to its end record in metrics.jsonl. The cooldown is complete when the last logged lr
   multiplier equals the schedule's floor (the demo's trapezoidal floor, 0).
2. Once more with checkpoints every 10 steps, SIGKILLed when the run has counted `--kill-at` of
   its budget, then run again (it resumes by itself). The total from outside is the killed
   session's span (start record to the kill) plus the resumed session's (start to end record):
   the time lost after the last checkpoint counts, as the machine was paid for it.

Prints one row per run (steps, training time by the run and from outside, its ratio to the
budget, last lr multiplier) and exits 0 only when every run is within 5% of the budget with its
cooldown completed. Takes about (runs + 1) x (minutes + start-up); run it under the CPU lock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TOLERANCE = 0.05
FLOOR = 0.0  # the demo's schedule: trapezoidal, floor 0


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # the line a SIGKILL cut short
            out.append(json.loads(line))
    return out


def train(run_dir: Path, minutes: float, extra: list[str]) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "littlelm",
        "train",
        "demo",
        f"train.budget.hours={minutes / 60}",
        f"run.name={run_dir.name}",
        f"run.out_dir={run_dir.parent}",
        *extra,
    ]
    log = open(run_dir.parent / f"{run_dir.name}.log", "a")  # noqa: SIM115 (the child owns it)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def spent(run_dir: Path) -> float:
    try:
        return json.loads((run_dir / "budget.json").read_text())["spent"]
    except (OSError, ValueError, KeyError):
        return 0.0


def outcome(run_dir: Path, budget_s: float, outside: float, label: str) -> dict:
    recs = records(run_dir)
    end = [r for r in recs if r["kind"] == "end"]
    train = [r for r in recs if r["kind"] == "train"]
    counted = end[-1]["budget_spent"] if end else float("nan")
    return {
        "run": label,
        "steps": end[-1]["step"] if end else None,
        "counted_s": counted,
        "outside_s": outside,
        "ratio": outside / budget_s,
        "last_lr": train[-1]["lr_mult"] if train else None,
        "ok": bool(end)
        and abs(outside / budget_s - 1) <= TOLERANCE
        and abs(counted / budget_s - 1) <= TOLERANCE
        and train[-1]["lr_mult"] == FLOOR,
    }


def span(recs: list[dict], until: float | None = None) -> float:
    """Seconds from the last start record to the end record (or to `until`)."""
    start = [r["time"] for r in recs if r["kind"] == "start"][-1]
    end = until if until is not None else [r["time"] for r in recs if r["kind"] == "end"][-1]
    return end - start


def plain_run(out: Path, i: int, minutes: float) -> dict:
    run_dir = out / f"budget-{i}"
    if train(run_dir, minutes, []).wait() != 0:
        raise SystemExit(f"run {run_dir} failed; see {run_dir}.log")
    return outcome(run_dir, minutes * 60, span(records(run_dir)), f"plain {i}")


def killed_run(out: Path, minutes: float, kill_at: float) -> dict:
    run_dir = out / "budget-killed"
    extra = ["checkpoint.every=10"]
    proc = train(run_dir, minutes, extra)
    while spent(run_dir) < kill_at * minutes * 60:
        if proc.poll() is not None:
            raise SystemExit(f"run {run_dir} ended before the kill; see {run_dir}.log")
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    killed_at = time.time()
    proc.wait()
    first = span(records(run_dir), until=killed_at)
    if train(run_dir, minutes, extra).wait() != 0:
        raise SystemExit(f"resumed run {run_dir} failed; see {run_dir}.log")
    second = span(records(run_dir))
    row = outcome(run_dir, minutes * 60, first + second, "SIGKILL + resume")
    row["run"] += f" (killed at {first:.0f}s)"
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kill-at", type=float, default=0.5, help="share of the budget at the kill")
    p.add_argument("--out", default="/tmp/budget-bench")
    args = p.parse_args()
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty; pass another --out")
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    rows = [plain_run(out, i + 1, args.minutes) for i in range(args.runs)]
    rows.append(killed_run(out, args.minutes, args.kill_at))
    budget = args.minutes * 60
    print(f"\nbudget {budget:.0f} s (train.budget.hours={args.minutes / 60:.5f}), tolerance 5%")
    print(f"{'run':<34} {'steps':>5} {'counted s':>9} {'outside s':>9} {'ratio':>6} {'last lr':>7}")
    for r in rows:
        print(
            f"{r['run']:<34} {r['steps']!s:>5} {r['counted_s']:>9.1f} {r['outside_s']:>9.1f} "
            f"{r['ratio']:>6.3f} {r['last_lr']!s:>7} {'ok' if r['ok'] else 'FAIL'}"
        )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
