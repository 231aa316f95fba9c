"""A LoRA run's adapters in PEFT's format: `littlelm export LORA_RUN --out DIR` writes the merged
model in DIR (as any export), the run's base exported in DIR/base/, and the adapters alone in
DIR/adapter/, whose base_model_name_or_path names DIR/base (absolute), so that
`peft.AutoPeftModelForCausalLM.from_pretrained("DIR/adapter")` loads base and adapter
(trust_remote_code=True for the littlelm architecture):

    adapter_config.json        peft_type LORA: r, lora_alpha, lora_dropout, target_modules
    adapter_model.safetensors  base_model.model.<module>.lora_A.weight (r × in) / lora_B.weight

and, for a run that trained token rows (lora.trainable_tokens), `trainable_token_indices`
{module: ids} with base_model.model.<module>.token_adapter.trainable_tokens_delta (ids × width):
PEFT's trainable tokens hold the rows themselves (it writes them over the base's), so they are
the merged export's rows, in the export's own form (cut, normalised), for the token embedding
and, unless the export ties it to the embedding, lm_head.

or `peft.PeftModel.from_pretrained(base, "DIR/adapter")`, where `base` is DIR/base or any
export of the run's base checkpoint (the same architecture, so the module names are those
interop/arch.py maps littlelm's to). PEFT scales B A by lora_alpha / r (lora_alpha / sqrt(r)
with use_rslora), as littlelm does.

Tensors LoRA trains in full (lora.train_embeddings, train_norms) have no place there that
loads onto the base's export unchanged (their exported form is transformed: a normalised,
vocabulary-cut embedding), so such a run's export writes the merged model alone and says why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from littlelm.interop import arch as A
from littlelm.model.gpt import GPTConfig
from littlelm.model.lora import LoRAConfig
from littlelm.train.checkpoint import files as ckpt

ADAPTER_DIR = "adapter"
BASE_DIR = "base"  # the run's base, exported: what the adapter's base_model_name_or_path names


def adapter_problem(lora: LoRAConfig) -> str | None:
    """Why a LoRA run's adapters cannot be exported for PEFT (None: they can)."""
    if lora.train_embeddings or lora.train_norms:
        trained = [k for k in ("train_embeddings", "train_norms") if getattr(lora, k)]
        return (
            f"no PEFT adapter: lora.{' and lora.'.join(trained)} trained tensors in full, which a "
            "PEFT adapter on the base's export cannot hold as exported; the merged model in the "
            "directory has them"
        )
    return None


def peft_tensors(checkpoint: Path, m: GPTConfig, arch: str) -> tuple[dict, list[str]]:
    """(PEFT's adapter tensors, the transformers module names they adapt) of a LoRA checkpoint
    whose export has architecture `arch`."""
    table = A.names(arch, m)  # {} for littlelm's own names (remote code)
    loaded = ckpt.load_checkpoint(checkpoint, with_optimizer=False)
    out: dict[str, torch.Tensor] = {}
    modules = []
    for name in loaded.model:
        if name.endswith(".delta"):  # trained token rows: token_rows, from the merged export
            continue
        module, _, which = name.rpartition(".")  # blocks.0.attn.c_q, lora_A
        own = f"{A.REMOTE_PREFIX}{module}.weight"  # modeling_littlelm.py's name (remote code)
        theirs = table.get(f"{module}.weight", own).removesuffix(".weight")
        out[f"base_model.model.{theirs}.{which}.weight"] = loaded.model[name].contiguous()
        modules.append(theirs)
    loaded.model.release()
    return out, sorted(set(modules))


def target_pattern(modules: list[str]) -> str:
    """A regular expression PEFT full-matches against module names: exactly `modules` (as
    templates over the layer index). Suffix names would not do: littlelm's own names have a
    c_proj in both attention and the MLP, and one may be a target without the other."""
    templates = sorted({re.sub(r"\.\d+\.", ".{i}.", m) for m in modules})
    return "|".join(re.escape(t).replace(r"\{i\}", r"\d+") for t in templates)


def token_rows(
    hf_tensors: dict[str, torch.Tensor], ids: list[int], m: GPTConfig, arch: str, tied: bool
) -> dict[str, torch.Tensor]:
    """{exported module: its rows `ids`} of the merged export's tensors `hf_tensors`: the token
    embedding's and (when the export does not tie them) lm_head's; {} when no rows were
    trained."""
    if not ids:
        return {}
    wte = A.names(arch, m).get("wte.weight", f"{A.REMOTE_PREFIX}wte.weight")
    kept = [wte] if tied else [wte, "lm_head.weight"]
    return {n.removesuffix(".weight"): hf_tensors[n][ids].contiguous() for n in kept}


def write_adapter(
    checkpoint: Path,
    out: Path,
    m: GPTConfig,
    arch: str,
    lora: LoRAConfig,
    base: Path,
    rows: dict[str, torch.Tensor] | None = None,
    ids: list[int] | None = None,
) -> Path:
    """DIR/adapter/ (adapter_config.json, adapter_model.safetensors) inside the export `out`
    (being written), on the exported base `base` (an absolute path: PEFT resolves it from the
    working directory), with the trained token rows `rows` (token_rows) of tokens `ids`.
    Returns the folder."""
    tensors, modules = peft_tensors(checkpoint, m, arch)
    for module, t in (rows or {}).items():
        tensors[f"base_model.model.{module}.token_adapter.trainable_tokens_delta"] = t
    folder = out / ADAPTER_DIR
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    ckpt.umask_mode(folder / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target_pattern(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": lora.use_rslora,
        "modules_to_save": None,
        # by the module's own name (PEFT matches the last part of the path)
        "trainable_token_indices": (
            {module.rpartition(".")[2]: ids for module in rows} if rows and ids else None
        ),
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder
