"""The verbs that check a run before it runs: plan, bench, grow; each a typed function whose
docstring is its --help (cli.py registers them)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from cyclopts import Parameter
from cyclopts.validators import Number

from littlelm.cli_args import (
    Checkpoint,
    Config,
    Dollars,
    Json,
    Overrides,
    Positive,
    split_config,
    stdout_to_stderr,
)


def _stage_or_override(type_: Any, value: str) -> None:
    if value.startswith("-"):
        raise ValueError(f"{value!r} is not a run file nor a key=value override")


StagesAndOverrides = Annotated[
    str,
    Parameter(
        validator=_stage_or_override,
        help="more run files (stages of one pipeline, planned together) and key=value overrides",
    ),
]
PositiveReal = Annotated[float | None, Parameter(validator=Number(gt=0, lt=float("inf")))]

# Each verb imports what it runs inside its body: `littlelm VERB --help` and tab completion import
# none of it.


def plan(
    config: Config = "demo",
    /,
    *overrides: StagesAndOverrides,
    gpu: list[str] | None = None,
    tokens: Positive | None = None,
    devices: Positive = 1,
    gpus: list[str] | None = None,
    json: Json = False,
    chart: str | None = None,
    no_trace: bool = False,
    device: Literal["cpu"] | None = None,
    price_per_hour: Dollars = None,
    detail: bool = False,
    write_gbs: PositiveReal = None,
    deadline: PositiveReal = None,
) -> None:
    """Memory, speed and cost of a run (or a pipeline's stages) on each GPU of a catalog.

    examples:
      littlelm plan demo
      littlelm plan run.yaml --gpu H100-SXM --price-per-hour 1.99   # your price per GPU-hour
      littlelm plan demo --device cpu --price-per-hour 0.10   # this machine, at its price
      littlelm plan run.yaml --gpu H100-SXM --devices 8 --chart plan.png
      littlelm plan run.yaml --json model.n_layer=24
      littlelm plan pretrain.yaml sft.yaml --deadline 120   # a pipeline: the cheapest GPU in time

    Args:
        gpu: plan for this catalog GPU (repeatable)
        tokens: token budget (default: the config's)
        devices: data-parallel GPUs (DDP)
        gpus: extra GPU catalog YAML (repeatable)
        chart: write a memory and cost chart to this PNG
        no_trace: skip the FakeTensorMode trace
        device: also predict the run on this machine's CPU (rates probed here, in seconds)
        price_per_hour: what you pay per device-hour: the price of each GPU named with --gpu and, with --device cpu, of this machine; with neither, of every catalog GPU
        detail: memory by category, trace check, every remedy
        write_gbs: checkpoint write bandwidth, GB/s (default 0.2: a network filesystem's, assumed)
        deadline: hours the whole pipeline may take: pick the cheapest GPU kind and count that finishes in time
    """
    import json as js
    from pathlib import Path

    from littlelm.plan.cost import load_catalog
    from littlelm.plan.pipeline import load_stages
    from littlelm.plan.planner import make_plan
    from littlelm.plan.report import plan_chart, plan_json, print_plan
    from littlelm.plan.saves import checkpoint_costs

    first, rest = split_config(config, overrides)  # `plan a=1`: the demo with a=1
    stages = [first, *(o for o in rest if "=" not in o)]
    if len(stages) > 1 or deadline is not None:
        from littlelm.plan.pipeline_report import pipeline_json, print_pipeline

        with stdout_to_stderr(json):
            p = _plan_stages(stages, rest, gpu, gpus, devices, deadline, price_per_hour, no_trace)
        print(js.dumps(pipeline_json(p), indent=1)) if json else print_pipeline(p)
        return
    with stdout_to_stderr(json):
        # grow's parent; a base not trained yet: its config.yaml, or the fix named
        cfg = load_stages([first], rest, world_size=devices)[0][1]
        p = make_plan(
            cfg,
            load_catalog([*map(Path, gpus or [])]),
            gpu,
            tokens,
            devices,
            not no_trace,
            local=device == "cpu",
            price_per_hour=price_per_hour,
        )
        p.checkpoints = checkpoint_costs(p, write_gbs)
        if chart:
            plan_chart(p, chart)
            print(f"chart written to {chart}")  # on stderr with --json
    print(js.dumps(plan_json(p), indent=1)) if json else print_plan(p, detail=detail)


def _plan_stages(stages, overrides, gpu, gpus, devices, deadline, price, no_trace):
    """`plan` of several stages: each on every GPU kind and count (COUNTS, or --devices N)."""
    from pathlib import Path

    from littlelm.plan.cost import load_catalog
    from littlelm.plan.pipeline import COUNTS, load_stages, plan_pipeline

    settings = [o for o in overrides if "=" in o]
    counts = COUNTS if devices == 1 else (devices,)
    return plan_pipeline(
        load_stages(stages, settings),
        load_catalog([*map(Path, gpus or [])]),
        gpu,
        counts,
        deadline,
        price,
        trace=not no_trace,
    )


def bench(
    config: Config = "demo", /, *overrides: Overrides, steps: Positive = 4, json: Json = False
) -> None:
    """Run real steps, a save and a resume; measure them.

    examples:
      littlelm bench demo --steps 8
      littlelm bench run.yaml --json model.n_layer=4

    Args:
        steps: steps before and after resume
    """
    import json as js

    from littlelm.plan.bench import run_bench
    from littlelm.plan.report import print_bench
    from littlelm.schema import load_run
    from littlelm.train.growth import complete_growth

    with stdout_to_stderr(json):  # grown: the parent's shape
        result = run_bench(complete_growth(load_run(*split_config(config, overrides))), steps)
    print(js.dumps(result, indent=1)) if json else print_bench(result)


def grow(parent: Checkpoint, /, *overrides: Overrides, to: Config) -> None:
    """Check growing a checkpoint into a run's larger model (docs/growth.md).

    Build RUN's model from PARENT as `littlelm train` would with grow.parent=PARENT, check that
    it computes the parent's function, and print where each block comes from and the learning
    rate of every parameter group. Writes nothing.

    examples:
      littlelm grow runs/small --to big.yaml train.max_steps=2000

    Args:
        to: run file (or packaged config) of the grown model; the overrides apply to it
    """
    from littlelm.schema import load_run
    from littlelm.train.growth import preview_growth

    items = [f"grow.parent={parent}", *overrides]
    print(
        "\n".join(
            [
                *preview_growth(load_run(to, items)),
                f"train it: littlelm train {to} {' '.join(items)}",
            ]
        )
    )
