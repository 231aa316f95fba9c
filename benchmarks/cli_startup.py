"""Start-up time of a CLI generated from typed functions, per library: the measurement that picks
the generator for littlelm's CLI.

    python benchmarks/cli_startup.py [--runs 10] [--libraries argparse typer cyclopts tyro jsonargparse]

For each library it writes one small program with 22 verbs (littlelm's count), each verb a
function with typed parameters and a docstring (its help), and times, in fresh processes:
`prog --help`, `prog train --help` and `prog train demo --nproc=2` (parse only: the verb returns
at once). Dotted `key=value` overrides anywhere on the line are not a library feature: littlelm
takes them out of argv before any parser sees it, so they cost the same with every library. littlelm's own imports are not part of it: what is measured is what the library adds to
every command a user types, including tab completion, which runs the program once per <TAB>.
The table gives the median wall time of --runs runs, and the import time of the library alone.
A library not installed is reported as such (pip install it into the interpreter running this).

    python benchmarks/cli_startup.py --littlelm TREE [TREE ...] [--runs 5]

times littlelm's own `python -m littlelm --help` and `... train --help` instead, from each
checkout TREE (PYTHONPATH set to it), the trees interleaved run by run: the before/after check of
a change to the command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERBS = [
    "train", "sample", "chat", "config", "list_", "grow", "report", "eval", "eval_bundle", "plan",
    "bench", "data_prepare", "data_inspect", "sweep", "export", "import_", "chat_tokens", "serve",
    "runs", "compare", "cache", "version",
]  # fmt: skip

# one verb's signature, as littlelm's train has it: a config, overrides anywhere, options
FUNC = '''
def {name}(config: str = "demo", *, resume: str = "auto", nproc: int = 1, json: bool = False,
           device: str = "auto") -> None:
    """{doc}

    Args:
        config: a packaged config name or a YAML file
        resume: auto, never or a checkpoint directory
        nproc: processes (one per GPU)
        json: one JSON document on stdout
        device: auto, cpu, cuda
    """
    return None
'''

PROGRAMS = {
    "argparse": """
import argparse, sys
p = argparse.ArgumentParser(prog="prog")
sub = p.add_subparsers(dest="verb", required=True)
for name, f in FUNCS.items():
    s = sub.add_parser(name, help=f.__doc__.splitlines()[0])
    s.add_argument("config", nargs="?", default="demo")
    s.add_argument("--resume", default="auto")
    s.add_argument("--nproc", type=int, default=1)
    s.add_argument("--json", action="store_true")
    s.add_argument("--device", default="auto")
a = p.parse_args()
""",
    "typer": """
import typer
app = typer.Typer(add_completion=True)
for name, f in FUNCS.items():
    app.command(name)(f)
app()
""",
    "cyclopts": """
import cyclopts
app = cyclopts.App()
for name, f in FUNCS.items():
    app.command(f, name=name)
app()
""",
    "tyro": """
import tyro
tyro.extras.subcommand_cli_from_dict(FUNCS)
""",
    "jsonargparse": """
from jsonargparse import auto_cli
auto_cli(FUNCS)
""",
}


# how each passes the config: typer and argparse positionally, the others as an option
positional = {"argparse": ["demo"], "typer": ["--config", "demo"], "cyclopts": ["demo"]}
positional |= {"tyro": ["--config", "demo"], "jsonargparse": ["--config", "demo"]}


def source(lib: str) -> str:
    funcs = "".join(FUNC.format(name=v, doc=f"Do {v}.") for v in VERBS)
    table = "FUNCS = {" + ", ".join(f"{v!r}: {v}" for v in VERBS) + "}\n"
    return funcs + table + PROGRAMS[lib]


def timed(cmd: list[str], runs: int) -> tuple[float, int]:
    times, rc = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True)
        times.append(time.perf_counter() - t0)
        rc = rc or done.returncode
    return statistics.median(times), rc


def littlelm_startup(trees: list[str], runs: int) -> None:
    import os

    cases = (["--help"], ["train", "--help"])
    times: dict[tuple[str, int], list[float]] = {(t, i): [] for t in trees for i in range(2)}
    for _ in range(runs):
        for tree in trees:
            for i, extra in enumerate(cases):
                env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
                t0 = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "littlelm", *extra], env=env, capture_output=True)  # fmt: skip
                times[tree, i].append(time.perf_counter() - t0)
                assert done.returncode == 0, done.stderr.decode()
    print(f"median of {runs} fresh processes (ms), trees interleaved\n")
    print("| tree | littlelm --help | littlelm train --help | all --help runs |")
    print("| --- | --- | --- | --- |")
    for tree in trees:
        one, two = (times[tree, i] for i in range(2))
        runs_ms = " ".join(f"{1000 * t:.0f}" for t in one)
        print(f"| {tree} | {1000 * statistics.median(one):.0f} | {1000 * statistics.median(two):.0f} | {runs_ms} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--libraries", nargs="+", default=list(PROGRAMS))
    p.add_argument("--littlelm", nargs="+", metavar="TREE", help="time littlelm's own CLI")
    args = p.parse_args()
    if args.littlelm:
        littlelm_startup(args.littlelm, args.runs)
        return
    py = sys.executable
    base, _ = timed([py, "-c", "pass"], args.runs)
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, median wall time (ms); ")
    print(f"a bare interpreter start: {1000 * base:.0f} ms\n")
    print(
        "| library | version | import | prog --help | prog train --help | prog train demo --nproc=2 |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for lib in args.libraries:
            if lib != "argparse" and importlib.util.find_spec(lib) is None:
                print(f"| {lib} | not installed | | | | |")
                continue
            version = "stdlib"
            if lib != "argparse":
                from importlib.metadata import version as v

                version = v(lib)
            prog = Path(tmp) / f"{lib}_prog.py"
            prog.write_text(source(lib))
            imp, _ = timed([py, "-c", f"import {lib}"], args.runs)
            cells = []
            for extra in (
                ["--help"],
                ["train", "--help"],
                ["train", *positional[lib], "--nproc=2"],
            ):
                t, rc = timed([py, str(prog), *extra], args.runs)
                cells.append(f"{1000 * t:.0f}" + (f" (exit {rc})" if rc else ""))
            print(f"| {lib} | {version} | {1000 * imp:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
