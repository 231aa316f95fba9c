"""Host RAM per rank while a run resumes, at 1 and 2 processes on this CPU.

    python benchmarks/resume_memory.py                       # this checkout
    python benchmarks/resume_memory.py --baseline ../old     # and another checkout, for a ratio
    python benchmarks/resume_memory.py --phase resume ...    # the resume alone, no step after it

The demo scaled to about 100M parameters (12 layers x 768) trains one step and saves; a second
`littlelm train` resumes from that checkpoint and trains one more step, while this script reads
each training process's /proc/PID/smaps_rollup every 20 ms. Per rank it reports the peak
resident set (Rss: every page the process maps, shared page-cache pages included) and the peak
proportional set (Pss: shared pages divided among the processes that map them, which is how a
node's RAM is split between its ranks) and the peak anonymous memory (what the process owns
outright: a memory-mapped checkpoint's pages are file-backed, shared between the ranks of a
node through the page cache and dropped by the kernel under pressure, so they cannot OOM a node
the way a read into private memory can). One micro-batch of 1 x 128 tokens keeps activations
small, so what is measured is the weights and optimizer state the resume brings in.

`--phase step` (the default) resumes and trains one step: on a CPU the step's own state (weights,
gradients, two AdamW moments) is then the peak whatever the resume does. `--phase resume` asks
the resumed run for no further step (train.max_steps stays 1): the process builds the model,
reads the checkpoint into it and the optimizer, and exits, so the peak is the resume's own
spike, which on a GPU node is what lands in host RAM (the step's state lives on the GPU there).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SHAPE = [
    "model.n_layer=12",
    "model.d_model=768",
    "model.n_head=12",
    "train.micro_batch_size=1",
    "train.seq_len=128",
    "train.precision=fp32",  # the memory in question is the same; bf16 is slow on some CPUs
    "optimizer.name=adamw",  # two moments per weight; Muon's bf16 Newton-Schulz is slow there too
    "eval.every=0",
    "eval.at_end=false",
    "callbacks=[]",
]


def rollup(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] in ("Rss:", "Pss:", "Anonymous:"):
                out[parts[0][:-1]] = int(parts[1]) * 1024
    except OSError:
        pass
    return out


def trainers(root: int) -> list[int]:
    """The training processes under `root` (the HWM wrapper): torchrun's workers (LOCAL_RANK
    set), or else the wrapper's own child, the one training process."""
    found, child = [], 0
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        if b"LOCAL_RANK=" in env:
            found.append(pid)
        if pid == root and kids:
            child = int(kids[0])
        stack += [int(k) for k in kids]
    return found or ([child] if child else [])


# Runs a command and prints the kernel's high-water mark of its largest process (ru_maxrss of the
# waited-for children: torchrun waits for its workers, so that is the largest rank's peak RSS).
# Sampling misses peaks shorter than its interval; the kernel's count does not.
HWM = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)"
)


def run_and_watch(cmd: list[str], env: dict, cwd: Path) -> dict[int, dict[str, int]]:
    cmd = [sys.executable, "-c", HWM, *cmd]
    # cwd away from any checkout: `python -m` puts the working directory ahead of PYTHONPATH,
    # so run from this repository it would import this checkout's littlelm as the baseline too
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    peaks: dict[int, dict[str, int]] = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            for pid in trainers(proc.pid):
                now = rollup(pid)
                best = peaks.setdefault(pid, {"Rss": 0, "Pss": 0, "Anonymous": 0})
                for k, v in now.items():
                    best[k] = max(best[k], v)
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    _, err = proc.communicate()
    done.set()
    t.join()
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed:\n{err.decode()[-2000:]}")
    peaks[0] = {"hwm": int(err.decode().split()[-1]) * 1024}  # KiB, Linux
    return peaks


def measure(code: Path, nproc: int, out: Path, phase: str = "step") -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    base = [sys.executable, "-m", "littlelm", "train", "demo", *SHAPE]
    base += [f"run.out_dir={out}", f"run.name=resume_{nproc}", f"train.batch_tokens={128 * nproc}"]
    # options after every override: checkouts before 2026-12-01 took overrides only before them
    tail = ["--nproc", str(nproc)] if nproc > 1 else []
    run_and_watch([*base, "train.max_steps=1", "checkpoint.at_end=true", *tail], env, out)
    steps = 2 if phase == "step" else 1  # 1: resumes from step 1, finished: loads and exits
    peaks = run_and_watch([*base, f"train.max_steps={steps}", *tail], env, out)
    gib = 2**30
    hwm = peaks.pop(0)["hwm"]
    return {
        "hwm": hwm / gib,
        "rss": max(p["Rss"] for p in peaks.values()) / gib,
        "pss": max(p["Pss"] for p in peaks.values()) / gib,
        "anon": max(p["Anonymous"] for p in peaks.values()) / gib,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with")
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--phase", choices=["step", "resume"], default="step")
    args = ap.parse_args()
    codes = {"this checkout": Path(__file__).resolve().parents[1]}
    if args.baseline:
        codes["baseline"] = args.baseline.resolve()
    results = {}
    for label, code in codes.items():
        for n in args.nproc:
            with tempfile.TemporaryDirectory() as tmp:
                results[label, n] = measure(code, n, Path(tmp), args.phase)
    print("| code | ranks | peak RSS per rank GiB (kernel) | sampled: Rss | Pss | anonymous |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for (label, n), r in results.items():
        print(
            f"| {label} | {n} | {r['hwm']:.2f} | {r['rss']:.2f} | {r['pss']:.2f} "
            f"| {r['anon']:.2f} |"
        )
    if args.baseline:
        for n in args.nproc:
            new, old = results["this checkout", n], results["baseline", n]
            print(
                f"{n} rank(s): this / baseline = {new['hwm'] / old['hwm']:.2f} (peak RSS, kernel), "
                f"{new['rss'] / old['rss']:.2f} (Rss), "
                f"{new['pss'] / old['pss']:.2f} (Pss), {new['anon'] / old['anon']:.2f} (anonymous)"
            )


if __name__ == "__main__":
    main()
