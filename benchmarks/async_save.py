"""What a checkpoint costs the training loop on a slow disk: synchronous against background
saves (checkpoint.async_save), and a disk that stalls.

    python benchmarks/async_save.py [--mbps 200] [--layers 13] [--steps 61] [--every 30]

1. Mounts benchmarks/slowfs.py (FUSE: a passthrough to a local directory whose writes are paced
   to `--mbps` MB/s, the 100-300 MB/s of the NAS and distributed filesystems users train from,
   and whose fsync hangs while a flag file exists). Needs /dev/fuse, libfuse3 (`apt-get
   install fuse3`) and `pip install mfusepy`, and root (or fusermount3) to mount.
2. Trains the same model (AdamW, fp32, `--layers` x 768: about 1.1 GB of weights and moments
   per checkpoint at 13 layers) twice in this process with run.out_dir on the mount, saving every
   `--every` steps (no final save): once with checkpoint.async_save=false, once with true. Each
   save's blocked time is the time Trainer.save took on the training thread; a background
   save's write time is its thread's. Prints a table, the checkpoint size, and the ratio of the
   blocked times (the acceptance: <= 10%), and checks the two runs' checkpoints hold the same
   tensors.
3. A stalled disk: a tiny `littlelm train` on the mount (background saves,
   checkpoint.save_wait_seconds=`--wait`, slow_after_minutes=0.05); once its first checkpoint
   is complete the flag makes every fsync hang. The run must keep training (a later step
   logged, the next due save skipped and said, the stuck save reported), then SIGTERM must end
   it with exit 2 within `--wait` plus a margin, naming the stuck save, with the previous
   checkpoint complete and loadable.

Exit status 0 when every check passes. About three minutes on 2 CPU cores at the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import yaml

from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.trainer import Trainer

HERE = Path(__file__).resolve().parent
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "model",
    "data",
    "step",
    "loss",
    "train",
    "save",
    "disk",
    "write",
    "time",
    "fast",
    "slow",
]


@contextlib.contextmanager
def mounted(work: Path, mbps: float, flag: Path):
    backing, mount = work / "backing", work / "mnt"
    for d in (backing, mount):
        d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE / "slowfs.py"), str(backing), str(mount)]
    proc = subprocess.Popen(
        [*cmd, "--mbps", str(mbps), "--stall-flag", str(flag)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not os.path.ismount(mount):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(
                f"cannot mount benchmarks/slowfs.py on {mount}: {proc.stderr.read()[-600:]}\n"
                "it needs /dev/fuse, libfuse3 (apt-get install fuse3), mfusepy (pip install "
                "mfusepy) and root or fusermount3"
            )
        time.sleep(0.1)
    try:
        yield mount
    finally:
        flag.unlink(missing_ok=True)
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], check=False)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def corpus(work: Path) -> Path:
    path = work / "corpus.txt"
    rng = random.Random(0)
    paras = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for _ in range(800)]
    path.write_text("\n\n".join(paras) + "\n")
    return path


def tree(text: Path, out: Path, name: str, **over) -> dict:
    t = {
        "run": {"name": name, "out_dir": str(out), "seed": 0, "device": "cpu"},
        "model": {"name": "gpt", "n_layer": 2, "d_model": 64, "n_head": 2, "max_seq_len": 64},
        "data": {
            "tokenizer": {"name": "byte"},
            "sources": {"text": {"name": "text", "path": str(text), "split": "paragraph"}},
            "val_fraction": 0.05,
        },
        "optimizer": {"name": "adamw"},
        "train": {"micro_batch_size": 1, "seq_len": 64, "precision": "fp32", "log_every": 1},
        "eval": {"every": 0, "at_end": False},
        "checkpoint": {"keep_last": 1, "at_end": False},
    }
    for key, value in over.items():
        t[key].update(value)
    return t


def timed_run(cfg_path: Path) -> dict:
    """Train in this process; each save's blocked time (on the training thread) and each
    background write's time (on its thread)."""
    trainer = Trainer(load_run(cfg_path), resume="never")
    blocked: list[float] = []
    writes: list[float] = []
    save, write = trainer.save, trainer.checkpointer.write

    def timed_save(final: bool = False):
        t0 = time.perf_counter()
        try:
            return save(final)
        finally:
            blocked.append(time.perf_counter() - t0)

    def timed_write(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return write(*args, **kwargs)
        finally:
            writes.append(time.perf_counter() - t0)

    trainer.save = timed_save  # type: ignore[method-assign]
    trainer.checkpointer.write = timed_write  # type: ignore[method-assign]
    t0 = time.perf_counter()
    end = trainer.fit()
    total = time.perf_counter() - t0
    newest = ckpt.latest_checkpoint(trainer.checkpointer.dir, warn=False)
    size = sum(f.stat().st_size for f in newest.rglob("*") if f.is_file()) if newest else 0
    return {
        "blocked": blocked,
        "writes": writes,
        "total": total,
        "step_time": end["train_time"] / max(1, end["step"]),
        "size": size,
        "newest": newest,
    }


def same_tensors(a: Path, b: Path) -> bool:
    x, y = (ckpt.load_checkpoint(d) for d in (a, b))
    weights = x.model.shapes == y.model.shapes and all(
        torch.equal(x.model[k], y.model[k]) for k in x.model.shapes
    )
    ox, oy = x.optimizer or {}, y.optimizer or {}
    moments = ox.get("state", {}).keys() == oy.get("state", {}).keys() and all(
        torch.equal(ox["state"][i][k], oy["state"][i][k])
        for i in ox["state"]
        for k in ox["state"][i]
        if isinstance(ox["state"][i][k], torch.Tensor)
    )
    return weights and moments


def stalled_run(work: Path, mount: Path, text: Path, flag: Path, wait: float) -> tuple[bool, str]:
    cfg = work / "stall.yaml"
    t = tree(
        text,
        mount / "runs",
        "stall",
        train={"max_steps": 1_000_000, "micro_batch_size": 4},
        checkpoint={
            "every": 20,
            "keep_last": 2,
            "async_save": True,
            "save_wait_seconds": wait,
            "slow_after_minutes": 0.05,
        },
    )
    cfg.write_text(yaml.safe_dump(t))
    env = {**os.environ, "LITTLELM_CACHE": str(work / "cache")}
    p = subprocess.Popen(
        [sys.executable, "-m", "littlelm", "train", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()  # type: ignore[arg-type]
    root = mount / "runs" / "stall" / "checkpoints"

    def until(test, limit: float = 180) -> bool:
        deadline = time.monotonic() + limit
        while not test():
            if p.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    ok = until(lambda: ckpt.latest_checkpoint(root, warn=False) is not None)
    flag.touch()  # every fsync from now on hangs
    first = ckpt.latest_checkpoint(root, warn=False)
    said = lambda text: any(text in line for line in lines)  # noqa: E731
    ok = ok and until(lambda: said("skipped: the save of step") and said("slow_after_minutes"))
    stuck_line = next((line for line in lines if "skipped: the save of step" in line), "")
    steps = [int(x.split()[1].split("/")[0]) for x in lines if x.startswith("step ")]
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(wait + 30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = None
    took = time.monotonic() - t0
    time.sleep(0.2)
    named = any("did not finish within checkpoint.save_wait_seconds" in x for x in lines)
    flag.unlink(missing_ok=True)  # the disk answers again: look at what the run left
    newest = ckpt.latest_checkpoint(root, warn=False)
    try:
        ckpt.load_checkpoint(newest)  # type: ignore[arg-type]
        readable = True
    except Exception:
        readable = False
    stuck = stuck_line.split("skipped: ")[-1].split(",")[0].strip()
    passed = bool(ok and rc == 2 and named and took <= wait + 10 and readable and newest == first)
    text_ = (
        f"first checkpoint {first.name if first else None}; then every fsync hung: training went "
        f"on to step {max(steps) if steps else '?'} ({stuck or 'no save reported stuck'}); "
        f"SIGTERM: exit {rc} after {took:.1f}s (checkpoint.save_wait_seconds={wait:g}), "
        f"stuck save named: {'yes' if named else 'NO'}; newest checkpoint "
        f"{newest.name if newest else None}, loads: {'yes' if readable else 'NO'}"
    )
    return passed, text_


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mbps", type=float, default=200.0, help="the disk's write rate, MB/s")
    ap.add_argument("--layers", type=int, default=13, help="layers of 768 (13: ~1.1 GB saved)")
    ap.add_argument("--steps", type=int, default=61)
    ap.add_argument("--every", type=int, default=30, help="steps between saves (> a write)")
    ap.add_argument("--wait", type=float, default=10.0, help="checkpoint.save_wait_seconds")
    ap.add_argument("--workdir", default=f"/tmp/littlelm-async-save-{os.getpid()}")
    ap.add_argument("--no-stall", dest="stall", action="store_false", help="skip step 3")
    args = ap.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["LITTLELM_CACHE"] = str(work / "cache")
    text, flag = corpus(work), work / "stall"
    with mounted(work, args.mbps, flag) as mount:
        results = {}
        for name, background in (("sync", False), ("background", True)):
            t = tree(
                text,
                mount / "runs",
                name,
                model={"n_layer": args.layers, "d_model": 768, "n_head": 12},
                train={"max_steps": args.steps},
                checkpoint={"every": args.every, "async_save": background},
            )
            path = work / f"{name}.yaml"
            path.write_text(yaml.safe_dump(t))
            results[name] = timed_run(path)
        sync, bg = results["sync"], results["background"]
        a, b = sync["newest"], bg["newest"]
        equal = a is not None and b is not None and a.name == b.name and same_tensors(a, b)
        stall = stalled_run(work, mount, text, flag, args.wait) if args.stall else None

    gb = sync["size"] / 1e9
    print(
        f"\nasync_save: {args.layers} x 768 AdamW fp32, checkpoint {gb:.2f} GB, disk paced to "
        f"{args.mbps:g} MB/s (FUSE, benchmarks/slowfs.py), {args.steps} steps, a save every "
        f"{args.every}"
    )
    print("| saves | blocked per save (mean, max) | write per save | step time | run |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        mean = sum(r["blocked"]) / max(1, len(r["blocked"]))
        w = r["writes"]
        print(
            f"| {name} ({len(r['blocked'])}) | {mean:.2f} s, {max(r['blocked'], default=0):.2f} s "
            f"| {sum(w) / max(1, len(w)):.2f} s | {r['step_time']:.2f} s | {r['total']:.0f} s |"
        )
    ratio = (sum(bg["blocked"]) / len(bg["blocked"])) / (
        sum(sync["blocked"]) / len(sync["blocked"])
    )
    counts = len(bg["blocked"]) == len(bg["writes"]) == len(sync["blocked"]) >= 2
    enough = gb >= 1.0 and counts  # no background save skipped: each was written
    print(
        f"background blocked time per save / synchronous: {ratio:.1%} (acceptance <= 10%)\n"
        f"checkpoints of both runs hold the same tensors: {'yes' if equal else 'NO'}"
    )
    ok = ratio <= 0.10 and equal and enough
    if stall is not None:
        print(f"stalled disk: {'ok' if stall[0] else 'FAILED'}: {stall[1]}")
        ok = ok and stall[0]
    print("PASS" if ok else "FAIL")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
