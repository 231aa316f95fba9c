"""`littlelm plan STAGE.yaml STAGE.yaml ...`: the stages of one pipeline (pretrain or grow, then
SFT, DPO...) planned together on each GPU kind and count, because a GPU is rented for the whole
path: whether every stage fits, each stage's hours and dollars, the total; with a deadline, the
cheapest kind and count that finishes in time, or, when none does, the one that comes closest.

A stage that starts from an earlier stage's run (`sft.base` or `grow.parent` naming its run
directory) is planned before that run exists: from the earlier stage's config (its vocabulary and
model), or from the base's config.yaml where only that is on disk.

    p = plan_pipeline(load_stages(["configs/plans/3b_grow.yaml", "configs/plans/3b_sft.yaml"]),
                      load_catalog(), deadline=120)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from littlelm.errors import CheckpointError, ConfigError, LittleLMError
from littlelm.plan import speed
from littlelm.plan.cost import Catalog, GpuPlan, plan_gpu
from littlelm.plan.dims import Dims
from littlelm.plan.planner import check_plannable, step_memory
from littlelm.schema import RunConfig, load_run, read_run
from littlelm.train.build import build_data, steps_from_epochs
from littlelm.train.growth import complete_growth, find_parent

COUNTS = (1, 2, 4, 8)  # GPUs per node: the counts a pipeline is planned on


@dataclass
class Stage:
    """One stage's file, overrides, and where its base's shape comes from."""

    path: str
    overrides: list[str]
    name: str  # run.name
    run_dir: Path
    based_on: str = ""  # "" (the base is on disk or there is none), or what stands in for it
    stand_in: list[str] = field(default_factory=list)  # overrides giving it the base's shape


@dataclass
class StagePlan:
    stage: Stage
    tokens: int
    plan: GpuPlan | None  # None: the stage cannot be planned on this count (batch does not split)
    strategy: str  # what it runs under here: ddp, or fsdp when only that fits
    problem: str = ""

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.tok_s is not None


@dataclass
class Option:
    """The whole pipeline on `devices` GPUs of one kind."""

    gpu: str
    devices: int
    price_per_hour: float  # one GPU
    stages: list[StagePlan]

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def hours(self) -> float | None:
        if not self.fits:
            return None
        return sum(s.plan.hours or 0.0 for s in self.stages if s.plan)

    @property
    def dollars(self) -> float | None:
        if not self.fits:
            return None
        return sum(s.plan.dollars or 0.0 for s in self.stages if s.plan)


@dataclass
class PipelinePlan:
    stages: list[Stage]
    options: list[Option]  # fitting ones cheapest first, then the rest
    deadline: float | None
    choice: Option | None  # the cheapest that fits (and meets the deadline, if one is given)
    closest: Option | None = None  # with a deadline none meets: the fastest that fits
    notes: list[str] = field(default_factory=list)


def _base_of(tree: dict) -> str | None:
    """The run directory or checkpoint a stage starts from (sft.base or grow.parent), if any."""
    for section, key in (("sft", "base"), ("grow", "parent")):
        value = (tree.get(section) or {}).get(key)
        if value:
            return str(value)
    return None


def _matches(base: str, run_dir: Path) -> bool:
    """Whether `base` names `run_dir` or a checkpoint inside it."""
    b, r = Path(base), run_dir
    return b == r or r in b.parents


def load_stages(
    paths: Sequence[str], overrides: Sequence[str] = (), world_size: int = 1
) -> list[tuple[Stage, RunConfig]]:
    """Each stage's config (the overrides apply to every stage), with a base that is not on disk
    yet stood in for by the earlier stage that trains it, or by the base's own config.yaml."""
    out: list[tuple[Stage, RunConfig]] = []
    for path in paths:
        tree, _, _ = read_run(path, overrides)
        base = _base_of(tree)
        earlier = next((s for s in reversed(out) if base and _matches(base, s[0].run_dir)), None)
        stage = Stage(str(path), list(overrides), "", Path())
        stand_in = None
        if base and not _on_disk(base):
            if earlier is not None:
                stand_in, stage.based_on = earlier[1], f"stage {earlier[0].name}'s config"
            elif (Path(base) / "config.yaml").is_file():
                stand_in = load_run(Path(base) / "config.yaml")
                stage.based_on = f"{base}/config.yaml (no checkpoint yet)"
        if stand_in is not None:
            stage.stand_in = _shape_of(stand_in)
        try:
            cfg = _complete(load_run(path, [*overrides, *stage.stand_in], world_size), stage)
        except LittleLMError as e:
            if not base or _on_disk(base) or stand_in is not None:
                raise
            raise ConfigError(
                [
                    f"{path}: {e}; {path} starts from {base}, which is not trained yet: name the "
                    f"stage that trains it first (littlelm plan BASE.yaml {path}), or plan it "
                    f"without its base ({'sft' if 'sft' in tree else 'grow'}=null)"
                ]
            ) from None
        stage.name, stage.run_dir = cfg.run.name, cfg.run_dir()
        out.append((stage, cfg))
    return out


def _complete(cfg: RunConfig, stage: Stage) -> RunConfig:
    """complete_growth where the base is on disk; with a stand-in, the config as it is: what
    growth derives from a checkpoint (the layer placement, the value-embedding layers of a
    model of the same shape) moves no byte or FLOP. train.epochs becomes steps as the trainer
    counts them, from the data prepared (cached, as `littlelm train` would prepare it)."""
    cfg = cfg if stage.based_on else complete_growth(cfg)
    if cfg.train.epochs is None:
        return cfg
    if stage.based_on:  # its data is read with the tokenizer of a base not on disk yet
        raise ConfigError(
            [
                f"{stage.path}: train.epochs counts the data's tokens, which needs the "
                f"tokenizer of a base not trained yet; plan it with train.max_steps=N"
            ]
        )
    return steps_from_epochs(cfg, build_data(cfg, print), print)


def _on_disk(base: str) -> bool:
    try:
        find_parent(base)
    except CheckpointError:
        return False
    return True


def _shape_of(cfg: RunConfig) -> list[str]:
    """Overrides that give a stage its base's vocabulary (which a saved tokenizer of a base not
    yet trained cannot tell) and, where the model derives it from its base, its value-embedding
    layers."""
    m = cfg.model
    out = [f"model.vocab_size={m.vocab_size}"]
    if m.value_embeds and m.value_embed_layers is not None:
        out.append(f"model.value_embed_layers=[{','.join(map(str, m.value_embed_layers))}]")
    return out


def _tokens(cfg: RunConfig) -> int:
    t = cfg.train
    return t.max_tokens or (t.max_steps or 0) * (t.batch_tokens or 0) or 1


def plan_pipeline(
    stages: list[tuple[Stage, RunConfig]],
    catalog: Catalog,
    gpu_names: list[str] | None = None,
    counts: Sequence[int] = COUNTS,
    deadline: float | None = None,
    price_per_hour: float | None = None,
    trace: bool = True,
) -> PipelinePlan:
    """Every stage on every (GPU kind, count): the memory model is scaled to each stage's trace
    once (at one GPU), the rest is the analytic model (milliseconds per GPU and count)."""
    records = speed.load_measurements()
    scales = {}
    for stage, cfg in stages:
        traced = check_plannable(cfg, trace)
        scales[stage.path] = step_memory(cfg.with_precision(True), traced)[0].trace_scale
    gpus = catalog.select(gpu_names)
    if price_per_hour is not None:
        update = {"price_per_hour": price_per_hour, "price_source": "--price-per-hour"}
        gpus = [g.model_copy(update=update) for g in gpus]
    options = {(g.name, n): Option(g.name, n, g.price_per_hour, []) for g in gpus for n in counts}
    for stage, _ in stages:
        tokens = None
        for n in counts:
            dims = _stage_dims(stage, n, scales[stage.path])
            for g in gpus:
                if isinstance(dims, str):
                    sp = StagePlan(stage, tokens or 0, None, "", dims)
                else:
                    tokens = dims[1]
                    sp = _on_gpu(stage, dims[0], g, catalog, tokens, n, records)
                options[(g.name, n)].stages.append(sp)
    ranked = sorted(options.values(), key=lambda o: (not o.fits, o.dollars or 0.0, o.hours or 0.0))
    fitting = [o for o in ranked if o.fits]
    in_time = [o for o in fitting if deadline is None or (o.hours or 0) <= deadline]
    choice = in_time[0] if in_time else None
    closest = None
    if choice is None and fitting:
        closest = min(fitting, key=lambda o: o.hours or 0.0)
    notes = [f"{s.name}: planned from {s.based_on}" for s, _ in stages if s.based_on]
    return PipelinePlan([s for s, _ in stages], ranked, deadline, choice, closest, notes)


def _stage_dims(stage: Stage, n: int, scale: float) -> tuple[tuple[Dims, Dims | None], int] | str:
    """(the stage's Dims on n GPUs under its strategy, and under FSDP when that differs), its
    tokens; or why it cannot run on n GPUs."""
    try:
        cfg = _complete(load_run(stage.path, [*stage.overrides, *stage.stand_in], n), stage)
    except LittleLMError as e:
        return str(e).splitlines()[0]
    d = replace(Dims.of(cfg.with_precision(True)), trace_scale=scale)
    fsdp = replace(d, strategy="fsdp") if n > 1 and d.strategy != "fsdp" else None
    return (d, fsdp), _tokens(cfg)


def _on_gpu(stage, dims, gpu, catalog, tokens, n, records) -> StagePlan:
    d, fsdp = dims
    bench = speed.speed_calibrations(records, gpu=gpu.name)
    measured = bench[-1] if bench else None
    p = plan_gpu(d, gpu, catalog, tokens, n, measured, with_methods=False)
    if p.tok_s is None and fsdp is not None:  # does not fit replicated: sharded, if that fits
        q = plan_gpu(fsdp, gpu, catalog, tokens, n, measured, with_methods=False)
        if q.tok_s is not None:
            return StagePlan(stage, tokens, q, "fsdp")
    return StagePlan(stage, tokens, p, d.strategy)
