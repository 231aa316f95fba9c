"""The analytic memory model: bytes per category of one training step, as pure functions.

Every formula follows what littlelm's step allocates (model/gpt.py, model/loss.py,
train/trainer.py, optim/), tensor by tensor; docs/planning.md explains each. `estimate`
returns the categories and the peak of each phase of a step:

    forward/backward  parameters + optimizer state + gradients (all of them from the second
                      micro-batch on; only lm_head's when grad_accum = 1) + weight copies
                      + activations + max(logits & loss, residual grad + backward temporaries)
    optimizer step    parameters + optimizer state + gradients + optimizer scratch

`Kernels` says whose kernels run. On CUDA, RMSNorm is one fused kernel that keeps its input and
1/rms (autocast runs it in fp32); PyTorch's CPU path is a chain of fp32 ops that also keeps x/rms
when the norm has a gain, and whose backward holds five row-sized fp32 tensors at once. CUDA
autocast also runs `pow` in fp32 (relu²'s square), and CUDA's FlashAttention backward adds an
fp32 accumulator. (The op lists of CUDA and CPU autocast differ; these are the ops of this model
where they do.) The plan uses "cuda"; the trace (CPU kernels)
is compared with "cpu".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from littlelm.plan.accounting import block_bytes
from littlelm.plan.shapes import Dims, buffer_shapes

Kernels = Literal["cuda", "cpu"]

PARAMS, GRADS, STATE = "parameters", "gradients", "optimizer state"
COPIES, ACT, LOSS = "weight copies", "activations", "logits & loss"
BWD, SCRATCH = "backward temporaries", "optimizer scratch"
CATEGORIES = (PARAMS, GRADS, STATE, COPIES, ACT, LOSS, BWD, SCRATCH)
FB, OPT = "forward/backward", "optimizer step"


@dataclass(frozen=True)
class Estimate:
    """Bytes per category and the peak of each phase (tensor memory of one device)."""

    categories: dict[str, int]
    phases: dict[str, int]
    dims: Dims
    kernels: Kernels = "cuda"

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    def peak_breakdown(self) -> dict[str, int]:
        """What is alive at the peak, by category (sums to `peak`)."""
        return phase_breakdowns(self.dims, self.categories, self.kernels)[self.peak_phase]


# ----------------------------------------------------------------------------------------------
# Static: parameters, gradients, optimizer state, weight copies


def parameter_bytes(d: Dims) -> int:
    weights = sum(block_bytes(4 * p.numel) for p in d.params)
    return weights + sum(block_bytes(4 * math.prod(s)) for s in buffer_shapes(d.model))


def gradient_bytes(d: Dims) -> int:
    return sum(block_bytes(4 * p.numel) for p in d.params)


def optimizer_state_bytes(d: Dims) -> int:
    """AdamW: exp_avg + exp_avg_sq (fp32) and a step counter per tensor; Muon: one fp32
    momentum buffer per matrix."""
    total = 0
    for p in d.params:
        if d.muon_param(p):
            total += block_bytes(4 * p.numel)
        else:
            total += 2 * block_bytes(4 * p.numel) + block_bytes(4)
    return total


def weight_copy_bytes(d: Dims) -> int:
    """Under bf16 autocast every weight a matmul reads is cast to bf16 once per forward (the
    autocast cache) and kept by autograd until that matmul's backward."""
    if not d.bf16:
        return 0
    m = d.model
    mats = [p for p in d.params if p.role == "matrix"]
    head = m.padded_vocab * m.d_model  # lm_head (or the tied embedding) as a matmul weight
    return sum(block_bytes(2 * p.numel) for p in mats) + block_bytes(2 * head)


# ----------------------------------------------------------------------------------------------
# Activations: what the forward keeps for backward


def layer_activation_bytes(d: Dims, layer: int, kernels: Kernels) -> float:
    """Bytes per token that block `layer` keeps for backward."""
    m, a = d.model, (2 if d.bf16 else 4)
    C, q, kv = m.d_model, m.n_head * m.head_dim, m.kv_heads * m.head_dim
    total = (3 if m.residual_scalars else 2) * 4 * C  # fp32 residual stream
    n_in = 2 if m.mlp == "swiglu" else 1
    total += (3 + n_in) * 2 * C if d.bf16 else 2 * 4 * C  # matmul inputs
    if m.qk_norm:
        # RMSNorm keeps its input in fp32: CUDA autocast runs rms_norm in fp32 (a cast of the
        # bf16 q and k), PyTorch's CPU path upcasts inside; plus 1/rms per head
        total += 4 * (q + kv) + 4 * (m.n_head + m.kv_heads)
    total += a * (q + kv) + a * kv  # q, k after RoPE and v, kept by attention
    total += a * q + 4 * m.n_head  # attention output and its log-sum-exp
    total += 2 * 4  # RMSNorm 1/rms per token, two norms
    if m.norm_affine and kernels == "cpu":
        total += 2 * 4 * C  # the CPU path keeps x/rms (fp32) for the gain's gradient
    total += mlp_activation_bytes(d, kernels)
    if m.has_value_embed(layer):
        total += 4 * kv + 2 * a * m.kv_heads + (a * m.ve_gate_channels if d.bf16 else 0)
    return total


def mlp_activation_bytes(d: Dims, kernels: Kernels) -> int:
    """Per token. SwiGLU keeps both projections, SiLU's output and the product. relu² keeps
    relu's output and its square; on CUDA, autocast runs `pow` (the square) in fp32, so it keeps
    an fp32 copy of relu's output and a bf16 copy of the square for the next matmul."""
    a, h = (2 if d.bf16 else 4), d.model.hidden
    if d.model.mlp == "swiglu":
        return 4 * a * h
    if kernels == "cuda" and d.bf16:
        return 2 * a * h + 4 * h
    return 2 * a * h


def activation_bytes(d: Dims, kernels: Kernels = "cuda") -> int:
    """All blocks, plus the embedding's output, x0, the token ids and the RoPE tables."""
    m, N = d.model, d.tokens
    per_token = sum(layer_activation_bytes(d, i, kernels) for i in range(m.n_layer))
    per_token += 4 * m.d_model * 2 + 4 * 2 + 8 * 2  # embedding, x0 (fp32), 2 norms, ids
    if not d.bf16:
        per_token += 4 * m.d_model  # norm_f output, kept by lm_head
    if m.norm_affine and kernels == "cpu":
        per_token += 4 * m.d_model  # norm_f's x/rms
    rope = 2 * block_bytes(2 * d.seq_len * m.head_dim // 2) if d.bf16 else 0
    return int(per_token * N) + rope


# ----------------------------------------------------------------------------------------------
# The loss: logits, softcap, log-softmax, and their gradients


def loss_stage_bytes(d: Dims, kernels: Kernels = "cuda") -> dict[str, float]:
    """Live bytes of the loss's tensors at each of its expensive moments (model/loss.py)."""
    m, N = d.model, d.tokens
    C, V, Vp = m.d_model, m.vocab_size, m.padded_vocab
    cap = m.softcap is not None
    x = 2 * C if d.bf16 else 0  # norm_f output cast for lm_head (fp32: counted in activations)
    if d.bf16:
        logits = 2 * Vp + 4 * V  # bf16 matmul output + its fp32 copy
    else:
        logits = 4 * Vp + (4 * V if (Vp > V and not cap) else 0)  # + reshape copy of a slice
    saved = 8 * V if cap else 4 * V  # tanh output + log-softmax output, or log-softmax only
    head_grad = (6 if d.bf16 else 4) * Vp * C  # lm_head's weight grad: bf16, then fp32
    stages = {
        "logits": N * (x + logits),
        "softcap": N * (x + (4 * Vp if not d.bf16 else 4 * V) + 8 * V) if cap else 0,
        "log-softmax": N * (x + saved + 4 * V + (0 if cap else (logits - 4 * V))),
        "backward": N * (x + saved + 8 * V),
        "lm_head backward": N * (x + (2 if d.bf16 else 4) * Vp) + head_grad,
        "norm_f backward": N * norm_backward_bytes(d, kernels),
    }
    return stages


def norm_backward_bytes(d: Dims, kernels: Kernels) -> int:
    """Per token, at an RMSNorm's backward: CUDA's fused kernel makes the input's gradient; the
    CPU path runs a chain of fp32 elementwise ops (five tensors of the row size alive)."""
    return (8 if kernels == "cuda" else 20) * d.model.d_model


def loss_bytes(d: Dims, kernels: Kernels = "cuda") -> int:
    return int(max(loss_stage_bytes(d, kernels).values()))


# ----------------------------------------------------------------------------------------------
# Backward temporaries of one block


def block_backward_stages(d: Dims, kernels: Kernels) -> dict[str, float]:
    """Live backward temporaries (bytes, the stream's gradient included) at the expensive
    moments of one block's backward."""
    m, N, a = d.model, d.tokens, (2 if d.bf16 else 4)
    C, q, kv, h = m.d_model, m.n_head * m.head_dim, m.kv_heads * m.head_dim, m.hidden
    fused = kernels == "cuda"
    base = residual_grad_bytes(d, kernels) / N
    norm = norm_backward_bytes(d, kernels)
    ve = any(m.has_value_embed(i) for i in range(m.n_layer))
    v_grad = 4 * kv if ve else a * kv
    # gradients of the MLP's hidden tensors; relu²'s square runs in fp32 under CUDA autocast
    if m.mlp == "swiglu":
        mlp = 3 * a * h
    else:
        mlp = 16 * h if (fused and d.bf16) else 4 * a * h
    if m.qk_norm:  # fp32 gradients through RoPE and the norm (CUDA), or the CPU's op chain
        qk = v_grad + a * kv + ((8 + a) * q if fused else 20 * q)
    else:
        qk = v_grad + a * kv + 2 * a * q
    w_mlp = (2 + 4) * C * h if d.bf16 else 4 * C * h
    # FlashAttention's backward on CUDA: the output's gradient, an fp32 accumulator for dq and
    # the softmax row sums, dq, and dk/dv at the query heads' width under GQA (summed after)
    gqa = m.kv_heads != m.n_head
    flash = a * q + 4 * q + 4 * m.n_head + a * q + (2 * a * q if gqa else 2 * a * kv)
    return {
        "attention kernel": N * (base + flash) if fused else 0,
        "mlp": N * (base + mlp),
        "mlp out projection": N * (base + a * C + a * h) + w_mlp,
        "norm": N * (base + norm),
        "attention": N * (base + qk),
        "attention inputs": N * (base + (4 * C if ve else 0) + 3 * 4 * C),
    }


def residual_grad_bytes(d: Dims, kernels: Kernels) -> int:
    """The stream's gradient passed down the blocks. Without residual scalars it accumulates in
    place; with them each block makes a new one and x0's gradient accumulates beside it. On the
    CPU an affine norm_f leaves one more fp32 tensor alive."""
    m = d.model
    per_token = 4 * m.d_model * (2 if m.residual_scalars else 1)
    if m.norm_affine and kernels == "cpu":
        per_token += 4 * m.d_model
    return per_token * d.tokens


def backward_temp_bytes(d: Dims, kernels: Kernels = "cuda") -> int:
    return int(max(block_backward_stages(d, kernels).values()))


# ----------------------------------------------------------------------------------------------
# Optimizer step scratch


def adamw_scratch(numels: list[int]) -> int:
    """torch's foreach AdamW takes sqrt(exp_avg_sq) of a whole group at once (fp32)."""
    return sum(block_bytes(4 * n) for n in numels)


def muon_scratch(shape: tuple[int, int], count: int, nesterov: bool) -> int:
    """Muon on `count` same-shaped matrices: the Nesterov direction (fp32), its stack (fp32),
    then Newton–Schulz in bf16: x, a·x, poly·x, their sum and two Gram-sized matrices."""
    rows, cols = shape
    k = count * rows * cols
    s = min(rows, cols)
    directions = 4 * k if nesterov else 0
    return directions + 4 * k + 4 * 2 * k + 2 * 2 * count * s * s


def optimizer_scratch_bytes(d: Dims) -> int:
    peak = 0
    for params in d.groups().values():
        adam = [p.numel for p in params if not d.muon_param(p)]
        if adam:
            peak = max(peak, adamw_scratch(adam))
        shapes: dict[tuple[int, ...], int] = {}
        for p in params:
            if d.muon_param(p):
                shapes[p.shape] = shapes.get(p.shape, 0) + 1
        for shape, count in shapes.items():
            peak = max(peak, muon_scratch(shape, count, d.nesterov))  # type: ignore[arg-type]
    return peak


# ----------------------------------------------------------------------------------------------
# The whole step


def estimate(d: Dims, kernels: Kernels = "cuda") -> Estimate:
    cats = {
        PARAMS: parameter_bytes(d),
        GRADS: gradient_bytes(d),
        STATE: optimizer_state_bytes(d),
        COPIES: weight_copy_bytes(d),
        ACT: activation_bytes(d, kernels),
        LOSS: loss_bytes(d, kernels),
        BWD: backward_temp_bytes(d, kernels),
        SCRATCH: optimizer_scratch_bytes(d),
    }
    return Estimate(cats, phase_peaks(d, cats, kernels), d, kernels)


def phase_breakdowns(d: Dims, c: dict[str, int], kernels: Kernels) -> dict[str, dict[str, int]]:
    """What is alive at the peak of each phase, by category (the sum is the phase's peak).

    The forward/backward peak is the largest of three moments: the loss's backward (every
    activation alive), the top block's backward, and (grad_accum = 1, where gradients appear
    during backward) the bottom block's, with nearly every gradient made and nearly every
    activation freed."""
    m, N, L = d.model, d.tokens, d.model.n_layer
    kept = {PARAMS: c[PARAMS], STATE: c[STATE]}
    head_grad = block_bytes(4 * m.padded_vocab * m.d_model)
    layer = [int(layer_activation_bytes(d, i, kernels) * N) for i in range(L)]
    if d.grad_accum > 1:
        grads_top = grads_bottom = c[GRADS]
    else:
        embeds = sum(block_bytes(4 * p.numel) for p in d.params if p.role.endswith("embedding"))
        grads_top, grads_bottom = head_grad, c[GRADS] - embeds
    live = {**kept, COPIES: c[COPIES], ACT: c[ACT], GRADS: grads_top}
    moments = [
        {**live, LOSS: c[LOSS]},
        {**live, BWD: c[BWD]},
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


def resume_device_bytes(e: Estimate) -> int:
    """GPU memory while resuming. load_checkpoint reads the checkpoint into host RAM, then
    load_state_dict copies the optimizer state to the GPU one tensor at a time (same dtype, so
    no cast temporaries): the GPU holds the weights and one copy of the state, below the step's
    peak. A loader that mapped the checkpoint straight to the GPU would hold the state twice."""
    return e.categories[PARAMS] + e.categories[STATE]


def resume_host_bytes(e: Estimate) -> int:
    """Host RAM while resuming: the whole checkpoint (weights + optimizer state)."""
    return e.categories[PARAMS] + e.categories[STATE]


def phase_peaks(d: Dims, c: dict[str, int], kernels: Kernels) -> dict[str, int]:
    return {k: sum(v.values()) for k, v in phase_breakdowns(d, c, kernels).items()}
