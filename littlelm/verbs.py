"""The verbs on a whole run file, which tie several packages together and so sit above them
(pyproject's layers): train (the Trainer, printing with console.py), config show and list (the
schema), data prepare (the schema's data section), sweep (runs, then report/compare.py's table;
in sweep/, its --help and <TAB> would import sweep/__init__.py's schema, and with it torch).
The verbs of one package live in its verbs.py; cli.py registers them all."""

from __future__ import annotations

from typing import Annotated

from cyclopts import Parameter

from littlelm.cli_args import Config, Dollars, Overrides, Positive, split_config

# Each verb imports what it runs inside its body: `littlelm VERB --help` and tab completion import
# none of it.


def train(
    config: Config = "demo",
    /,
    *overrides: Overrides,
    resume: str = "auto",
    nproc: int | None = None,
) -> int:
    """Train (or resume) a run.

    examples:
      littlelm train demo
      littlelm train run.yaml train.max_steps=500 optimizer.lr=3e-3
      littlelm train demo --resume never train.max_steps=5
      littlelm train run.yaml --nproc 2 run.name=ddp

    Args:
        resume: auto (newest complete checkpoint of the run), never (start fresh; refused over existing checkpoints), or a checkpoint path
        nproc: train with N processes on this machine (runs torchrun; one per GPU)
    """
    from littlelm.console import Console
    from littlelm.schema import load_run
    from littlelm.train import distributed
    from littlelm.train.device import pick_device
    from littlelm.train.trainer import Trainer

    name, items = split_config(config, overrides)
    env = distributed.detect_env()
    if nproc is not None:
        cfg = load_run(name, items, world_size=nproc)  # report config errors once
        distributed.launch(nproc, ["train", config, *overrides, "--resume", resume], cfg.run.device)
    cfg = load_run(name, items, world_size=env.world_size)
    with distributed.session(cfg.distributed, pick_device(cfg.run.device), env) as parallel:
        console = Console()  # what the run prints (littlelm/console.py)
        trainer = Trainer(cfg, resume=resume, parallel=parallel, callbacks=(console,))
        trainer.stop.persist = True  # this process ends with the run: a stop ignores signals after
        result = trainer.fit()
        console.report(trainer, result)
    return 0 if result["finished"] or result.get("stopped_by") else 1


def show(config: Config = "demo", /, *overrides: Overrides, flat: bool = False) -> None:
    """Print the merged, validated, resolved config.

    examples:
      littlelm config show demo
      littlelm config show run.yaml model.n_layer=8 --flat

    Args:
        flat: one dotted key per line
    """
    from littlelm.config import dump_yaml, flatten, to_tree
    from littlelm.schema import load_run

    cfg = load_run(*split_config(config, overrides))
    print(
        "\n".join(f"{k}: {v!r}" for k, v in flatten(to_tree(cfg)).items())
        if flat
        else dump_yaml(cfg),
        end="\n" if flat else "",
    )


def list_() -> None:
    """List every registered component."""
    from littlelm.schema import components

    for kind, rows in components().items():
        print(f"{kind}s:\n" + "".join(f"  {name:<16} {doc}\n" for name, doc in rows), end="")


def prepare(
    config: Config = "demo",
    /,
    *overrides: Overrides,
    out: str | None = None,
    only: Annotated[list[str] | None, Parameter(consume_multiple=True)] = None,
    workers: int | None = None,
    no_verify: bool = False,
) -> None:
    """Tokenize a config's data sources into shards (resumable, every core).

    examples:
      littlelm data prepare demo
      littlelm data prepare run.yaml --out shards/ --only web

    Args:
        config: run or data file
        out: write each source to OUT/LABEL (default: the cache `littlelm train` uses)
        only: prepare only these sources (labels)
        workers: tokenizing processes (default: one per core, one per 64 MB of input at most)
        no_verify: check an already prepared dataset's shard sizes and headers only, not every checksum (damaged shards are rebuilt either way)
    """
    from pathlib import Path

    from littlelm.data.build import prepare_data, prepared_section
    from littlelm.data.prepare import duplicates_note
    from littlelm.schema import load_data_config

    name, items = split_config(config, overrides)
    cfg = load_data_config(
        name, [*items, f"data.workers={workers}"] if workers is not None else items
    )
    _, result = prepare_data(
        cfg, Path(out) if out else None, only, verify="sizes" if no_verify else "checksums"
    )
    for label, (src, _, manifest) in result.items():  # also of a dataset prepared before
        if note := duplicates_note(label, manifest, not src.prepared):
            print(f"note: {note}")
    if out is not None:
        print(prepared_section(result))


def sweep(
    config: Config = "demo",
    /,
    *overrides: Overrides,
    set: list[str] | None = None,
    grid: bool = False,
    zip: bool = False,
    budget: str | None = None,
    seeds: Positive = 1,
    devices: str | None = None,
    name: str | None = None,
    price_per_hour: Dollars = None,
) -> None:
    """Run variants of a config (at equal budget) and compare them (docs/budget.md).

    examples:
      littlelm sweep demo --set model.n_layer=4,6 --budget 10m
      littlelm sweep demo --set train.seq_len=256,512 --set model.n_layer=4,6 --seeds 2

    Args:
        set: KEY=v1,v2: a key and the values to try (repeatable)
        grid: every combination (the default)
        zip: the i-th values of every key together
        budget: every variant's budget: 90s, 30m, 2h, $5 or 500M (tokens)
        seeds: repeats of each variant
        devices: GPU indices to run variants side by side, e.g. 0,1,2,3
        name: sweep directory name under run.out_dir (default sweep-CONFIG)
        price_per_hour: dollars per GPU-hour, for a $ budget and the table's cost column
    """
    from littlelm.errors import ConfigError
    from littlelm.report.compare import write_sweep_report
    from littlelm.sweep import SweepOptions, run_sweep

    if grid and zip:
        raise ConfigError(
            ["--grid and --zip: give one (--grid, every combination, is the default)"]
        )
    base, items = split_config(config, overrides)
    opts = SweepOptions(
        base,
        items,
        set or [],
        zip,
        budget,
        seeds,
        devices.split(",") if devices else None,
        name,
        price_per_hour,
    )
    path, table = write_sweep_report(run_sweep(opts), price_per_hour)
    print(f"{table}\nwrote {path} and its plots ({path.parent})")
