"""Kill a training run with SIGKILL at random moments and check that it recovers exactly.

    python benchmarks/faults.py [--kills 10] [--seed 0] [--steps 300] [--every 25]

1. Trains a small config (2 layers, d_model 64, byte tokenizer, synthetic text) in a child
   process without interruption: the reference.
2. Trains the same config again in a fresh run directory and kills the child with SIGKILL at
   `--kills` random moments, then runs `littlelm train` again (it resumes by itself). About
   four kills in ten land inside a checkpoint save: the child runs with
   LITTLELM_FAULT_SAVE_DELAY so each save pauses between its file writes and between its
   rename and the pruning, and the kill comes at a random moment of that window after the
   temporary directory appears. The others land at a random moment of a random step.
3. Prints one row per kill (the step reached, the checkpoint resumed from, the steps lost, what
   the save left behind) and checks: every kill recovered from the newest complete checkpoint,
   no kill lost more than one checkpoint interval, the final weights are bitwise equal to the
   reference's, and so is every logged per-step loss.

Exit status 0 only when every check passes. On 2 CPU cores it takes about two minutes.
`--device cuda` trains on a GPU instead (for a borrowed GPU): recoveries and lost steps are
checked the same way; weights and losses are compared and the largest difference printed, but
bitwise equality is not required there, since some CUDA kernels are not deterministic.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from littlelm.train import checkpoint as ckpt

STEP_LINE = re.compile(r"^step (\d+)/\d+ \|")
RESUMED = re.compile(r"^resumed from \S+ \(step (\d+),")
WORDS = [
    *[
        "the",
        "model",
        "reads",
        "a",
        "token",
        "and",
        "predicts",
        "the",
        "next",
        "one",
        "while",
        "the",
        "optimizer",
        "adjusts",
    ],
    *[
        "every",
        "weight",
        "a",
        "small",
        "network",
        "learns",
        "quickly",
        "when",
        "the",
        "data",
        "is",
        "clean",
        "def",
        "main",
    ],
    *[
        "return",
        "value",
        "print",
        "import",
        "class",
        "self",
        "none",
        "true",
        "false",
        "for",
        "while",
        "if",
        "else",
    ],
]


def make_run(work: Path, name: str, steps: int, every: int, device: str) -> Path:
    rng = random.Random(0)
    corpus = work / "corpus.txt"
    if not corpus.exists():
        paras = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 80))) + "."
            for _ in range(3000)
        ]
        corpus.write_text("\n\n".join(paras) + "\n")
    tree = {
        "run": {"name": name, "out_dir": str(work / "runs"), "seed": 0, "device": device},
        "model": {"name": "gpt", "n_layer": 2, "d_model": 64, "n_head": 2, "max_seq_len": 64},
        "data": {
            "tokenizer": {"name": "byte"},
            "sources": {"text": {"name": "text", "path": str(corpus), "split": "paragraph"}},
            "val_fraction": 0.05,
            "buffer_docs": 64,
        },
        "optimizer": {"name": "muon"},
        "schedule": {"name": "trapezoidal", "warmup_steps": 10},
        "train": {"micro_batch_size": 8, "seq_len": 64, "max_steps": steps, "log_every": 1},
        "eval": {"every": 0, "at_end": False},
        "checkpoint": {"every": every, "keep_last": 2},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


class Child:
    """`littlelm train CONFIG` in a child process; stdout and stderr collected by threads."""

    def __init__(self, config: Path, env: dict):
        self.p = subprocess.Popen(
            [sys.executable, "-m", "littlelm", "train", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=lambda s=s, k=k: k.extend(s), daemon=True)
            for s, k in ((self.p.stdout, self.out), (self.p.stderr, self.err))
        ]
        for r in self.readers:
            r.start()

    def last_step(self) -> int:
        for line in reversed(self.out):
            m = STEP_LINE.match(line)
            if m:
                return int(m.group(1))
        return 0

    def resumed_step(self) -> int | None:
        for line in self.out:
            m = RESUMED.match(line)
            if m:
                return int(m.group(1))
        return None

    def drain(self) -> int:
        rc = self.p.wait()
        for r in self.readers:
            r.join()
        return rc


@dataclass
class Kill:
    kind: str  # "step" or "save"
    target: int  # the step (or the checkpoint step whose save is hit)


def plan(kills: int, steps: int, every: int, seed: int) -> list[Kill]:
    rng = random.Random(seed)
    n_save = max(1, round(kills * 0.4))
    saves = rng.sample(range(every, steps + 1, every), n_save)
    others = [s for s in range(2, steps) if s not in saves]
    plan = [Kill("save", s) for s in saves] + [
        Kill("step", s) for s in rng.sample(others, kills - n_save)
    ]
    return sorted(plan, key=lambda k: k.target)


def wait_for(child: Child, test, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while not test():
        if child.p.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def strike(child: Child, kill: Kill, root: Path, rng: random.Random, window: float) -> bool:
    """Wait for the kill's moment, SIGKILL the child; False if it ended first."""
    if kill.kind == "save":
        pattern = f"step_{kill.target:06d}.tmp-*"
        if not wait_for(child, lambda: any(root.glob(pattern))):
            return False
        time.sleep(rng.uniform(0, window))
    else:
        if not wait_for(child, lambda: child.last_step() >= kill.target):
            return False
        time.sleep(rng.uniform(0, 0.05))  # somewhere inside a following step
    child.p.send_signal(signal.SIGKILL)
    return True


def recovers(child: Child, expect: int) -> bool:
    """The new child resumed from the newest complete checkpoint and trained on (or finished)."""
    wait_for(child, lambda: child.last_step() > expect or child.p.poll() is not None)
    start = child.resumed_step() or 0
    return start == expect and (child.last_step() > start or child.p.wait() == 0)


def losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert len(steps) == len(set(steps)), "a step is logged twice in metrics.jsonl"
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt.latest_checkpoint(run_dir / "checkpoints") / "model.safetensors")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kills", type=int, default=10, help="SIGKILLs to deliver")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--steps", type=int, default=300, help="training steps")
    ap.add_argument("--every", type=int, default=25, help="checkpoint interval in steps")
    ap.add_argument("--save-delay", type=float, default=0.1, help="seconds per pause in a save")
    ap.add_argument(
        "--workdir",
        default=f"/tmp/littlelm-faults-{os.getpid()}",
        help="runs, data cache and configs go here (kept afterwards)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (bitwise check) or cuda")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LITTLELM_CACHE": str(work / "cache")}
    t0 = time.monotonic()

    ref_cfg = make_run(work, "reference", args.steps, args.every, args.device)
    ref = Child(ref_cfg, env)
    if ref.drain() != 0:
        print("".join(ref.out + ref.err))
        return 1
    ref_time = time.monotonic() - t0
    cfg = make_run(work, "faulted", args.steps, args.every, args.device)
    root = work / "runs" / "faulted" / "checkpoints"
    faulty_env = {**env, ckpt.FAULT_DELAY_ENV: str(args.save_delay)}
    rng = random.Random(args.seed + 1)
    window = 5 * args.save_delay  # 4 file writes + the rename-to-prune gap
    rows, recovered = [], 0
    child = Child(cfg, faulty_env)
    for i, kill in enumerate(plan(args.kills, args.steps, args.every, args.seed), 1):
        if not strike(child, kill, root, rng, window):
            print(f"kill {i}: the child ended before its moment\n" + "".join(child.err))
            return 1
        child.drain()
        reached = child.last_step()
        partial = sorted(d.name for d in root.glob("*.tmp-*")) if root.is_dir() else []
        newest = ckpt.latest_checkpoint(root, warn=False)
        expect = ckpt.checkpoint_step(newest) if newest else 0
        child = Child(cfg, faulty_env)
        good = recovers(child, expect)
        start = child.resumed_step() or 0
        recovered += good
        rows.append((i, kill, reached, start, reached - start, partial, good))
    rc = child.drain()
    total = time.monotonic() - t0

    print(
        f"\nfaults: {args.kills} SIGKILLs, {args.steps} steps, checkpoint every {args.every} steps, "
        f"save pauses {args.save_delay}s, seed {args.seed}"
    )
    print(
        "| kill | moment | step reached | resumed from | steps lost | left by the kill | recovered |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, kill, reached, start, lost, partial, good in rows:
        moment = (
            f"in save of step {kill.target}" if kill.kind == "save" else f"after step {kill.target}"
        )
        left = ", ".join(partial) or "-"
        print(
            f"| {i} | {moment} | {reached} | {start} | {lost} | {left} | {'yes' if good else 'NO'} |"
        )

    a, b = final_weights(ref_cfg.parent / "runs" / "reference"), final_weights(root.parent)
    weights_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    la, lb = losses(ref_cfg.parent / "runs" / "reference"), losses(root.parent)
    losses_equal = la == lb and len(la) == args.steps
    w_diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    l_diff = max(abs(la[k] - lb.get(k, float("inf"))) for k in la)
    worst = max(r[4] for r in rows)
    in_save = sum(1 for r in rows if r[1].kind == "save")
    print(
        f"\nrecoveries: {recovered}/{args.kills} ({in_save} kills aimed inside a save; "
        f"{sum(1 for r in rows if r[5])} kills left a half-written checkpoint directory)\n"
        f"steps lost per kill: max {worst}, mean {sum(r[4] for r in rows) / len(rows):.1f} "
        f"(checkpoint interval {args.every})\n"
        f"final run exit status: {rc}\n"
        f"final weights bitwise equal to the uninterrupted run: {'yes' if weights_equal else 'NO'}"
        f" (largest difference {w_diff:.3g})\n"
        f"per-step losses ({len(lb)} steps) bitwise equal: {'yes' if losses_equal else 'NO'}"
        f" (largest difference {l_diff:.3g})\n"
        f"wall time: {total:.0f}s (uninterrupted run {ref_time:.0f}s)"
    )
    exact = (weights_equal and losses_equal) or args.device != "cpu"
    passed = recovered == args.kills and worst <= args.every and rc == 0 and exact
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
