"""Growing a trained GPT into a larger one that computes the same function at step 0.

A grown model is a freshly initialised model of the new shape into which the parent's tensors
are copied. What is copied where, and why the function is unchanged:

- Depth. Each parent block goes to one child layer, in order (`layer_map`); the other layers are
  new blocks, which are fresh blocks: their output projections (attention and MLP `c_proj`) are
  zero, so a new block adds nothing to the residual stream, and its residual scalars start at
  λ_resid = 1, λ_x0 = 0, so it leaves the stream as it found it. Per-layer things move with their
  block: its entries of `resid_lambdas` / `x0_lambdas`, and its value-embedding table and gate.
  Value embeddings sit on a list of layers (`GPTConfig.value_embed_layers`): a parent block keeps
  its table (or its lack of one) wherever it lands; new blocks get tables on the child's usual
  alternating pattern (fresh tables, harmless behind a zero c_proj). `grown_value_embed_layers`
  computes that list; schema resolution writes it into the grown run's model section.
- MLP width. New hidden units get fresh input rows and zero output columns: they compute
  something, and it is multiplied by zero.
- Heads. head_dim must not change (RoPE frequencies and QK-norm depend on it). New query heads
  and new key/value heads get fresh input rows and zero `c_proj` columns. With grouped-query
  attention, query head h reads kv head h // group; parent kv head k stays k, and parent query
  head k·g + j moves to k·g' + j, so every old query head still reads its old kv head. This
  needs n_kv' >= n_kv and g' >= g.
- Model width (d_model C -> C'). The stream gets C' - C channels that are zero at step 0: the
  embedding's new columns and every old output projection's new rows are zero. RMSNorm then
  divides by an RMS over C' channels, so a zero-padded stream normalises to s = sqrt(C'/C)
  times the old normalised vector. The parent's weights are rescaled to absorb s exactly: the
  token embedding ×s (the stream then is s × the parent's stream, and every later RMSNorm sees
  an RMS of exactly the old value), every matrix that reads a normalised input (q, k, v, gates,
  MLP in, lm_head) ×1/s on its old columns, every output projection ×s. Tied embeddings cannot
  take both ×s and ×1/s: the shared matrix gets ×1/s, which leaves the embedding's RMSNorm off
  by its epsilon term only (relative error ~1e-7).
- Everything else must stay the same (vocabulary, MLP type, feature switches, rope base,
  ve_gate_channels); `check_growable` lists what differs. Shrinking is refused.

So every growth `check_growable` accepts is exact in exact arithmetic; in fp32 the grown model's
logits match the parent's to rounding (tests/test_grow.py checks each kind).

Origin tags (for per-tag learning rates, optim/groups.py): a tensor copied whole is `old`; a
tensor with no parent counterpart is `new`; a tensor partly copied (a widened matrix, the
per-layer scalar vectors after depth growth) takes `grow.widened` (train/growth.py; default `old`, which
protects the parent's function); token-indexed tables and lm_head that hold copied weights are
`embedding`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from littlelm.config import validate
from littlelm.errors import CheckpointError
from littlelm.model.blocks import MLPS
from littlelm.model.gpt import GPT, GPTConfig

PLACEMENTS = ("interleave", "end", "start")

# GPTConfig fields that growth cannot change without changing the function
SAME = (
    "vocab_size",
    "mlp",
    "qk_norm",
    "softcap",
    "residual_scalars",
    "value_embeds",
    "ve_gate_channels",
    "tie_embeddings",
    "norm_affine",
    "rope_base",
    "embed_norm",
    "norm_eps",
    "qk_norm_affine",
)


def parent_model_config(state: dict, path: Path) -> GPTConfig:
    tree = state.get("config", {}).get("model", {})
    if tree.get("name") != "gpt":
        raise CheckpointError(f"grow.parent: {path} is not a gpt checkpoint; only gpt can grow")
    return validate(GPTConfig, tree, source=str(path / "state.json"))


# ----------------------------------------------------------------------------------------------
# Where the parent's blocks go


def layer_map(placement: str | list, parent_layers: int, child_layers: int) -> list[int | None]:
    """For each child layer, the parent block it starts from (None = a new block).

    interleave: new blocks spread evenly, each after a run of parent blocks (4 -> 6 gives
    [0, 1, new, 2, 3, new]); end: all after; start: all before; a list is checked and returned.
    Raises ValueError (with the fix) when the placement cannot work.
    """
    k = child_layers - parent_layers
    if k < 0:
        raise ValueError(
            f"model.n_layer {child_layers} is smaller than the parent's {parent_layers}; "
            "growth cannot remove blocks"
        )
    if isinstance(placement, list):
        return _check_layer_list(placement, parent_layers, child_layers)
    if placement == "end":
        return [*range(parent_layers), *[None] * k]
    if placement == "start":
        return [*[None] * k, *range(parent_layers)]
    out: list[int | None] = []
    for i in range(parent_layers):
        out.append(i)
        out += [None] * ((i + 1) * k // parent_layers - i * k // parent_layers)
    return out


def _check_layer_list(layers: list, parent_layers: int, child_layers: int) -> list[int | None]:
    old = [p for p in layers if p is not None]
    if len(layers) != child_layers or old != list(range(parent_layers)):
        raise ValueError(
            f"grow.placement {layers} must have one entry per layer ({child_layers}) and list "
            f"each parent block 0..{parent_layers - 1} once, in order, with null for new blocks"
        )
    return list(layers)


def grown_value_embed_layers(
    parent: GPTConfig, child: GPTConfig, layers: list[int | None]
) -> list[int]:
    """Parent blocks keep their value embeddings; new blocks follow the alternating pattern."""
    last = (child.n_layer - 1) % 2
    return [
        c
        for c, p in enumerate(layers)
        if (p is not None and parent.has_value_embed(p)) or (p is None and c % 2 == last)
    ]


def check_growable(parent: GPTConfig, child: GPTConfig, layers: list[int | None]) -> list[str]:
    """Every reason `child` cannot be grown from `parent` with the function preserved."""
    problems = [
        f"model.{k}: {getattr(child, k)!r} differs from the parent's {getattr(parent, k)!r}; "
        "growth keeps it (set it back)"
        for k in SAME
        if getattr(child, k) != getattr(parent, k)
    ]
    if child.head_dim != parent.head_dim:
        problems.append(
            f"model: head_dim {child.head_dim} differs from the parent's {parent.head_dim}; "
            f"set model.head_size: {parent.head_dim} (RoPE and QK-norm depend on it)"
        )
    sizes = {
        "n_layer": (parent.n_layer, child.n_layer),
        "d_model": (parent.d_model, child.d_model),
        "n_head": (parent.n_head, child.n_head),
        "n_kv_head": (parent.kv_heads, child.kv_heads),
        "mlp_hidden": (parent.hidden, child.hidden),
        "n_head / n_kv_head": (_group(parent), _group(child)),
    }
    problems += [
        f"model.{k}: {c} is smaller than the parent's {p}; growth cannot shrink"
        for k, (p, c) in sizes.items()
        if c < p
    ]
    lost = [
        c
        for c, p in enumerate(layers)
        if p is not None and parent.has_value_embed(p) and not child.has_value_embed(c)
    ]
    if lost:
        problems.append(
            f"model.value_embed_layers must include {lost} (parent blocks with value embeddings "
            "land there); leave it null and it is derived"
        )
    return problems


def _group(cfg: GPTConfig) -> int:
    return cfg.n_head // cfg.kv_heads


# ----------------------------------------------------------------------------------------------
# Copying the weights


@dataclass(frozen=True)
class Copy:
    """Put `src * scale` at the index vectors `idx` (one per dim) of a child tensor; with
    `zero_rest` the rest of the tensor is zeroed first (else it keeps its fresh init).
    `src=None` only zeroes the tensor."""

    src: torch.Tensor | None
    idx: tuple[torch.Tensor, ...] = ()
    scale: float = 1.0
    zero_rest: bool = False


class Growth:
    """The parent -> child correspondence, tensor by tensor."""

    def __init__(self, parent: GPTConfig, child: GPTConfig, layers: list[int | None]):
        self.parent, self.child, self.layers = parent, child, layers
        self.s = math.sqrt(child.d_model / parent.d_model)
        P, g, g2, hd = parent, _group(parent), _group(child), parent.head_dim
        q_heads = [(h // g) * g2 + h % g for h in range(P.n_head)]  # parent q head -> child
        self.q_rows = torch.cat([torch.arange(c * hd, (c + 1) * hd) for c in q_heads])
        self.kv_rows = torch.arange(P.kv_heads * hd)
        assert P.vocab_size is not None, "a checkpoint's config has its tokenizer's vocab_size"
        self.C, self.V = torch.arange(P.d_model), torch.arange(P.vocab_size)
        self.hidden = torch.arange(P.hidden)
        self.block_pos = torch.tensor([c for c, p in enumerate(layers) if p is not None])

    def copy_for(self, name: str, tensors: Mapping[str, torch.Tensor]) -> Copy | None:
        """How child parameter `name` takes the parent's weights; None = it stays fresh."""
        if name.startswith("blocks."):
            _, c, rest = name.split(".", 2)
            p = self.layers[int(c)]
            if p is None:
                return None
            src = tensors.get(f"blocks.{p}.{rest}")
            if src is None:  # a value-embedding gate the parent block did not have
                return None
            return block_rule(rest.removesuffix(".weight"))(self, src)
        if name.startswith("value_embeds."):
            p = self.layers[int(name.split(".")[1])]
            if p is None:
                return None
            src = tensors.get(f"value_embeds.{p}.weight")
            if src is None:  # an old block that had no table gets one that adds zero
                return Copy(None, zero_rest=True)
            return Copy(src[: len(self.V)], (self.V, self.kv_rows))
        if name in ("resid_lambdas", "x0_lambdas"):
            return Copy(tensors[name], (self.block_pos,))
        if name == "norm_f.weight":
            return Copy(tensors[name], (self.C,))
        if name == "wte.weight":  # tied: it is also lm_head, which needs 1/s
            scale = 1 / self.s if self.child.tie_embeddings else self.s
            return Copy(tensors[name][: len(self.V)], (self.V, self.C), scale, zero_rest=True)
        if name == "lm_head.weight":
            return Copy(tensors[name][: len(self.V)], (self.V, self.C), 1 / self.s)
        raise AssertionError(f"no growth rule for parameter {name}")


def _reads(rows: Callable[[Growth], torch.Tensor]) -> Callable[[Growth, torch.Tensor], Copy]:
    """A matrix that reads the normalised stream: old columns ×1/s, new rows and columns fresh."""
    return lambda g, src: Copy(src, (rows(g), g.C[: src.size(1)]), 1 / g.s)


def _writes(cols: Callable[[Growth], torch.Tensor]) -> Callable[[Growth, torch.Tensor], Copy]:
    """An output projection: old part ×s, new rows (stream channels) and columns zero."""
    return lambda g, src: Copy(src, (g.C, cols(g)), g.s, zero_rest=True)


BLOCK_RULES: dict[str, Callable[[Growth, torch.Tensor], Copy]] = {
    "attn.c_q": _reads(lambda g: g.q_rows),
    "attn.c_k": _reads(lambda g: g.kv_rows),
    "attn.c_v": _reads(lambda g: g.kv_rows),
    "attn.ve_gate": _reads(lambda g: torch.arange(g.parent.kv_heads)),
    "attn.c_proj": _writes(lambda g: g.q_rows),
    "mlp.c_proj": _writes(lambda g: g.hidden),  # the MLP's inputs: block_rule
    "attn.q_norm": lambda g, src: Copy(src, (torch.arange(src.numel()),)),  # head_dim fixed
    "attn.k_norm": lambda g, src: Copy(src, (torch.arange(src.numel()),)),
    "norm1": lambda g, src: Copy(src, (g.C,)),
    "norm2": lambda g, src: Copy(src, (g.C,)),
}


def block_rule(name: str) -> Callable[[Growth, torch.Tensor], Copy]:
    """The rule for block tensor `name` (`attn.c_q`, ...): BLOCK_RULES', or for the input
    linears of any MLP variant (model/blocks.py) new hidden rows, as a reader of the stream."""
    if name.startswith("mlp.") and any(name[4:] in s.inputs for s in MLPS.values()):
        return _reads(lambda g: g.hidden)
    return BLOCK_RULES[name]


@torch.no_grad()
def apply_copy(t: torch.Tensor, copy: Copy) -> None:
    if copy.zero_rest:
        t.zero_()
    if copy.src is None:
        return
    src = (copy.src.float() * copy.scale).to(t.device, t.dtype)
    if t.dim() == 1:
        t[copy.idx[0]] = src
    else:
        t[copy.idx[0][:, None], copy.idx[1][None, :]] = src


@torch.no_grad()
def grow_into(
    child: GPT,
    tensors: Mapping[str, torch.Tensor],
    parent: GPTConfig,
    layers: list[int | None],
    widened: str = "old",
) -> dict[str, str]:
    """Copy the parent's `tensors` into the freshly initialised `child`; return the child's
    origin tags (parameter name -> tag), for the optimizer's groups. The caller has checked
    `check_growable`."""
    growth = Growth(parent, child.cfg, layers)
    origin = {}
    for name, p in child.named_parameters():
        copy = growth.copy_for(name, tensors)
        if copy is not None:
            apply_copy(p, copy)
        origin[name] = _origin(child.role(name), p, copy, widened)
    return origin


def _origin(role: str, p: torch.Tensor, copy: Copy | None, widened: str) -> str:
    if copy is None or copy.src is None:
        return "new"
    if role in ("embedding", "value_embedding", "lm_head"):
        return "embedding"
    return "old" if copy.src.numel() == p.numel() else widened


@torch.no_grad()
def logit_gap(parent: GPT, child: GPT, tokens: torch.Tensor) -> tuple[float, float]:
    """(max |child logits - parent logits|, max |parent logits|) on `tokens` (B, T), in fp32
    without autocast and with full-precision matmuls."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    device = child.wte.weight.device
    try:
        with torch.autocast(device.type, enabled=False):
            a = parent(tokens.to(parent.wte.weight.device)).float().cpu()
            b = child(tokens.to(device)).float().cpu()
    finally:
        torch.set_float32_matmul_precision(saved)
    return (b - a).abs().max().item(), a.abs().max().item()
