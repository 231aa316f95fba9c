"""The analytic memory model: bytes per category of one training step, as pure functions of a
run's `Dims`.

The trace (plan/trace.py) is the reference. These formulas count the same tensors where the
trace would be too slow or cannot run: the search over micro-batch sizes and remedies, FSDP's
shards, 8-bit AdamW (CUDA-only), --no-trace. tests/test_plan_memory.py holds them within 10% of
the trace, category by category and phase by phase; a plan scales them by the trace's peak over
their own (`Dims.trace_scale`), so the two never disagree in one plan. Attention is
FlashAttention's, as a GPU runs it (and as the trace stands it in). docs/planning.md explains
each formula; not modelled: FP8 linears (planned as bf16, an upper bound) and torch.compile.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from littlelm.model import blocks
from littlelm.model.blocks import MLPS
from littlelm.model.kernels import group_rows
from littlelm.optim.base import ELEMENTS, GroupRule
from littlelm.plan.dims import Dims, model_tensors
from littlelm.plan.trace import (
    ACT,
    BWD,
    COPIES,
    FB,
    GRADS,
    KV,
    LOSS,
    OPT,
    PARAMS,
    REF,
    SAMPLE,
    SCRATCH,
    STATE,
    Memory,
    block_bytes,
)

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------------------------
# Static: parameters, gradients, optimizer state, weight copies


def gradient_bytes(d: Dims) -> int:
    return sum(block_bytes(d.param_bytes * p.numel) for p in d.trainable)


# bitsandbytes' NF4 (Linear4bit, QLoRA's defaults): two weights per byte; an absmax per block of
# 64 weights, itself quantized to 8 bits (double quantization) with an fp32 absmax per 256 of
# them and its 256-entry fp32 code book
NF4_BLOCK, NF4_BLOCK2, NF4_CODE = 64, 256, 256


def nf4_bytes(numel: int) -> int:
    """One NF4 weight: the packed codes and its quantization constants (each its own tensor)."""
    blocks = -(-numel // NF4_BLOCK)
    return (
        block_bytes(-(-numel // 2))  # the codes, two per byte
        + block_bytes(blocks)  # the absmax of each block, 8-bit
        + block_bytes(4 * -(-blocks // NF4_BLOCK2))  # their fp32 absmax
        + block_bytes(4 * NF4_CODE)  # the second quantization's code book
        + block_bytes(4)  # its offset (the mean it subtracts)
    )


def parameter_bytes(d: Dims) -> int:
    """Parameters and the RoPE tables, in train.master_weights' dtype (fp32 or bf16); QLoRA's
    frozen target weights in NF4 (`nf4_bytes`), LoRA's in bf16 when held so."""
    own = sum(
        nf4_bytes(p.numel) if p.nf4 else block_bytes((2 if p.bf16 else d.param_bytes) * p.numel)
        for p in d.params
    )
    return own + sum(block_bytes(d.param_bytes * n) for n in d.buffers)


def reference_bytes(d: Dims) -> int:
    """DPO's frozen reference when it is a copy: the whole model's parameters and buffers in
    train.master_weights' dtype (train/growth.py's base_copy), none otherwise."""
    if not d.reference_copy:
        return 0
    params, buffers = model_tensors(d.model)
    return sum(block_bytes(d.param_bytes * n) for n in (*(p.numel for p in params), *buffers))


def optimizer_state_bytes(d: Dims) -> int:
    """Each trained tensor's state as its rule keeps it (`GroupRule.state_bytes`). Under ddp,
    rank 0's share: of a MATRICES rule (sharded Muon) the matrices it owns, of an ELEMENTS rule
    under ZeRO-1 1/world of each tensor."""
    w = d.ddp_ranks
    total = sum(
        sum(block_bytes(b) for b in rule.state_bytes(math.prod(shape), d.param_bytes))
        * d.matrix_owned(count)
        for rule, shape, count in d.matrix_buckets()
    )
    for p in d.trainable:
        if d.matrix_param(p):
            continue
        rule = d.rule(p)
        zero = d.shard_adamw and rule.sharding == ELEMENTS
        numel = -(-p.numel // w) if zero else p.numel
        total += sum(block_bytes(b) for b in rule.state_bytes(numel, d.param_bytes))
    return total


def weight_copy_bytes(d: Dims) -> int:
    """Weights a matmul reads in another dtype or layout, kept until its backward: q, k and v's
    weights stacked for their one matmul; under bf16 autocast with fp32 master weights every
    other block matmul weight cast once per forward, and the plain loss's lm_head rows."""
    m, C = d.model, d.model.d_model
    qkv = (m.n_head + 2 * m.kv_heads) * m.head_dim * C
    stacked = d.lora is None or not d.lora.attention  # adapted q, k, v: three matmuls, not one
    # a frozen weight's copy is kept for its input's gradient, which the first block's
    # attention does not need when its input carries none (Dims.frozen_input)
    quiet = 1 if d.frozen_input else 0
    # under activation checkpointing the stack is remade with its layer in the backward pass
    stacks = 0 if d.checkpointing or not stacked else m.n_layer - quiet
    total = stacks * block_bytes(d.act_bytes * qkv)
    if not d.bf16 or d.master_bf16:
        return total
    attn_in = ("attn.c_q", "attn.c_k", "attn.c_v")
    for p in d.params:
        if p.nf4 or p.bf16 or p.role not in ("matrix", "adapter"):
            continue  # NF4 weights are dequantized, used and freed (model/nf4.py); bf16 ones read
        if stacked and p.module in attn_in:
            continue  # in the stack
        # a frozen weight of the first block; an adapter's copy is kept all the same (autocast
        # caches a trained leaf's cast for the forward)
        first = p.name.startswith("blocks.0.") and quiet and p.role == "matrix"
        if first and p.module in (*attn_in, "attn.ve_gate"):
            continue  # reads the first block's input: no gradient, no copy kept
        mlp_in = p.module.startswith("mlp.") and p.module != "mlp.c_proj"
        if first and stacked and (p.module == "attn.c_proj" or mlp_in):
            continue  # a frozen first attention: no gradient until the MLP's adapters' outputs
        total += block_bytes(2 * p.numel)
    # the plain loss's lm_head rows cast (under LoRA's token rows: of the copy, the loss's);
    # RL's logits come from the whole (padded) weight (model/gpt.py's head)
    rows = m.padded_vocab if d.groups is not None else m.vocab
    return total + (block_bytes(2 * rows * C) if d.plain_loss and not d.head_copy else 0)


# ----------------------------------------------------------------------------------------------
# Activations: what the forward keeps for backward, bytes per token


def layer_activation_bytes(d: Dims, layer: int) -> float:
    """What block `layer` keeps for backward, per token (model/gpt.py, model/kernels.py)."""
    m, a, sb = d.model, d.act_bytes, d.param_bytes
    C, H, Hkv = m.d_model, m.n_head, m.kv_heads
    q, kv = H * m.head_dim, Hkv * m.head_dim
    ve = m.has_value_embed(layer)
    lo = d.lora
    if lo is not None and layer == 0 and d.frozen_input and not lo.attention:
        # a frozen attention on an input without gradient records nothing: the block keeps
        # its MLP's tensors (and norm2's output, the adapters' input) only
        return a * C + mlp_activation_bytes(d) + adapter_activation_bytes(d, "mlp.")
    # the stream (the embedding's dtype): the mixed input, after attention, after the MLP
    total = (3 if m.residual_scalars else 2) * sb * C
    total += 2 * (a * C + blocks.NORM_KEEPS)  # two norms: outputs (in the matmul dtype) and 1/rms
    if lo is not None and layer == 0 and d.frozen_input:  # norm1 and the mix get no gradient
        total -= (2 if m.residual_scalars else 1) * sb * C + blocks.NORM_KEEPS
    if lo is not None and not lo.attention:  # norm1's output: read by frozen matmuls only
        total -= a * C
    if lo is not None and not lo.mlp:  # norm2's output, c_proj's input: read by frozen ones
        total -= a * C + a * m.hidden
    if m.norm_affine:
        total += 2 * a * C  # the gain's product is a new tensor; its mul keeps the norm output
    # q, k and v come out of one matmul; that output stays alive while qk-norm keeps q and k
    # (views of it) or attention keeps v (a view of it, when no value embedding replaces v);
    # adapted, q and k are one tensor (their outputs concatenated) and v another
    if lo is not None and lo.attention:
        total += (a * (q + kv) if m.qk_norm else 0) + (a * kv if not ve else 0)
    elif m.qk_norm or not ve:
        total += a * (q + 2 * kv)
    if m.qk_norm:
        total += blocks.NORM_KEEPS * (H + Hkv)  # the norm per head
    if m.qk_norm and m.qk_norm_affine:
        total += a * (q + kv)  # the gains' product is a new tensor
    total += a * (q + kv)  # q and k after RoPE, kept by attention
    if ve:  # v + gate·ve, ve in the matmul dtype, the gate's sigmoid and 2·sigmoid
        total += 2 * a * kv + 2 * a * Hkv
    total += a * q + 4 * H  # attention output and FlashAttention's log-sum-exp (fp32)
    return total + mlp_activation_bytes(d) + adapter_activation_bytes(d)


def adapter_activation_bytes(d: Dims, within: str = "") -> int:
    """What one block's adapters (those of modules starting with `within`) keep per token: A's
    output (rank wide, read by B's gradient); with dropout, the dropped input and its mask."""
    lo = d.lora
    if lo is None:
        return 0
    widths = {p.module: p.shape[1] for p in d.params if p.role == "matrix" and p.module}
    total = 0
    for module in lo.targets:
        if module.startswith(within):
            total += d.act_bytes * lo.rank
            total += (d.act_bytes + 1) * widths[module] if lo.dropout else 0
    return total


def mlp_activation_bytes(d: Dims) -> int:
    """The hidden-wide tensors the MLP variant keeps for its backward (model/blocks.py)."""
    return MLPS[d.model.mlp].saved * d.act_bytes * d.model.hidden


def activation_bytes(d: Dims) -> int:
    """All blocks (with activation checkpointing only their inputs), plus the embedding's
    lookup and its normalised x0, norm_f, the token ids and the RoPE tables cast to bf16."""
    m, sb = d.model, d.param_bytes
    per_token: float
    if d.checkpointing:  # each layer keeps only its input; the last layer's output too
        per_token = m.n_layer * sb * m.d_model
    else:
        per_token = sum(layer_activation_bytes(d, i) for i in range(m.n_layer))
    per_token += 2 * sb * m.d_model + 2 * blocks.NORM_KEEPS + 8 * 2  # lookup, x0, 2 norms, ids
    if d.plain_loss:
        per_token += d.act_bytes * m.d_model  # norm_f's output, kept by lm_head
    casts = d.bf16 and not d.master_bf16
    rope = 2 * block_bytes(2 * d.seq_len * m.head_dim) if casts else 0
    return int(per_token * d.tokens) + rope


# ----------------------------------------------------------------------------------------------
# The loss: logits, softcap, log-softmax, and their gradients

BLOCK_SCALAR = 512  # a 0-d or tiny tensor takes one allocator block


def chunked_loss_stages(d: Dims) -> dict[str, float]:
    """The chunked loss makes each chunk's logits and their gradient in the forward pass, into a
    buffer shared by a group of chunks (`group_rows`); at a group's end one product makes d(x)
    for its rows and one its (V, C) share of d(lm_head), summed in fp32. Beside the rows'
    tensors (mask, scale, d(x)) and the buffer: inside a chunk (its output, the fp32 copy and
    with a soft cap the capped copy; d(lm_head) from the first group's end on), a group's end
    (the product beside its fp32 sum), and the loss's backward (d(x), d(lm_head) scaled)."""
    m, N, a = d.model, d.tokens, d.act_bytes
    C, V, Vp = m.d_model, m.vocab, m.padded_vocab
    n = min(d.model.loss_chunk, N)
    rows = block_bytes(N) + block_bytes(4 * N) + block_bytes(a * N * C) + BLOCK_SCALAR
    dw = block_bytes(4 * V * C)
    group = min(group_rows(N, n, V, a), N)
    buf = block_bytes(a * group * V)
    many_groups = group < N
    fp32_rows = 2 if m.softcap is not None else 1
    logits_copy = block_bytes(a * n * V) if a != 4 else 0  # the matmul output, before .float()
    small = block_bytes(8 * n) + 6 * block_bytes(4 * n) + BLOCK_SCALAR  # per-row tensors
    chunk = fp32_rows * block_bytes(4 * n * V) + max(logits_copy, small)
    running = dw if (a != 4 or many_groups) else 0  # in fp32 the first product is the sum
    padded = Vp != V or d.param_bytes != 4  # d(lm_head) into a zero-padded tensor of its dtype
    # a frozen lm_head (LoRA): its gradient, made in the forward all the same, is not scaled
    scaled = (dw + (block_bytes(d.param_bytes * Vp * C) if padded else 0)) if d.head_trains else 0
    return {
        "chunk": rows + buf + chunk + (dw if many_groups else 0),
        "group": rows + buf + block_bytes(a * V * C) + running,
        "backward": rows + block_bytes(a * N * C) + dw + scaled,
    }


def plain_loss_stages(d: Dims) -> dict[str, float]:
    """lm_head over the real rows, its fp32 copy, the soft cap (tanh keeps its output),
    log-softmax (keeps its output), and their gradients in the backward."""
    m, N = d.model, d.tokens
    C, V = m.d_model, m.vocab
    cap = m.softcap is not None
    x = 2 * C if d.bf16 else 0  # norm_f output (counted in activations)
    logits = (2 * V + 4 * V) if d.bf16 else 4 * V  # matmul output (+ its fp32 copy)
    saved = 8 * V if cap else 4 * V  # tanh output + log-softmax output, or log-softmax only
    head_grad = (2 + d.param_bytes) * V * C if d.bf16 else 4 * V * C
    head_grad *= d.head_trains  # a frozen lm_head (LoRA) gets none
    return {
        "logits": N * logits,
        "softcap": N * (4 * V + 8 * V) if cap else 0,
        "log-softmax": N * (saved + 4 * V + (0 if cap else (logits - 4 * V))),
        "backward": N * (saved + 8 * V),
        "lm_head backward": N * (x + d.act_bytes * V) + head_grad,
    }


def rl_loss_stages(d: Dims) -> dict[str, float]:
    """RL's per-token log-probs of a group's rows (train/rl.py's reply_logps): the model's head
    makes every logit (lm_head's output, its fp32 copy, which the max's backward keeps; with a
    soft cap tanh's output kept too), the tempered logits (shifted, divided), log-softmax (keeps
    its output), and in the backward a gradient of each beside what they keep (16 fp32 values
    per token and vocabulary entry, 20 with the soft cap: measured on the trace, exact at
    every vocabulary and padding tried)."""
    m, N, a = d.model, d.tokens, d.act_bytes
    C, V, Vp = m.d_model, m.vocab, m.padded_vocab
    cap = 4 * V if m.softcap is not None else 0
    head_grad = (2 + d.param_bytes) * Vp * C if d.bf16 else 4 * Vp * C
    head_grad *= d.head_trains  # a frozen lm_head (LoRA) gets none
    return {
        "logits": N * (a * Vp + 4 * V),
        "log-softmax": N * (12 * V + cap),
        "backward": N * (16 * V + cap),
        "lm_head backward": N * (4 * V + 2 * a * Vp + a * C) + head_grad,
    }


def sampling_bytes(d: Dims) -> int:
    """RL's sampling (train/rl.py, model/generate.py's sample_group): one group's KV cache of
    `width` positions in the compute dtype, beside the largest of the prompt's forward (its
    logits at every position: lm_head's output and its fp32 copy, or with a soft cap the copy,
    its scaled copy and tanh's output; norm_f's output and the stream) and, with iterations >
    1, the replies' log-probs as sampled (RL's loss path without gradients)."""
    g = d.groups
    if g is None:
        return 0
    m, a = d.model, d.act_bytes
    C, V, Vp = m.d_model, m.vocab, m.padded_vocab
    cache = m.n_layer * 2 * block_bytes(a * g.size * g.width * m.kv_heads * m.head_dim)
    logits = 12 * V if m.softcap is not None else a * Vp + 4 * V
    block = 8 * C + a * C + 2 * a * m.hidden  # the stream and x0, norm's output, the MLP's
    prompt = g.size * g.prompt * max(logits + a * C + 4 * C, block)
    # the replies' log-probs: the logits (with a soft cap its chain's largest moment), the
    # tempered copy beside them (measured on the trace)
    old_per = 12 * V if m.softcap is not None else a * Vp + 8 * V
    old = g.size * (g.width - 1) * old_per if g.keeps_old else 0
    return cache + int(max(prompt, old))


# ----------------------------------------------------------------------------------------------
# Backward temporaries of one block


def block_backward_stages(d: Dims) -> dict[str, float]:
    """Live backward temporaries (the stream's gradients included) at the expensive moments of
    one block's backward: the MLP's hidden gradients; q and k's gradient (one tensor) through
    RoPE and qk-norm, v's beside; q, k, v's gradients stacked for the one matmul with its input
    gradient; FlashAttention's backward (flash_api.cpp, mha_bwd)."""
    m, N, a, sb = d.model, d.tokens, d.act_bytes, d.param_bytes
    C, q, kv, h = m.d_model, m.n_head * m.head_dim, m.kv_heads * m.head_dim, m.hidden
    # the stream's gradient, accumulated in place; with residual scalars x0's beside it
    base = sb * C * (2 if m.residual_scalars else 1)
    mlp = MLPS[m.mlp].backward * a * h
    qkv = 2 * a * (q + 2 * kv) + a * C + (sb * C if m.residual_scalars else 0)
    # the output's gradient, an fp32 accumulator for dq and the softmax row sums, dq, dk and dv
    # (under GQA at the query heads' width first, then summed into the key/value heads')
    gqa = m.kv_heads != m.n_head
    flash = a * q + 4 * q + 4 * m.n_head + a * q + 2 * a * kv + (2 * a * q if gqa else 0)
    fixed = 3 * BLOCK_SCALAR + (2 * BLOCK_SCALAR if m.residual_scalars else 0)
    if (
        m.tie_embeddings and d.head_grad_kept
    ):  # the lm_head half of the tied embedding's gradient waits for the rest
        fixed += block_bytes(d.param_bytes * m.padded_vocab * C)
    rope_norm = 3 * a * (q + kv) + a * kv  # d(q|k), RoPE's output, the swapped halves; d(v)
    lo = d.lora
    if lo is not None and lo.mlp:
        # adapted linears: the base's and the adapter's input gradients, and the adapter's
        # rank-wide one between its B and A (measured on the trace: the MLP's backward peaks
        # with two of the stream's width and one of the rank's beside its hidden gradients)
        mlp += 2 * a * C + a * lo.rank
    stages: dict[str, float] = {
        "mlp": N * (base + mlp),
        "rope and qk-norm": N * (base + rope_norm),
        "attention inputs": N * (base + qkv),
        "attention kernel": N * (base + flash),
    }
    if d.checkpointing:
        # the layer is recomputed first (its activations, less its output, are counted here);
        # each MLP tensor is freed as its gradient is made, so one gradient fewer is alive
        again = (max(layer_activation_bytes(d, i) for i in range(m.n_layer)) - sb * C) * N
        stages = {k: v + again for k, v in stages.items()}
        stages["mlp"] -= a * h * N
        # by the attention's backward the MLP's recomputed tensors and norm2's output are freed
        for k in ("rope and qk-norm", "attention inputs", "attention kernel"):
            stages[k] -= (mlp_activation_bytes(d) + a * C) * N
    return {k: v + fixed for k, v in stages.items()}


# ----------------------------------------------------------------------------------------------
# Optimizer step scratch


def optimizer_scratch_bytes(d: Dims) -> int:
    """The largest temporaries of clipping (one fp32 norm per tensor, their stack and total) and
    of `optimizer.step()`: each rule's for its largest tensor (`GroupRule.scratch_bytes`; fused
    AdamW none, the stochastic-rounding AdamW three fp32 tensors of its size), a MATRICES rule's
    per bucket (`bucket_scratch`: Muon's, with its owned updates and their all-gather); ZeRO-1's
    slices and their fp32 all-gather, per rule."""
    peak = (len(d.trainable) + 2) * block_bytes(4)
    w = d.ddp_ranks
    by_rule: dict[GroupRule, list[int]] = {}
    for p in d.trainable:
        if not d.matrix_param(p):
            by_rule.setdefault(d.rule(p), []).append(p.numel)
    for rule, sizes in by_rule.items():
        sliced = d.shard_adamw and rule.sharding == ELEMENTS  # ZeRO-1 steps a 1/w slice
        largest = -(-max(sizes) // w) if sliced else max(sizes)
        scratch = rule.scratch_bytes(largest, d.param_bytes, d.stochastic_rounding)
        peak = max(peak, sum(block_bytes(b) for b in scratch))
        if sliced and w > 1:
            peak = max(peak, 4 * (w + 1) * sum(-(-n // w) for n in sizes))
    for rule, shape, count in d.matrix_buckets():
        peak = max(peak, rule.bucket_scratch(shape, d.matrix_owned(count), count, d.param_bytes, w))
    return peak


# ----------------------------------------------------------------------------------------------
# The whole step


def estimate(d: Dims) -> Memory:
    """The whole step, every figure times `d.trace_scale` (1 unless a plan anchored it)."""
    # the loss's own tensors at the most expensive of its moments (model/kernels.py)
    if d.groups is not None:
        loss_stages = rl_loss_stages
    else:
        loss_stages = plain_loss_stages if d.plain_loss else chunked_loss_stages
    cats = {
        PARAMS: parameter_bytes(d),
        REF: reference_bytes(d),
        GRADS: gradient_bytes(d),
        STATE: optimizer_state_bytes(d),
        KV: sampling_bytes(d),
        COPIES: weight_copy_bytes(d),
        ACT: activation_bytes(d),
        # LoRA's trained token rows: lm_head's weight copy is alive through the loss
        LOSS: int(max(loss_stages(d).values())) + d.head_copy,
        BWD: int(max(block_backward_stages(d).values())),
        SCRATCH: optimizer_scratch_bytes(d),
    }
    f = d.trace_scale

    def scaled(c: dict[str, int]) -> dict[str, int]:
        return c if f == 1 else {k: round(v * f) for k, v in c.items()}

    breakdowns = {k: scaled(v) for k, v in phase_breakdowns(d, cats).items()}
    source = "analytic model" + (f" x {f:.4f} (the trace's peak over its own)" if f != 1 else "")
    return Memory(scaled(cats), breakdowns, source)


def phase_breakdowns(d: Dims, c: dict[str, int]) -> dict[str, dict[str, int]]:
    """What is alive at the peak of each phase, by category. The forward/backward peak is the
    largest of: the loss (every activation alive; the chunked loss peaks inside the forward,
    before any gradient of this micro-batch), each stage of the top block's backward, and the
    bottom block's (grad_accum = 1: nearly every gradient made, nearly every activation freed).
    The optimizer step: parameters, state, gradients and scratch."""
    m, N, L, a = d.model, d.tokens, d.model.n_layer, d.act_bytes
    kept = {PARAMS: c[PARAMS], REF: c[REF], STATE: c[STATE]}
    head_grad = block_bytes(d.param_bytes * m.padded_vocab * m.d_model) if d.head_grad_kept else 0
    if d.checkpointing:
        layer = [int(m.d_model * d.param_bytes * N)] * L
    else:
        layer = [int(layer_activation_bytes(d, i) * N) for i in range(L)]
    # RL's groups each add their gradients to the step's (the second group's backward with the
    # first's gradients alive), as micro-batches do
    accumulating = d.grad_accum > 1 or (d.groups is not None and d.groups.count > 1)
    qkv = (m.n_head + 2 * m.kv_heads) * m.head_dim * m.d_model
    recomputed = block_bytes(a * qkv) if d.checkpointing else 0  # one layer's q, k, v stack
    if accumulating:
        grads_top = grads_bottom = c[GRADS]
    else:
        embeds = sum(
            block_bytes(d.param_bytes * p.numel)
            for p in d.trainable
            if p.role.endswith("embedding")
        )
        grads_top, grads_bottom = head_grad, c[GRADS] - embeds
    loss = {**kept, COPIES: c[COPIES], ACT: c[ACT], LOSS: c[LOSS]}
    if d.plain_loss:
        loss[GRADS] = grads_top
    else:  # norm_f's output and lm_head cast for the chunks are alive beside the loss
        loss[ACT] += block_bytes(a * N * m.d_model)
        if d.casts_head and not d.head_copy:  # else the copy's cast is the loss's (head_copy)
            loss[COPIES] += block_bytes(2 * m.vocab * m.d_model)
        loss[GRADS] = c[GRADS] if accumulating else 0
    # by the top block's attention backward its MLP's tensors and norm2's output are freed
    # (with checkpointing the stages count that already)
    freed = 0 if d.checkpointing else (mlp_activation_bytes(d) + a * m.d_model) * N
    top = [
        {
            **kept,
            COPIES: c[COPIES] + recomputed,
            ACT: c[ACT] - (0 if stage == "mlp" else int(freed)),
            GRADS: grads_top,
            BWD: int(temps),
        }
        for stage, temps in block_backward_stages(d).items()
    ]
    bottom = {
        **kept,
        COPIES: c[COPIES] // L if d.bf16 else 0,
        ACT: c[ACT] - sum(layer) + layer[0],
        GRADS: grads_bottom,
        BWD: c[BWD],
    }
    out = {
        FB: max([loss, *top, bottom], key=lambda x: sum(x.values())),
        OPT: {**kept, GRADS: c[GRADS], SCRATCH: c[SCRATCH]},
    }
    if d.groups is not None:  # RL samples first: no gradients then (zero_grad sets them None)
        # under bf16 autocast with fp32 weights every weight's cast, which autocast keeps (of
        # weights that take gradients) until the group's sampling ends
        out = {SAMPLE: {**kept, KV: c[KV], COPIES: c[COPIES]}, **out}
    return out


def checkpoint_bytes(e: Memory) -> int:
    """Weights + optimizer state: what a resume holds on the GPU (load_checkpoint copies the
    state one tensor at a time, below the step's peak) and maps in host RAM once per node."""
    return e.categories[PARAMS] + e.categories[STATE]


# ----------------------------------------------------------------------------------------------
# FSDP2 (train/distributed.py; docs/distributed.md): `fully_shard` per block, bf16
# `param_dtype`, reshard after forward, keeps 1/N of the parameters, gradients and optimizer
# state per GPU and gathers the unit it works on and the prefetched next (bf16 weights, and
# gradients in the parameters' dtype before their reduce-scatter). DDP needs nothing here: its
# gradients live in the buckets (`gradient_as_bucket_view=True`), and sharded Muon and ZeRO-1
# are in the formulas above through `Dims.ddp_ranks`.


def fsdp_per_gpu(d: Dims, shards: int) -> tuple[dict[str, int], int]:
    """Bytes per category on one GPU under FSDP over `shards` GPUs (the gathered units counted
    as weight copies) and the peak: the sharded state, the two gathered units, lm_head
    gathered while the loss runs (in bf16, so autocast makes no copies of it), and a DPO run's
    reference, whole."""
    c = estimate(replace(d, strategy="fsdp", world=shards)).categories
    per = 2 + d.param_bytes  # bf16 weights gathered + gradients (the parameters' dtype)
    in_blocks = sum(p.numel for p in d.params if p.name.startswith("blocks."))
    gathered = 2 * max(1, in_blocks // d.model.n_layer) * per  # two units (blocks)
    per_gpu = {k: v // shards if k in (PARAMS, GRADS, STATE, SCRATCH) else v for k, v in c.items()}
    per_gpu[COPIES] += gathered
    # DPO's frozen reference is whole on every rank (train/growth.py's base_copy builds it so)
    sharded = (c[PARAMS] + c[GRADS] + c[STATE]) // shards + c[REF]
    head = d.model.padded_vocab * d.model.d_model * per
    forward_backward = sharded + gathered + c[ACT] + max(c[LOSS] + head, c[BWD] + gathered)
    sampling = sharded + gathered + c[KV]  # RL's (0 for the others): the units it gathers too
    return per_gpu, max(forward_backward, sampling, sharded + c[SCRATCH] // shards)
