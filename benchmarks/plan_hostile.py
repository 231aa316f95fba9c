"""How long `littlelm plan` takes on configs of hostile sizes (the test suite bounds the work it
does, tests/test_plan.py; this times it).

    python benchmarks/plan_hostile.py [--rounds 2] [--no-cpu]

Each config is the tiny test config with one size pushed to the schema's limits, planned by the
CLI's main (every catalog GPU, `--json`), and again with `--device cpu` (this CPU's probes at
capped shapes). Prints one table of the wall time per config: the median over the rounds and
the slowest.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_corpus, tiny_tree, write_config
from littlelm.cli import main

HOSTILE = {
    "seq 1e9 beyond max_seq_len (refused)": ["train.seq_len=1000000000"],
    "seq 1e9": ["train.seq_len=1000000000", "model.max_seq_len=1000000000"],
    "seq 100000": ["train.seq_len=100000", "model.max_seq_len=100000"],
    "micro-batch 1e9": ["train.micro_batch_size=1000000000"],
    "grad accumulation 1e9": ["train.grad_accum=1000000000"],
}


def timed(argv: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = main(argv)
    return time.perf_counter() - t0, rc


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-cpu", action="store_true", help="skip the --device cpu plans")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="plan-hostile-"))
    corpus = make_corpus(root / "corpus.txt")
    config = write_config(root / "tiny.yaml", tiny_tree(corpus, root / "runs"))
    modes = {"GPUs": []} | ({} if args.no_cpu else {"GPUs and --device cpu": ["--device", "cpu"]})
    print("| config | plan of | rc | median s | slowest s |")
    print("| --- | --- | --- | --- | --- |")
    for name, overrides in HOSTILE.items():
        for mode, extra in modes.items():
            runs = [
                timed(["plan", str(config), *overrides, *extra, "--json"])
                for _ in range(args.rounds)
            ]
            secs = [s for s, _ in runs]
            print(
                f"| {name} | {mode} | {runs[0][1]} | {statistics.median(secs):.2f} "
                f"| {max(secs):.2f} |"
            )


if __name__ == "__main__":
    main_()
