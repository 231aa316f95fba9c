"""Which Hugging Face architecture a littlelm model is, and back: one name table per
architecture, and the config.json <-> GPTConfig translations.

littlelm -> transformers (export):
    llama     SwiGLU, no QK-norm, no softcap, no residual scalars, no value embeddings
              -> LlamaForCausalLM (stock; llama.cpp: `export --gguf`, gguf_export.py)
    qwen3     the same with QK-norm -> Qwen3ForCausalLM (q_norm / k_norm gains)
    qwen2     the llama features with q/k/v biases (qkv_bias) -> Qwen2ForCausalLM
    littlelm  anything else (relu², value embeddings, residual scalars, softcap, biases with
              QK-norm) -> our modeling_littlelm.py, loaded with trust_remote_code=True;
              littlelm's own names
transformers -> littlelm (import): llama (SmolLM, SmolLM2 are llama), mistral, qwen2 (Qwen2,
Qwen2.5: q/k/v biases), qwen3, and littlelm's own exports. A sliding window is imported as the
context length (exact: no sequence is longer than the window); features littlelm lacks are
refused by name, with what the user can do.
"""

from __future__ import annotations

from dataclasses import dataclass

from littlelm.errors import CheckpointError
from littlelm.model import blocks
from littlelm.model.gpt import GPTConfig


# The MLP variants (model/blocks.py) a stock class computes: its gated MLP, act(gate_proj(x)) ·
# up_proj(x) -> down_proj, with transformers' `hidden_act`, and the variant's linears' names
# there. A variant without an entry is exported with littlelm's modeling file.
@dataclass(frozen=True)
class StockMLP:
    hidden_act: str
    names: dict[str, str]  # littlelm linear (blocks.MLPSpec.inputs, c_proj) -> transformers'


STOCK_MLP = {
    "swiglu": StockMLP("silu", {"c_gate": "gate_proj", "c_fc": "up_proj", "c_proj": "down_proj"}),
}

# littlelm parameter name -> transformers name; "{i}" is the layer index (the MLP's: STOCK_MLP)
LLAMA = {
    "wte.weight": "model.embed_tokens.weight",
    "norm_f.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
    "blocks.{i}.norm1.weight": "model.layers.{i}.input_layernorm.weight",
    "blocks.{i}.norm2.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blocks.{i}.attn.c_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blocks.{i}.attn.c_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blocks.{i}.attn.c_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blocks.{i}.attn.c_proj.weight": "model.layers.{i}.self_attn.o_proj.weight",
}
QWEN3 = {
    **LLAMA,
    "blocks.{i}.attn.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blocks.{i}.attn.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
}
QWEN2 = {
    **LLAMA,
    "blocks.{i}.attn.c_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blocks.{i}.attn.c_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blocks.{i}.attn.c_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
}
# None: littlelm's own names
TABLES = {"llama": LLAMA, "mistral": LLAMA, "qwen2": QWEN2, "qwen3": QWEN3, "littlelm": None}
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
REMOTE_PREFIX = "model."  # modeling_littlelm.py's backbone: every name but lm_head's is under it
IMPORTABLE = ("llama", "mistral", "qwen2", "qwen3", "littlelm")
STOCK_NORM = "RMSNorm"  # the norm that transformers' Llama and Qwen classes and llama.cpp compute
REMOTE_FEATURES = {  # GPTConfig switch -> why no stock class has it
    "residual_scalars": "per-layer residual scalars",
    "value_embeds": "value embeddings",
    "softcap": "a logit softcap",
}


def names(arch: str, m: GPTConfig) -> dict[str, str]:
    """littlelm name -> transformers name of every tensor of m in the stock architecture
    `arch` (empty for littlelm's own names): the table and m's MLP, for m.n_layer layers."""
    table = TABLES[arch]
    if table is None:
        return {}
    mlp = {
        f"blocks.{{i}}.mlp.{ours}.weight": f"model.layers.{{i}}.mlp.{theirs}.weight"
        for ours, theirs in STOCK_MLP[m.mlp].names.items()
    }
    out = {}
    for ours, theirs in {**table, **mlp}.items():
        layers = range(m.n_layer) if "{i}" in ours else [None]
        out.update({ours.format(i=i): theirs.format(i=i) for i in layers})
    return out


def export_arch(m: GPTConfig) -> tuple[str, str]:
    """(architecture, reason): a stock class when every feature of m has one."""
    remote = [why for key, why in REMOTE_FEATURES.items() if getattr(m, key)]
    if m.value_embeds and not any(m.has_value_embed(i) for i in range(m.n_layer)):
        remote.remove(REMOTE_FEATURES["value_embeds"])
    if m.mlp not in STOCK_MLP:
        remote.append(f"the {m.mlp} MLP")
    if blocks.NORM_TITLE != STOCK_NORM:  # read when called: a norm changed in blocks.py follows
        remote.append(f"the {blocks.NORM_TITLE} norm")
    if m.qkv_bias and m.qk_norm:
        remote.append("q/k/v biases together with QK-norm")
    if remote:
        return "littlelm", (
            f"uses {', '.join(remote)}, which no stock transformers class has: exported with "
            "littlelm's modeling file (load with trust_remote_code=True)"
        )
    if m.qk_norm:
        return "qwen3", f"SwiGLU + {STOCK_NORM} + RoPE with QK-norm: stock Qwen3ForCausalLM"
    if m.qkv_bias:
        return "qwen2", f"SwiGLU + {STOCK_NORM} + RoPE with q/k/v biases: stock Qwen2ForCausalLM"
    return "llama", f"SwiGLU + {STOCK_NORM} + RoPE: stock LlamaForCausalLM"


def norm_eps(m: GPTConfig) -> float:
    """The norms' epsilon littlelm uses in fp32 (model/blocks.py), for transformers and GGUF."""
    return blocks.fp32_eps(m.norm_eps)


def stock_config(m: GPTConfig, arch: str, bos_id: int) -> dict:
    """config.json of a stock Llama/Qwen3 model computing what m computes."""
    cfg = {
        "architectures": [CLASSES[arch]],
        "model_type": arch,
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "intermediate_size": m.hidden,
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "num_key_value_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "hidden_act": STOCK_MLP[m.mlp].hidden_act,
        "max_position_embeddings": m.max_seq_len,
        "rms_norm_eps": norm_eps(m),
        "rope_parameters": {"rope_type": "default", "rope_theta": m.rope_base},
        "rope_theta": m.rope_base,  # older readers (llama.cpp, vLLM) look here
        "attention_bias": False,
        # the embedding norm is folded into the table, which then differs from lm_head
        "tie_word_embeddings": m.tie_embeddings and not m.embed_norm,
        "bos_token_id": bos_id,
        "eos_token_id": bos_id,
        "torch_dtype": "float32",
    }
    if arch == "llama":
        cfg["mlp_bias"] = False
    if arch == "qwen2":
        cfg |= {"use_sliding_window": False, "sliding_window": None}
        del cfg["attention_bias"]  # Qwen2's q/k/v always have biases, its o_proj never
    return cfg


def remote_config(m: GPTConfig, bos_id: int) -> dict:
    """config.json of our own modeling file (same names, same switches as GPTConfig)."""
    return {
        "architectures": ["LittleLMForCausalLM"],
        "model_type": "littlelm",
        "auto_map": {
            "AutoConfig": "modeling_littlelm.LittleLMConfig",
            "AutoModelForCausalLM": "modeling_littlelm.LittleLMForCausalLM",
        },
        "vocab_size": m.vocab_size,
        "padded_vocab": m.padded_vocab,
        "vocab_pad_multiple": m.vocab_pad_multiple,
        "n_layer": m.n_layer,
        "d_model": m.d_model,
        "n_head": m.n_head,
        "n_kv_head": m.kv_heads,
        "head_dim": m.head_dim,
        "hidden": m.hidden,
        "mlp": m.mlp,
        "max_seq_len": m.max_seq_len,
        "rope_base": m.rope_base,
        "qk_norm": m.qk_norm,
        "qk_norm_affine": m.qk_norm_affine,
        "qkv_bias": m.qkv_bias,
        "softcap": m.softcap,
        "residual_scalars": m.residual_scalars,
        "value_embed_layers": [i for i in range(m.n_layer) if m.has_value_embed(i)],
        "ve_gate_channels": m.ve_gate_channels,
        "norm_affine": m.norm_affine,
        "embed_norm": m.embed_norm,
        "norm_eps": m.norm_eps,
        "tie_word_embeddings": m.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": bos_id,
        "torch_dtype": "float32",
    }


def _refuse(source: str, feature: str, fix: str) -> CheckpointError:
    return CheckpointError(
        f"{source}: {feature}, which littlelm's model does not have; it cannot be imported ({fix})"
    )


def check_importable(hf: dict, source: str) -> str:
    """The config's architecture, after refusing every feature littlelm lacks, by name."""
    arch = hf.get("model_type")
    if arch not in IMPORTABLE:
        raise CheckpointError(
            f"{source}: unsupported architecture {arch!r} ({', '.join(hf.get('architectures') or [])}); "
            f"littlelm imports {', '.join(IMPORTABLE)} checkpoints (SmolLM and SmolLM2 are llama, "
            "Qwen2.5 is qwen2)"
        )
    if arch == "littlelm":
        return arch
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise _refuse(
            source,
            f"RoPE scaling {rope_type!r}",
            "littlelm has plain RoPE only: pick a checkpoint without rope scaling (SmolLM2, "
            "Qwen2.5 up to 7B, TinyLlama), or remove the scaling from config.json to import it "
            "with plain RoPE, which changes its outputs: continued training then has to recover",
        )
    if stock_mlp(hf) is None:
        gated = ", ".join(f"{k} ({v.hidden_act})" for k, v in STOCK_MLP.items())
        raise _refuse(source, f"a {hf['hidden_act']} MLP", f"littlelm's gated MLPs: {gated}")
    if hf.get("mlp_bias") or (arch != "qwen2" and hf.get("attention_bias")):
        raise _refuse(
            source,
            "biases in the MLP or output projection",
            "littlelm has biases on the query, key and value projections only (model.qkv_bias, "
            "as Qwen2 and Qwen2.5 have them)",
        )
    return arch


def stock_mlp(hf: dict) -> str | None:
    """The MLP variant computing a stock config's gated MLP (its hidden_act), or None."""
    act = hf.get("hidden_act", "silu")
    return next((k for k, v in STOCK_MLP.items() if v.hidden_act == act), None)


def sliding_window(hf: dict, arch: str) -> int | None:
    """The attention window, when it is narrower than the context: None otherwise."""
    window = hf.get("sliding_window")
    windowed = window and (arch == "mistral" or hf.get("use_sliding_window"))
    return window if windowed and window < hf.get("max_position_embeddings", 2048) else None


def imported_config(hf: dict, arch: str) -> GPTConfig:
    """The GPTConfig computing what a Llama/Mistral/Qwen3 config.json describes."""
    if arch == "littlelm":
        return _from_remote(hf)
    rope = hf.get("rope_parameters") or {}
    heads = hf["num_attention_heads"]
    # a sliding window becomes the context: full attention over at most `window` tokens is
    # windowed attention exactly
    context = sliding_window(hf, arch) or hf.get("max_position_embeddings", 2048)
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        n_layer=hf["num_hidden_layers"],
        d_model=hf["hidden_size"],
        n_head=heads,
        n_kv_head=hf.get("num_key_value_heads") or heads,
        head_size=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_seq_len=context,
        rope_base=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        mlp=stock_mlp(hf),
        mlp_hidden=hf["intermediate_size"],
        qk_norm=arch == "qwen3",
        qk_norm_affine=arch == "qwen3",
        qkv_bias=arch == "qwen2",
        softcap=None,
        residual_scalars=False,
        value_embeds=False,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_affine=True,
        embed_norm=False,
        norm_eps=hf.get("rms_norm_eps", 1e-6),
    )


def _from_remote(hf: dict) -> GPTConfig:
    layers = hf.get("value_embed_layers") or []
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        vocab_pad_multiple=hf.get("vocab_pad_multiple", hf["padded_vocab"]),
        n_layer=hf["n_layer"],
        d_model=hf["d_model"],
        n_head=hf["n_head"],
        n_kv_head=hf["n_kv_head"],
        head_size=hf["head_dim"],
        max_seq_len=hf["max_seq_len"],
        rope_base=hf["rope_base"],
        mlp=hf["mlp"],
        mlp_hidden=hf["hidden"],
        qk_norm=hf["qk_norm"],
        qk_norm_affine=hf["qk_norm_affine"],
        qkv_bias=hf.get("qkv_bias", False),
        softcap=hf["softcap"],
        residual_scalars=hf["residual_scalars"],
        value_embeds=bool(layers),
        value_embed_layers=layers or None,
        ve_gate_channels=hf["ve_gate_channels"],
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_affine=hf["norm_affine"],
        embed_norm=hf["embed_norm"],
        norm_eps=hf["norm_eps"],
    )
