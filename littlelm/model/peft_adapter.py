"""A PEFT LoRA adapter directory as the starting point of a LoRA run (`lora.init_from`; peft's
`PeftModel.from_pretrained(base, DIR, is_trainable=True)`): adapter_config.json and
adapter_model.safetensors as peft writes them, for an export of the run's base in either of
littlelm's export forms (a stock architecture's names, e.g. Llama's
`model.layers.3.self_attn.q_proj`, or the littlelm architecture's `model.blocks.3.attn.c_q`).

    problems = load_peft_adapter(model, cfg, DIR)   # into a model add_lora wrapped; [] = loaded

Each adapter's A and B go to the block linear its module names (model/lora.py's
TRANSFORMERS_NAMES, or littlelm's own qualified names); peft's trainable tokens
(`trainable_token_indices`, the rows themselves) become the change of the run's token rows,
which must be the same tokens. The adapter's r, lora_alpha, use_rslora and its set of adapted
linears must be the run's `lora:` section's: a mismatch is a problem naming the key to set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from littlelm.model.lora import OWN_NAMES, TRANSFORMERS_NAMES, LoRAConfig, LoRALinear
from littlelm.model.token_rows import TokenRows

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# base_model.model.<module path>.lora_A.weight, the path ending in a layer index and a linear
_ADAPTER = re.compile(r"\.(?:layers|blocks)\.(\d+)\.(.+)\.(lora_[AB])\.weight$")
_TOKENS = re.compile(r"\.([A-Za-z_]+)\.token_adapter\.trainable_tokens_delta$")
_EMBEDDING_NAMES = ("embed_tokens", "wte")  # the token embedding in the two export forms


def read_adapter(directory: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(adapter_config.json, the tensors) of a PEFT adapter directory; a missing or unreadable
    file raises ValueError naming it."""
    config_path, weights = directory / CONFIG, directory / WEIGHTS
    for path in (config_path, weights):
        if not path.is_file():
            raise ValueError(
                f"lora.init_from: {path} is missing; give a directory peft's save_pretrained "
                f"wrote ({CONFIG} and {WEIGHTS}), e.g. `littlelm export RUN --out DIR`'s DIR/adapter"
            )
    try:
        config = json.loads(config_path.read_text())
        tensors = load_file(str(weights))
    except (OSError, ValueError) as e:
        raise ValueError(f"lora.init_from: {directory} cannot be read ({e})") from None
    return config, tensors


def _linear(path: str) -> str | None:
    """littlelm's qualified name ("attn.c_q") of an adapted linear, from the part of its path
    after the layer index (transformers' "self_attn.q_proj", littlelm's "attn.c_q")."""
    last = path.rsplit(".", 1)[-1]
    if last in TRANSFORMERS_NAMES:
        return TRANSFORMERS_NAMES[last]
    return path if path in OWN_NAMES else None


def config_problems(config: dict, cfg: LoRAConfig, directory: Path) -> list[str]:
    """Where the adapter's config differs from the run's lora section (each names its fix)."""
    problems = []
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(
            f"lora.init_from: {directory} holds a {config['peft_type']} adapter, not LoRA"
        )
    pairs = (("r", "rank", cfg.rank), ("lora_alpha", "alpha", cfg.alpha))
    for theirs, ours, value in (*pairs, ("use_rslora", "use_rslora", cfg.use_rslora)):
        have = config.get(theirs, False if theirs == "use_rslora" else None)
        if have is not None and have != value:
            problems.append(
                f"lora.init_from: the adapter's {theirs} is {have}, this run's lora.{ours} "
                f"{value}; set lora.{ours}: {have}"
            )
    return problems


@torch.no_grad()
def load_peft_adapter(model: nn.Module, cfg: LoRAConfig, directory: str | Path) -> list[str]:
    """Put the PEFT adapter in `directory` into `model` (wrapped by add_lora for `cfg`);
    returns the problems (nothing is changed then), [] when loaded."""
    directory = Path(directory)
    try:
        config, tensors = read_adapter(directory)
    except ValueError as e:
        return [str(e)]
    problems = config_problems(config, cfg, directory)
    layers = {
        f"blocks.{i}.{name}": m
        for i, block in enumerate(getattr(model, "blocks", []))
        for name, m in block.named_modules()
        if isinstance(m, LoRALinear)
    }
    found: dict[str, dict[str, torch.Tensor]] = {}
    rows: dict[str, torch.Tensor] = {}
    unknown = []
    stock = False
    for key, t in tensors.items():
        match = _ADAPTER.search(key)
        tokens = _TOKENS.search(key)
        if match and _linear(match.group(2)) is not None:
            name = f"blocks.{match.group(1)}.{_linear(match.group(2))}"
            found.setdefault(name, {})[match.group(3)] = t
        elif tokens:
            rows["wte" if tokens.group(1) in _EMBEDDING_NAMES else tokens.group(1)] = t
            stock = stock or tokens.group(1) == "embed_tokens"  # a stock architecture's export
        else:
            unknown.append(key)
    if unknown:
        problems.append(
            f"lora.init_from: {directory} holds tensors that are not a block linear's adapter "
            f"or trainable tokens ({unknown[:3]}); littlelm continues LoRA adapters only"
        )
    if set(found) != set(layers):
        theirs = sorted({n.split(".", 2)[2] for n in found})
        problems.append(
            f"lora.init_from: the adapter adapts {theirs}, this run's lora.targets "
            f"{sorted({n.split('.', 2)[2] for n in layers})}; set lora.targets: {theirs}"
        )
    problems += _row_problems(model, config, rows, stock)
    for name, pair in found.items():
        m = layers.get(name)
        if m is None:
            continue
        for which in ("lora_A", "lora_B"):
            own = getattr(m, which)
            given = pair.get(which)
            if given is None or tuple(given.shape) != tuple(own.shape):
                got = None if given is None else tuple(given.shape)
                problems.append(f"lora.init_from: {name}.{which} is {got}, here {tuple(own.shape)}")
    if problems:
        return problems
    for name, pair in found.items():
        layers[name].lora_A.copy_(pair["lora_A"])
        layers[name].lora_B.copy_(pair["lora_B"])
    for attr, t in rows.items():
        m = getattr(model, attr)
        assert isinstance(m, TokenRows)
        # peft keeps the rows themselves; littlelm trains their change from the base's
        m.delta.copy_(t.to(m.frozen.dtype) - m.frozen[m.ids])
    return []


def _row_problems(
    model: nn.Module, config: dict, rows: dict[str, torch.Tensor], stock: bool
) -> list[str]:
    """The adapter's trainable tokens against the run's token rows: the same ids, each of the
    run's matrices present, and (from a stock architecture's export, `stock`) computable."""
    indices = config.get("trainable_token_indices")
    ids = [int(i) for i in model.wte.ids] if isinstance(model.wte, TokenRows) else []
    if not rows and not ids:
        return []
    if isinstance(indices, dict):
        indices = next(iter(indices.values()), [])
    if sorted(indices or []) != ids:
        want = sorted(indices or [])
        fix = f"lora.trainable_tokens: {want}" if want else "lora.trainable_tokens: none"
        return [
            f"lora.init_from: the adapter trains the rows of tokens {want}, this run {ids}; set {fix}"
        ]
    tied = model.lm_head is model.wte
    need = {"wte"} | (set() if tied else {"lm_head"})
    wte = rows.get("wte")
    cfg = getattr(model, "cfg", None)
    # a stock export's table is normalised once (interop/hf.py; littlelm's own architecture
    # normalises at each lookup, as littlelm does)
    if wte is not None and stock and getattr(cfg, "embed_norm", False):
        rms = wte.float().pow(2).mean(1).sqrt()
        if (rms - 1).abs().max() > 1e-3:  # the export's normalised rows come back unchanged
            return [
                "lora.init_from: this model normalises each embedding row (model.embed_norm) and "
                "the adapter's rows are not normalised (trained on the export, whose table is "
                "normalised once and used as it is): littlelm cannot compute them. Continue "
                "from a littlelm LoRA run instead (sft.base: RUN), or from an adapter without "
                "trainable tokens with lora.trainable_tokens: none"
            ]
    if set(rows) != need:
        return [
            f"lora.init_from: the adapter holds trainable tokens of {sorted(rows)}, this run "
            f"trains {sorted(need)} (its lm_head is {'tied' if tied else 'untied'}); an adapter "
            "from another model shape does not fit"
        ]
    return []
