"""Starting a run from a smaller trained checkpoint: the `grow:` section (docs/growth.md).

    complete_growth   at start-up (config loading reads no checkpoint): find the parent
                      checkpoint, turn grow.placement into the explicit layer list and fill
                      model.value_embed_layers, so the run directory's config describes the
                      grown model completely
    grow_from_parent  at the start of a fresh run: copy the parent's weights into the freshly
                      built model (model/grow.py), set the origin tags, check that the logits
                      match the parent's, and hand back the parent's data position

The parent is read only by these two; a run that resumes from its own checkpoint never needs it
once its resolved config (runs/NAME/config.yaml) is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from littlelm.checkpoint_dirs import find_checkpoint
from littlelm.config import flatten, marked, to_tree
from littlelm.errors import CheckpointError, ConfigError, LittleLMError, TrainingError
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.model.grow import (
    check_growable,
    grow_into,
    grown_value_embed_layers,
    layer_map,
    logit_gap,
    parent_model_config,
)
from littlelm.model.lora import has_lora
from littlelm.model.protocol import LanguageModel
from littlelm.optim.groups import group_table
from littlelm.optim.schedule import OriginLR, OriginRamp, multiplier
from littlelm.train.build import build_model, optimizer_for
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.checkpoint.save_restore import plain_tensors
from littlelm.train.start_from import GrowConfig

if TYPE_CHECKING:  # the schema composes train/'s sections, so train/ names it for types only
    from littlelm.schema import RunConfig

VERIFY_RTOL = 1e-4  # of the largest logit; fp32 growth lands near 1e-6
# weights in bf16 (train.master_weights=bf16): the parent is rounded the same way and computes
# the same operations, so only the order of sums may differ (bf16's 8 bits: 4e-3 per rounding)
VERIFY_RTOL_LOW = 2e-2


def lineage_start(checkpoint: str | Path, depth: int = 16) -> dict | None:
    """Where a run grown from `checkpoint` starts on its lineage's axes: the parent's steps and
    tokens, plus its own parent's if it was grown too. None when the checkpoint cannot be read
    (a grown run may resume after its parent is gone)."""
    try:
        state = json.loads((Path(checkpoint) / "state.json").read_text())
    except (OSError, ValueError):
        return None
    start = {"checkpoint": str(checkpoint), "step": state["step"], "tokens": state["tokens"]}
    config = state.get("config") or {}
    grandparent = (config.get("sft") or {}).get("base") or (config.get("grow") or {}).get("parent")
    earlier = lineage_start(grandparent, depth - 1) if grandparent and depth > 1 else None
    if earlier is not None:
        start["step"] += earlier["step"]
        start["tokens"] += earlier["tokens"]
    return start


def complete_growth(cfg: RunConfig) -> RunConfig:
    """`cfg` (resolved) with growth's derived values filled in from the parent checkpoint: the
    parent's exact checkpoint directory, grow.placement as the explicit layer list and
    model.value_embed_layers, so that whatever builds a model from the config (the trainer, the
    planner) sees the grown model. Called at start-up (the trainer, `littlelm grow`, `plan`):
    config loading itself reads no checkpoint. A config that has them already (a run
    directory's) needs no parent, so a run resumes after its parent is gone. Raises ConfigError
    naming what is wrong."""
    g, m = cfg.starts_from(), cfg.model
    if g is None:
        return cfg
    if cfg.sft is not None:
        return _complete_sft(cfg, g)
    if not m.growable:
        raise ConfigError(["grow: only the gpt model can be grown"])
    derive = isinstance(g.placement, str) or (m.value_embeds and m.value_embed_layers is None)
    try:
        path = find_parent(g.parent)
    except CheckpointError as e:
        if derive:
            raise ConfigError([str(e)]) from None
        return cfg  # nothing to derive: the parent may be gone
    g = g.model_copy(update={"parent": str(path)})
    if derive:
        try:
            parent = parent_model_config(read_parent_state(path), path)
            layers = layer_map(g.placement, parent.n_layer, m.n_layer)
        except (LittleLMError, ValueError) as e:
            raise ConfigError([f"grow: {e}"]) from None
        g = g.model_copy(update={"placement": layers})
        m = _grown_model(parent, m, layers)
    return cfg.model_copy(update={"grow": g, "model": m})


def _grown_model(parent: GPTConfig, m: GPTConfig, layers: list[int | None]) -> GPTConfig:
    """The model section `m` with value_embed_layers derived from the parent's when unset,
    checked to grow from `parent` by `layers` with its function kept."""
    if m.value_embeds and m.value_embed_layers is None:
        ve_layers = grown_value_embed_layers(parent, m, layers)
        m = m.model_copy(update={"value_embed_layers": ve_layers})
    if problems := check_growable(parent, m, layers):
        raise ConfigError(problems)
    return m


def _complete_sft(cfg: RunConfig, g: GrowConfig) -> RunConfig:
    """complete_growth of an SFT run: sft.base made the exact checkpoint, the model checked to
    have the base's shape, model.value_embed_layers the base's."""
    m = cfg.model
    layers: list[int | None] = list(range(m.n_layer))  # the identity placement
    try:
        path = find_parent(g.parent, "sft.base")
    except CheckpointError as e:
        if m.value_embeds and m.value_embed_layers is None:
            raise ConfigError([str(e)]) from None
        return cfg  # nothing to derive: a resumed run needs no base
    try:
        parent = parent_model_config(read_parent_state(path, "sft.base"), path)
    except LittleLMError as e:
        raise ConfigError([f"sft: {e}"]) from None
    shape = ("n_layer", "d_model", "n_head", "kv_heads", "hidden", "vocab_size")
    differ = [k for k in shape if getattr(parent, k) != getattr(m, k)]
    if differ:
        raise ConfigError(
            [
                f"sft.base: {path} has {', '.join(f'{k} {getattr(parent, k)}' for k in differ)}, "
                f"the model section {', '.join(f'{k} {getattr(m, k)}' for k in differ)}; an SFT "
                "run has its base's shape (copy the base's model section; to grow the base into a "
                "larger model, use grow: {parent: ...}, docs/growth.md)"
            ]
        )
    m = _grown_model(parent, m, layers)
    assert cfg.sft is not None, "called for an SFT run only"
    sft = cfg.sft.model_copy(update={"base": str(path)})
    return cfg.model_copy(update={"sft": sft, "model": m})


def find_parent(path: str | Path, key: str = "grow.parent") -> Path:
    """A checkpoint directory, or the newest complete checkpoint of a run directory."""
    try:
        return find_checkpoint(path)
    except CheckpointError as e:
        section = key.partition(".")[0]
        raise CheckpointError(
            f"{key}: {e}; give a checkpoint directory (runs/NAME/checkpoints/step_N) or a "
            "run directory (its newest checkpoint is used); to look at or plan the model "
            f"without it, override {section}=null"
        ) from None


def read_parent_state(path: Path, key: str = "grow.parent") -> dict:
    try:
        return json.loads((path / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{key}: cannot read {path / 'state.json'} ({e})") from None


@dataclass
class GrownFrom:
    """What `grow_from_parent` did, for the start-up log and the trainer."""

    path: Path
    step: int
    tokens: int
    parent: GPTConfig
    layers: list[int | None]
    loader_state: dict | None  # the parent's data position, when continue_data
    gap: float | None  # max |Δlogit| on the probe, None when not checked
    origin: dict[str, str]  # parameter name -> origin tag (old, new, embedding): lrs per tag
    grew: bool = True  # False: the same shape (a continuation, as import's train.yaml runs)

    def summary(self) -> str:
        p = self.parent
        new = [c for c, src in enumerate(self.layers) if src is None]
        check = f"max |Δlogit| {self.gap:.2g} on the probe" if self.gap is not None else "unchecked"
        where = (
            f"{self.path} (step {self.step}, {self.tokens:,} tokens; "
            f"{p.n_layer} layers × {p.d_model} wide, {p.n_head} heads, MLP {p.hidden})"
        )
        if not self.grew:  # nothing grew: say what it is, a start from the parent's weights
            return f"starting from the weights of {where}, the same shape; function {check}"
        return f"grown from {where}; new blocks at layers {new or 'none'}; function {check}"


def grow_at_start(
    model: LanguageModel, cfg: RunConfig, resumed_step: int | None, data
) -> GrownFrom | None:
    """A fresh grown run (or one resumed at step 0): the parent's weights and origin tags go
    into `model` (None: not a grown run, or one resumed past its start)."""
    g = cfg.starts_from()
    if g is None or resumed_step:
        return None
    assert isinstance(model, GPT), "complete_growth refuses a model whose config is not growable"
    if has_lora(model):  # a LoRA run resumed at step 0: its base is in already (its load)
        return None
    return grow_from_parent(model, g, data.tokenizer.fingerprint, cfg, _key(cfg))


def check_lora_start(cfg: RunConfig, grown: GrownFrom | None) -> None:
    """A fresh LoRA run starts from trained weights of its own shape: LoRA learns a small
    change of a model that works already. From random weights the frozen base is noise that the
    adapters cannot undo (train every weight instead), and a grown model's new blocks start as
    the identity (their output projections zero), frozen there for good."""
    if cfg.lora is None:
        return
    if grown is None:
        raise ConfigError(
            [
                "lora: the run starts from random weights; LoRA trains a low-rank change of a "
                "trained base, which a frozen random model is not. Set sft: {base: RUN_DIR} "
                "(fine-tuning) or grow: {parent: RUN_DIR} with the parent's shape (continued "
                "pretraining), or remove lora: to train every weight"
            ]
        )
    if grown.grew:
        raise ConfigError(
            [
                f"lora with a grown model: {grown.path} is grown into another shape here, and "
                "the new blocks (the identity at their start) would stay frozen; grow and train "
                "every weight first, then LoRA from that run (or give the model section the "
                "parent's shape)"
            ]
        )


def base_copy(cfg: RunConfig, device: torch.device, fingerprint: str) -> torch.nn.Module:
    """A frozen copy of the run's base (sft.base) on `device`, in train.master_weights' dtype: a
    DPO run's reference (train/dpo.py). Read from the base checkpoint (and checked against its
    logits, as the run's own copy), at start and on resume alike; the run's RNG is untouched."""
    g = cfg.starts_from()
    assert g is not None, "schema.resolve refuses dpo: without sft:"
    with torch.random.fork_rng(devices=[]):  # building must not move the run's RNG
        model = build_model(cfg, device)
    assert isinstance(model, GPT), "complete_growth refuses a model whose config is not growable"
    grow_from_parent(
        model, g.model_copy(update={"continue_data": False}), fingerprint, key=_key(cfg)
    )
    model.requires_grad_(False)
    return model.eval()


def _key(cfg: RunConfig) -> str:
    """The section the run's start is configured in: sft (sft.base) or grow (grow.parent)."""
    return "sft" if cfg.sft is not None else "grow"


def grow_from_parent(
    model: GPT,
    g: GrowConfig,
    fingerprint: str | None,
    run: RunConfig | None = None,
    key: str = "grow",
) -> GrownFrom:
    """Copy the parent checkpoint into `model` (freshly initialised, any device). The parent's
    tokenizer must have `fingerprint` (None: not checked); with grow.continue_data, `run` (this
    run's config) must have the parent's data section and seed; `key`, the section `g` came
    from (named in messages)."""
    path = find_parent(g.parent)
    loaded = ckpt.load_checkpoint(path, with_optimizer=False)
    parent = parent_model_config(loaded.state, path)
    if fingerprint is not None and loaded.state.get("tokenizer") != fingerprint:
        raise CheckpointError(
            f"grow.parent: {path} was trained with a different tokenizer; a grown run must use "
            "the parent's data.tokenizer (and data it was prepared with)"
        )
    try:
        layers = layer_map(g.placement, parent.n_layer, model.cfg.n_layer)
    except ValueError as e:
        raise ConfigError([f"grow.placement: {e}"]) from None
    problems = check_growable(parent, model.cfg, layers)
    if problems:
        raise ConfigError(problems)
    tensors = plain_tensors(loaded)  # a LoRA run's checkpoint: its base with the adapters merged
    origin = grow_into(model, tensors, parent, layers, g.widened)
    gap = _verify(model, parent, tensors, path, g.verify_tokens, key) if g.verify_tokens else None
    loader = None
    if g.continue_data and run is not None:
        _check_same_data(loaded.state.get("config", {}), run, path)
        loader = loaded.state.get("loader")
    state = loaded.state
    steps, tokens = state["step"], state.get("tokens", 0)
    m = model.cfg
    shape = ("n_layer", "d_model", "n_head", "kv_heads", "hidden", "vocab_size")
    grew = [getattr(parent, k) for k in shape] != [getattr(m, k) for k in shape]
    return GrownFrom(path, steps, tokens, parent, layers, loader, gap, origin, grew=grew)


def _verify(
    model: GPT, parent_cfg: GPTConfig, tensors: Mapping, path: Path, n_tokens: int, key: str
) -> float:
    """Rebuild the parent next to the grown model and compare their logits on a probe. The
    parent's tensors take the grown model's dtypes (train.master_weights=bf16 keeps bf16
    weights): the copy is compared with the parent as rounded to them, so a correct copy
    matches at any precision."""
    device = model.wte.weight.device
    with torch.random.fork_rng(devices=[]):  # building the parent must not move the run's RNG
        parent = GPT(parent_cfg)
    ckpt.load_model_tensors(parent, tensors, path)
    dtypes = {n: t.dtype for n, t in [*model.named_parameters(), *model.named_buffers()]}
    low = model.wte.weight.dtype  # a tensor the grown model does not have: the weights' dtype
    with torch.no_grad():
        for name, t in [*parent.named_parameters(), *parent.named_buffers()]:
            t.data = t.data.to(dtypes.get(name, low if t.is_floating_point() else t.dtype))
    parent.to(device)
    T = min(n_tokens, parent_cfg.max_seq_len, model.cfg.max_seq_len)
    gen = torch.Generator().manual_seed(0)
    vocab = parent_cfg.vocab_size
    assert vocab is not None, "a checkpoint's config has its tokenizer's vocab_size"
    tokens = torch.randint(0, vocab, (1, T), generator=gen)
    gap, scale = logit_gap(parent, model, tokens)
    del parent
    rtol = VERIFY_RTOL if low == torch.float32 else VERIFY_RTOL_LOW
    if gap > rtol * max(1.0, scale):
        raise TrainingError(
            f"the grown model does not reproduce {path}: max |Δlogit| {gap:.3g} on a probe of "
            f"{T} tokens (largest logit {scale:.3g}), in {str(low).removeprefix('torch.')}. "
            f"This is a littlelm bug; please report it ({key}.verify_tokens: 0 skips the check)"
        )
    return gap


def _check_same_data(parent: dict, run: RunConfig, path: Path) -> None:
    child = to_tree(run)
    old, new = flatten(parent.get("data", {}), "data"), flatten(child.get("data", {}), "data")
    keys = sorted(
        k
        for k in set(old) | set(new)
        # data keys marked SAME_DATA (prefetch, cache_dir, ...) do not change what comes next
        if old.get(k) != new.get(k) and not marked(type(run), child, k, "same_data")
    )
    if parent.get("run", {}).get("seed") != child.get("run", {}).get("seed"):
        keys.append("run.seed")
    if keys:
        raise ConfigError(
            [
                f"grow.continue_data: {', '.join(keys)} differ from the parent's ({path}), so its "
                "data position means nothing here; set them as the parent had them, or set "
                "grow.continue_data: false to start the data from the beginning"
            ]
        )


def preview_growth(cfg: Any) -> list[str]:
    """What `littlelm grow` prints: the parent, the grown shape, where each block comes from,
    the logit check and the parameter groups with their learning rates. Builds the grown model
    on the CPU exactly as training would; trains nothing and writes nothing."""
    cfg = complete_growth(cfg)
    torch.manual_seed(cfg.run.seed)
    model = GPT(cfg.model)
    g = cfg.starts_from()
    grown = grow_from_parent(model, g, None, None)
    groups = optimizer_for(cfg, model, origin=grown.origin).param_groups
    m = model.cfg
    where = " ".join("new" if p is None else str(p) for p in grown.layers)
    lines = [
        grown.summary(),
        f"grown: {m.n_layer} layers × {m.d_model} wide, {m.n_head} heads ({m.kv_heads} kv) of "
        f"{m.head_dim}, MLP {m.hidden}; {model.param_counts()['total']:,} parameters",
        f"layer <- parent block: {where}",
        f"value embeddings at layers {[i for i in range(m.n_layer) if m.has_value_embed(i)]}",
        f"{'group':<26}{'tensors':>8}{'parameters':>14}  {'optimizer':<10}  lr (peak of the schedule)",
    ]
    lines += [
        f"{name:<26}{n:>8}{numel:>14,}  {opt:<10}  {lr}"
        for name, n, numel, opt, lr in group_rows(groups, g)
    ]
    if cfg.grow is not None and not g.lr_multipliers and not cfg.optimizer.origin_multipliers():
        lines.append(
            "one lr for old and new weights: on the parent's own data the loss jumps after "
            "growth, then ended lowest at three of four seed runs; on new data it learns the new "
            "best and forgets the most of the old. To learn new data and keep the old, set "
            "grow.lr_multipliers: {old: 0.2, embedding: 0.5} (measured at two seeds: a quarter "
            "to a half of one lr's forgetting, the new data's loss 0.005-0.014 higher; "
            "docs/growth.md, what to choose)"
        )
    return lines


def group_rows(groups: list[dict], grow: GrowConfig | None) -> list[tuple[str, int, int, str, str]]:
    """The start-up table's rows (group, tensors, parameters, optimizer, lr): the lr as a
    number, or how it moves in a grown run whose grow.lr_multipliers ramp that group's origin."""
    ramps = grow.lr_multipliers if grow is not None else None
    rows = []
    for group, (name, n, numel, opt, lr) in zip(groups, group_table(groups)):
        rows.append((name, n, numel, opt, lr_text(lr, (ramps or {}).get(group["origin"]))))
    return rows


def lr_text(lr: float, spec: OriginLR | None) -> str:
    """`lr` (the group's base lr) under `spec`: '0.02', or '0.00066 → 0.02 in 200 steps' (a
    geometric ramp; other shapes are named)."""
    if spec is None:
        return f"{lr:.3g}"
    if not isinstance(spec, OriginRamp) or spec.ramp_steps == 0:
        return f"{lr * multiplier(spec, 0):.3g}"
    shape = "" if spec.shape == "geometric" else f" ({spec.shape})"
    return f"{lr * spec.start:.3g} → {lr * spec.end:.3g} in {spec.ramp_steps} steps{shape}"
