"""The GPU catalog: the packaged gpus.yaml, overridden by the user's files.

Files are read in order: littlelm/plan/gpus.yaml, then ~/.config/littlelm/gpus.yaml (or
$LITTLELM_GPUS), then each `--gpus FILE`. A later file's entry replaces the fields it names of
an entry with the same key, or adds a GPU; its `defaults:` replace the defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from littlelm.config import Cfg, parse_yaml
from littlelm.errors import ConfigError, did_you_mean

PACKAGED = Path(__file__).with_name("gpus.yaml")
USER = Path("~/.config/littlelm/gpus.yaml")


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


class Catalog:
    def __init__(self, gpus: dict[str, GPU], defaults: Defaults, sources: list[Path]):
        self.gpus = gpus
        self.defaults = defaults
        self.sources = sources

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


def user_files(extra: list[str | Path] = ()) -> list[Path]:
    files = []
    user = Path(os.environ.get("LITTLELM_GPUS", USER)).expanduser()
    if user.is_file():
        files.append(user)
    for f in extra:
        p = Path(f).expanduser()
        if not p.is_file():
            raise ConfigError([f"GPU catalog file not found: {p}"])
        files.append(p)
    return files


def load_catalog(extra: list[str | Path] = ()) -> Catalog:
    files = [PACKAGED, *user_files(extra)]
    raw: dict[str, dict] = {}
    defaults: dict = {}
    for path in files:
        tree = _read(path)
        defaults.update(tree.get("defaults") or {})
        for key, entry in (tree.get("gpus") or {}).items():
            if not isinstance(entry, dict):
                raise ConfigError([f"{path}: gpus.{key} must be a mapping of fields"])
            raw.setdefault(str(key), {}).update(entry)
    return Catalog(_validate(raw, files), _defaults(defaults, files), files)


def _read(path: Path) -> dict:
    try:
        tree = parse_yaml(path.read_text()) or {}
    except Exception as e:  # yaml errors carry line numbers
        raise ConfigError([f"{path}: malformed YAML ({e})"]) from None
    if not isinstance(tree, dict) or set(tree) - {"gpus", "defaults"}:
        raise ConfigError([f"{path}: a GPU catalog has only `defaults:` and `gpus:` sections"])
    return tree


def _validate(raw: dict[str, dict], files: list[Path]) -> dict[str, GPU]:
    gpus, problems = {}, []
    for key, entry in raw.items():
        try:
            gpus[key] = GPU(**{**entry, "name": key})
        except ValidationError as e:
            for err in e.errors():
                loc = ".".join(str(x) for x in err["loc"])
                problems.append(f"gpus.{key}.{loc}: {err['msg']}")
    if problems:
        raise ConfigError(problems, ", ".join(map(str, files)))
    return gpus


def _defaults(tree: dict, files: list[Path]) -> Defaults:
    try:
        return Defaults(**tree)
    except ValidationError as e:
        raise ConfigError(
            [f"defaults.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()],
            ", ".join(map(str, files)),
        ) from None
