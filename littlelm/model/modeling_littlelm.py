"""A littlelm GPT for transformers: `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`.

`littlelm export` copies this file next to the weights when the model uses a feature no stock
transformers architecture has (relu² MLP, value embeddings, residual scalars, logit softcap,
un-gained QK-norm with an embedding norm, ...), with blocks.py (littlelm/model/blocks.py: the MLP
variants, which littlelm's model builds from too). It depends on torch and transformers only,
and computes what littlelm/model/gpt.py computes, in the same order (fp32 logits within 1e-4):

    x = wte(ids), RMS-normalised (embed_norm); x0 = x
    per layer i:  x = λ_resid[i]·x + λ_x0[i]·x0                     (residual_scalars)
                  x = x + attn(norm1(x)),  x = x + mlp(norm2(x))
    attn:         q, k, v projections; v += 2·sigmoid(gate(x[:ve_gate_channels]))·ve[i](ids)
                  on value-embedding layers; RMS-norm q and k per head (qk_norm, optional
                  gains), RoPE on the two halves of each head, causal SDPA (grouped queries)
    mlp:          blocks.MLPS[mlp]: c_proj(relu(c_fc(x))²), c_proj(silu(c_gate(x))·c_fc(x)), ...
    logits = softcap(lm_head(norm_f(x))),  softcap(l) = c·tanh(l/c)

As transformers' models are: LittleLMModel (the backbone, returning norm_f(x) as
last_hidden_state) under LittleLMForCausalLM.model, and lm_head on it. Parameter names are
littlelm's own under `model.` (lm_head.weight at the top); wte and lm_head hold the vocabulary's
rows only (littlelm's padding rows, which no token reaches, are cut: a padded row of lm_head
would take probability in a log-softmax run on the hidden states, as TRL runs it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

# shipped beside this file: transformers resolves the import
from .blocks import MLP, Norm, TorchOps


class LittleLMConfig(PretrainedConfig):
    model_type = "littlelm"

    def __init__(
        self,
        vocab_size: int = 257,
        padded_vocab: int = 320,
        n_layer: int = 2,
        d_model: int = 64,
        n_head: int = 4,
        n_kv_head: int = 4,
        head_dim: int = 16,
        hidden: int = 256,
        mlp: str = "relu2",
        max_seq_len: int = 1024,
        rope_base: float = 10000.0,
        qk_norm: bool = True,
        qk_norm_affine: bool = False,
        qkv_bias: bool = False,
        softcap: float | None = None,
        residual_scalars: bool = False,
        value_embed_layers: list[int] | None = None,
        ve_gate_channels: int = 32,
        norm_affine: bool = False,
        embed_norm: bool = True,
        norm_eps: float | None = None,
        use_cache: bool = True,
        **kwargs,
    ):
        self.use_cache = use_cache
        self.vocab_size, self.padded_vocab = vocab_size, padded_vocab
        self.n_layer, self.d_model, self.n_head, self.n_kv_head = (
            n_layer,
            d_model,
            n_head,
            n_kv_head,
        )
        self.head_dim, self.hidden, self.mlp = head_dim, hidden, mlp
        self.max_seq_len, self.rope_base = max_seq_len, rope_base
        self.qk_norm, self.qk_norm_affine, self.softcap = qk_norm, qk_norm_affine, softcap
        self.qkv_bias = qkv_bias
        self.residual_scalars = residual_scalars
        self.value_embed_layers = list(value_embed_layers or [])
        self.ve_gate_channels = ve_gate_channels
        self.norm_affine, self.embed_norm, self.norm_eps = norm_affine, embed_norm, norm_eps
        # transformers' generic names, read by generation and serving code (and TRL, which
        # applies final_logit_softcapping when it runs lm_head on the hidden states itself)
        self.final_logit_softcapping = softcap
        self.hidden_size, self.num_hidden_layers = d_model, n_layer
        self.num_attention_heads, self.num_key_value_heads = n_head, n_kv_head
        self.max_position_embeddings = max_seq_len
        super().__init__(**kwargs)


def rope(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype):
    """cos, sin (B, T, 1, D) for positions (B, T): [cos, cos] and [-sin, sin] as in littlelm."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.float()[..., None] * inv_freq.to(positions.device)  # (B, T, D/2)
    cos, sin = angles.cos(), angles.sin()
    cos, sin = torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
    return cos[:, :, None].to(dtype), sin[:, :, None].to(dtype)


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: LittleLMConfig, layer: int):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        H, Hkv, D, C = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.d_model
        self.c_q = nn.Linear(C, H * D, bias=cfg.qkv_bias)
        self.c_k = nn.Linear(C, Hkv * D, bias=cfg.qkv_bias)
        self.c_v = nn.Linear(C, Hkv * D, bias=cfg.qkv_bias)
        self.c_proj = nn.Linear(H * D, C, bias=False)
        if layer in cfg.value_embed_layers:
            self.ve_gate = nn.Linear(cfg.ve_gate_channels, Hkv, bias=False)
        if cfg.qk_norm and cfg.qk_norm_affine:
            self.q_norm = Norm(D, True, None)
            self.k_norm = Norm(D, True, None)

    def forward(self, x, cos, sin, ve, cache, mask):
        cfg, (B, T, _) = self.cfg, x.shape
        H, Hkv, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        q = self.c_q(x).view(B, T, H, D)
        k = self.c_k(x).view(B, T, Hkv, D)
        v = self.c_v(x).view(B, T, Hkv, D)
        if ve is not None:  # value embedding through a gate in (0, 2)
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., : cfg.ve_gate_channels]))  # (B, T, Hkv)
            v = v + gate.unsqueeze(-1) * ve.view(B, T, Hkv, D).to(v.dtype)
        if cfg.qk_norm:
            norm = TorchOps.rms_norm  # per head, without a gain: the gains follow
            q, k = norm(q, None, cfg.norm_eps), norm(k, None, cfg.norm_eps)
            if cfg.qk_norm_affine:
                q_gain, k_gain = self.q_norm.weight, self.k_norm.weight
                assert q_gain is not None and k_gain is not None, "built with gains"
                q, k = q * q_gain.to(q.dtype), k * k_gain.to(k.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(k, v, self.layer)  # every position so far: (B, Hkv, S, D)
        gqa = Hkv != H
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, H * D))


class Block(nn.Module):
    def __init__(self, cfg: LittleLMConfig, layer: int):
        super().__init__()
        self.norm1 = Norm(cfg.d_model, cfg.norm_affine, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.norm2 = Norm(cfg.d_model, cfg.norm_affine, cfg.norm_eps)
        self.mlp = MLP(cfg.mlp, cfg.d_model, cfg.hidden)

    def forward(self, x, cos, sin, ve, cache, mask):
        x = x + self.attn(self.norm1(x, TorchOps), cos, sin, ve, cache, mask)
        return x + self.mlp(self.norm2(x, TorchOps), TorchOps)


class LittleLMPreTrainedModel(PreTrainedModel):
    config_class = LittleLMConfig
    base_model_prefix = "model"  # transformers' convention: the head's backbone is `.model`
    _supports_sdpa = True


class LittleLMModel(LittleLMPreTrainedModel):
    """The backbone: token ids -> the final-normed hidden states (`last_hidden_state`), as
    transformers' base models return them (TRL, peft and lm-eval call it through `.model`)."""

    def __init__(self, cfg: LittleLMConfig):
        super().__init__(cfg)
        V, C, kv = cfg.padded_vocab, cfg.d_model, cfg.n_kv_head * cfg.head_dim
        # the vocabulary rows no token reaches are cut, as lm_head's are
        self.wte = nn.Embedding(cfg.vocab_size, C)
        self.value_embeds = nn.ModuleDict(
            {str(i): nn.Embedding(V, kv) for i in cfg.value_embed_layers}
        )
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm_f = Norm(C, cfg.norm_affine, cfg.norm_eps)
        if cfg.residual_scalars:
            self.resid_lambdas = nn.Parameter(torch.ones(cfg.n_layer))
            self.x0_lambdas = nn.Parameter(torch.zeros(cfg.n_layer))
        self.post_init()

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, value):
        self.wte = value

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: DynamicCache | None = None,
        use_cache: bool | None = None,
        past_key_values: DynamicCache | None = None,  # the name before transformers 5.2x
        **kwargs,
    ) -> BaseModelOutputWithPast:
        cfg, (B, T) = self.config, input_ids.shape
        cache = cache if cache is not None else past_key_values
        if (cfg.use_cache if use_cache is None else use_cache) and cache is None:
            cache = DynamicCache(config=cfg)
        start = cache.get_seq_length() if cache is not None else 0
        positions: torch.Tensor | None = position_ids
        if positions is None:
            positions = torch.arange(start, start + T, device=input_ids.device).expand(B, T)
        x = self.wte(input_ids)
        if cfg.embed_norm:
            x = TorchOps.rms_norm(x, None, cfg.norm_eps)
        cos, sin = rope(positions, cfg.head_dim, cfg.rope_base, x.dtype)
        mask = LittleLMForCausalLM._mask(attention_mask, T, start + T, x.device)
        x0 = x
        for i, block in enumerate(self.blocks):
            if cfg.residual_scalars:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](input_ids) if str(i) in self.value_embeds else None
            x = block(x, cos, sin, ve, cache, mask)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm_f(x, TorchOps),
            **_cache_field(BaseModelOutputWithPast, cache),
        )


def _cache_field(output: Any, cache) -> dict[str, Any]:
    """The output's cache, under the name this transformers gives it."""
    name = "cache" if "cache" in output.__dataclass_fields__ else "past_key_values"
    return {name: cache}


class LittleLMForCausalLM(LittleLMPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.wte.weight"}  # noqa: RUF012 (transformers' API)

    def __init__(self, cfg: LittleLMConfig):
        super().__init__(cfg)
        self.model = LittleLMModel(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.wte

    def set_input_embeddings(self, value):
        self.model.wte = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def get_decoder(self):
        return self.model

    def set_decoder(self, decoder):
        self.model = decoder

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: DynamicCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        past_key_values: DynamicCache | None = None,  # the name before transformers 5.2x
        **kwargs,
    ) -> CausalLMOutputWithPast:
        cfg = self.config
        out = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache if cache is not None else past_key_values,
            use_cache=use_cache,
        )
        logits = self.lm_head(out.last_hidden_state).float()
        if cfg.softcap:
            logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
            )
        cache_out = getattr(out, next(iter(_cache_field(type(out), None))))
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, **_cache_field(CausalLMOutputWithPast, cache_out)
        )

    @staticmethod
    def _mask(attention_mask, T: int, S: int, device) -> torch.Tensor | None:
        """None for plain causal attention, else a (B|1, 1, T, S) bool mask (True = attend):
        causal over the S cached + new positions, without padded keys."""
        padded = attention_mask is not None and not bool(attention_mask.all())
        if not padded and (T == S or T == 1):
            return None
        mask = torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)[None, None]
        if padded:
            mask = mask & attention_mask[:, None, None, -S:].bool()
        return mask
