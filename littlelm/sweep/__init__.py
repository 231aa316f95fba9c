"""`littlelm sweep`: a list of config diffs run as ordinary runs, compared at equal budget.

    opts = SweepOptions("demo", sets=["model.n_layer=4,6"], budget="10m")
    sweep_dir = run_sweep(opts)          # then littlelm.report.compare.write_sweep_report

spec.py turns --set/--grid/--zip/--seeds/--budget into variants and checks every variant's config
before anything trains; runner.py runs them (resumably) as `littlelm train` processes. The
comparison (table and plots) is `littlelm report SWEEP_DIR` (report/compare.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from littlelm.schema import load_run
from littlelm.sweep.runner import (
    Pool,
    SweepLock,
    finished,
    launch,
    train_command,
    write_manifest,
)
from littlelm.sweep.spec import (
    SweepError,
    Variant,
    budget_override,
    check_budgets,
    check_devices,
    check_sweep_name,
    load_variants,
    make_variants,
    parse_budget,
    parse_set,
    read_base,
)

__all__ = ["SweepError", "SweepOptions", "plan_sweep", "run_sweep"]


@dataclass
class SweepOptions:
    base: str
    overrides: list[str] = field(default_factory=list)  # key=value for every variant
    sets: list[str] = field(default_factory=list)  # KEY=v1,v2 (one per --set)
    zip: bool = False
    budget: str | None = None
    seeds: int = 1
    devices: list[str] | None = None  # GPU indices for side-by-side runs; None = one at a time
    name: str | None = None
    price_per_hour: float | None = None  # dollars per GPU-hour, for --budget $X and the table


@dataclass
class Job:
    variant: Variant
    run_dir: Path
    log: Path
    command: list[str]
    shared: list[str]  # the overrides every variant gets: the command's key=value and --budget

    @property
    def name(self) -> str:
        return self.variant.name

    def done(self) -> bool:
        return finished(self.run_dir)

    def summary(self, rc: int) -> str:
        state = "finished" if self.done() else f"stopped (exit {rc}; see {self.log})"
        return f"variant {self.name}: {state}"


def plan_sweep(opts: SweepOptions) -> tuple[Path, list[Job]]:
    """The sweep directory and one job per variant, every config checked; nothing runs."""
    if opts.seeds < 1:
        raise SweepError(f"--seeds must be at least 1, got {opts.seeds}")
    check_devices(opts.devices)
    name = opts.name or f"sweep-{Path(opts.base).stem}"
    check_sweep_name(name)
    # --budget may be what ends the base run (it has no max_steps): check the base with it
    price = opts.price_per_hour
    if price is None:
        base_budget = read_base(opts.base, opts.overrides).train.budget
        price = base_budget.price_per_gpu_hour if base_budget is not None else None
    budget = parse_budget(opts.budget, price) if opts.budget else None
    base_cfg = load_run(opts.base, [*opts.overrides, *budget_override(budget)])
    variants = make_variants(
        [parse_set(s) for s in opts.sets], opts.zip, opts.seeds, base_cfg.run.seed
    )
    sweep_dir = Path(base_cfg.run.out_dir) / name
    configs = load_variants(opts.base, opts.overrides, variants, sweep_dir, budget_override(budget))
    check_budgets(configs, [v.name for v in variants])
    jobs, shared = [], [*opts.overrides, *budget_override(budget)]
    for v, cfg in zip(variants, configs, strict=True):
        overrides = [*shared, *v.overrides]
        overrides += [f"run.name={json.dumps(v.name)}", f"run.out_dir={json.dumps(str(sweep_dir))}"]
        log = sweep_dir / "logs" / f"{v.name}.log"
        jobs.append(Job(v, cfg.run_dir(), log, train_command(opts.base, overrides), shared))
    return sweep_dir, jobs


def run_sweep(opts: SweepOptions, say=print) -> Path:
    """Run every unfinished variant; returns the sweep directory (raises if any failed)."""
    sweep_dir, jobs = plan_sweep(opts)
    with SweepLock(sweep_dir):  # one sweep process per directory
        return _run_locked(opts, sweep_dir, jobs, say)


def _run_locked(opts: SweepOptions, sweep_dir: Path, jobs: list[Job], say) -> Path:
    args = {
        "overrides": opts.overrides,
        "sets": opts.sets,
        "zip": opts.zip,
        "budget": opts.budget,
        "seeds": opts.seeds,
        "price_per_hour": opts.price_per_hour,
    }
    write_manifest(sweep_dir, opts.base, args, jobs[0].shared, [j.variant for j in jobs])
    todo = [j for j in jobs if not j.done()]
    for j in jobs:
        if j not in todo:
            say(f"variant {j.name}: already finished, skipped")
    say(
        f"sweep {sweep_dir}: {len(jobs)} variant(s), {len(todo)} to run"
        + (f" on devices {','.join(opts.devices)}" if opts.devices else ", one after another")
    )

    def start(job: Job, device: str | None):
        say(f"variant {job.name}: training (log: {job.log})")
        return launch(job.command, job.log, device)

    failed = Pool(opts.devices or [None], start, say).run(todo)
    if failed:
        raise SweepError(
            f"{len(failed)} variant(s) did not finish: {'; '.join(failed)}. Fix the cause and "
            "run the same command: finished variants are skipped, the others resume"
        )
    return sweep_dir
