"""The schema of a run file, and `load_run` which turns a YAML path into a resolved RunConfig.

Sections and who owns them:

    run         name, output directory, seed, device            (here)
    model       the model's config (gpt)                        (littlelm.model.gpt)
    data        tokenizer, sources, split, packing              (littlelm.data.build)
    optimizer   adamw or muon, by name, with its options        (littlelm.optim.groups)
    schedule    lr schedule, by name, with its options          (littlelm.optim.schedule)
    train       batch, steps, precision, compile, clipping      (littlelm.train.trainer)
    eval        validation loss / bits per byte, named sets     (littlelm.train.validation)
    checkpoint  interval, retention, save-failure policy        (littlelm.train.trainer)
    guard       non-finite / spiking losses, rollback           (littlelm.train.guard)
    distributed ddp/fsdp, optimizer sharding, world size        (littlelm.train.distributed)
    callbacks   list of callbacks, by name                      (littlelm.train.callbacks)
    grow        start from a smaller trained checkpoint         (littlelm.train.growth)
    sft         fine-tune a base model (post-training)          (littlelm.train.growth)
    lora        train low-rank adapters on a frozen base        (littlelm.model.lora)
    rl          RL with verifiable rewards after SFT            (littlelm.train.rl_config)
    dpo         preference tuning after SFT                     (littlelm.train.dpo)

`resolve` returns a new config with the values derived from others filled in (vocabulary size
from the tokenizer, which `load_run` looks up, so that resolving reads no file; sequence length, gradient accumulation, step count from a token budget), so
the resolved config a run directory keeps says exactly what ran; the validated config it was
given is left as it is.

Which keys a resumed run may change is declared on the fields themselves
(`json_schema_extra=RESUMABLE`; `resumable` below reads it for train/checkpoint/resume.py).

This module sits above the components and the trainer: it composes the sections owned by
model/, optim/, data/ and train/ (which never import it at run time: the trainer is handed the
RunConfig, and names its type only for the type checker), each section's class beside the code
it configures, each component field a union of the config classes it may hold, chosen by `name`
(littlelm/config.py). `callbacks:` alone is an open table (littlelm/registry.py), since eval/'s
callback sits above the schema; it is filled at the first lookup or by
`littlelm.components.register_all()`.
"""

from __future__ import annotations

import copy
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, field_validator

from littlelm.config import (
    RESUMABLE,
    Cfg,
    ComponentConfig,
    Kind,
    apply_overrides,
    component_paths,
    first_sentence,
    load_tree,
    marked,
    packaged_names,
    slot,
    validate,
)
from littlelm.data.build import DataConfig
from littlelm.data.tokenizers import vocab_size_of
from littlelm.errors import ConfigError
from littlelm.model.gpt import GPTConfig
from littlelm.model.lora import LoRAConfig, rank_problems, target_problems
from littlelm.optim.base import WHOLE, OptimizerConfig
from littlelm.optim.groups import ORIGINS, MuonConfig, OptimizerChoice
from littlelm.optim.schedule import ScheduleChoice, TrapezoidalConfig, resolve_lr_multipliers
from littlelm.registry import callback_classes
from littlelm.train.budget import BudgetConfig
from littlelm.train.distributed import DistributedConfig
from littlelm.train.dpo import DPOConfig, dpo_problems
from littlelm.train.guard import GuardConfig
from littlelm.train.objective import ObjectiveConfig
from littlelm.train.rl_config import RLConfig
from littlelm.train.rl_config import problems as rl_problems
from littlelm.train.start_from import GrowConfig, SFTConfig

PACKAGED_CONFIGS = Path(__file__).parent / "configs"
# Most filesystems allow 255 bytes per name; littlelm adds up to ~40 (`-bench`, `.log`, `.tmp`)
MAX_NAME_BYTES = 200


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot be a run name, or None when it can."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        return (
            "must be one directory name (not empty, '.' or '..', no '/' or '\\'): the run's "
            "directory is run.out_dir/run.name, so choose where it goes with run.out_dir"
        )
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_NAME_BYTES:
        return (
            f"is {size} bytes long; a run name is a directory name, at most {MAX_NAME_BYTES} "
            "bytes (filesystems allow 255 per name, and littlelm adds suffixes): choose a shorter one"
        )
    return None


class RunSection(Cfg):
    name: str = Field(
        "run", description="Run name; its directory is out_dir/name.", json_schema_extra=RESUMABLE
    )
    out_dir: str = Field(
        "runs", description="Parent directory of run directories.", json_schema_extra=RESUMABLE
    )
    seed: int = Field(1337, description="Seed of weights init and data order.")
    device: Literal["auto", "cpu", "cuda", "mps"] = Field(
        "auto", description="Where to train.", json_schema_extra=RESUMABLE
    )

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
        json_schema_extra=RESUMABLE,
    )
    max_steps: int | None = Field(
        None,
        description="Optimizer steps to train; or set max_tokens, epochs or budget.",
        ge=1,
        json_schema_extra=RESUMABLE,
    )
    max_tokens: int | None = Field(
        None,
        description="Token budget; sets max_steps when that is null.",
        ge=1,
        json_schema_extra=RESUMABLE,
    )
    epochs: float | None = Field(
        None,
        description="Passes over the training data (HF's num_train_epochs): steps = epochs x "
        "the sources' training tokens / batch_tokens, rounded up, counted once the data is "
        "prepared (the start line says the steps; the run's config.yaml records max_steps). "
        "Pretraining and SFT only; not with max_steps, max_tokens or budget.",
        gt=0,
        json_schema_extra=RESUMABLE,
    )
    budget: BudgetConfig | None = Field(
        None,
        description="Train to a budget of tokens, hours or dollars (train/budget.py); "
        "max_steps/max_tokens, when also set, stay a cap.",
        json_schema_extra=RESUMABLE,  # a budget may be raised or lowered mid-run
    )
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="bf16 autocast, plain fp32, or auto: bf16 where the device multiplies bf16 in "
        "hardware (CUDA from Ampere on, CPUs with AVX-512 BF16 or AMX), fp32 elsewhere (software "
        "bf16 is ~30x slower than fp32 there; littlelm/hardware.py). LITTLELM_NATIVE_BF16=1 "
        "or 0 in the environment overrides that detection.",
        # may change on resume (a run moved to other hardware): the weights, gradients and
        # optimizer state are in train.master_weights' dtype either way
        json_schema_extra=RESUMABLE,
    )
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
        json_schema_extra=RESUMABLE,
    )
    compile: bool | None = Field(
        None,
        description="torch.compile the model (minutes of warm-up); null = on when training on "
        "CUDA, off elsewhere.",
        json_schema_extra=RESUMABLE,
    )
    grad_clip: float | None = Field(
        1.0,
        description="Clip the global grad norm to this; null = off.",
        gt=0,
        json_schema_extra=RESUMABLE,
    )
    log_every: int = Field(
        10,
        description="Steps between progress lines and metrics records.",
        ge=1,
        json_schema_extra=RESUMABLE,
    )

    def compiles(self, device: torch.device | str) -> bool:
        """Whether the run torch.compiles its model on `device` (`compile`, null: on CUDA)."""
        if self.compile is not None:
            return self.compile
        return torch.device(device).type == "cuda"


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
    sets: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Named validation sets, each the held-out documents of the data sources "
        "listed (e.g. {old: [web], new: [pubmed]}; one label alone may be given without a list), "
        "each logged as its own series (metrics.jsonl val_sets.NAME.loss / .bpb) beside "
        "val_loss / val_bpb over all held-out data, which stay as without sets. max_tokens is "
        "shared by the sources' weights as without sets.",
    )

    @field_validator("sets", mode="before")
    @classmethod
    def _one_label(cls, sets: Any) -> Any:
        if isinstance(sets, dict):  # {new: pubmed} is {new: [pubmed]}
            return {k: [v] if isinstance(v, str) else v for k, v in sets.items()}
        return sets

    @field_validator("sets")
    @classmethod
    def _set_names(cls, sets: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, labels in sets.items():
            if not SET_NAME.fullmatch(name):  # a dot would split the metric's name in reports
                raise ValueError(f"set name {name!r}: use letters, digits, '_' and '-' only")
            if not labels:
                raise ValueError(f"set {name!r} lists no data source")
        return sets


SET_NAME = re.compile(r"[A-Za-z0-9_-]+")


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
    # `async` is a Python keyword, so the field is named after DCP's async_save
    async_save: bool | Literal["auto"] = Field(
        "auto",
        description="Write checkpoints on a background thread: training waits only while the "
        "state is copied to host memory. auto: when that copy fits in half the host's "
        "available memory (said at start).",
    )
    slow_after_minutes: float = Field(
        10.0,
        description="Report a background save still running after this many minutes (the run "
        "goes on; 0 = never).",
        ge=0,
    )
    save_wait_seconds: float = Field(
        600.0,
        description="The longest the end of a run (a SIGTERM, Ctrl-C, a rollback) waits for a "
        "background save; past it the run exits 2, naming the stuck save.",
        gt=0,
    )


class RunConfig(Cfg):
    run: RunSection = Field(
        default_factory=RunSection, description="Name, output directory, seed, device."
    )
    # one model today: a new one makes this `GPTConfig | ItsConfig` (model/protocol.py)
    model: Annotated[GPTConfig, Kind("model")] = Field(
        default_factory=GPTConfig, description="The model (littlelm list)."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Tokenizer, sources, packing.")
    optimizer: Annotated[OptimizerChoice, Kind("optimizer")] = Field(
        default_factory=MuonConfig,
        description="Optimizer and its per-role lrs.",
        json_schema_extra=RESUMABLE,
    )
    schedule: Annotated[ScheduleChoice, Kind("schedule")] = Field(
        default_factory=TrapezoidalConfig,
        description="Learning-rate schedule.",
        json_schema_extra=RESUMABLE,
    )
    train: TrainConfig = Field(default_factory=TrainConfig, description="Batch, steps, precision.")
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description="Validation loss and bits per byte.",
        json_schema_extra=RESUMABLE,
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints.", json_schema_extra=RESUMABLE
    )
    guard: GuardConfig = Field(
        default_factory=GuardConfig,
        description="Skipping bad updates, rollback, stopping.",
        json_schema_extra=RESUMABLE,
    )
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig,
        description="Several processes (torchrun): ddp or fsdp, optimizer sharding.",
        json_schema_extra=RESUMABLE,
    )
    callbacks: Annotated[list[Any], Kind("callback", table=callback_classes)] = Field(
        default_factory=list,
        description="Extra callbacks (samples, loggers, evals).",
        json_schema_extra=RESUMABLE,
    )
    grow: GrowConfig | None = Field(
        None, description="Grow a smaller trained checkpoint into this model; null = random init."
    )
    sft: SFTConfig | None = Field(
        None,
        description="Supervised fine-tuning: start from a base model's weights "
        "(docs/post-training.md); null = not a fine-tuning run.",
    )
    lora: LoRAConfig | None = Field(
        None,
        description="Train low-rank adapters (LoRA) on the frozen weights the run starts from "
        "(sft.base or grow.parent; docs/post-training.md); null = train every weight.",
    )
    rl: RLConfig | None = Field(
        None,
        description="RL with verifiable rewards (GRPO-style) from the SFT model sft.base names "
        "(docs/post-training.md); null = the loss is the data's next-token loss.",
    )
    dpo: DPOConfig | None = Field(
        None,
        description="Preference tuning (DPO) of sft.base on a preference source's pairs "
        "(docs/post-training.md); null = the loss is the next-token loss.",
    )

    @classmethod
    def upgrade(cls, tree: dict, origin: dict[str, str]) -> list[str]:
        """Read an older layout as today's, in place (`config.validate` calls this before
        validating): an SFT run written before `sft:` existed started from its base through a
        same-shape `grow:` (a grow section without growth's own settings, in a run with a chat
        source), in YAML files and in the config.yaml of run directories and checkpoints. Returns
        a note per change."""
        g = tree.get("grow")
        if not isinstance(g, dict) or tree.get("sft") is not None or not _old_sft(tree, g):
            return []
        tree["sft"] = {
            "base": g["parent"],
            "continue_data": g.get("continue_data", True),  # grow's default, kept
            **({"verify_tokens": g["verify_tokens"]} if "verify_tokens" in g else {}),
        }
        tree["grow"] = None
        renames = {"grow.parent": "sft.base"}
        for key in [k for k in origin if k == "grow" or k.startswith("grow.")]:
            where = origin.pop(key)
            if key not in ("grow.placement", "grow.widened", "grow.lr_multipliers"):
                origin[renames.get(key, "sft." + key.partition(".")[2])] = where
        return [
            "an SFT run's grow: section is read as sft: {base: ...}, post-training's own "
            "section; write it there (docs/post-training.md)"
        ]

    def starts_from(self) -> GrowConfig | None:
        """The checkpoint whose weights the run starts from, as growth (train/growth.py) copies
        it: grow:, or sft:'s base as a same-shape grow; None for a run from random weights."""
        if self.sft is not None:
            return self.sft.as_grow(self.model.n_layer)
        return self.grow

    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def with_precision(self, native_bf16: bool) -> RunConfig:
        """This config with train.precision (and the optimizer's own `auto` dtypes) made concrete
        for a device that does (or does not) multiply bf16 in hardware (littlelm/hardware.py):
        `auto` is bf16 there, fp32 elsewhere; bf16 master weights compute in bf16 anywhere."""
        t = self.train
        precision = t.precision
        if t.master_weights == "bf16":
            precision = "bf16"
        elif precision == "auto":
            precision = "bf16" if native_bf16 else "fp32"
        optimizer = self.optimizer.with_native_bf16(native_bf16)  # e.g. Muon's ns_dtype
        if precision == t.precision and optimizer is self.optimizer:
            return self
        train = t.model_copy(update={"precision": precision})
        return self.model_copy(update={"train": train, "optimizer": optimizer})


def components(cls: type[Cfg] = RunConfig) -> dict[str, list[tuple[str, str]]]:
    """Every component a run file may name, by kind (model, tokenizer, ...): (name, the first
    sentence of its config's docstring), as `littlelm list` prints them."""
    out: dict[str, list[tuple[str, str]]] = {}
    for field in cls.model_fields.values():
        meta = slot(field)
        if meta is not None:
            out.setdefault(meta.kind, []).extend(
                (name, first_sentence(c.__doc__ or "")) for name, c in sorted(meta.classes.items())
            )
        for sub in typing.get_args(field.annotation) or (field.annotation,):
            if (
                isinstance(sub, type)
                and issubclass(sub, Cfg)
                and not issubclass(sub, ComponentConfig)
            ):
                for kind, rows in components(sub).items():
                    out.setdefault(kind, []).extend(rows)
    return out


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
    known = packaged_names(PACKAGED_CONFIGS)
    raise ConfigError([f"config file not found: {path} (packaged configs: {known})"])


def load_run(path: str | Path, overrides: Sequence[str] = (), world_size: int = 1) -> RunConfig:
    """Read, merge, override, validate and resolve a run file. The files it reads: the run
    file with its includes, and, when model.vocab_size is not set, what the tokenizer's
    vocabulary size needs (a saved, Hugging Face or tiktoken tokenizer's files)."""
    tree, origin, path = read_run(path, overrides)
    cfg = validate(RunConfig, tree, origin, str(path))
    vocab = vocab_size_of(cfg.data.tokenizer) if cfg.model.vocab_size is None else None
    return resolve(cfg, world_size, str(path), vocab_size=vocab)


def load_data_config(path: str | Path, overrides: Sequence[str] = ()) -> DataConfig:
    """The validated data section of a run file (or of a file holding only `data:`)."""
    tree, origin, path = read_run(path, overrides)
    return validate(RunConfig, tree, origin, str(path)).data


def read_run(path: str | Path, overrides: Sequence[str] = ()) -> tuple[dict, dict[str, str], Path]:
    """(the merged tree, the file or override that set each key, the file): includes of paths
    or packaged names, then the overrides; a component renamed on the way starts afresh."""
    path = find_config(path)
    components = component_paths(RunConfig)
    tree, origin = load_tree(path, components, PACKAGED_CONFIGS)
    apply_overrides(tree, origin, overrides, components)
    return tree, origin, path


def resumable(key: str, tree: dict | None = None) -> bool:
    """Whether a resumed run may change the dotted `key` of its config (`tree`: the config as
    plain data, which names the components whose fields are looked up)."""
    return marked(RunConfig, tree or {}, key, "resumable")


def resolve(
    cfg: RunConfig, world_size: int = 1, source: str = "", vocab_size: int | None = None
) -> RunConfig:
    """A new config with the derived values filled in (`cfg` is left as it is); every
    inconsistency is reported at once. Reads no file: `vocab_size` is the tokenizer's, for a
    config without model.vocab_size (load_run looks it up; a tokenizer with files has it there)."""
    m = cfg.model
    if m.vocab_size is None:
        if vocab_size is None:
            raise ValueError(
                "resolve: model.vocab_size is not set; pass the tokenizer's vocab_size"
            )
        m = m.model_copy(update={"vocab_size": vocab_size})
    train, problems = _resolve_train(cfg.train, m.max_seq_len, world_size)
    dist, more = _resolve_world(cfg, world_size)
    problems += more
    if not cfg.data.sources:
        problems.append(
            "data.sources is empty: a run needs a data section naming at least one source, e.g. "
            "data: {sources: {main: {name: text, path: corpus.txt}}} (see littlelm/configs/demo.yaml)"
        )
    problems += [
        f"eval.sets.{name}: no data source {label!r}; sources: {', '.join(cfg.data.sources)}"
        for name, labels in cfg.eval.sets.items()
        for label in labels
        if label not in cfg.data.sources
    ]
    # growth's values derived from the parent checkpoint (layer placement, value-embedding
    # layers) are filled in at start-up (train/growth.py complete_growth): resolving reads no file
    grow, more = _resolve_grow_lr(cfg.grow, cfg.optimizer)
    problems += more
    if cfg.grow is not None and cfg.sft is not None:
        problems.append(
            "grow and sft are both set: a run starts from one checkpoint; sft: {base: ...} for "
            "fine-tuning a base of this shape, grow: {parent: ...} for a larger model"
        )
    problems += _lora_problems(cfg, world_size)
    dist_cfg = cfg.distributed  # world_size: the processes running (torchrun's or --nproc)
    problems += rl_problems(cfg.rl, cfg.sft is not None, world_size, dist_cfg.strategy)
    sources: dict[str, str] = {k: src.name for k, src in cfg.data.sources.items()}
    problems += dpo_problems(cfg.dpo, cfg.sft is not None, sources)
    objectives = sorted(
        k for k in type(cfg).model_fields if isinstance(getattr(cfg, k), ObjectiveConfig)
    )
    if len(objectives) > 1:  # each replaces the step's loss with its own (train/objective.py)
        problems.append(
            f"{' and '.join(objectives)} are both set: a run has one objective; train one from the "
            "SFT run, then the next from that run (sft: {base: RUN}), e.g. DPO then RL"
        )
    if problems:
        raise ConfigError(problems, source or None)
    update = {"model": m, "train": train, "distributed": dist, "grow": grow}
    return cfg.model_copy(update=copy.deepcopy(update), deep=True)


def _lora_problems(cfg: RunConfig, world_size: int) -> list[str]:
    """What a LoRA run cannot combine with (a LoRA run without a base is refused at start-up,
    train/growth.py: the planner may look at such a config)."""
    if cfg.lora is None:
        return []
    problems = []
    if world_size > 1 and cfg.distributed.strategy == "fsdp" and cfg.lora.quantize == "nf4":
        # FSDP2 shards a frozen base like any parameter (LoRA's checkpoints, resumes and
        # rollbacks gather the adapters through it: tests/test_lora_fsdp.py), but bitsandbytes'
        # packed 4-bit weights are not tensors it can split
        problems.append(
            "lora.quantize=nf4 with distributed.strategy=fsdp: FSDP2 cannot split QLoRA's packed "
            "4-bit base weights; use distributed.strategy=ddp (each rank holds the 4-bit base, "
            "and only the adapters have gradients and optimizer state) or lora.quantize=none"
        )
    shapes = _shapes_only(cfg.model)
    problems += target_problems(shapes, cfg.lora) + rank_problems(shapes, cfg.lora)
    if cfg.model.fp8:
        problems.append(
            "lora with model.fp8: FP8 base linears under adapters are not supported; turn "
            "model.fp8 off for a LoRA run"
        )
    return problems


def _shapes_only(model: GPTConfig) -> torch.nn.Module:
    """The model on the meta device (no memory, no RNG drawn): its linears' shapes; the
    vocabulary, resolved from the tokenizer later, does not shape a block's linears."""
    with torch.device("meta"), torch.random.fork_rng(devices=[]):
        return model.model_copy(update={"vocab_size": model.vocab_size or 1}).build()


def _old_sft(tree: dict, g: dict) -> bool:
    """Whether `grow:` (of `tree`) is how SFT was configured before `sft:`: the parent with
    only the keys SFT uses (or growth's resolved to nothing: the identity placement and no lr
    multipliers, as a run directory's config.yaml has them), and a chat source."""
    sources = (tree.get("data") or {}).get("sources") or {}
    chat = isinstance(sources, dict) and any(
        (s.get("name") if isinstance(s, dict) else s) == "chat" for s in sources.values()
    )
    n_layer = (tree.get("model") or {}).get("n_layer")
    return (
        chat
        and "parent" in g
        and set(g)
        <= {"parent", "continue_data", "verify_tokens", "placement", "widened", "lr_multipliers"}
        and g.get("placement", list(range(n_layer or 0))) == list(range(n_layer or 0))
        and g.get("widened", "old") == "old"
        and not g.get("lr_multipliers")
    )


def _resolve_grow_lr(
    g: GrowConfig | None, optimizer: OptimizerConfig
) -> tuple[GrowConfig | None, list[str]]:
    """grow.lr_multipliers made explicit (optim/schedule.py says how)."""
    if g is None:
        return g, []
    constant = optimizer.origin_multipliers()
    specs, problems = resolve_lr_multipliers(g.lr_multipliers, constant, ORIGINS)
    return g.model_copy(update={"lr_multipliers": specs}), problems


def _resolve_train(
    t: TrainConfig, max_seq_len: int, world_size: int
) -> tuple[TrainConfig, list[str]]:
    """The train section with sequence length, batch and step count derived; its problems."""
    problems: list[str] = []
    seq_len = max_seq_len if t.seq_len is None else t.seq_len
    if seq_len > max_seq_len:
        problems.append(
            f"train.seq_len {seq_len} exceeds model.max_seq_len {max_seq_len}; lower one or raise the other"
        )
    per_micro = t.micro_batch_size * seq_len * world_size
    accum = t.grad_accum
    if t.batch_tokens is not None and accum is not None and t.batch_tokens != per_micro * accum:
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
            accum = t.batch_tokens // per_micro
    accum = accum or 1
    batch_tokens = per_micro * accum
    max_steps, max_tokens = t.max_steps, t.max_tokens
    budget_steps, budget_problems = _budget(t, batch_tokens)
    problems += budget_problems
    max_steps = budget_steps or max_steps
    timed = t.budget is not None and t.budget.kind in ("hours", "dollars")
    lengths = [f"train.{k}" for k in ("max_steps", "max_tokens", "budget") if getattr(t, k)]
    if t.epochs is not None and lengths:  # two lengths would leave one silently unused
        problems.append(
            f"train.epochs and {' and '.join(lengths)} both set the run's length: give one "
            f"(remove train.epochs, or {' and '.join(lengths)})"
        )
    elif t.epochs is not None:
        pass  # the steps follow from the data's size, known once it is prepared (Trainer)
    elif max_steps is None and max_tokens is None and not timed:
        problems.append("set train.max_steps, train.max_tokens, train.epochs or train.budget")
    elif max_steps is None and max_tokens is not None:
        max_steps = max(1, max_tokens // batch_tokens)
    if max_steps is not None:
        max_tokens = max_steps * batch_tokens
    problems += _precision_problems(t)
    derived = dict(
        seq_len=seq_len,
        grad_accum=accum,
        batch_tokens=batch_tokens,
        max_steps=max_steps,
        max_tokens=max_tokens,
    )
    return t.model_copy(update=derived), problems


def _budget(t: TrainConfig, batch_tokens: int) -> tuple[int | None, list[str]]:
    """Check train.budget; a tokens budget gives the step count (train.max_steps or
    max_tokens, when also set, stay a cap: the run ends at whichever comes first)."""
    b = t.budget
    if b is None:
        return None, []
    if b.kind is None:
        given = [k for k in ("tokens", "hours", "dollars") if getattr(b, k) is not None]
        return None, [
            "train.budget: set exactly one of tokens, hours or dollars"
            + (f" (got {' and '.join(given)})" if given else "")
        ]
    if b.kind == "dollars" and b.price_per_gpu_hour is None:
        return None, [
            "train.budget.dollars needs train.budget.price_per_gpu_hour (dollars per GPU-hour)"
        ]
    if b.kind == "tokens" and b.tokens is not None:
        if b.tokens < batch_tokens:
            return None, [
                f"train.budget.tokens {b.tokens:,} is less than one step's batch of "
                f"{batch_tokens:,} tokens; raise the budget or lower train.batch_tokens"
            ]
        cap = t.max_steps or (t.max_tokens // batch_tokens if t.max_tokens else None)
        return min(b.tokens // batch_tokens, cap or b.tokens // batch_tokens), []
    return None, []


def _precision_problems(t: TrainConfig) -> list[str]:
    problems = []
    if t.master_weights == "bf16" and t.precision == "fp32":
        problems.append("train.master_weights=bf16 needs train.precision=bf16 (or auto)")
    if t.stochastic_rounding and t.master_weights != "bf16":
        problems.append(
            "train.stochastic_rounding only applies to bf16 parameters: "
            "set train.master_weights=bf16 or turn it off"
        )
    return problems


def _resolve_world(cfg: RunConfig, world_size: int) -> tuple[DistributedConfig, list[str]]:
    """distributed.world_size is the number of processes actually running."""
    d, problems = cfg.distributed, []
    if d.world_size is not None and d.world_size != world_size:
        problems.append(
            f"distributed.world_size is {d.world_size} but {world_size} process(es) are running; "
            "it is derived from torchrun's WORLD_SIZE: remove it (and train.grad_accum, which "
            "depends on it) from the config"
        )
    if world_size > 1 and cfg.data.on_exhausted == "stop":
        problems.append(
            "data.on_exhausted=stop needs a single process (ranks would run out of data at "
            "different steps); use repeat and set train.max_tokens"
        )
    problems += cfg.optimizer.check_world(world_size)
    whole = [r.kind for r in cfg.optimizer.traits().rules if r.sharding == WHOLE]
    if world_size > 1 and d.strategy == "fsdp" and whole:  # FSDP2 hands each rank a slice
        problems.append(
            f"optimizer.name={cfg.optimizer.name}: its {', '.join(whole)} groups step whole "
            "tensors, which distributed.strategy=fsdp splits across the ranks; use "
            "distributed.strategy=ddp"
        )
    if world_size > 1 and d.strategy == "fsdp" and cfg.train.master_weights == "bf16":
        problems.append(
            "train.master_weights=bf16 is not supported with distributed.strategy=fsdp yet; use "
            "ddp, or fp32 master weights (FSDP already keeps 1/world of them per GPU)"
        )
    return d.model_copy(update={"world_size": world_size}), problems
