"""How long one optimizer step takes: the step's work, kind by kind, over the device's rates.

    step  = grad_accum x micro-batch + optimizer + exposed communication
    micro = sum over GEMMs and their three products (forward, input gradient, weight gradient)
                of max(FLOPs / matmul rate, bytes / bandwidth, launch)
            + causal attention FLOPs / attention rate
            + max(elementwise bytes / bandwidth, elementwise kernels x launch)

Every GEMM of the model is listed with its shape (forward one product, backward two), so the
shape of a run (micro-batch, sequence, width) moves the prediction through the rates measured
at those shapes, not through one assumed MFU. `Rates` say where each figure comes from: measured
on this machine (plan/probe.py), the catalog's datasheet times the documented ceilings
(gpus.yaml `defaults`), or a bench measurement's ratio (plan/calibration.py).

Not modelled: torch.compile's fusions (planned as eager), the overlap of host dispatch with a
previous kernel beyond the per-kernel max, and pipeline bubbles (littlelm has no pipeline
parallelism).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from littlelm.plan.shapes import Dims

# Elementwise passes of one block, in vectors of d_model (D) and of the MLP's hidden width (H)
# read plus written per token, forward; the backward moves about twice as much (each op reads
# its saved input and the incoming gradient and writes one gradient).
BLOCK_PASSES_D = 4 + 6  # two RMSNorms (read + write), two residual adds (2 reads + 1 write)
RESIDUAL_SCALAR_PASSES_D = 6  # x = l_resid * x + l_x0 * x0 before each block
BACKWARD_FACTOR = 2.0
KERNELS_PER_BLOCK = 60  # forward + backward kernels of one block outside its GEMMs (eager)


# The three products of a linear layer y = x W^T, x (m, k), W (n, k): each has its own operand
# layout (a CPU's BLAS runs them at different speeds: the probe times each)
PRODUCTS = ("forward", "input_grad", "weight_grad")  # x W^T; dy W; dy^T x


@dataclass(frozen=True)
class Gemm:
    """`count` products of (m, k) x (k, n) per micro-batch, forward; the backward runs two of
    the same size (input and weight gradients)."""

    name: str
    m: int
    k: int
    n: int
    count: int = 1
    fp8: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.count


@dataclass(frozen=True)
class Rates:
    """What a device achieves, in FLOP/s, bytes/s and seconds, with where each comes from."""

    matmul: float  # FLOP/s on large GEMMs in the run's compute dtype
    attention: float  # FLOP/s of causal attention, forward + backward
    bandwidth: float  # bytes/s of elementwise work
    launch: float  # seconds of host time per kernel (dispatch + launch)
    fp8_matmul: float | None = None
    interconnect: float | None = None  # bytes/s of ring bus bandwidth between GPUs
    # FLOP/s measured per GEMM and product (PRODUCTS), where probed
    gemm_rate: Callable[[Gemm, str], float] | None = None
    source: str = "assumed"
    calibration: float = 1.0  # measured / predicted step time of a bench on this device
    calibration_source: str = ""

    def gemm(self, g: Gemm, product: str = "forward") -> float:
        if g.fp8 and self.fp8_matmul:
            return self.fp8_matmul
        return self.gemm_rate(g, product) if self.gemm_rate else self.matmul


@dataclass
class StepTime:
    """Seconds of one optimizer step on one device, by kind of work (before calibration)."""

    parts: dict[str, float] = field(default_factory=dict)
    calibration: float = 1.0

    @property
    def raw(self) -> float:
        return sum(self.parts.values())

    @property
    def seconds(self) -> float:
        return self.raw * self.calibration


def gemms(d: Dims) -> list[Gemm]:
    """Every GEMM of one micro-batch's forward pass (the lm_head included)."""
    m = d.model
    M, D, hd = d.tokens, m.d_model, m.head_dim
    fp8 = d.fp8

    def lin(name, k, n, count=m.n_layer):
        return Gemm(name, M, k, n, count, fp8 and min(k, n) >= m.fp8_min_dim)

    out = [
        lin("q", D, m.n_head * hd),
        lin("k+v", D, 2 * m.kv_heads * hd),
        lin("attention out", m.n_head * hd, D),
    ]
    if m.mlp == "swiglu":
        out.append(lin("mlp gate+up", D, 2 * m.hidden))
    else:
        out.append(lin("mlp up", D, m.hidden))
    out.append(lin("mlp down", m.hidden, D))
    out.append(Gemm("lm_head", M, D, m.padded_vocab))  # the head stays in bf16 under fp8
    return out


def attention_flops(d: Dims) -> float:
    """Causal attention of one micro-batch, forward + backward: the forward's two products over
    the lower triangle (2 x 2 x B x H x T^2/2 x hd) and a backward of 2.5 forwards (it
    recomputes the scores, FlashAttention-style, as the CPU kernel does too)."""
    m = d.model
    forward = 2.0 * d.micro_batch * m.n_head * d.seq_len**2 * m.head_dim
    return forward * 3.5 * m.n_layer


def act_bytes(d: Dims) -> int:
    return 2 if d.bf16 else 4


def elementwise_bytes(d: Dims) -> float:
    """Bytes one micro-batch moves outside GEMMs and attention: norms, residuals, RoPE,
    activation functions, the loss's softmax, autocast's weight casts and the gradient
    accumulation into the parameters' dtype."""
    m, T = d.model, d.tokens
    es = act_bytes(d)
    qk = (m.n_head + m.kv_heads) * m.head_dim
    per_token = BLOCK_PASSES_D * m.d_model + 2 * qk  # RoPE on q and k: read + write
    if m.qk_norm:
        per_token += 2 * qk
    if m.residual_scalars:
        per_token += RESIDUAL_SCALAR_PASSES_D * m.d_model
    per_token += (3 if m.mlp == "swiglu" else 2) * m.hidden  # activation: inputs + output
    blocks = T * per_token * es * m.n_layer * (1 + BACKWARD_FACTOR)
    # loss: logits written, softmax read + written, gradient written, all in fp32 (4 bytes);
    # the softcap's tanh adds a pass each way
    logit_passes = 4 + (2 if m.softcap else 0)
    loss = T * m.padded_vocab * 4 * logit_passes
    params = d.n_params
    casts = params * (4 + 2) if d.bf16 and not d.master_bf16 else 0  # fp32 -> bf16 copies
    accumulate = params * (d.param_bytes * 2 + es)  # read + write the sum, read the new part
    return blocks + loss + casts + accumulate


def elementwise_kernels(d: Dims) -> int:
    return KERNELS_PER_BLOCK * d.model.n_layer + 30  # + embedding, loss, final norm


def optimizer_work(d: Dims) -> tuple[float, float]:
    """(bytes, FLOPs) of clipping and one optimizer step on this device's share."""
    n = d.n_params
    shard = d.world if d.strategy == "fsdp" else 1
    pb = d.param_bytes
    # foreach AdamW: parameter, gradient and two moments read, three written, in about three
    # passes of torch's multi-tensor kernels; clipping reads every gradient and scales it
    adam_bytes = 3 * (pb * 4 + pb * 3) if not d.adamw_8bit else 3 * (pb * 4 + 2 * 2)
    clip = 3 * pb
    if d.optimizer != "muon":
        return n * (adam_bytes + clip) / shard, 0.0
    matrix = d.numel("matrix")
    flops = 0.0
    for shape, count in d.muon_buckets():
        a, b = sorted(shape[-2:])
        # 5 Newton-Schulz iterations: X X^T (2a^2b), A A (2a^3), B X (2a^2b)
        flops += 5 * (4 * a * a * b + 2 * a**3) * d.muon_owned(count)
    muon_bytes = pb * 3 + d.ns_bytes * 6  # per parameter: momentum update, iterate in and out
    return ((n - matrix) * adam_bytes + matrix * muon_bytes + n * clip) / shard, flops


def communication_bytes(d: Dims, devices: int) -> tuple[float, float]:
    """(per step, per micro-batch) bytes each GPU sends over a ring: DDP all-reduces the
    gradients once per step (2 (n-1)/n of them); FSDP gathers the bf16 weights in the forward
    and the backward and reduce-scatters the gradients, every micro-batch ((n-1)/n each)."""
    if devices <= 1:
        return 0.0, 0.0
    ring = (devices - 1) / devices
    if d.strategy == "fsdp":
        return 0.0, d.n_params * (2 + 2 + d.param_bytes) * ring
    return d.n_params * d.param_bytes * 2 * ring, 0.0


def step_time(d: Dims, rates: Rates, devices: int = 1, recompute: float | None = None) -> StepTime:
    """Seconds of one optimizer step on each of `devices` data-parallel devices. `recompute` is
    the fraction of the blocks' forward run again in the backward: 1 under
    train.activation_checkpointing (the default), about 0.5 for selective checkpointing."""
    bw = rates.bandwidth
    redo = (1.0 if d.checkpointing else 0.0) if recompute is None else recompute
    gemm_s = 0.0
    for g in gemms(d):
        es = 1 if g.fp8 else act_bytes(d)
        bytes_ = es * (g.m * g.k + g.k * g.n + g.m * g.n)
        for product in PRODUCTS:
            one = max(g.flops / g.count / rates.gemm(g, product), bytes_ / bw, rates.launch)
            # the recompute of checkpointed blocks runs the forward again (not the lm_head's)
            times = 1 + (redo if product == "forward" and g.name != "lm_head" else 0)
            gemm_s += times * one * g.count
    attn_s = attention_flops(d) * (1 + redo / 3.5) / rates.attention
    elem_s = max(elementwise_bytes(d) / bw, elementwise_kernels(d) * rates.launch)
    elem_s *= 1 + redo / (1 + BACKWARD_FACTOR)
    opt_bytes, opt_flops = optimizer_work(d)
    backward = d.grad_accum * (gemm_s + attn_s + elem_s) * 2 / 3
    per_step, per_micro = communication_bytes(d, devices)
    link = rates.interconnect or 0.0
    comm = 0.0
    if link and per_micro:  # FSDP: prefetched gathers overlap the micro-batch's compute
        comm = d.grad_accum * max(0.0, per_micro / link - (gemm_s + attn_s + elem_s))
    elif link and per_step:  # DDP: buckets reduce during the last micro-batch's backward
        last = backward / d.grad_accum
        comm = max(per_step / link - last, per_step / link * 0.05)  # the last bucket is exposed
    parts = {
        "GEMMs": d.grad_accum * gemm_s,
        "attention": d.grad_accum * attn_s,
        "elementwise": d.grad_accum * elem_s,
        "optimizer": opt_bytes / bw + opt_flops / rates.matmul,
        "communication": comm,
    }
    return StepTime(parts, rates.calibration)


def tokens_per_second(d: Dims, rates: Rates, devices: int = 1) -> float:
    """Training tokens per second over all `devices` (each runs grad_accum micro-batches)."""
    return devices * d.tokens * d.grad_accum / step_time(d, rates, devices).seconds


def catalog_rates(gpu, catalog, d: Dims) -> Rates:
    """A catalog GPU's rates: its datasheet times the documented ceilings (gpus.yaml)."""
    c = catalog.defaults
    peak = (gpu.bf16_tflops if d.bf16 else gpu.fp32_tflops) * 1e12
    fp8 = gpu.fp8_tflops * 1e12 * c.matmul_ceiling if gpu.fp8_tflops else None
    attention = gpu.attention_fraction or c.attention_fraction
    link = gpu.interconnect_gbs * 1e9 * c.interconnect_efficiency if gpu.interconnect_gbs else None
    return Rates(
        matmul=peak * c.matmul_ceiling,
        attention=peak * attention if d.bf16 else peak * c.matmul_ceiling / 4,
        bandwidth=gpu.bandwidth_gbs * 1e9 * c.bandwidth_ceiling,
        launch=c.launch_us * 1e-6,
        fp8_matmul=fp8,
        interconnect=link,
        source="datasheet x ceilings (gpus.yaml defaults)",
    )
