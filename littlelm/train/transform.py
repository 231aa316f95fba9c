"""What a run does to its model besides training it: a model transform, one object that the
trainer, the checkpoints and the loader of trained models (littlelm/load.py) call without
knowing what it is.

    t = build_transform(cfg, tokenizer)   # train/build.py: LoRA's for a `lora:` run, else none
    t.start(model, grown)                 # a fresh run, once the base weights are in
    t.trained_state(weights, model)       # what a checkpoint keeps of the weights
    t.record()                            # what it adds to state.json (lora_base, lora_tokens)
    t.load(model, loaded)                 # a checkpoint's weights into a freshly built model
    t.load_trained(model, loaded, load_whole)   # a rollback's, into the running model
    t.merge(model)                        # the plain model (sample, chat, eval, export)
    t.reference(model, copy)              # the frozen reference: LoRA's adapters off, or copy()

`Transform` is the identity (a run that trains every weight). `LoRA` puts adapters on the
frozen base (model/lora.py holds the adapters, their tensors and the merge): its checkpoints keep
the trained tensors alone, and state.json's `lora_base` names the base checkpoint with its
fingerprint and the sha256 of its weights (train/checkpoint/files.py), checked whenever the
adapters are loaded: a user's 3B base is not copied into every checkpoint, and the base must
still be there, unchanged. `plain_tensors` reads any checkpoint as the plain model's tensors (a
LoRA run's: its base with the adapters merged), so a run may start from a LoRA run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from littlelm.config import validate
from littlelm.data.tokenizer import Tokenizer
from littlelm.errors import CheckpointError, ConfigError
from littlelm.model.gpt import GPT
from littlelm.model.grow import parent_model_config
from littlelm.model.lora import (
    LoRAConfig,
    adapters_off,
    add_lora,
    base_dtype,
    check_lora,
    has_lora,
    load_trained,
    merge_lora,
    trained_tensors,
)
from littlelm.model.peft_adapter import load_peft_adapter
from littlelm.train.checkpoint import files as ckpt


class Transform:
    """The identity: the run trains (and its checkpoints keep) every weight."""

    # whether trained_state keeps every weight (what a background save stages: writer.py)
    keeps_every_weight = True

    def start(self, model: torch.nn.Module, grown: Any) -> None:
        """A fresh run, its start's weights in (`grown`: train/growth.py's GrownFrom, or None)."""

    def applied(self, model: torch.nn.Module) -> bool:
        """Whether `model` is transformed already (a run resumed at its step 0)."""
        return False

    def trained_state(self, weights: dict, model: torch.nn.Module) -> dict:
        """Of the model's whole state dict, what a checkpoint keeps."""
        return weights

    def record(self) -> dict:
        """What the transform adds to a checkpoint's state.json."""
        return {}

    def load(self, model: torch.nn.Module, loaded: ckpt.Loaded) -> None:
        """A checkpoint's weights into a freshly built (untransformed, unsharded) model."""
        if "lora_base" in loaded.state:
            raise ConfigError(
                [f"{loaded.path} is a LoRA run's checkpoint; its config's lora section is missing"]
            )
        ckpt.load_model_tensors(model, loaded.model, loaded.path)

    def load_trained(
        self, model: torch.nn.Module, loaded: ckpt.Loaded, load_whole: Callable[[], None]
    ) -> None:
        """A rollback: the checkpoint's weights into the running model (`load_whole` loads the
        whole state dict, sharded as the model is)."""
        load_whole()

    def merge(self, model: torch.nn.Module) -> torch.nn.Module:
        """The plain model computing what the transformed one computes."""
        return model

    def reference(
        self, model: torch.nn.Module, copy: Callable[[], torch.nn.Module]
    ) -> torch.nn.Module:
        """The frozen reference of an objective (DPO, RL's KL): the run's base as it was.
        `copy()` reads a second model from the base checkpoint (train/growth.py's base_copy)."""
        return copy()


class LoRA(Transform):
    """Adapters on a frozen base (model/lora.py); `base` is the checkpoint the run starts from
    (sft.base or grow.parent, made exact by complete_growth), None when the run has none."""

    keeps_every_weight = False  # the trained tensors alone: the base stays in its checkpoint

    def __init__(
        self,
        cfg: LoRAConfig,
        base: str | None,
        precision: str | None = None,
        token_ids: list[int] | None = None,
    ):
        self.cfg, self.base = cfg, base
        # the token rows trained (lora.trainable_tokens resolved by the run's tokenizer); None
        # when loading: the checkpoint's state.json says which
        self.token_ids = token_ids
        # the frozen linears' dtype in a run computing in `precision` (None: as loaded, what
        # sample, eval and export read: the merge is then computed from the base's own weights)
        self.base_dtype = base_dtype(cfg, precision) if precision else None
        self.base_record: dict | None = None  # {path, fingerprint, sha256, stat}: read once

    def _apply(self, model: torch.nn.Module) -> None:
        problems = check_lora(model, self.cfg)
        if problems:
            raise ConfigError(problems)
        add_lora(model, self.cfg, self.base_dtype, self.token_ids or ())

    def start(self, model: torch.nn.Module, grown: Any) -> None:
        """A fresh LoRA run starts from trained weights of its own shape: LoRA learns a small
        change of a model that works already. From random weights the frozen base is noise that
        the adapters cannot undo (train every weight instead), and a grown model's new blocks
        start as the identity (their output projections zero), frozen there for good."""
        if grown is None:
            raise ConfigError(
                [
                    "lora: the run starts from random weights; LoRA trains a low-rank change of "
                    "a trained base, which a frozen random model is not. Set sft: {base: "
                    "RUN_DIR} (fine-tuning) or grow: {parent: RUN_DIR} with the parent's shape "
                    "(continued pretraining), or remove lora: to train every weight"
                ]
            )
        if grown.grew:
            raise ConfigError(
                [
                    f"lora with a grown model: {grown.path} is grown into another shape here, "
                    "and the new blocks (the identity at their start) would stay frozen; grow "
                    "and train every weight first, then LoRA from that run (or give the model "
                    "section the parent's shape)"
                ]
            )
        self._apply(model)
        if self.cfg.init_from is not None:  # a PEFT adapter's A, B and token rows, not fresh
            problems = load_peft_adapter(model, self.cfg, self.cfg.init_from)
            if problems:
                raise ConfigError(problems)

    def applied(self, model: torch.nn.Module) -> bool:
        return has_lora(model)

    def trained_state(self, weights: dict, model: torch.nn.Module) -> dict:
        return trained_tensors(weights, model)  # the base stays in its checkpoint

    def record(self) -> dict:
        if self.base_record is None:
            assert self.base is not None, "a LoRA run starts from a checkpoint (LoRA.start)"
            # complete_growth made it the exact checkpoint; absolute, so that every verb finds
            # it from any directory
            path = Path(self.base).resolve()
            self.base_record = {
                "path": str(path),
                "fingerprint": ckpt.fingerprint(path),
                **ckpt.weights_identity(path),
            }
        # which rows the checkpoint's wte.rows are (a loader cannot know the tokenizer's ids)
        return {"lora_base": self.base_record, "lora_tokens": list(self.token_ids or ())}

    def load(self, model: torch.nn.Module, loaded: ckpt.Loaded) -> None:
        """A LoRA checkpoint into the plain `model`: the base's weights from the checkpoint its
        state.json names (checked against the fingerprint and weights' hash recorded there),
        the adapters put on, then the checkpoint's trained tensors. Raises CheckpointError when
        the base is gone or changed."""
        record = loaded.state.get("lora_base")
        if record is None:
            raise ConfigError(
                [
                    f"{loaded.path} is not a LoRA run's checkpoint; remove the lora section to load it"
                ]
            )
        path, want = base_path(loaded), record.get("fingerprint")
        try:
            found = ckpt.fingerprint(path)
        except CheckpointError:
            relative = (
                ""
                if Path(record.get("path", "")).is_absolute()
                else (
                    " (its state.json records it relative to the directory that run started in: "
                    "run from there, or write the absolute path into lora_base.path of "
                    f"{loaded.path / 'state.json'})"
                )
            )
            raise CheckpointError(
                f"{loaded.path} holds LoRA adapters of the base {path}, which cannot be read"
                f"{relative}: put that checkpoint back where it was (a LoRA run's checkpoints "
                "keep the adapters alone, the base's weights stay in the base's checkpoint)"
            ) from None
        changed = f"fingerprint was {want}, is {found}" if found != want else None
        if changed is None and ckpt.weights_changed(path, record):
            changed = "its model.safetensors hashes differently, same size and header"
        if changed:
            raise CheckpointError(
                f"{loaded.path} holds LoRA adapters of the base {path}, which changed since (its "
                f"{changed}): the adapters only fit the weights they were trained on; restore "
                "that checkpoint as it was"
            )
        base = ckpt.load_checkpoint(path, with_optimizer=False)
        ckpt.load_model_tensors(model, plain_tensors(base), path)  # a LoRA base: merged in turn
        base.model.release()
        self.token_ids = loaded.state.get("lora_tokens", [])  # older checkpoints: none
        self._apply(model)
        load_trained(model, loaded.model, loaded.path)
        kept = {k: record[k] for k in ("sha256", "stat") if k in record}
        if "sha256" in kept:  # checked above: equal; its stat now (a copy has a new mtime)
            kept["stat"] = ckpt.weights_stat(path)
        self.base_record = {"path": str(path.resolve()), "fingerprint": found, **kept}

    def load_trained(
        self, model: torch.nn.Module, loaded: ckpt.Loaded, load_whole: Callable[[], None]
    ) -> None:
        load_trained(model, loaded.model, loaded.path)  # the frozen base is in already

    def merge(self, model: torch.nn.Module) -> torch.nn.Module:
        return merge_lora(model)

    def reference(
        self, model: torch.nn.Module, copy: Callable[[], torch.nn.Module]
    ) -> torch.nn.Module:
        """The model itself with its adapters off (PEFT's disable_adapter): the frozen base is
        the run's base, so one set of base weights serves policy and reference. A run that
        trains tensors in full (train_embeddings, train_norms) changed its base: a copy then."""
        if self.cfg.train_embeddings or self.cfg.train_norms:
            return copy()
        return AdaptersOff(model)


class AdaptersOff(torch.nn.Module):
    """A LoRA model called with its adapters off: its frozen base, computing what a copy of the
    base computes (the same tensors, the same ops). Holds no weights of its own; the model is
    kept out of its parameters (a plain attribute) so that nothing counts or moves them twice."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.__dict__["model"] = model  # not a submodule: the trainer owns it

    def forward(self, *args, **kwargs):
        with adapters_off(self.__dict__["model"]):
            return self.__dict__["model"](*args, **kwargs)


def transform_for(
    lora: LoRAConfig | None,
    base: str | None,
    precision: str | None = None,
    tokenizer: Tokenizer | None = None,
) -> Transform:
    """The transform of a run whose lora section is `lora`, started from the checkpoint `base`,
    computing in `precision` (as resolved: the frozen base's dtype; None: as loaded), its
    trained token rows picked in `tokenizer` (None: as the checkpoint loaded says)."""
    if lora is None:
        return Transform()
    ids = None if tokenizer is None else trained_token_ids(lora, tokenizer)
    return LoRA(lora, base, precision, ids)


def trained_token_ids(lora: LoRAConfig, tokenizer: Tokenizer) -> list[int]:
    """lora.trainable_tokens as ids of `tokenizer`: its chat control tokens (those it has), none,
    or the ids given, each checked to be in its vocabulary."""
    if lora.train_embeddings or lora.trainable_tokens == "none":
        return []
    if lora.trainable_tokens == "chat":
        return tokenizer.chat_token_ids()
    bad = [i for i in lora.trainable_tokens if not 0 <= i < tokenizer.vocab_size]
    if bad:
        raise ConfigError(
            [
                f"lora.trainable_tokens: {bad} is not a token id of this run's tokenizer (0 to "
                f"{tokenizer.vocab_size - 1}); give ids in that range, chat or none"
            ]
        )
    return sorted(set(lora.trainable_tokens))


def base_path(loaded: ckpt.Loaded) -> Path:
    """The base checkpoint LoRA checkpoint `loaded` names. Runs record it absolute; an older
    run's relative path is relative to the directory that run started in, which is known when
    run.out_dir was relative: the checkpoint is START/out_dir/name/checkpoints/step_N."""
    path = Path(loaded.state["lora_base"].get("path", ""))
    if path.is_absolute() or path.exists():
        return path
    out_dir = Path(loaded.state.get("config", {}).get("run", {}).get("out_dir", ""))
    parents = loaded.path.resolve().parents
    depth = 2 + len(out_dir.parts)  # checkpoints/, the run's directory, out_dir's parts: START
    usable = out_dir.parts and not out_dir.is_absolute() and ".." not in out_dir.parts
    if usable and depth < len(parents) and (parents[depth] / path).exists():
        return parents[depth] / path
    return path


def plain_tensors(loaded: ckpt.Loaded) -> Mapping:
    """The plain model's tensors of a checkpoint: its own, or for a LoRA run's checkpoint
    (adapters alone) its base's with the adapters merged in, as `load_model` reads it; so a run
    may start from a LoRA run (sft.base, grow.parent, the frozen reference)."""
    if "lora_base" not in loaded.state:
        return loaded.model
    config = loaded.state.get("config", {})
    model = parent_model_config(loaded.state, loaded.path)
    lora = validate(LoRAConfig, config.get("lora") or {}, source=str(loaded.path / "state.json"))
    # the adapters go on the base's own weights (a QLoRA run's too: nf4 needs CUDA), as load_model
    with torch.random.fork_rng(devices=[]):  # building it must not move the run's RNG
        plain = GPT(model)
    t = LoRA(lora.model_copy(update={"quantize": "none"}), None)
    t.load(plain, loaded)
    return t.merge(plain).state_dict()
