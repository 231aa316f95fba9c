"""Data-parallel throughput: tokens/s of the same run (same global batch) at several world sizes
and strategies, each a real `littlelm train` (`--nproc N` starts torchrun).

    .venv/bin/python benchmarks/ddp.py                         # CPU: world 1 and 2, ~5 minutes
    .venv/bin/python benchmarks/ddp.py --device cuda --nprocs 1,2,4,8 --steps 30 --micro 16 \\
        --set model.n_layer=12 model.d_model=768

The run is the demo config (6 layers, d_model 256, seq 512, BPE 4096 on the Python standard
library) with a global batch of nprocs_max x micro-batch x seq_len tokens (--micro, --seq-len),
so every world size does the same work per step (smaller worlds accumulate). tokens/s is
measured from metrics.jsonl over the steps after the first `--warmup` (training time only: no
evaluation or checkpoint). On a CPU, world 1 uses every core in one process and world N gives
each process 1 thread (torchrun's default), so more processes cannot add compute: expect little
or no speed-up there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

CASES = {  # name -> extra overrides (world size > 1 only)
    "ddp": [],  # sharded Muon, the default
    "ddp-replicated-muon": ["distributed.shard_muon=false"],
    "ddp-zero1": ["distributed.shard_adamw=true"],
    "fsdp": ["distributed.strategy=fsdp"],
}


def run(nproc: int, overrides: list[str], out: Path, timeout: float) -> dict:
    name = f"w{nproc}-{abs(hash(tuple(overrides))) % 10**6}"
    cmd = [sys.executable, "-m", "littlelm", "train", "demo", *overrides]
    cmd += [f"run.out_dir={out}", f"run.name={name}", "--resume", "never"]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    resolved = yaml.safe_load((out / name / "config.yaml").read_text())
    return {
        "records": [r for r in records if r["kind"] == "train"],
        "wall": time.time() - t0,
        "accum": resolved["train"]["grad_accum"],
        "seq_len": resolved["train"]["seq_len"],
    }


def tokens_per_s(records: list[dict], warmup: int) -> float:
    first = next(r for r in records if r["step"] == warmup)
    last = records[-1]
    return (last["tokens"] - first["tokens"]) / (last["train_time"] - first["train_time"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nprocs", default="1,2", help="world sizes, comma-separated")
    p.add_argument("--cases", default=",".join(CASES), help="strategies for world size > 1")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the measurement")
    p.add_argument("--micro", type=int, default=8, help="micro-batch per process")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per row")
    p.add_argument("--device", default="cpu")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value overrides")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    worlds = [int(n) for n in args.nprocs.split(",")]
    batch = max(worlds) * args.micro * args.seq_len
    common = [
        f"run.device={args.device}",
        f"train.seq_len={args.seq_len}",
        f"model.max_seq_len={args.seq_len}",
        f"train.micro_batch_size={args.micro}",
        f"train.batch_tokens={batch}",
        f"train.max_steps={args.steps}",
        "train.log_every=1",
        "eval.every=0",
        "eval.at_end=false",
        "checkpoint.every=0",
        "checkpoint.at_end=false",
        "callbacks=[]",
        *args.set,
    ]
    table = Table(title=f"data-parallel throughput, global batch {batch:,} tokens")
    for col in ("world", "strategy", "accum", "tokens/s", "vs world 1", "wall s"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    base = None
    with tempfile.TemporaryDirectory(prefix="littlelm-ddp-") as tmp:
        for world in worlds:
            cases = ["single"] if world == 1 else args.cases.split(",")
            for case in cases:
                if world > 1 and case not in CASES:
                    raise SystemExit(f"unknown case {case!r}; cases: {', '.join(CASES)}")
                r = run(world, common + CASES.get(case, []), Path(tmp), args.timeout)
                tps = tokens_per_s(r["records"], args.warmup)
                base = base or (tps if world == 1 else None)
                ratio = f"{tps / base:.2f}x" if base else "-"
                table.add_row(
                    str(world), case, str(r["accum"]), f"{tps:,.0f}", ratio, f"{r['wall']:.0f}"
                )
    Console().print(table)
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, device "
        f"{args.device}; {args.steps} steps, first {args.warmup} excluded"
    )


if __name__ == "__main__":
    main()
