"""The schema of a run file, and `load_run` which turns a YAML path into a resolved RunConfig.

Sections and who owns them:

    run         name, output directory, seed, device            (here)
    model       registered model + its config                   (littlelm.model)
    data        tokenizer, sources, split, packing              (littlelm.data.build)
    optimizer   registered optimizer + its config               (littlelm.optim.groups)
    schedule    registered lr schedule + its config             (littlelm.optim.schedule)
    train       batch, steps, precision, compile, clipping      (littlelm.train.trainer)
    eval        validation loss / bits per byte                 (littlelm.train.trainer)
    checkpoint  interval, retention, save-failure policy        (littlelm.train.trainer)
    guard       non-finite / spiking losses, rollback           (littlelm.train.guard)
    distributed ddp/fsdp, optimizer sharding, world size        (littlelm.train.distributed)
    callbacks   list of registered callbacks                    (littlelm.train.callbacks)
    grow        start from a smaller trained checkpoint         (littlelm.model.grow)

`resolve` fills in the values derived from others (vocabulary size from the tokenizer, sequence
length, gradient accumulation, step count from a token budget), so the resolved config a run
directory keeps says exactly what ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

import littlelm.components  # noqa: F401  (fills the registries)
from littlelm.config import Cfg, Registered, apply_overrides, load_tree, validate
from littlelm.data.build import DataConfig
from littlelm.data.tokenizer import vocab_size_of
from littlelm.errors import ConfigError
from littlelm.model.grow import GrowConfig
from littlelm.registry import CALLBACKS, MODELS, OPTIMIZERS, SCHEDULES
from littlelm.train.distributed import DistributedConfig
from littlelm.train.growth import resolve_growth
from littlelm.train.guard import GuardConfig
from littlelm.train.rundir import run_name_problem

PACKAGED_CONFIGS = Path(__file__).parent / "configs"


class RunSection(Cfg):
    name: str = Field("run", description="Run name; its directory is out_dir/name.")
    out_dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(1337, description="Seed of weights init and data order.")
    device: Literal["auto", "cpu", "cuda", "mps"] = Field("auto", description="Where to train.")

    @field_validator("name")
    @classmethod
    def _one_component(cls, name: str) -> str:
        problem = run_name_problem(name)  # `../x`, `a/b` or `` would write outside out_dir
        if problem:
            raise ValueError(problem)
        return name


class TrainConfig(Cfg):
    micro_batch_size: int = Field(
        8, description="Sequences per forward/backward pass (per device).", ge=1
    )
    seq_len: int | None = Field(
        None, description="Tokens per sequence; null = model.max_seq_len.", ge=2
    )
    batch_tokens: int | None = Field(
        None,
        description="Tokens per optimizer step, all devices; null = one micro-batch per device.",
    )
    grad_accum: int | None = Field(
        None,
        description="Micro-batches per optimizer step (derived from batch_tokens; do not set both).",
        ge=1,
    )
    max_steps: int | None = Field(
        None, description="Optimizer steps to train; or set max_tokens.", ge=1
    )
    max_tokens: int | None = Field(
        None, description="Token budget; sets max_steps when that is null.", ge=1
    )
    precision: Literal["bf16", "fp32"] = Field("bf16", description="bf16 autocast, or plain fp32.")
    master_weights: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="dtype of the parameters, their gradients and the optimizer state "
        "(bf16 halves them; needs precision bf16).",
    )
    stochastic_rounding: bool = Field(
        False,
        description="Round each parameter update stochastically into bf16 parameters "
        "(needs master_weights bf16).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Keep only each layer's input and recompute the layer in the backward "
        "pass (about 1/3 more compute, far less activation memory).",
    )
    compile: bool = Field(False, description="torch.compile the model (minutes of warm-up).")
    grad_clip: float | None = Field(
        1.0, description="Clip the global grad norm to this; null = off.", gt=0
    )
    log_every: int = Field(
        10, description="Steps between progress lines and metrics records.", ge=1
    )


class EvalConfig(Cfg):
    every: int = Field(
        250, description="Steps between validation evaluations; 0 = only at the end.", ge=0
    )
    at_end: bool = Field(True, description="Evaluate after the last step.")
    max_tokens: int | None = Field(
        None, description="Validation tokens per evaluation; null = the whole val split.", ge=1
    )
    batch_size: int | None = Field(
        None, description="Rows per eval batch; null = train.micro_batch_size.", ge=1
    )


class CheckpointConfig(Cfg):
    every: int = Field(1000, description="Steps between checkpoints; 0 = only at the end.", ge=0)
    at_end: bool = Field(True, description="Save after the last step.")
    keep_last: int = Field(
        2, description="Complete checkpoints kept (the newest is never deleted).", ge=1
    )
    keep_every: int = Field(
        0,
        description="Also keep every checkpoint whose step is a multiple of this; 0 = none.",
        ge=0,
    )
    on_save_error: Literal["stop", "continue"] = Field(
        "stop",
        description="When a periodic save fails (disk full, unwritable): stop the run, or warn "
        "and keep training (the final save always stops on failure).",
    )


class RunConfig(Cfg):
    run: RunSection = Field(
        default_factory=RunSection, description="Name, output directory, seed, device."
    )
    model: Annotated[Any, Registered(MODELS, default="gpt")] = Field(
        default_factory=lambda: {"name": "gpt"}, description="The model (littlelm list)."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Tokenizer, sources, packing.")
    optimizer: Annotated[Any, Registered(OPTIMIZERS, default="muon")] = Field(
        default_factory=lambda: {"name": "muon"}, description="Optimizer and its per-role lrs."
    )
    schedule: Annotated[Any, Registered(SCHEDULES, default="trapezoidal")] = Field(
        default_factory=lambda: {"name": "trapezoidal"}, description="Learning-rate schedule."
    )
    train: TrainConfig = Field(default_factory=TrainConfig, description="Batch, steps, precision.")
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="Validation loss and bits per byte."
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints."
    )
    guard: GuardConfig = Field(
        default_factory=GuardConfig, description="Skipping bad updates, rollback, stopping."
    )
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig,
        description="Several processes (torchrun): ddp or fsdp, optimizer sharding.",
    )
    callbacks: Annotated[Any, Registered(CALLBACKS, container="list")] = Field(
        default_factory=list, description="Extra callbacks (samples, loggers, evals)."
    )
    grow: GrowConfig | None = Field(
        None, description="Grow a smaller trained checkpoint into this model; null = random init."
    )

    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name


def find_config(path: str | Path) -> Path:
    """A path, or the name of a packaged config (`demo` -> littlelm/configs/demo.yaml,
    `plans/3b_grow` -> littlelm/configs/plans/3b_grow.yaml)."""
    p = Path(path)
    if p.is_file():
        return p
    name = p if p.suffix else p.with_suffix(".yaml")
    for packaged in (PACKAGED_CONFIGS / name, PACKAGED_CONFIGS / name.name):  # plans/x or x
        if packaged.is_file() and len(p.parts) <= 2:
            return packaged
    known = ", ".join(
        sorted(
            str(f.relative_to(PACKAGED_CONFIGS).with_suffix(""))
            for f in PACKAGED_CONFIGS.rglob("*.yaml")
        )
    )
    raise ConfigError([f"config file not found: {path} (packaged configs: {known})"])


def load_run(path: str | Path, overrides: list[str] = (), world_size: int = 1) -> RunConfig:
    """Read, merge, override, validate and resolve a run file."""
    path = find_config(path)
    tree, origin = load_tree(path)
    apply_overrides(tree, origin, overrides)
    cfg = validate(RunConfig, tree, origin, str(path))
    return resolve(cfg, world_size, str(path))


def load_data_config(path: str | Path, overrides: list[str] = ()) -> DataConfig:
    """The validated data section of a run file (or of a file holding only `data:`)."""
    path = find_config(path)
    tree, origin = load_tree(path)
    apply_overrides(tree, origin, overrides)
    return validate(RunConfig, tree, origin, str(path)).data


def resolve(cfg: RunConfig, world_size: int = 1, source: str = "") -> RunConfig:
    """Fill in derived values; report every inconsistency at once."""
    problems: list[str] = []
    m, t = cfg.model, cfg.train
    if m.vocab_size is None:
        m.vocab_size = vocab_size_of(cfg.data.tokenizer)
    if t.seq_len is None:
        t.seq_len = m.max_seq_len
    if t.seq_len > m.max_seq_len:
        problems.append(
            f"train.seq_len {t.seq_len} exceeds model.max_seq_len {m.max_seq_len}; lower one or raise the other"
        )
    per_micro = t.micro_batch_size * t.seq_len * world_size
    if (
        t.batch_tokens is not None
        and t.grad_accum is not None
        and t.batch_tokens != per_micro * t.grad_accum
    ):
        problems.append(
            "train.batch_tokens and train.grad_accum are both set and disagree; set only batch_tokens"
        )
    elif t.batch_tokens is not None:
        if t.batch_tokens % per_micro:
            problems.append(
                f"train.batch_tokens {t.batch_tokens} is not a multiple of micro_batch_size × seq_len × devices "
                f"= {per_micro}; use {max(1, round(t.batch_tokens / per_micro)) * per_micro}"
            )
        else:
            t.grad_accum = t.batch_tokens // per_micro
    t.grad_accum = t.grad_accum or 1
    t.batch_tokens = per_micro * t.grad_accum
    if t.max_steps is None and t.max_tokens is None:
        problems.append("set train.max_steps or train.max_tokens")
    elif t.max_steps is None:
        t.max_steps = max(1, t.max_tokens // t.batch_tokens)
    if t.max_steps is not None:
        t.max_tokens = t.max_steps * t.batch_tokens
    if t.master_weights == "bf16" and t.precision != "bf16":
        problems.append("train.master_weights=bf16 needs train.precision=bf16")
    if t.stochastic_rounding and t.master_weights != "bf16":
        problems.append(
            "train.stochastic_rounding only applies to bf16 parameters: "
            "set train.master_weights=bf16 or turn it off"
        )
    problems += _resolve_world(cfg, world_size)
    if not cfg.data.sources:
        problems.append(
            "data.sources is empty: a run needs a data section naming at least one source, e.g. "
            "data: {sources: {main: {name: text, path: corpus.txt}}} (see littlelm/configs/demo.yaml)"
        )
    problems += resolve_growth(cfg)
    if problems:
        raise ConfigError(problems, source or None)
    return cfg


def _resolve_world(cfg: RunConfig, world_size: int) -> list[str]:
    """distributed.world_size is the number of processes actually running."""
    d, problems = cfg.distributed, []
    if d.world_size is not None and d.world_size != world_size:
        problems.append(
            f"distributed.world_size is {d.world_size} but {world_size} process(es) are running; "
            "it is derived from torchrun's WORLD_SIZE: remove it (and train.grad_accum, which "
            "depends on it) from the config"
        )
    d.world_size = world_size
    if world_size > 1 and cfg.data.on_exhausted == "stop":
        problems.append(
            "data.on_exhausted=stop needs a single process (ranks would run out of data at "
            "different steps); use repeat and set train.max_tokens"
        )
    if world_size > 1 and getattr(cfg.optimizer, "adamw_8bit", False):
        problems.append(
            "optimizer.adamw_8bit is not supported with several processes yet (its state is not "
            "sharded or gathered by littlelm's ddp/fsdp optimizers); set optimizer.adamw_8bit=false"
        )
    if world_size > 1 and d.strategy == "fsdp" and cfg.train.master_weights == "bf16":
        problems.append(
            "train.master_weights=bf16 is not supported with distributed.strategy=fsdp yet; use "
            "ddp, or fp32 master weights (FSDP already keeps 1/world of them per GPU)"
        )
    return problems
