"""Which checkpoint a run resumes from, and whether this run's config may continue it.

    --resume auto    the newest complete checkpoint of the run directory (an unreadable one is
                     reported and the one before it is used); none = start fresh
    --resume never   start fresh; refused when the run directory already has checkpoints
    --resume PATH    that checkpoint; refused when the run directory has newer ones

Refusing `never` and `PATH` over existing newer checkpoints keeps two trajectories from mixing
in one directory: `auto` would later pick the other run's newest checkpoint, and pruning would
delete this run's.

A config may differ from its checkpoint's only in the keys its schema marks resumable, next to
each field (`json_schema_extra=RESUMABLE`: training length, logging, evaluation, checkpointing,
optimizer hyper-parameters but not the optimizer, schedule, guard, mixture weights, how the
loss is computed, ...; `config.marked`); every other difference (model shape,
tokenizer, data sources, batch shape, seed) is refused, naming each key with its old and new
value. `schema` is the run config's class (littlelm/schema.py's RunConfig, which sits above
train/ and is handed in).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from littlelm.config import Cfg, flatten, marked, to_tree, validate
from littlelm.errors import CheckpointError, ConfigError
from littlelm.train.checkpoint import files as ckpt


def config_changes(old: dict, new: dict, schema: type[Cfg]) -> tuple[list[str], list[str]]:
    """(allowed, refused) differences between two config trees, as 'key: old -> new'."""
    a, b = flatten(old), flatten(new)
    allowed: list[str] = []
    refused: list[str] = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            text = f"{key}: {a.get(key, '(unset)')!r} -> {b.get(key, '(unset)')!r}"
            tree = new if key in b else old
            (allowed if marked(schema, tree, key, "resumable") else refused).append(text)
    return allowed, refused


def with_defaults(saved: dict, schema: type[Cfg]) -> dict:
    """A checkpoint's config with the fields added to littlelm since it was written filled in
    with their defaults, so that upgrading littlelm mid-run changes no setting; as saved when
    it no longer validates (the differences then name what to restore)."""
    try:
        return to_tree(validate(schema, saved))
    except ConfigError:
        return saved


# Defaults changed since checkpoints were written: (key, the default before, changed on). A run
# resumed with a config that leaves such a key unset keeps the value it trained with, so that
# upgrading littlelm mid-run changes no setting (as `with_defaults` for fields added since).
CHANGED_DEFAULTS: tuple[tuple[str, object, str], ...] = (
    ("optimizer.scalar_lr", 0.5, "2026-12-05"),  # Muon's: now 0.002 (benchmarks/RESULTS.md)
)


def keep_old_defaults(cfg: Cfg, saved: dict) -> tuple[Cfg, list[str]]:
    """`cfg` with every CHANGED_DEFAULTS key it leaves unset set back to the old default where
    the checkpoint's config (`saved`) has that; and a line for the log for each."""
    flat, notes = flatten(saved), []
    for key, old, since in CHANGED_DEFAULTS:
        *path, leaf = key.split(".")
        nodes: list[Any] = [cfg]
        for part in path:
            nodes.append(getattr(nodes[-1], part, None))
        node = nodes[-1]
        if not isinstance(node, Cfg) or leaf not in type(node).model_fields:
            continue
        now = getattr(node, leaf)
        if leaf in node.model_fields_set or flat.get(key) != old or now == old:
            continue
        new = node.model_copy(update={leaf: old})
        for parent, part in zip(reversed(nodes[:-1]), reversed(path)):
            new = parent.model_copy(update={part: new})
        cfg = new
        notes.append(
            f"{key} stays {old!r} as this run trained with it (the default before {since}, "
            f"{now!r} since); set {key} to change it"
        )
    return cfg, notes


def check_compatible(
    state: dict, config: dict, fingerprint: str | None, path: Path, schema: type[Cfg]
) -> list[str]:
    """Raise CheckpointError when `config` cannot continue the checkpoint's run; return the
    allowed differences (for the log)."""
    saved = with_defaults(state.get("config", {}), schema)
    allowed, refused = config_changes(saved, config, schema)
    if state.get("tokenizer") != fingerprint:
        keys = [c for c in refused if c.startswith("data.tokenizer.")]
        refused.insert(
            0,
            "the tokenizer"
            + (
                f" ({'; '.join(keys)})"
                if keys
                else " (same settings, but it was trained on different text)"
            ),
        )
    if refused:
        hint = ""
        if any(c.startswith("train.batch_tokens:") for c in refused) and any(
            c.startswith("distributed.world_size:") for c in allowed
        ):
            was = flatten(state.get("config", {})).get("train.batch_tokens")
            hint = (
                f" (the world size changed: set train.batch_tokens={was} to keep the global batch)"
            )
        raise CheckpointError(
            f"cannot resume {path}: these settings differ from the checkpoint's and cannot "
            f"change mid-run: {'; '.join(dict.fromkeys(refused))}{hint}. Restore them, or start "
            "a new run (another run.name)"
        )
    return allowed


def choose(ckpt_dir: Path, resume: str) -> list[Path]:
    """Candidate checkpoints to resume from, best first (several only for `auto`)."""
    found = ckpt.list_checkpoints(ckpt_dir)
    if resume == "auto":
        return found[::-1]
    if resume == "never":
        if found:
            raise CheckpointError(
                f"{ckpt_dir} already holds checkpoints (newest: {found[-1].name}); --resume never "
                "would mix a new run with them. Resume it (--resume auto), delete or move that "
                "directory, or choose another run.name"
            )
        return []
    path = Path(resume)
    if not (path / "state.json").is_file():
        raise CheckpointError(f"--resume {resume}: not a complete checkpoint (no state.json)")
    step = ckpt.checkpoint_step(path)
    newer = [d.name for d in found if ckpt.checkpoint_step(d) > step]
    if newer:
        raise CheckpointError(
            f"{ckpt_dir} holds checkpoints newer than {path} ({', '.join(newer)}); resuming "
            "from an older one would mix two runs in one directory. Move them away, or train "
            "under another run.name"
        )
    return [path]


def refuse_early(ckpt_dir: Path, resume: str, config: dict, schema: type[Cfg]) -> None:
    """Refuse now, before any data preparation or tokenizer training, a resume that `load`
    would refuse later: `never` or PATH over newer checkpoints (`choose`), or a config that
    differs from the checkpoint's in a key that cannot change. Reads state.json only; the
    tokenizer's fingerprint is checked once the tokenizer exists, and an unreadable checkpoint
    is left to `load_first` (which falls back to the one before)."""
    for path in choose(ckpt_dir, resume):
        try:
            state = json.loads((path / "state.json").read_text())
            ckpt.check_state_types(state, path)
        except (OSError, ValueError, ckpt.UnreadableCheckpoint):
            continue
        saved = with_defaults(state.get("config", {}), schema)
        _, refused = config_changes(saved, config, schema)
        other_tokenizer = any(c.startswith("data.tokenizer.") for c in refused)
        fingerprint = None if other_tokenizer else state.get("tokenizer")
        check_compatible(state, config, fingerprint, path, schema)
        return


def load_first(candidates: list[Path]) -> ckpt.Loaded | None:
    """Load the first readable candidate; an unreadable one is reported and skipped."""
    for i, path in enumerate(candidates):
        try:
            return ckpt.load_checkpoint(path)
        except ckpt.UnreadableCheckpoint as e:
            if i + 1 == len(candidates):
                raise
            warnings.warn(
                f"{e}; resuming from the one before it, {candidates[i + 1]}", stacklevel=2
            )
    return None


def compact(obj):
    """`obj` with every non-contiguous tensor replaced by a contiguous copy. Fused AdamW
    kernels assume contiguous moments and silently misplace updates in strided ones, which
    checkpoints written by ZeroAdamW before it saved compact copies hold (views into the
    gathered buffer)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_contiguous() else obj.clone(memory_format=torch.contiguous_format)
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(compact(v) for v in obj)
    return obj


def load_optimizer_state(optimizer, state: dict) -> None:
    """Restore the optimizer's state (moments, step counts) but keep this run's
    hyper-parameters: torch's load_state_dict would bring back the checkpoint's lr, betas and
    weight decay and silently undo a changed `optimizer.*` setting."""
    fresh = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(compact(state))
    except (ValueError, KeyError) as e:
        raise CheckpointError(
            f"the checkpoint's optimizer state does not fit this run's optimizer ({e})"
        ) from None
    for group, hyper in zip(optimizer.param_groups, fresh):
        group.update(hyper)
