"""Load a trained model (and its tokenizer) from a checkpoint directory or a run directory."""

from __future__ import annotations

from pathlib import Path

import torch

from littlelm.checkpoint_dirs import find_checkpoint
from littlelm.config import validate
from littlelm.data.tokenizer import Tokenizer
from littlelm.data.tokenizers import load_tokenizer
from littlelm.schema import RunConfig
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.transform import transform_for

__all__ = ["find_checkpoint", "load_model"]  # find_checkpoint: littlelm/checkpoint_dirs.py


def load_model(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, Tokenizer, RunConfig]:
    """(model in eval mode, tokenizer, the run's config) from a checkpoint; a LoRA run's
    adapters merged into its base's weights (the plain model: every verb reads it as any other)."""
    path = find_checkpoint(path)
    loaded = ckpt.load_checkpoint(path, with_optimizer=False)
    cfg = validate(RunConfig, loaded.state["config"], source=str(path / "state.json"))
    model = cfg.model.build()
    # a QLoRA run's adapters go on the base's own weights, not their 4-bit rounding: it loads
    # anywhere (bitsandbytes' NF4 needs CUDA), for every verb that reads a run
    lora = cfg.lora.model_copy(update={"quantize": "none"}) if cfg.lora else None
    transform = transform_for(lora, None)  # its base: the one the checkpoint names
    transform.load(model, loaded)  # a LoRA run's base + adapters
    transform.merge(model)  # ... merged into the plain model
    tokenizer = load_tokenizer(path / "tokenizer")
    return model.to(device).eval(), tokenizer, cfg
