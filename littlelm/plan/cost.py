"""The GPUs and what a run costs on each: the catalog, the fit, the micro-batch search, the
remedies, speed and dollars.

The catalog is the packaged gpus.yaml, overridden in order by ~/.config/littlelm/gpus.yaml (or
$LITTLELM_GPUS) and each `--gpus FILE`: a later entry replaces the fields it names of one with
the same key, or adds a GPU; its `defaults:` replace the defaults. Against one GPU:

    needed   = tensor peak x (1 + allocator margin) + CUDA context and workspaces
    tokens/s = the step model at the micro-batch that runs: the configured one if it fits,
               else the largest that fits with the same tokens per step; none if none fits
    cost     = hours x price x devices

The tensor peak is the analytic model's scaled to the trace (`Dims.trace_scale`): it is
evaluated for every micro-batch and remedy, which the trace would take minutes for. A time or
money budget buys tok/s x seconds tokens on each GPU (a dollars budget buys more hours on a
cheaper GPU: `apply_budget`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from littlelm.config import Cfg, parse_yaml
from littlelm.errors import ConfigError, did_you_mean
from littlelm.model.gpt import flops_per_token
from littlelm.model.lora import LoRAConfig
from littlelm.plan import memory as mem
from littlelm.plan import speed
from littlelm.plan.calibration import cuda_calibration
from littlelm.plan.dims import Adapters, Dims

PACKAGED = Path(__file__).with_name("gpus.yaml")
USER = Path("~/.config/littlelm/gpus.yaml")
GIB = 2**30
FSDP_SIZES = (2, 4, 8)


class Defaults(Cfg):
    context_gib: float = Field(0.5, description="CUDA context outside PyTorch's allocator, GiB.")
    workspace_gib: float = Field(0.0625, description="cuBLAS/cuBLASLt workspaces, GiB.", ge=0)
    allocator_margin: float = Field(
        0.05, description="Caching-allocator fragmentation: reserved/allocated - 1.", ge=0
    )
    matmul_ceiling: float = Field(
        0.80,
        description="Fraction of the datasheet matrix peak that large GEMMs reach (0-1).",
        gt=0,
        le=1,
    )
    attention_fraction: float = Field(
        0.35,
        description="Fraction of the datasheet matrix peak that fused causal attention "
        "(forward + backward) reaches (0-1).",
        gt=0,
        le=1,
    )
    bandwidth_ceiling: float = Field(
        0.90, description="Fraction of the datasheet memory bandwidth a copy reaches.", gt=0, le=1
    )
    launch_us: float = Field(
        8.0, description="Host time per eager kernel (dispatch + launch), microseconds.", ge=0
    )
    interconnect_efficiency: float = Field(
        0.80,
        description="Fraction of the link bandwidth NCCL's ring collectives reach.",
        gt=0,
        le=1,
    )


class GPU(Cfg):
    """One GPU model in the catalog."""

    name: str = Field("", description="Catalog key (filled in from the mapping).")
    match: list[str] = Field(
        default_factory=list, description="Substrings of torch.cuda.get_device_name()."
    )
    datasheet: str = Field("", description="Where its peak figures come from (a URL).")
    arch: str = Field(
        "",
        description="Architecture (ampere, ada, hopper, blackwell, cdna3): which published runs "
        "calibrate its speed (plan/calibration.py).",
    )
    memory_gib: float = Field(..., description="Total memory as PyTorch reports it, GiB.", gt=0)
    bf16_tflops: float = Field(..., description="Dense bf16 tensor peak, TFLOP/s.", gt=0)
    fp8_tflops: float | None = Field(None, description="Dense fp8 tensor peak, TFLOP/s.", gt=0)
    fp32_tflops: float = Field(..., description="Plain fp32 peak (no TF32), TFLOP/s.", gt=0)
    bandwidth_gbs: float = Field(..., description="Memory bandwidth, GB/s.", gt=0)
    price_per_hour: float = Field(..., description="On-demand USD per GPU-hour.", ge=0)
    price_date: str = Field(..., description="When that price was seen (YYYY-MM).")
    price_source: str = Field("", description="Where the price comes from.")
    interconnect_gbs: float | None = Field(
        None,
        description="GPU-to-GPU bandwidth within a node, one direction, GB/s (NVLink or PCIe); "
        "null = unknown (multi-GPU plans then leave communication out and say so).",
        gt=0,
    )
    attention_fraction: float | None = Field(
        None, description="Override of defaults.attention_fraction for this GPU.", gt=0, le=1
    )
    mfu: float | None = Field(
        None,
        description="Fixed model FLOPs utilisation (0-1) to use instead of the step model; "
        "null = predict it from the run's shapes.",
        gt=0,
        le=1,
    )
    context_gib: float | None = Field(
        None, description="CUDA context, GiB; null = the catalog default.", ge=0
    )

    @field_validator("price_date", mode="before")
    @classmethod
    def _date_text(cls, v):
        return str(v) if v is not None else v


class Catalog(Cfg):
    """The catalog files merged, validated at once: every problem named by its key."""

    defaults: Defaults = Field(default_factory=Defaults, description="Catalog-wide defaults.")
    gpus: dict[str, GPU] = Field(default_factory=dict, description="GPUs by catalog key.")
    __hash__ = object.__hash__  # by identity: calibration.fitted_points caches per catalog

    def select(self, names: list[str] | None) -> list[GPU]:
        """The named GPUs (case-insensitive), or all of them."""
        if not names:
            return list(self.gpus.values())
        by_lower = {k.lower(): v for k, v in self.gpus.items()}
        missing = [n for n in names if n.lower() not in by_lower]
        if missing:
            known = ", ".join(self.gpus)
            hints = "".join(did_you_mean(n, self.gpus) for n in missing)
            raise ConfigError([f"unknown GPU {', '.join(missing)}{hints}; the catalog has {known}"])
        return [by_lower[n.lower()] for n in names]

    def identify(self, device_name: str) -> GPU | None:
        """The catalog entry whose `match` names the device (the longest match wins)."""
        best, length = None, 0
        for gpu in self.gpus.values():
            for m in gpu.match:
                if m.lower() in device_name.lower() and len(m) > length:
                    best, length = gpu, len(m)
        return best

    def context_gib(self, gpu: GPU) -> float:
        ctx = gpu.context_gib if gpu.context_gib is not None else self.defaults.context_gib
        return ctx + self.defaults.workspace_gib


def load_catalog(extra: Sequence[str | Path] = ()) -> Catalog:
    user = Path(os.environ.get("LITTLELM_GPUS", USER)).expanduser()
    files = [PACKAGED, *([user] if user.is_file() else [])]
    for f in extra:
        p = Path(f).expanduser()
        if not p.is_file():
            raise ConfigError([f"GPU catalog file not found: {p}"])
        files.append(p)
    raw: dict[str, dict] = {}
    defaults: dict = {}
    for path in files:
        tree = _read(path)
        defaults.update(tree.get("defaults") or {})
        for key, entry in (tree.get("gpus") or {}).items():
            if not isinstance(entry, dict):
                raise ConfigError([f"{path}: gpus.{key} must be a mapping of fields"])
            raw.setdefault(str(key), {}).update(entry)
    try:
        return Catalog(defaults=defaults, gpus={k: {**e, "name": k} for k, e in raw.items()})
    except ValidationError as e:
        problems = [f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()]
        raise ConfigError(problems, ", ".join(map(str, files))) from None


def _read(path: Path) -> dict:
    try:
        tree = parse_yaml(path.read_text()) or {}
    except Exception as e:  # yaml errors carry line numbers
        raise ConfigError([f"{path}: malformed YAML ({e})"]) from None
    if not isinstance(tree, dict) or set(tree) - {"gpus", "defaults"}:
        raise ConfigError([f"{path}: a GPU catalog has only `defaults:` and `gpus:` sections"])
    return tree


@dataclass
class Remedy:
    name: str  # what to change, in config terms where one exists
    needed_gib: float  # memory needed per GPU after the change
    saving_gib: float
    fits: bool
    note: str = ""


@dataclass
class GpuPlan:
    gpu: GPU
    devices: int
    micro_batch: int  # configured
    needed_gib: float  # at the configured micro-batch
    headroom_gib: float
    fits: bool
    lines: dict[str, float]  # GiB per line of the device budget
    best_micro_batch: int | None  # largest that fits and keeps the tokens per step
    best_grad_accum: int | None
    needed_at_best_gib: float | None  # at best_micro_batch
    tok_s: float | None  # all devices, at the micro-batch that runs; None: nothing fits
    mfu: float | None
    mfu_source: str  # where the speed comes from (step model + calibration, or catalog mfu)
    hours: float | None
    dollars: float | None
    dollars_per_btok: float | None
    remedies: list[Remedy] = field(default_factory=list)
    measured: dict | None = None  # bench's measurement of this run on this GPU, if any
    budget_tokens: int | None = None  # what a time or money budget buys here (apply_budget)
    budget_steps: int | None = None
    # a fine-tuning run: full, LoRA and QLoRA on this GPU (`training_methods`), else empty
    methods: list[MethodPlan] = field(default_factory=list)


@dataclass
class MethodPlan:
    """One way to fine-tune the run (full, LoRA or QLoRA) on one GPU."""

    method: str  # "full", "LoRA", "QLoRA"
    change: str  # the config change that picks it; "" for the run as configured
    trainable: int  # parameters that get gradients and optimizer state
    plan: GpuPlan


def training_methods(d: Dims) -> list[tuple[str, str, Dims]]:
    """(method, config change, Dims) of full fine-tuning, LoRA and QLoRA of the run: its own
    `lora:` section (with quantize none, and nf4) where it has one, else LoRA's defaults."""
    own = d.lora or Adapters.of(default_lora(), d.model, d.bf16, d.chat_tokens)
    assert own is not None, "a LoRAConfig gives adapters"
    configured = "full" if d.lora is None else ("QLoRA" if d.lora.nf4 else "LoRA")
    out = []
    for method, dm, change in (
        ("full", d.without_lora(), "lora=null"),
        ("LoRA", d.with_lora(replace(own, nf4=False)), LORA_CHANGE),
        ("QLoRA", d.with_lora(replace(own, nf4=True)), QLORA_CHANGE),
    ):
        if d.lora is not None and method != "full":
            change = f"lora.quantize={'nf4' if method == 'QLoRA' else 'none'}"
        out.append((method, "" if method == configured else change, dm))
    return out


def default_lora() -> LoRAConfig:
    """LoRA's defaults (model/lora.py's LoRAConfig): what a run without `lora:` would get."""
    return LoRAConfig()


LORA_CHANGE = "lora={}"  # a `lora:` section of the defaults: rank 32 on every block linear
QLORA_CHANGE = "lora={quantize: nf4}"


def method_plans(
    d: Dims, gpu: GPU, catalog: Catalog, tokens: int, devices: int = 1, configured=None
) -> list[MethodPlan]:
    """Full, LoRA and QLoRA of a fine-tuning run on `gpu` (`configured`: the run's own plan
    there, reused for its method)."""
    out = []
    for method, change, dm in training_methods(d):
        p = configured if configured is not None and not change else None
        p = p or plan_gpu(dm, gpu, catalog, tokens, devices, with_methods=False)
        out.append(MethodPlan(method, change, dm.n_trainable, p))
    return out


def device_lines(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> dict[str, float]:
    """The memory budget of one GPU in GiB: tensor peak, allocator margin, context."""
    e = mem.estimate(d)
    fsdp = d.strategy == "fsdp" and devices > 1
    step_peak = mem.fsdp_per_gpu(d, devices)[1] if fsdp else e.peak  # per rank
    resume = mem.checkpoint_bytes(e) // (devices if fsdp else 1)
    tensor_peak = max(step_peak, resume)
    margin = tensor_peak * catalog.defaults.allocator_margin
    return {
        "tensor peak": tensor_peak / GIB,
        "resume spike": (tensor_peak - step_peak) / GIB,
        "allocator margin": margin / GIB,
        "CUDA context & workspaces": catalog.context_gib(gpu),
        "needed": (tensor_peak + margin) / GIB + catalog.context_gib(gpu),
    }


def needed_gib(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> float:
    return device_lines(d, gpu, catalog, devices)["needed"]


def micro_batch_options(d: Dims) -> list[int]:
    """Micro-batch sizes that keep the tokens per optimizer step exactly: the divisors of the
    sequences per device per step, found up to its square root (a billion takes 32k steps)."""
    seqs = d.micro_batch * d.grad_accum
    small = [m for m in range(1, math.isqrt(seqs) + 1) if seqs % m == 0]
    return sorted({*small, *(seqs // m for m in small)})


def largest_fitting(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> int | None:
    fits = (
        m
        for m in reversed(micro_batch_options(d))
        if needed_gib(d.with_micro_batch(m), gpu, catalog, devices) <= gpu.memory_gib
    )
    return next(fits, None)


def gpu_speed(
    d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1, measured: dict | None = None
) -> tuple[float, str]:
    """Tokens/s over `devices` GPUs of this kind and where the figure comes from: the step
    model on the catalog's ceilings, calibrated by this GPU's own bench if there is one, else
    by the published points (calibration.yaml); or the catalog's fixed `mfu` where set."""
    if gpu.mfu is not None:
        fpt = flops_per_token(d.model, d.seq_len)
        return gpu.mfu * speed.peak_flops(gpu, d) / fpt * devices, "catalog mfu"
    rates = speed.catalog_rates(gpu, catalog, d)
    if measured and measured.get("speed_ratio"):
        ratio, source = measured["speed_ratio"], f"bench on this GPU {measured['time'][:10]}"
    else:
        cal = cuda_calibration(catalog, gpu, d.compile)
        ratio, source = cal.ratio, f"calibrated by {cal.source}"
    rates = replace(rates, calibration=ratio)
    return speed.tokens_per_second(d, rates, devices), f"step model, {source}"


def plan_gpu(
    d: Dims,
    gpu: GPU,
    catalog: Catalog,
    tokens: int,
    devices: int = 1,
    measured: dict | None = None,
    with_methods: bool = True,
) -> GpuPlan:
    """The run on `gpu`; for a fine-tuning run (and `with_methods`) also full, LoRA and QLoRA
    there (`GpuPlan.methods`)."""
    lines = device_lines(d, gpu, catalog, devices)
    need = lines["needed"]
    fits = need <= gpu.memory_gib
    best = largest_fitting(d, gpu, catalog, devices)
    runs = d if fits else (d.with_micro_batch(best) if best else None)
    tok_s, source = gpu_speed(runs, gpu, catalog, devices, measured) if runs else (None, "")
    price = gpu.price_per_hour * devices
    hours = tokens / tok_s / 3600 if tok_s else None
    fpt = flops_per_token(d.model, d.seq_len)
    plan = GpuPlan(
        gpu=gpu,
        devices=devices,
        micro_batch=d.micro_batch,
        needed_gib=need,
        headroom_gib=gpu.memory_gib - need,
        fits=fits,
        lines=lines,
        best_micro_batch=best,
        best_grad_accum=(d.micro_batch * d.grad_accum // best) if best else None,
        needed_at_best_gib=needed_gib(runs, gpu, catalog, devices) if runs else None,
        tok_s=tok_s,
        mfu=tok_s / devices * fpt / speed.peak_flops(gpu, d) if tok_s else None,
        mfu_source=source,
        hours=hours,
        dollars=hours * price if hours is not None else None,
        dollars_per_btok=price / (tok_s * 3600) * 1e9 if tok_s else None,
        remedies=[] if fits else remedies(d, gpu, catalog, devices),
    )
    if with_methods and d.fine_tunes:
        plan.methods = method_plans(d, gpu, catalog, tokens, devices, plan)
    return plan


def config_changes(d: Dims) -> list[tuple[str, str, Dims]]:
    """Config changes that lower memory without changing the tokens per step, mildest first:
    (override, why, the changed Dims)."""
    out = []
    if d.model.loss == "plain":
        chunked = replace(d, model=d.model.model_copy(update={"loss": "chunked"}))
        out.append(("model.loss=chunked", "the full logits never exist", chunked))
    for override, why, lighter in d.optimizer.lighter:  # what the optimizer offers
        if not d.stochastic_rounding or lighter.stochastic_rounding:
            out.append((override, why, replace(d, optimizer=lighter)))
    if d.bf16 and not d.master_bf16:
        why = (
            "parameters, gradients and state in bf16, no casts (add train.stochastic_rounding=true)"
        )
        out.append(("train.master_weights=bf16", why, replace(d, master_bf16=True)))
    if not d.checkpointing:
        why = "each layer recomputed in the backward pass: about 1/3 more compute"
        out.append(("train.activation_checkpointing=true", why, replace(d, checkpointing=True)))
    return out


def remedies(d: Dims, gpu: GPU, catalog: Catalog, devices: int = 1) -> list[Remedy]:
    """Each change that lowers memory with its predicted saving at the configured micro-batch;
    a change that is not enough alone also comes with the largest micro-batch that then fits."""
    base = needed_gib(d, gpu, catalog, devices)
    out: list[Remedy] = []

    def add(name: str, dm: Dims, note: str, devices: int = devices) -> None:
        need = needed_gib(dm, gpu, catalog, devices)
        out.append(Remedy(name, need, base - need, need <= gpu.memory_gib, note))

    best = largest_fitting(d, gpu, catalog, devices)
    if (best or 1) < d.micro_batch:
        dm = d.with_micro_batch(best or 1)
        add(f"train.micro_batch_size={best or 1}", dm, _accum_note(d, dm))
    for name, why, changed in config_changes(d):
        add(name, changed, why)
        if not out[-1].fits:
            m = largest_fitting(changed, gpu, catalog, devices)
            if m:
                dm = changed.with_micro_batch(m)
                add(f"{name} train.micro_batch_size={m}", dm, f"{why}; {_accum_note(d, dm)}")
    if d.fine_tunes and d.lora is None:  # a fine-tuning run trains a few adapters instead
        for method, change, dm in training_methods(d)[1:]:
            why = (
                f"{method}: the base frozen{' in 4-bit NF4' if dm.lora and dm.lora.nf4 else ''}"
                f", {dm.n_trainable / 1e6:,.1f}M adapter parameters get gradients and state"
            )
            add(change, dm, why)
    # what schema refuses under fsdp: QLoRA's packed base, RL's sampling on each rank apart
    fsdp_ok = not (d.lora is not None and d.lora.nf4) and d.groups is None
    for n in FSDP_SIZES if fsdp_ok else ():
        sharded = replace(d, strategy="fsdp", world=n)
        if needed_gib(sharded, gpu, catalog, n) <= gpu.memory_gib or n == FSDP_SIZES[-1]:
            note = "FSDP2: parameters, gradients and optimizer state split over the GPUs"
            add(f"distributed.strategy=fsdp on {n} GPUs (--nproc {n})", sharded, note, n)
            break
    # those that fit first, mildest change first (the order above); then the rest, closest first
    return sorted(out, key=lambda r: (not r.fits, 0.0 if r.fits else r.needed_gib))


def _accum_note(d: Dims, dm: Dims) -> str:
    return f"grad_accum {d.grad_accum} -> {dm.grad_accum} keeps the tokens per step"


def apply_budget(p: GpuPlan, budget, batch_tokens: int, cap: int | None = None) -> GpuPlan:
    """`p` with its time, cost, tokens and steps those of a time or money budget (tokens at
    most `cap`, train.max_tokens, which ends the run first when it is reached first)."""
    if p.tok_s is None or budget is None or budget.kind not in ("hours", "dollars"):
        return p  # nothing runs on this GPU, or no time budget
    if budget.kind == "hours":
        seconds = budget.hours * 3600
    else:  # dollars buy hours at this GPU's price
        seconds = budget.dollars / (p.gpu.price_per_hour * p.devices) * 3600
    tokens = int(p.tok_s * seconds)
    if cap is not None and tokens > cap:
        tokens, seconds = cap, cap / p.tok_s
    return replace(
        p,
        hours=seconds / 3600,
        dollars=seconds / 3600 * p.gpu.price_per_hour * p.devices,
        budget_tokens=tokens,
        budget_steps=tokens // batch_tokens,
    )
