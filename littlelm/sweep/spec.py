"""What a sweep runs: variants of a base run file, each an ordinary run (a list of overrides).

    littlelm sweep demo --set model.n_layer=4,6 --set optimizer.lr_matrix=0.01,0.02 --budget 10m

`--grid` (the default) takes every combination of the --set values; `--zip` pairs the i-th value
of every key. `--seeds N` repeats each variant with run.seed, run.seed + 1, ... Each variant's
name comes from its diff (`n_layer=4,lr_matrix=0.01`, `,seed=2` appended with repeats) and is
its run directory inside the sweep directory. `--budget` gives every variant the same budget:
90s, 30m, 2h (wall-clock), $5 (dollars; needs a price per GPU-hour) or 500M, 2B (tokens).

Every variant's config is loaded and checked before anything trains: an unknown key (with a
did-you-mean), a value of the wrong type, an empty grid or a budget too small for one step is
one clear error naming the variant.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field

import yaml

from littlelm.config import parse_yaml, validate
from littlelm.errors import ConfigError, LittleLMError
from littlelm.model.gpt import flops_per_token
from littlelm.schema import MAX_NAME_BYTES, RunConfig, load_run, read_run, run_name_problem
from littlelm.train.budget import check_budget_fits
from littlelm.train.device import peak_flops, pick_device, with_precision

RESERVED = ("run.name", "run.out_dir")  # the sweep sets these for each variant
TIME_UNITS = {"s": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0, "d": 24.0}  # lower case
TOKEN_UNITS = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}  # M = million


class SweepError(LittleLMError):
    """A sweep that cannot run as given (its arguments, or its directory)."""


@dataclass
class Variant:
    name: str
    overrides: list[str]  # dotted key=value, JSON values
    values: dict[str, object] = field(default_factory=dict)  # the swept keys' values
    seed: int | None = None  # with --seeds N: run.seed of this repeat

    @property
    def group(self) -> str:
        """The variant's name without its seed (repeats of one variant share it)."""
        return self.name.rsplit(",seed=", 1)[0] if self.seed is not None else self.name


def parse_set(item: str) -> tuple[str, list]:
    """'model.n_layer=4,6' -> ('model.n_layer', [4, 6]); values are YAML ('[1,2]' stays a list)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise SweepError(f"--set {item!r}: expected KEY=v1,v2,..., e.g. model.n_layer=4,6")
    if key in RESERVED:
        raise SweepError(f"--set {key}: the sweep names each variant's run itself; leave it out")
    if not raw.strip():
        raise SweepError(f"--set {key}= has no values: the grid would be empty; give v1,v2,...")
    try:
        values = parse_yaml(f"[{raw}]")
    except yaml.YAMLError:
        raise SweepError(
            f"--set {item!r}: cannot read the values as a comma-separated list"
        ) from None
    if not values:
        raise SweepError(f"--set {key}= has no values: the grid would be empty; give v1,v2,...")
    return key, values


def combine(sets: list[tuple[str, list]], zip_: bool) -> list[dict[str, object]]:
    """Every combination (grid) or the i-th values together (zip), as {key: value}."""
    if not sets:
        raise SweepError("a sweep needs at least one --set KEY=v1,v2 (the grid is empty)")
    keys = [k for k, _ in sets]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise SweepError(f"--set {dupes[0]} is given twice; list all its values in one --set")
    lists = [v for _, v in sets]
    if zip_:
        lengths = {len(v) for v in lists}
        if len(lengths) > 1:
            sizes = ", ".join(f"{k}: {len(v)}" for k, v in sets)
            raise SweepError(f"--zip needs as many values for every key ({sizes})")
        combos = list(zip(*lists, strict=True))
    else:
        combos = list(itertools.product(*lists))
    return [dict(zip(keys, c, strict=True)) for c in combos]


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each key's last part, or the whole dotted key where two keys share a last part."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def value_text(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return re.sub(r"[^A-Za-z0-9._+\-=\[\],:]", "_", str(text))  # safe in a directory name


def fit_name(name: str, room: int = 0) -> str:
    """`name`, or where it is too long for a directory name (with `room` bytes to spare) its
    start and a hash of the whole: `n_layer=2,window=[...]~3f2a9c1d` (sweep.json keeps the values)."""
    limit = MAX_NAME_BYTES - room
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    head = name.encode()[: limit - 9].decode(errors="ignore")
    return f"{head}~{digest}"


def make_variants(
    sets: list[tuple[str, list]], zip_: bool, seeds: int = 1, base_seed: int = 0
) -> list[Variant]:
    combos = combine(sets, zip_)
    short = short_keys([k for k, _ in sets])
    out = []
    for combo in combos:
        name = ",".join(f"{short[k]}={value_text(v)}" for k, v in combo.items())
        name = fit_name(name, room=0 if seeds == 1 else len(f",seed={base_seed + seeds}"))
        overrides = [f"{k}={json.dumps(v)}" for k, v in combo.items()]
        if seeds == 1:
            out.append(Variant(name, overrides, combo))
            continue
        for i in range(seeds):
            seed = base_seed + i
            out.append(
                Variant(f"{name},seed={seed}", [*overrides, f"run.seed={seed}"], combo, seed)
            )
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise SweepError("two variants would share a name: the --set values repeat")
    return out


def parse_budget(text: str, price: float | None) -> dict:
    """'90s' / '30m' / '2h' -> hours; '$5' / '5$' -> dollars; '500M' / '2e9' -> tokens (m is
    minutes, M millions)."""
    t = text.strip().replace("_", "")
    m = re.fullmatch(r"\$?([0-9.]+(?:e-?[0-9]+)?)\$?(usd)?", t)
    if m and ("$" in t or m.group(2)):
        if price is None:
            raise SweepError(
                f"--budget {text}: a dollar budget needs a price; pass --price-per-hour "
                "(per GPU-hour) or set train.budget.price_per_gpu_hour in the base config"
            )
        return {"dollars": float(m.group(1)), "price_per_gpu_hour": price}
    m = re.fullmatch(r"([0-9.]+(?:e-?[0-9]+)?)(s|min|m|h|d)", t)
    if m:
        return {"hours": float(m.group(1)) * TIME_UNITS[m.group(2)]}
    m = re.fullmatch(r"([0-9.]+(?:e-?[0-9]+)?)(k|K|M|B|G|T)?(tok|tokens)?", t)
    if m and (m.group(2) or m.group(3) or "e" in t or t.isdigit()):
        return {"tokens": int(float(m.group(1)) * TOKEN_UNITS[m.group(2) or ""])}
    raise SweepError(
        f"--budget {text!r}: expected a time (90s, 30m, 2h), dollars ($5) or tokens (500M, 2B)"
    )


def check_sweep_name(name: str) -> None:
    """The sweep directory is run.out_dir/NAME: one directory name, like a run's."""
    if run_name_problem(name):
        raise SweepError(
            f"--name {name[:60]!r}: the sweep's directory is run.out_dir/NAME, so NAME must be "
            f"one directory name (not empty, '.' or '..', no '/' or '\\', at most "
            f"{MAX_NAME_BYTES} bytes); choose where it goes with run.out_dir=DIR"
        )


def check_devices(devices: list[str] | None) -> None:
    """--devices: distinct GPU indices (each runs one variant at a time)."""
    if devices is None:
        return
    bad = [d for d in devices if not d.strip().isdigit()]
    if bad or not devices:
        raise SweepError(
            f"--devices {','.join(devices)!r}: expected GPU indices separated by commas, e.g. 0,1,2"
        )
    numbers = [int(d) for d in devices]
    dupes = sorted({d for d in numbers if numbers.count(d) > 1})
    if dupes:
        raise SweepError(
            f"--devices names GPU {dupes[0]} twice: two variants would share it and each "
            "would run slower; list each GPU once"
        )


def read_base(base: str, overrides: list[str]) -> RunConfig:
    """The base config validated but not resolved: its price and seed, before --budget (which
    may be what ends its runs) is applied; the full check comes with the budget."""
    tree, origin, path = read_run(base, overrides)  # as `littlelm train` reads it
    return validate(RunConfig, tree, origin, str(path))


def budget_override(budget: dict | None) -> list[str]:
    return [] if budget is None else [f"train.budget={json.dumps(budget)}"]


def load_variants(
    base: str, base_overrides: list[str], variants: list[Variant], out_dir, extra: list[str]
) -> list[RunConfig]:
    """Every variant's resolved config; all problems of all variants raised together."""
    problems, configs = [], []
    for v in variants:
        where = [f"run.name={json.dumps(v.name)}", f"run.out_dir={json.dumps(str(out_dir))}"]
        try:
            configs.append(load_run(base, [*base_overrides, *extra, *v.overrides, *where]))
        except ConfigError as e:
            problems += [f"variant {v.name}: {p}" for p in e.problems]
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)), base)
    return configs


def check_budgets(configs: list[RunConfig], names: list[str]) -> None:
    """A time budget too small for one step of a variant, at its device's peak: an error."""
    problems = []
    for cfg, name in zip(configs, names, strict=True):
        b = cfg.train.budget
        seconds = b.seconds(cfg.distributed.world_size or 1) if b is not None else None
        if seconds is None or not cfg.model.analytic_plan:  # FLOPs are counted for gpt only
            continue
        device = pick_device(cfg.run.device)
        peak = peak_flops(device, precision=with_precision(cfg, device).train.precision)
        # the one model config whose plan is analytic, checked above (no class test: contracts)
        m = cfg.model
        seq_len, batch_tokens = cfg.train.seq_len, cfg.train.batch_tokens
        assert seq_len is not None and batch_tokens is not None, "load_run derives them"
        fpt = flops_per_token(m, seq_len)
        problem = check_budget_fits(seconds, batch_tokens, fpt, peak, device.type)
        if problem:
            problems.append(f"variant {name}: {problem}")
    if problems:
        raise ConfigError(problems)
