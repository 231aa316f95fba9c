"""What the verbs of `littlelm` share (each verb is a typed function in a verbs.py beside what it
runs; cli.py registers them): the annotated parameter types with their help and checks, the
completion of config names, and two helpers. It imports only typing and cyclopts, so that
parsing a command line, `--help` and tab completion import nothing else."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal

from cyclopts import Parameter, Token
from cyclopts.validators import Number


def _configs(context: Any) -> list[str]:
    """Shell completion of CONFIG: packaged configs, YAML files and directories."""
    from pathlib import Path

    packaged = Path(__file__).parent / "configs"  # schema.PACKAGED_CONFIGS, without importing it
    names = sorted(str(f.relative_to(packaged).with_suffix("")) for f in packaged.rglob("*.yaml"))
    here = Path(context.incomplete).parent if context.incomplete else Path(".")
    files = (
        [
            f"{p}/" if p.is_dir() else str(p)
            for p in here.iterdir()
            if p.suffix in (".yaml", ".yml") or p.is_dir()
        ]
        if here.is_dir()
        else []
    )
    return [*names, *files]


def _override(type_: Any, value: str) -> None:
    if "=" not in value or value.startswith("-"):
        raise ValueError(f"{value!r} is not an override: overrides are written key=value")


def _int(type_: Any, tokens: Sequence[Token]) -> int:
    return int(float(tokens[0].value))  # 2e9 tokens, 1_000 steps


Config = Annotated[str, Parameter(completer=_configs, help="run file or packaged config")]
Overrides = Annotated[
    str, Parameter(validator=_override, help="key=value overrides, anywhere on the line")
]
Checkpoint = Annotated[
    str, Parameter(help="checkpoint directory or run directory (newest checkpoint)")
]
Positive = Annotated[int, Parameter(converter=_int, validator=Number(gte=1))]
Device = Annotated[str, Parameter(help="auto, cpu, cuda, cuda:1, mps")]
Precision = Annotated[
    Literal["auto", "bf16", "fp32"],
    Parameter(
        help="matmul precision: auto = the one the model trained in where the device computes it natively, else fp32"
    ),
]
Dollars = Annotated[float | None, Parameter(validator=Number(gte=0, lt=float("inf")))]
Json = Annotated[
    bool, Parameter(help="print one JSON object on stdout (anything else goes to stderr)")
]


def split_config(config: str, overrides: Sequence[str]) -> tuple[str, list[str]]:
    """A leading override means the default config: `train a=1` is `train demo a=1`."""
    return ("demo", [config, *overrides]) if "=" in config else (config, list(overrides))


@contextlib.contextmanager
def stdout_to_stderr(active: bool) -> Iterator[None]:
    """With `--json`, stdout carries the one JSON document only: whatever the verb prints on the
    way (progress, a subprocess's or a C library's output) goes to stderr, Python's and fd 1's."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
