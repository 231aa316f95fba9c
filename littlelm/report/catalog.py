"""What each logged metric is, its unit, and which plot it goes on.

Known fields are listed in KNOWN by (record kind, field). A field nobody listed still gets
plotted: its figure and unit are guessed from its name (`peak_mem_gib` goes on the memory plot
in GiB, `crop_rate` is a fraction, `data_wait_s` is in seconds) and, when no unit can be told,
its axis says so rather than inventing one. Adding a metric to the trainer? Add a line to KNOWN
(or name the field with a unit suffix from SUFFIX_UNITS) and the report labels it properly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

UNKNOWN_UNIT = "unit not recorded"
LR_PANEL = "learning-rate multiplier"


@dataclass(frozen=True)
class Metric:
    label: str  # what the value is, e.g. "train loss"
    unit: str  # the axis unit, e.g. "nats/token"
    figure: str  # which PNG it goes on (a key of FIGURES)
    panel: str = ""  # metrics with the same panel share one axis; "" = its own
    scale: float = 1.0  # multiply logged values by this (fraction -> %, bytes -> GiB)
    log_y: bool = False
    from_zero: bool = False  # the y axis starts at 0 (rates, sizes: a change reads as its size)
    points: bool = False  # events (logged only when they happen): markers, no connecting line

    @property
    def axis(self) -> str:
        return f"{self.label} ({self.unit})"


# Figure key -> (file stem, title). Order is the order in the report.
FIGURES = {
    "loss": "Training and validation loss",
    "bpb": "Validation bits per byte",
    "lr": "Learning-rate schedule",
    "throughput": "Throughput and MFU",
    "grad_norm": "Gradient norm",
    "guard": "Loss guard: skipped updates and rollbacks",
    "memory": "Memory",
    "data": "Data",
    "evals": "Evaluation scores",
    "rl": "RL: reward, pass@1, KL to the SFT model, reply length, time per step",
    "other": "Other logged metrics",
}

KNOWN: dict[tuple[str, str], Metric] = {
    ("train", "loss"): Metric("train loss", "nats/token", "loss", "loss"),
    ("eval", "val_loss"): Metric("validation loss", "nats/token", "loss", "loss"),
    ("eval", "val_bpb"): Metric("validation bits per byte", "bits/byte", "bpb", "validation"),
    ("train", "lr_mult"): Metric(
        "logged", "× each group's base lr", "lr", LR_PANEL, from_zero=True
    ),
    ("config", "lr_mult"): Metric(
        "schedule (from config)", "× each group's base lr", "lr", LR_PANEL, from_zero=True
    ),
    ("train", "tok_per_s"): Metric("throughput", "tokens/s", "throughput", from_zero=True),
    ("train", "mfu"): Metric(
        "MFU", "% of peak bf16 FLOP/s", "throughput", scale=100, from_zero=True
    ),
    ("train", "grad_norm"): Metric("grad norm before clipping", "L2", "grad_norm", log_y=True),
    ("train", "crop_rate"): Metric(
        "cropped document tokens", "fraction of tokens", "data", from_zero=True
    ),
    ("train", "split_rate"): Metric(
        "row tokens continuing a split document", "fraction of tokens", "data", from_zero=True
    ),
    ("eval", "core"): Metric("CORE", "centered accuracy", "evals"),
    ("train", "skipped"): Metric(
        "updates skipped since the last record", "steps", "guard", from_zero=True, points=True
    ),
    ("rollback", "failed_at"): Metric(
        "rollback to the point on x, from the step", "step", "guard", points=True
    ),
    # RL runs (train/rl.py): means over the steps since the last record
    ("train", "rl_reward"): Metric("mean reward of the sampled replies", "reward", "rl"),
    ("train", "rl_pass1"): Metric(
        "sampled replies scoring 1 (pass@1)", "fraction", "rl", from_zero=True
    ),
    ("train", "rl_kl"): Metric("KL to the SFT model (k3)", "nats/reply token", "rl"),
    ("train", "rl_reply_tokens"): Metric("reply length", "tokens", "rl", from_zero=True),
    ("train", "rl_flat_frac"): Metric(
        "groups with equal rewards (no signal)", "fraction", "rl", from_zero=True
    ),
    ("train", "rl_sample_s"): Metric("sampling", "s/step", "rl", "rl time", from_zero=True),
    ("train", "rl_learn_s"): Metric(
        "loss and gradients", "s/step", "rl", "rl time", from_zero=True
    ),
}

# Fields that are bookkeeping or x axes, never plotted.
NOT_PLOTTED = {
    "step",
    "tokens",
    "time",
    "train_time",
    "eval_time",
    "eta_s",
    "val_tokens",
    "max_steps",
    "finished",
    "rollbacks",
}

# Name suffix -> (unit, scale). The first match wins, so longer suffixes come first.
SUFFIX_UNITS = [
    ("_bytes", "GiB", 1 / 2**30),
    ("_gib", "GiB", 1.0),
    ("_gb", "GB", 1.0),
    ("_mib", "MiB", 1.0),
    ("_mb", "MB", 1.0),
    ("_per_s", "per second", 1.0),
    ("_pct", "%", 1.0),
    ("_percent", "%", 1.0),
    ("_frac", "fraction", 1.0),
    ("_fraction", "fraction", 1.0),
    ("_rate", "fraction", 1.0),
    ("_ratio", "ratio", 1.0),
    ("_ms", "milliseconds", 1.0),
    ("_secs", "seconds", 1.0),
    ("_seconds", "seconds", 1.0),
    ("_time", "seconds", 1.0),
    ("_s", "seconds", 1.0),
    ("_tokens", "tokens", 1.0),
    ("_loss", "nats/token", 1.0),
    ("_bpb", "bits/byte", 1.0),
    ("_acc", "accuracy", 1.0),
    ("_accuracy", "accuracy", 1.0),
    ("_norm", "L2 norm", 1.0),
]


def describe(kind: str, name: str) -> Metric | None:
    """How to plot field `name` of `kind` records; None for fields that are not plotted."""
    top = name.split(".")[0]
    if top == "val_sets":  # val_sets.NAME.loss: a named validation set (eval.sets)
        return validation_set(name)
    if top in NOT_PLOTTED or top in ("params", "flops_per_token", "peak_flops"):
        return None
    if (kind, name) in KNOWN:
        return KNOWN[(kind, name)]
    if (kind, top) in KNOWN:  # a nested field of a known one: same axis, one line per key
        return replace(KNOWN[(kind, top)], panel=top, label=top)
    unit, scale = unit_of(name)
    figure = figure_of(kind, name)
    panel = "memory" if figure == "memory" else panel_of(name)
    zero = figure == "memory" or unit in ("GiB", "GB", "MiB", "MB", "fraction", "%")
    return Metric(name, unit, figure, panel, scale, "norm" in name, zero)


def validation_set(name: str) -> Metric | None:
    """`val_sets.NAME.loss` / `.bpb` share the axis of val_loss / val_bpb, one line per set."""
    _, set_name, leaf = [*name.split(".", 2), "", ""][:3]
    base = KNOWN.get(("eval", f"val_{leaf}"))
    if base is None or leaf == "tokens" or not set_name:
        return None
    return replace(base, label=f"{base.label}, {set_name}")


def unit_of(name: str) -> tuple[str, float]:
    """('peak_mem_gib') -> ('GiB', 1.0); an unknown suffix -> (UNKNOWN_UNIT, 1.0)."""
    low = name.lower()
    for part in (low, low.split(".")[0]):  # the leaf's suffix, else its parent's
        for suffix, unit, scale in SUFFIX_UNITS:
            if part.endswith(suffix):
                return unit, scale
    for word in ("mix", "proportion", "share"):
        if word in low:
            return "fraction", 1.0
    return UNKNOWN_UNIT, 1.0


def figure_of(kind: str, name: str) -> str:
    low = name.lower()
    words = low.replace(".", "_").split("_")
    if "mem" in low or "memory" in words:
        return "memory"
    if "grad" in words or "norm" in words:
        return "grad_norm"
    if "lr" in words:
        return "lr"
    if "mfu" in words or "tok_per_s" in low or "flops" in low:
        return "throughput"
    if any(w in low for w in ("mix", "crop", "proportion", "data_wait")):
        return "data"
    if kind == "train":
        return "other"
    return "evals" if kind == "eval" else kind


def panel_of(name: str) -> str:
    """Nested fields ('mixture.web', 'mixture.code') share their parent's panel."""
    return name.split(".")[0] if "." in name else ""


def figure_title(key: str) -> str:
    return FIGURES.get(key, f"{key} records")


def figure_order(key: str) -> int:
    return list(FIGURES).index(key) if key in FIGURES else len(FIGURES)
