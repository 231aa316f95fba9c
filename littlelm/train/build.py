"""The one place that makes a run's model and optimizer from its config. The trainer (and so
bench, which runs the trainer) and the planner's fake-tensor trace all call these, so what is
planned is what is trained.

    model = build_model(cfg, device)          # parameters in train.master_weights' dtype
    with_lora(cfg, model)                     # lora: adapters on, once the base weights are in
    transform = build_transform(cfg, tok)     # the same, as the trainer's model transform
    optimizer = optimizer_for(cfg, model)     # once the model is loaded, grown and sharded
    model, optimizer = build(cfg, device)     # both at once (the planner's trace)
    objective = build_objective(cfg, setting) # what the run minimises (train/objective.py)
    data = build_data(cfg, log)               # the trainer's data, checked against the model

`traced=True` builds for the trace, under FakeTensorMode: the parameters are cast in place
(Module.to swaps tensors, which fake ones refuse), and the optimizer config may stand in a
variant that runs on fake CPU tensors (`OptimizerConfig.traceable`: 8-bit AdamW is traced as
torch's AdamW).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from littlelm.data import build as data_build
from littlelm.data.chat import CHAT_TOKENS
from littlelm.data.tokenizer import Tokenizer, TokenizerConfig
from littlelm.errors import ConfigError, DataError
from littlelm.model.lora import LoRAConfig, add_lora, base_dtype, check_lora
from littlelm.model.protocol import LanguageModel
from littlelm.train.objective import Objective, Setting, chosen_objective
from littlelm.train.step import LanguageModelLoss
from littlelm.train.transform import Transform, transform_for

if TYPE_CHECKING:  # the schema composes train/'s sections, so train/ names it for types only
    from littlelm.schema import RunConfig

# dtype of the parameters, their gradients and the optimizer state (train.master_weights)
PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(cfg: RunConfig, device: torch.device, traced: bool = False):
    """The model (with a LoRA run's adapters) and its optimizer, as a fresh (not resumed, not
    grown) run starts."""
    model = build_model(cfg, device, traced)
    with_lora(cfg, model)
    return model, optimizer_for(cfg, model, traced)


def build_model(cfg: RunConfig, device: torch.device, traced: bool = False) -> LanguageModel:
    """The model `cfg.model` builds, freshly initialised (from the current RNG state), on
    `device` in train.master_weights' dtype, with train.activation_checkpointing set."""
    model = cfg.model.build()
    dtype = PARAM_DTYPES[cfg.train.master_weights]
    if traced:
        _cast(model, dtype)
    else:
        model = model.to(device, dtype)
    model.activation_checkpointing = cfg.train.activation_checkpointing
    return model


def with_lora(cfg: RunConfig, model: LanguageModel) -> LanguageModel:
    """A LoRA run's model (`cfg.lora`; model/lora.py): `model`, its base weights in already
    (adapters start from them: B = 0), with its linears wrapped and all but the trained tensors
    frozen, in place. The trainer calls it after copying the base in (train/growth.py) or on
    resume (train/checkpoint/save_restore.py); the planner's trace right after the build."""
    if cfg.lora is None:
        return model
    assert isinstance(model, torch.nn.Module), "every model is one (model/protocol.py)"
    problems = check_lora(model, cfg.lora)
    if problems:
        raise ConfigError(problems)
    # the frozen base in the training precision as resolved, as the trainer's transform holds
    # it (train/transform.py; a config whose precision is still `auto` keeps it as built)
    ids = stand_in_ids(cfg.lora, cfg.data.tokenizer)
    add_lora(model, cfg.lora, base_dtype(cfg.lora, cfg.train.precision), ids)
    return model


def stand_in_ids(lora: LoRAConfig, tokenizer: TokenizerConfig) -> list[int]:
    """The trained token rows of lora.trainable_tokens without building the tokenizer (the
    planner's trace): the ids given, or as many rows as the chat tokens `tokenizer` will have,
    the first ids standing in for theirs (which rows a run trains changes no tensor's size);
    the trainer picks the real ones (train/transform.py's trained_token_ids)."""
    if isinstance(lora.trainable_tokens, list) and lora.rows_trained(0):
        return sorted(set(lora.trainable_tokens))
    return list(range(lora.rows_trained(planned_chat_tokens(tokenizer))))


def planned_chat_tokens(tokenizer: TokenizerConfig) -> int:
    """How many chat control tokens the tokenizer `tokenizer` will have, read without training
    it; a saved one not written yet (a later stage of a planned pipeline) is counted with
    all of them, as a littlelm tokenizer has by default (a plan then counts their rows)."""
    try:
        return tokenizer.tokenizer_class().chat_tokens_for(tokenizer)
    except DataError:
        return len(CHAT_TOKENS)


def optimizer_for(
    cfg: RunConfig, model: LanguageModel, traced: bool = False, origin: dict | None = None
):
    """The run's optimizer: what `cfg.optimizer` builds over `model`'s parameters (its groups
    and lrs: optim/groups.py) with growth's `origin` tags (None: a run never grown), rounding
    stochastically when train.stochastic_rounding is on."""
    oc = cfg.optimizer.traceable() if traced else cfg.optimizer
    return oc.build(model, cfg.train.stochastic_rounding, origin)


def build_transform(cfg: RunConfig, tokenizer: Tokenizer) -> Transform:
    """The run's model transform (train/transform.py): LoRA's adapters on its base (and the
    token rows it trains, ids of `tokenizer`), or none."""
    g = cfg.starts_from()
    # train.precision as resolved for the device (the trainer's cfg): the frozen base's dtype
    parent = g.parent if g is not None else None
    return transform_for(cfg.lora, parent, cfg.train.precision, tokenizer)


def build_objective(cfg: RunConfig, setting: Setting) -> Objective:
    """The run's objective: the one its config's objective section (dpo:, rl:, ...) builds, or
    the language-model loss (pretraining, SFT) when none is set."""
    chosen = chosen_objective(cfg)
    return chosen.build(setting) if chosen is not None else LanguageModelLoss(setting)


def build_data(cfg: RunConfig, log, progress=None):
    """The run's tokenizer and prepared data (data/build.py), checked against the model's
    vocabulary; a validation split too small to evaluate on is said now (`log`), not as
    `val loss nan` at each evaluation."""
    data = data_build.build_data(cfg.data, log, progress)
    if data.tokenizer.vocab_size != cfg.model.vocab_size:
        raise ConfigError([vocab_mismatch(cfg, data.tokenizer)])
    seq_len = cfg.train.seq_len
    assert seq_len is not None, "a resolved config has train.seq_len (schema.resolve)"
    evaluates = cfg.eval.every or cfg.eval.at_end
    warning = data.val_warning(seq_len) if evaluates else None
    if warning:
        log(f"warning: {warning}")
    cropped = data.crop_warning(seq_len)
    if cropped:  # said at start, not only as the crop rate at the end
        log(f"warning: {cropped}")
    for note in data.chat_notes(seq_len):  # conversations too long for a row
        log(f"warning: {note}")
    for note in data.duplicate_notes():  # repeats in the input that a run will not repeat
        log(f"note: {note}")
    return data


def steps_from_epochs(cfg: RunConfig, data, log) -> RunConfig:
    """`cfg` with train.epochs turned into train.max_steps (and max_tokens) from the prepared
    data's size: epochs x every source's training tokens / batch_tokens, rounded up, so the
    last epoch is finished. Said on the start line; the returned config has epochs null (it
    is what config.yaml records: the steps this run takes). A chat source's rows are padded,
    so an epoch counted in its tokens ends a little before the loader's pass over it."""
    t = cfg.train
    if t.epochs is None:
        return cfg
    chosen = chosen_objective(cfg)
    if chosen is not None:  # DPO draws pairs, RL prompts: a step is not batch_tokens of data
        raise ConfigError(
            [
                f"train.epochs counts a language-model run's tokens; this run's objective "
                f"({type(chosen).__name__}) does not read its data in tokens per step: "
                "give train.max_steps instead"
            ]
        )
    assert t.batch_tokens, "a resolved config has train.batch_tokens (schema.resolve)"
    tokens = sum(src.train_tokens for src in data.sources.values())
    if not tokens:
        raise DataError("train.epochs: the sources hold no training tokens; add data")
    steps = max(1, math.ceil(t.epochs * tokens / t.batch_tokens))
    log(
        f"train.epochs {t.epochs:g}: {steps:,} steps ({tokens:,} training tokens x "
        f"{t.epochs:g} / {t.batch_tokens:,} tokens per step, rounded up)"
    )
    update = {"epochs": None, "max_steps": steps, "max_tokens": steps * t.batch_tokens}
    return cfg.model_copy(update={"train": t.model_copy(update=update)})


def vocab_mismatch(cfg: RunConfig, tok) -> str:
    """Why the model's vocabulary is not the tokenizer's, blaming what set it: the user's
    model.vocab_size, or (when the model's size is the one the tokenizer's config promised,
    which `resolve` fills in for a null model.vocab_size) the tokenizer, which made another."""
    tc = cfg.data.tokenizer
    promised = tc.tokenizer_class().vocab_size_for(tc)
    if cfg.model.vocab_size != promised:
        return (
            f"model.vocab_size {cfg.model.vocab_size} differs from the tokenizer's "
            f"{tok.vocab_size}; leave model.vocab_size null"
        )
    if tc.tokenizer_class().trainable:
        return (
            f"the {tok.kind} tokenizer learned {tok.vocab_size} tokens from its training text, "
            f"not the {promised} data.tokenizer.vocab_size asks for: the text has too few "
            f"distinct pieces to merge into more. Set data.tokenizer.vocab_size to "
            f"{tok.vocab_size} (or less), or give it more text (data.tokenizer.train_chars, "
            "more sources)"
        )
    return (
        f"the tokenizer ({tok.describe()}) has {tok.vocab_size} tokens, not the {promised} its "
        "files said when the run was configured: were they replaced meanwhile? Prepare the "
        "data again, or set model.vocab_size to the tokenizer's size"
    )


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """`model.to(dtype)` for fake tensors: floating parameters and buffers become `dtype`."""
    if dtype == torch.float32:
        return
    for module in model.modules():
        for _name, p in module.named_parameters(recurse=False):
            p.data = p.data.to(dtype)
        for name, b in module.named_buffers(recurse=False):
            if b.is_floating_point():
                module._buffers[name] = b.to(dtype)
