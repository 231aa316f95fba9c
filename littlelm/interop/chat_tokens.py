"""`littlelm chat-tokens RUN --out DIR`: give a model trained before the chat tokens existed
littlelm's chat format (docs/post-training.md), as a new run directory to fine-tune from.

Its tokenizer gets the four chat tokens as special tokens after its last id (ids V..V+3); the
model gets them in its spare padded vocabulary rows, or, when the padding has no four spare
rows, in rows added to it (one more `vocab_pad_multiple`). Every other weight is copied. The
new rows start sensibly: each new embedding (and value-embedding) row is the mean of the
trained rows, so the token reads as an average token, and each new lm_head row the mean of the
trained rows, so its logit starts at the average logit instead of a random one. What was done
is said (and recorded in the checkpoint's state.json: `chat_tokens_from`). The model computes
the same logits for every old token (checked); only fine-tuning teaches it the new ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from littlelm.config import to_tree, validate
from littlelm.data.chat import CHAT_TOKENS
from littlelm.errors import ConfigError, LittleLMError
from littlelm.interop.hf import NO_OPTIMIZER, staged
from littlelm.load import find_checkpoint, load_model
from littlelm.model.gpt import GPT
from littlelm.schema import RunConfig
from littlelm.train.checkpoint import files as ckpt

VOCAB_ROWS = ("wte.weight", "lm_head.weight")  # and value_embeds.*.weight


def add_chat_tokens(source: str | Path, out: str | Path) -> dict:
    path = find_checkpoint(source)
    model, tok, cfg = load_model(path)
    assert isinstance(model, GPT), "the embedding rows grown here are GPT's, the one model"
    origin = ckpt.load_checkpoint(path, with_optimizer=False).origin or {}  # growth's tags, kept
    if tok.special_id(CHAT_TOKENS[-1]) is not None:
        raise LittleLMError(
            f"{path}: its tokenizer has the chat tokens already; fine-tune it as is"
        )
    try:
        new_tok = tok.with_special_tokens(CHAT_TOKENS)
    except NotImplementedError:
        raise ConfigError(
            [
                f"{path}: a {tok.kind} tokenizer cannot take new special tokens here; train the "
                "base with data.tokenizer name bpe (it reserves the chat tokens)"
            ]
        ) from None
    old_m, V = model.cfg, tok.vocab_size
    m = old_m.model_copy(update={"vocab_size": new_tok.vocab_size})
    spare = m.padded_vocab == old_m.padded_vocab
    new = GPT(m)
    with torch.no_grad():
        old = model.state_dict()
        for name, t in new.state_dict().items():
            src = old[name]
            if name in VOCAB_ROWS or name.startswith("value_embeds."):
                t[: src.size(0)] = src  # every old row, the padding included
                t[V : new_tok.vocab_size] = src[:V].float().mean(0).to(t.dtype)
            else:
                t.copy_(src)
    _check_same_logits(model, new, V)
    tree = to_tree(cfg)
    tree["model"]["vocab_size"] = new_tok.vocab_size
    ck = Path(out) / "checkpoints" / "step_000000"
    tree["data"] = {"tokenizer": {"name": "saved", "path": str(ck / "tokenizer")}}
    tree["grow"] = None
    tree["run"] = {**tree["run"], "name": Path(out).name, "out_dir": str(Path(out).parent)}
    new_cfg = validate(RunConfig, tree, source="littlelm chat-tokens")
    ids = f"{V}-{new_tok.vocab_size - 1}"
    where = (
        f"spare padded rows {ids} of {old_m.padded_vocab}"
        if spare
        else f"rows {ids}, the padding grown from {old_m.padded_vocab} to {m.padded_vocab} rows"
    )
    with staged(Path(out)) as tmp:
        state = {"tokens": 0, "tokenizer": new_tok.fingerprint, "config": to_tree(new_cfg)}
        state["chat_tokens_from"] = str(path.resolve())
        saved = ckpt.save_checkpoint(
            tmp / "checkpoints", 0, new, NO_OPTIMIZER, state, origin, new_tok
        )
    return {
        "out": Path(out),
        "checkpoint": Path(out) / "checkpoints" / saved.name,
        "summary": (
            f"added {', '.join(CHAT_TOKENS)} to {path} as ids {ids}, in the model's {where}; "
            "their embedding and lm_head rows start at the mean of the trained rows"
        ),
    }


def _check_same_logits(old: GPT, new: GPT, V: int) -> None:
    """The old tokens' logits are unchanged (the new rows only add logits)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (1, min(32, old.cfg.max_seq_len)), generator=gen)
    with torch.no_grad():
        a, b = old(x), new(x)[..., :V]
    if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):  # a wider matmul may round differently
        raise LittleLMError(
            f"adding the chat tokens changed the old tokens' logits (max |Δ| "
            f"{(a - b).abs().max():.3g}); this is a littlelm bug, please report it"
        )
