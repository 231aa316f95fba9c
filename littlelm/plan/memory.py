"""The analytic memory model: bytes per category of one training step, as pure functions.

The trace (plan/trace.py) is the reference: it runs the real step on fake tensors. This model
counts the same tensors with formulas where the trace would be too slow or cannot run: the
search over micro-batch sizes and remedies, FSDP's shards, 8-bit AdamW (CUDA-only), plans with
--no-trace. tests/test_plan_memory.py holds it within 10% of the trace, category by category
and phase by phase, over five configs; a plan scales it by the trace's peak over its own at
the configured micro-batch (`Dims.trace_scale`), so that the two never disagree in one plan.

Every formula follows what littlelm's step allocates (model/gpt.py, model/kernels.py,
train/step.py, optim/), tensor by tensor; docs/planning.md explains each. `estimate` returns
the categories and the peak of each phase of a step:

    forward/backward  parameters + optimizer state + gradients (all of them from the second
                      micro-batch on; only lm_head's when grad_accum = 1) + weight copies
                      + activations + max(logits & loss, residual grad + backward temporaries)
    optimizer step    parameters + optimizer state + gradients + optimizer scratch

Attention is FlashAttention's, as a GPU runs it (and as the trace stands it in): it keeps a
log-sum-exp per head and row, and its backward has an fp32 dq accumulator. The elementwise ops
are the hand-written ones (model/kernels.py), whose tensors CUDA's fused F.rms_norm and autograd
versions keep too. Not modelled: FP8 linears (planned as bf16, an upper bound) and
torch.compile (planned as eager).
"""

from __future__ import annotations

import math
from dataclasses import replace

from littlelm.model.kernels import group_rows
from littlelm.plan.accounting import (
    ACT,
    BWD,
    COPIES,
    FB,
    GRADS,
    LOSS,
    OPT,
    PARAMS,
    SCRATCH,
    STATE,
    Memory,
    block_bytes,
)
from littlelm.plan.shapes import Dims

# ----------------------------------------------------------------------------------------------
# Static: parameters, gradients, optimizer state, weight copies


def parameter_bytes(d: Dims) -> int:
    """Parameters and the RoPE tables, in train.master_weights' dtype (fp32 or bf16)."""
    pb = d.param_bytes
    weights = sum(block_bytes(pb * p.numel) for p in d.params)
    return weights + sum(block_bytes(pb * n) for n in d.buffers)


def gradient_bytes(d: Dims) -> int:
    return sum(block_bytes(d.param_bytes * p.numel) for p in d.params)


BNB_MIN_8BIT = 4096  # bitsandbytes keeps tensors smaller than this in 32-bit state
BNB_BLOCK = 256  # elements per quantization block (one fp32 absmax each)


def adamw_state_bytes(d: Dims, numel: int) -> int:
    """exp_avg + exp_avg_sq in the parameters' dtype and a step counter (torch's fused AdamW);
    8-bit AdamW (bitsandbytes): one byte each plus an fp32 absmax per block of 256."""
    if d.adamw_8bit and numel >= BNB_MIN_8BIT:
        return 2 * block_bytes(numel) + 2 * block_bytes(4 * -(-numel // BNB_BLOCK))
    if d.adamw_8bit:
        return 2 * block_bytes(4 * numel)
    return 2 * block_bytes(d.param_bytes * numel) + block_bytes(4)


def optimizer_state_bytes(d: Dims) -> int:
    """AdamW (or 8-bit AdamW) for its parameters; Muon: one momentum buffer per matrix in the
    parameters' dtype. Under ddp, rank 0's share: the Muon matrices it owns (sharded Muon) and
    1/world of every AdamW tensor (ZeRO-1); fsdp is divided in fsdp_peak."""
    w = d.ddp_ranks
    total = sum(
        block_bytes(d.param_bytes * math.prod(shape)) * d.muon_owned(count)
        for shape, count in d.muon_buckets()
    )
    for p in d.params:
        if not d.muon_param(p):
            total += adamw_state_bytes(d, -(-p.numel // w) if d.shard_adamw else p.numel)
    return total


def weight_copy_bytes(d: Dims) -> int:
    """Weights a matmul reads in another dtype than they are stored in, kept by autograd until
    that matmul's backward: q, k and v run as one matmul against their weights concatenated
    (a new tensor in every precision); under bf16 autocast with fp32 master weights every
    other block matmul weight is cast to bf16 once per forward (the autocast cache), and the
    plain loss casts lm_head's real rows. The chunked loss's bf16 lm_head is transient (it
    is counted with the loss). bf16 master weights need no casts."""
    m, C = d.model, d.model.d_model
    qkv = (m.n_head + 2 * m.kv_heads) * m.head_dim * C
    a = 2 if d.bf16 else 4
    # under activation checkpointing the stack is remade with its layer in the backward pass
    total = 0 if d.checkpointing else m.n_layer * block_bytes(a * qkv)
    if not d.bf16 or d.master_bf16:
        return total
    attn_in = ("attn.c_q.", "attn.c_k.", "attn.c_v.")
    mats = [p for p in d.params if p.role == "matrix" and not any(k in p.name for k in attn_in)]
    total += sum(block_bytes(2 * p.numel) for p in mats)
    if d.loss == "plain":
        total += block_bytes(2 * m.vocab_size * C)
    return total


# ----------------------------------------------------------------------------------------------
# Activations: what the forward keeps for backward


def layer_activation_bytes(d: Dims, layer: int) -> float:
    """Bytes per token that block `layer` keeps for backward (model/gpt.py, model/kernels.py)."""
    m, a, sb = d.model, (2 if d.bf16 else 4), d.param_bytes
    C, H, Hkv = m.d_model, m.n_head, m.kv_heads
    q, kv = H * m.head_dim, Hkv * m.head_dim
    ve = m.has_value_embed(layer)
    # the stream (the embedding's dtype): the mixed input, after attention, after the MLP
    total = (3 if m.residual_scalars else 2) * sb * C
    total += 2 * a * C + 2 * 4  # two norms' outputs, written in the matmul dtype, and 1/rms
    if m.norm_affine:
        total += 2 * a * C  # the gain's product is a new tensor; its mul keeps the norm output
    # q, k and v come out of one matmul; that output stays alive while qk-norm keeps q and k
    # (views of it) or attention keeps v (a view of it, when no value embedding replaces v)
    if m.qk_norm or not ve:
        total += a * (q + 2 * kv)
    if m.qk_norm:
        total += 4 * (H + Hkv)  # 1/rms per head
    if m.qk_norm and m.qk_norm_affine:
        total += a * (q + kv)  # the gains' product is a new tensor
    total += a * (q + kv)  # q and k after RoPE, kept by attention
    if ve:  # v + gate·ve, ve in the matmul dtype, the gate's sigmoid and 2·sigmoid
        total += 2 * a * kv + 2 * a * Hkv
    total += a * q + 4 * H  # attention output and FlashAttention's log-sum-exp (fp32)
    return total + mlp_activation_bytes(d)


def mlp_activation_bytes(d: Dims) -> int:
    """Per token. SwiGLU keeps both projections, SiLU's output and the product; relu² (one
    hand-written op) keeps relu's output and its square."""
    a, h = (2 if d.bf16 else 4), d.model.hidden
    return 4 * a * h if d.model.mlp == "swiglu" else 2 * a * h


def activation_bytes(d: Dims) -> int:
    """All blocks (with activation checkpointing only their inputs), plus the embedding's
    lookup and its normalised x0, norm_f, the token ids and the RoPE tables cast to bf16."""
    m, N, sb = d.model, d.tokens, d.param_bytes
    if d.checkpointing:  # each layer keeps only its input; the last layer's output too
        per_token = m.n_layer * sb * m.d_model
    else:
        per_token = sum(layer_activation_bytes(d, i) for i in range(m.n_layer))
    per_token += 2 * sb * m.d_model + 2 * 4 + 8 * 2  # lookup, x0, 2 norms' 1/rms, ids
    if d.loss == "plain":
        per_token += (2 if d.bf16 else 4) * m.d_model  # norm_f's output, kept by lm_head
    casts = d.bf16 and not d.master_bf16
    rope = 2 * block_bytes(2 * d.seq_len * m.head_dim) if casts else 0
    return int(per_token * N) + rope


# ----------------------------------------------------------------------------------------------
# The loss: logits, softcap, log-softmax, and their gradients


def loss_stage_bytes(d: Dims) -> dict[str, float]:
    """Live bytes of the loss's own tensors at each of its expensive moments (model/kernels.py)."""
    return plain_loss_stages(d) if d.loss == "plain" else chunked_loss_stages(d)


def chunked_loss_stages(d: Dims) -> dict[str, float]:
    """The chunked loss (model/kernels.py) makes, during the forward pass, each chunk's logits
    and their gradient, written into a buffer (matmul dtype) shared by a group of chunks
    (group_rows); at a group's end one product makes d(x) for its rows (into the (N, C)
    d(x)) and one makes its (V, C) share of d(lm_head), which is summed in fp32. Beside the
    rows' tensors (mask, scale, d(x)) and the buffer, three moments:

    - inside a chunk of n rows: the matmul's output, its fp32 copy and (soft cap) the copy's
      sigmoid scaled anew; in fp32 the copy is the output itself, and the chunk's small
      per-row tensors (targets, gathers, sums) are alive beside its fp32 rows. d(lm_head)
      exists only from the end of the first group on;
    - a group's end: the (V, C) product in the matmul dtype beside its fp32 sum (the first
      group's cast, or the running sum of the earlier groups; in fp32 the first product is
      the sum itself);
    - the loss's backward: d(x) and d(lm_head) scaled by the incoming gradient (the latter
      into a zero-padded tensor of lm_head's dtype when padded rows or dtypes differ)."""
    m, N, a = d.model, d.tokens, (2 if d.bf16 else 4)
    C, V, Vp = m.d_model, m.vocab_size, m.padded_vocab
    n = min(d.model.loss_chunk, N)
    rows = block_bytes(N) + block_bytes(4 * N) + block_bytes(a * N * C)  # mask, scale, d(x)
    rows += BLOCK_SCALAR  # the running loss sum
    dw = block_bytes(4 * V * C)
    group = min(group_rows(N, n, V, a), N)
    buf = block_bytes(a * group * V)
    many_groups = group < N
    fp32_rows = 2 if m.softcap is not None else 1
    logits_copy = block_bytes(a * n * V) if a != 4 else 0  # the matmul output, before .float()
    small = block_bytes(8 * n) + 6 * block_bytes(4 * n) + BLOCK_SCALAR  # per-row tensors
    chunk = fp32_rows * block_bytes(4 * n * V) + max(logits_copy, small)
    product = block_bytes(a * V * C)
    running = dw if (a != 4 or many_groups) else 0
    padded = Vp != V or d.param_bytes != 4
    return {
        "chunk": rows + buf + chunk + (dw if many_groups else 0),
        "group": rows + buf + product + running,
        "backward": rows
        + block_bytes(a * N * C)
        + 2 * dw
        + (block_bytes(d.param_bytes * Vp * C) if padded else 0),
    }


BLOCK_SCALAR = 512  # a 0-d or tiny tensor takes one allocator block


def plain_loss_stages(d: Dims) -> dict[str, float]:
    """The plain loss: lm_head over the real rows, its fp32 copy, the soft cap (tanh keeps
    its output), log-softmax (keeps its output), and their gradients in the backward."""
    m, N = d.model, d.tokens
    C, V = m.d_model, m.vocab_size
    cap = m.softcap is not None
    x = 2 * C if d.bf16 else 0  # norm_f output (counted in activations)
    logits = (2 * V + 4 * V) if d.bf16 else 4 * V  # matmul output (+ its fp32 copy)
    saved = 8 * V if cap else 4 * V  # tanh output + log-softmax output, or log-softmax only
    head_grad = (2 + d.param_bytes) * V * C if d.bf16 else 4 * V * C
    return {
        "logits": N * logits,
        "softcap": N * (4 * V + 8 * V) if cap else 0,
        "log-softmax": N * (saved + 4 * V + (0 if cap else (logits - 4 * V))),
        "backward": N * (saved + 8 * V),
        "lm_head backward": N * (x + (2 if d.bf16 else 4) * V) + head_grad,
    }


def loss_bytes(d: Dims) -> int:
    return int(max(loss_stage_bytes(d).values()))


# ----------------------------------------------------------------------------------------------
# Backward temporaries of one block


def block_backward_stages(d: Dims) -> dict[str, float]:
    """Live backward temporaries (bytes, the stream's gradients included) at the expensive
    moments of one block's backward: the MLP's hidden gradients; q and k's gradients (side by
    side, one tensor) through RoPE (its output beside one temporary, the swapped halves) and
    qk-norm (one output), with v's gradient waiting beside them; and the gradients of q, k, v stacked for the one matmul,
    with that matmul's input gradient."""
    m, N, a, sb = d.model, d.tokens, (2 if d.bf16 else 4), d.param_bytes
    C, q, kv, h = m.d_model, m.n_head * m.head_dim, m.kv_heads * m.head_dim, m.hidden
    base = residual_grad_bytes(d) / N
    mlp = (3 if m.mlp == "swiglu" else 2) * a * h
    qkv = 2 * a * (q + 2 * kv) + a * C + (sb * C if m.residual_scalars else 0)
    # FlashAttention's backward: the output's gradient, an fp32 accumulator for dq and the
    # softmax row sums, dq, dk and dv; under GQA dk and dv at the query heads' width first,
    # then summed into the key/value heads' (flash_api.cpp, mha_bwd)
    gqa = m.kv_heads != m.n_head
    flash = a * q + 4 * q + 4 * m.n_head + a * q + 2 * a * kv + (2 * a * q if gqa else 0)
    fixed = 3 * BLOCK_SCALAR + (2 * BLOCK_SCALAR if m.residual_scalars else 0)
    if m.tie_embeddings:  # the lm_head half of the tied embedding's gradient waits for the rest
        fixed += block_bytes(d.param_bytes * m.padded_vocab * C)
    rope_norm = 3 * a * (q + kv) + a * kv  # d(q|k), RoPE's output, the swapped halves; d(v)
    stages = {
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
            if k in stages:
                stages[k] -= (mlp_activation_bytes(d) + a * C) * N
    return {k: v + fixed for k, v in stages.items()}


def residual_grad_bytes(d: Dims) -> int:
    """The stream's gradient passed down the blocks (the stream's dtype). Without residual
    scalars it accumulates in place; with them x0's gradient accumulates beside it."""
    m = d.model
    return d.param_bytes * m.d_model * (2 if m.residual_scalars else 1) * d.tokens


def backward_temp_bytes(d: Dims) -> int:
    return int(max(block_backward_stages(d).values()))


# ----------------------------------------------------------------------------------------------
# Optimizer step scratch


def adamw_scratch(d: Dims, numels: list[int]) -> int:
    """torch's fused AdamW updates each tensor in one kernel, without temporaries. The
    stochastic-rounding AdamW (optim/lowp.py) computes each tensor's update in fp32: three
    tensors of the largest size at once."""
    return 3 * block_bytes(4 * max(numels)) if d.stochastic_rounding else 0


def clip_scratch(d: Dims) -> int:
    """Gradient clipping (train/step.py) takes one fp32 norm per tensor before the step."""
    return (len(d.params) + 2) * block_bytes(4)  # + their stack and the total


def muon_scratch(shape: tuple[int, int], count: int, nesterov: bool, ns_bytes: int = 2) -> int:
    """Muon on `count` same-shaped matrices: the Nesterov direction (fp32), its stack (fp32),
    then Newton–Schulz in `ns_bytes` per element (bf16: 2, fp32: 4): x, a·x, poly·x, their sum
    and two Gram-sized matrices."""
    rows, cols = shape
    k = count * rows * cols
    s = min(rows, cols)
    directions = 4 * k if nesterov else 0
    return directions + 4 * k + 4 * ns_bytes * k + 2 * ns_bytes * count * s * s


def sharded_exchange_bytes(
    shape: tuple[int, ...], owned: int, world: int, ns_bytes: int = 2
) -> int:
    """Sharded Muon under ddp: the updates of the owned matrices (in the Newton–Schulz dtype)
    and the all-gather of every rank's (world x owned matrices)."""
    return ns_bytes * (world + 1) * owned * math.prod(shape)


def zero1_gather_bytes(d: Dims) -> int:
    """ZeRO-1 AdamW: this rank's flat slices and the all-gather of every rank's (fp32)."""
    w = d.ddp_ranks
    slices = sum(-(-p.numel // w) for p in d.params if not d.muon_param(p))
    return 4 * (w + 1) * slices


def optimizer_scratch_bytes(d: Dims) -> int:
    peak = clip_scratch(d)
    w = d.ddp_ranks
    for params in d.groups().values():
        adam = [p.numel for p in params if not d.muon_param(p)]
        if adam:
            numels = [-(-n // w) for n in adam] if d.shard_adamw else adam
            peak = max(peak, adamw_scratch(d, numels))
    for shape, count in d.muon_buckets():
        owned = d.muon_owned(count)
        need = muon_scratch(shape, owned, d.nesterov, d.ns_bytes)  # type: ignore[arg-type]
        if owned < count:
            need += sharded_exchange_bytes(shape, owned, w, d.ns_bytes)
        peak = max(peak, need)
    if d.shard_adamw and w > 1:
        peak = max(peak, zero1_gather_bytes(d))
    return peak


# ----------------------------------------------------------------------------------------------
# The whole step


def estimate(d: Dims) -> Memory:
    """The whole step, every figure times `d.trace_scale` (1 unless a plan anchored it)."""
    cats = {
        PARAMS: parameter_bytes(d),
        GRADS: gradient_bytes(d),
        STATE: optimizer_state_bytes(d),
        COPIES: weight_copy_bytes(d),
        ACT: activation_bytes(d),
        LOSS: loss_bytes(d),
        BWD: backward_temp_bytes(d),
        SCRATCH: optimizer_scratch_bytes(d),
    }
    f = d.trace_scale

    def scaled(c: dict[str, int]) -> dict[str, int]:
        return c if f == 1 else {k: round(v * f) for k, v in c.items()}

    breakdowns = {k: scaled(v) for k, v in phase_breakdowns(d, cats).items()}
    source = "analytic model" + (f" x {f:.4f} (the trace's peak over its own)" if f != 1 else "")
    return Memory(scaled(cats), breakdowns, source)


def phase_breakdowns(d: Dims, c: dict[str, int]) -> dict[str, dict[str, int]]:
    """What is alive at the peak of each phase, by category (the sum is the phase's peak).

    The forward/backward peak is the largest of three moments: the loss (every activation
    alive; the chunked loss peaks inside the forward pass, before any gradient of this
    micro-batch), the top block's backward (each of its stages), and (grad_accum = 1, where
    gradients appear during backward) the bottom block's, with nearly every gradient made and
    nearly every activation freed."""
    m, N, L, a = d.model, d.tokens, d.model.n_layer, (2 if d.bf16 else 4)
    kept = {PARAMS: c[PARAMS], STATE: c[STATE]}
    head_grad = block_bytes(d.param_bytes * m.padded_vocab * m.d_model)
    if d.checkpointing:
        layer = [int(m.d_model * d.param_bytes * N)] * L
    else:
        layer = [int(layer_activation_bytes(d, i) * N) for i in range(L)]
    accumulating = d.grad_accum > 1
    qkv = (m.n_head + 2 * m.kv_heads) * m.head_dim * m.d_model
    recomputed = block_bytes(a * qkv) if d.checkpointing else 0  # one layer's q, k, v stack
    if accumulating:
        grads_top = grads_bottom = c[GRADS]
    else:
        embeds = sum(block_bytes(4 * p.numel) for p in d.params if p.role.endswith("embedding"))
        grads_top, grads_bottom = head_grad, c[GRADS] - embeds
    loss = {**kept, COPIES: c[COPIES], ACT: c[ACT], LOSS: c[LOSS]}
    if d.loss == "plain":
        loss[GRADS] = grads_top
    else:  # norm_f's output and lm_head cast for the chunks are alive beside the loss
        loss[ACT] += block_bytes(a * N * m.d_model)
        if d.bf16 and not d.master_bf16:
            loss[COPIES] += block_bytes(2 * m.vocab_size * m.d_model)
        loss[GRADS] = c[GRADS] if accumulating else 0
    # the top block's backward, at each of its moments: by the attention's, its MLP's
    # tensors and norm2's output are freed (with checkpointing the stages count that already)
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
    moments = [
        loss,
        *top,
        {
            **kept,
            COPIES: c[COPIES] // L if d.bf16 else 0,
            ACT: c[ACT] - sum(layer) + layer[0],
            GRADS: grads_bottom,
            BWD: c[BWD],
        },
    ]
    return {
        FB: max(moments, key=lambda x: sum(x.values())),
        OPT: {**kept, GRADS: c[GRADS], SCRATCH: c[SCRATCH]},
    }


def resume_device_bytes(e: Memory) -> int:
    """GPU memory while resuming. load_checkpoint reads the checkpoint into host RAM, then
    load_state_dict copies the optimizer state to the GPU one tensor at a time (same dtype, so
    no cast temporaries): the GPU holds the weights and one copy of the state, below the step's
    peak. A loader that mapped the checkpoint straight to the GPU would hold the state twice."""
    return e.categories[PARAMS] + e.categories[STATE]


def resume_host_bytes(e: Memory, d: Dims, ranks_per_node: int = 1) -> tuple[int, int]:
    """Host RAM of one node while resuming: (page cache, private memory of all its ranks).
    load_checkpoint memory-maps the checkpoint (weights + optimizer state): its pages sit in
    the page cache once per node whatever the number of ranks (they map the same files), and
    the kernel can drop them under pressure; each rank owns only the tensor it is copying to
    its GPU (the largest: the embedding or lm_head in fp32). Measured on the CPU at 100M
    parameters: peak RSS per rank 0.49x at 2 ranks (0.56x at 1) of reading the whole
    checkpoint into each rank (benchmarks/resume_memory.py --phase resume)."""
    largest = max((p.numel for p in d.params), default=0) * 4
    return e.categories[PARAMS] + e.categories[STATE], largest * ranks_per_node


# ----------------------------------------------------------------------------------------------
# FSDP (train/model_parallel.py; docs/distributed.md has the formulas). DDP needs nothing here:
# its gradients live in the all-reduce buckets (`gradient_as_bucket_view=True`), and sharded
# Muon and ZeRO-1 are in optimizer_state_bytes through `Dims.ddp_ranks`. FSDP2 (`fully_shard`
# per block, bf16 `param_dtype`, reshard after forward) keeps 1/N of the parameters, gradients
# and optimizer state per GPU, and gathers the units it is working on: the current one and the
# prefetched next (bf16 weights, gradients in the parameters' dtype before their reduce-scatter).


def layer_param_numel(d: Dims) -> int:
    blocks = [p for p in d.params if p.name.startswith("blocks.")]
    return max(1, sum(p.numel for p in blocks) // d.model.n_layer)


def fsdp_categories(d: Dims, shards: int) -> dict[str, int]:
    """Bytes per category on one GPU under FSDP over `shards` GPUs: parameters, gradients,
    optimizer state and scratch split, the two gathered units counted as weight copies."""
    c = dict(estimate(replace(d, strategy="fsdp", world=shards)).categories)
    for k in (PARAMS, GRADS, STATE, SCRATCH):
        c[k] //= shards
    c[COPIES] += 2 * layer_param_numel(d) * (2 + d.param_bytes)
    return c


def fsdp_peak(d: Dims, shards: int) -> int:
    """Peak tensor bytes per GPU under FSDP over `shards` GPUs (each runs its own micro-batch):
    the sharded state, the two gathered units, and lm_head gathered while the loss runs (the
    weights are gathered in bf16, so autocast makes no copies of them)."""
    c = estimate(replace(d, strategy="fsdp", world=shards)).categories
    sharded = (c[PARAMS] + c[GRADS] + c[STATE]) // shards
    per = 2 + d.param_bytes  # bf16 weights gathered + gradients (the parameters' dtype)
    gathered = 2 * layer_param_numel(d) * per
    head = d.model.padded_vocab * d.model.d_model * per
    forward_backward = sharded + gathered + c[ACT] + max(c[LOSS] + head, c[BWD] + gathered)
    return max(forward_backward, sharded + c[SCRATCH] // shards)
