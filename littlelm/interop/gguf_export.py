"""`littlelm export RUN --gguf FILE`: a GGUF file for llama.cpp (and ollama, LM Studio, ...).

Written with the `gguf` package, the library llama.cpp maintains for its own converter, so the
tensor names come from its table (`gguf.get_tensor_name_map`) and the keys from its writer. What
littlelm writes itself, as llama.cpp's convert_hf_to_gguf.py would:
- the architecture of the stock export (arch.py): `llama`, `qwen2` or `qwen3`. The tensors are
  the stock export's (the embedding norm folded into the table, gains of ones, padding rows
  cut); for `llama` the q and k rows are permuted from the half-split RoPE layout (littlelm's
  and transformers') to llama.cpp's interleaved one; qwen2/qwen3 use the half-split layout.
- the tokenizer: model `gpt2` (byte-level BPE) with pre-tokenizer `gpt-2`, the regex of the
  ByteLevel pre-tokenizer littlelm's BPE trains with (llama.cpp's converter identifies it by a
  hash of its output on a probe, which a tokenizer trained here never matches: it refused
  littlelm exports with "BPE pre-tokenizer was not recognized"), or `qwen2` for an imported
  tokenizer that splits with Qwen2/2.5/3's regex (read from its tokenizer.json, not hashed; its
  NFC normalizer is left out, as llama.cpp's converter leaves it: text already in NFC, as
  nearly all text is, tokenizes the same); tokens, merges, the BOS token
  (also pad) as a control token, add_bos_token true and no separator, so a prompt tokenizes to
  what littlelm trained on;
- a chat model's format: `tokenizer.chat_template` (the Jinja template the Hugging Face export
  writes, BOS first) and EOS = the end of a turn (`<|end|>`, or an imported template's
  eos_token), so llama.cpp's chat completion renders littlelm's prompt and stops after the reply.
  Without a chat format EOS is BOS: a document ends where the next one's BOS would come.
Models no llama.cpp architecture computes (relu², value embeddings, residual scalars, a softcap)
and tokenizers with another pre-tokenizer are refused, with what to do instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from littlelm.data.tokenizer import Tokenizer
from littlelm.errors import CheckpointError
from littlelm.extras import require
from littlelm.interop import arch as A
from littlelm.interop.hf_tokenizer import chat_config, export_rules, raw_tokenizer, stop_ids
from littlelm.model.gpt import GPTConfig

LLAMA_CPP_ACT = "silu"  # llama.cpp's llama, qwen2 and qwen3 gate their MLPs with SiLU only
TYPES = ("f32", "f16")  # what each 2-D weight is stored as; norms and biases stay f32
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # llama.cpp's token types


def write_gguf(model, tok: Tokenizer, hf_tensors: dict, arch: str, out: Path, dtype: str) -> None:
    """`out`: model (stock-export tensors `hf_tensors` of `arch`) and tokenizer as GGUF."""
    require("gguf", extra="hf", feature="littlelm export --gguf")
    import gguf

    if arch == "littlelm":
        raise CheckpointError(
            "this model uses features no llama.cpp architecture computes (see the export "
            "reason above), so it has no GGUF form; train with model.mlp=swiglu "
            "model.value_embeds=false model.residual_scalars=false model.softcap=null to export "
            "one, or use the Hugging Face directory (`--out`) with transformers"
        )
    m: GPTConfig = model.cfg
    act = A.STOCK_MLP[m.mlp].hidden_act
    if act != LLAMA_CPP_ACT:
        raise CheckpointError(
            f"the {m.mlp} MLP gates with {act}, and llama.cpp's {arch} architecture with "
            f"{LLAMA_CPP_ACT} only, so it has no GGUF form; use the Hugging Face directory "
            "(`--out`) with transformers"
        )
    w = gguf.GGUFWriter(str(out), arch)
    _model_keys(w, m, arch, dtype, gguf)
    _tokenizer_keys(w, tok)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], m.n_layer)
    for name, t in hf_tensors.items():
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, f"no GGUF name for {name}"
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = m.n_head if "q_proj" in name else m.kv_heads
            t = interleave_rope_rows(t, heads)
        array = t.detach().float().numpy()
        if dtype == "f16" and array.ndim == 2:
            array = array.astype(np.float16)
        w.add_tensor(gname, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def interleave_rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k projection rows from the half-split RoPE layout (pairs i, i + d/2) to the
    interleaved one (pairs 2i, 2i + 1) that llama.cpp's `llama` architecture rotates."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _model_keys(w, m: GPTConfig, arch: str, dtype: str, gguf) -> None:
    w.add_name("littlelm export")
    w.add_context_length(m.max_seq_len)
    w.add_embedding_length(m.d_model)
    w.add_block_count(m.n_layer)
    w.add_feed_forward_length(m.hidden)
    w.add_head_count(m.n_head)
    w.add_head_count_kv(m.kv_heads)
    w.add_key_length(m.head_dim)
    w.add_value_length(m.head_dim)
    w.add_rope_dimension_count(m.head_dim)
    w.add_rope_freq_base(m.rope_base)
    w.add_layer_norm_rms_eps(A.norm_eps(m))
    w.add_vocab_size(m.vocab_size)
    ftype = gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
    w.add_file_type(ftype)


def _tokenizer_keys(w, tok: Tokenizer) -> None:
    raw, _ = raw_tokenizer(tok)
    spec = json.loads(raw.to_str())
    pre = spec.get("pre_tokenizer") or {}
    merges = spec["model"].get("merges") or []
    pre_name = _pre_tokenizer(pre, merges) if spec["model"].get("type") == "BPE" else None
    if pre_name is None:
        raise CheckpointError(
            f"the {tok.kind} tokenizer splits text with a pre-tokenizer neither llama.cpp's "
            "`gpt-2` nor its `qwen2` reproduces, so its GGUF would tokenize differently; export "
            "the Hugging Face directory (`--out DIR`) and convert it with llama.cpp's "
            "convert_hf_to_gguf.py, which knows the pre-tokenizers of published models, or "
            "train with data.tokenizer name bpe or byte"
        )
    if not merges:
        raise CheckpointError(
            f"the {tok.kind} tokenizer has no BPE merges, and a GGUF byte-level vocabulary "
            "needs them (llama.cpp refuses one without, and the gguf library cannot write an "
            "empty list); train with data.tokenizer name bpe to export a GGUF, or use the "
            "Hugging Face directory (`--out`)"
        )
    vocab = raw.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    added = {a["content"]: a for a in spec.get("added_tokens", [])}
    types = [
        (CONTROL if added[t]["special"] else USER_DEFINED) if t in added else NORMAL for t in tokens
    ]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_name)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tok.bos_id)
    # a chat model's end of turn (<|end|>), else the tokenizer's own eos (an imported one's), else
    # BOS: a document ends where the next one's BOS would come
    w.add_eos_token_id(stop_ids(tok)[0])
    w.add_pad_token_id(tok.bos_id)
    chat = chat_config(tok)
    if "chat_template" in chat:  # llama.cpp's chat completion renders it (Jinja), BOS included
        w.add_chat_template(chat["chat_template"])
    w.add_add_bos_token(export_rules(tok)[2])  # littlelm's documents start with BOS
    w.add_add_eos_token(False)
    w.add_add_sep_token(False)  # no second BOS after a prompt


# Qwen2's split regex (Qwen2, 2.5 and 3 tokenizer.json), llama.cpp's `qwen2` pre-tokenizer
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: dict, merges: list) -> str | None:
    """llama.cpp's name for the pre-tokenizer `pre` (tokenizer.json's), or None when it has
    none: `gpt-2` (llama.cpp's name for GPT-2's regex; "gpt2" is unknown to it) for ByteLevel
    with GPT-2's regex (littlelm's BPE), or any ByteLevel when there are no merges (the byte
    tokenizer: every byte is its own token however the text is split); `qwen2` for Qwen's split
    regex followed by a ByteLevel that splits no further."""
    parts = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
    last = parts[-1] if parts else {}
    if last.get("type") != "ByteLevel" or last.get("add_prefix_space"):
        return None
    if len(parts) == 1:
        return "gpt-2" if last.get("use_regex", True) or not merges else None
    split = parts[0]
    qwen2 = (
        len(parts) == 2
        and split.get("type") == "Split"
        and split.get("pattern") == {"Regex": QWEN2_SPLIT}
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and not last.get("use_regex", True)  # the split above is the only one
    )
    return "qwen2" if qwen2 else None
