"""How long one optimizer step takes: the step's work, kind by kind, over the device's rates;
where the rates come from (a catalog GPU's datasheet, or this CPU's probe); and what calibrates
them (published points, benches on disk).

    step  = grad_accum x micro-batch + optimizer + exposed communication
    micro = sum over GEMMs and their three products (forward, input gradient, weight gradient)
                of max(FLOPs / matmul rate, bytes / bandwidth, launch)
            + causal attention FLOPs / attention rate
            + max(elementwise bytes / elementwise rate, elementwise kernels x launch)

Every GEMM is listed at its shape, so the shape of a run moves the prediction through rates
measured at those shapes, not through one assumed MFU. Not modelled: torch.compile's fusions
(planned as eager), host dispatch overlapping a previous kernel beyond the per-kernel max.
docs/planning.md "Speed and cost" has the sources of every figure; plan/calibration.py what
calibrates it for a GPU.
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from littlelm.config import to_tree
from littlelm.data.cache import cache_root, digest
from littlelm.model import blocks
from littlelm.model.blocks import MLPS
from littlelm.model.kernels import causal_attention
from littlelm.plan.dims import Dims, model_tensors
from littlelm.train.device import tune_cpu_allocator

# The step model's constants: each is counted from the model's code (model/gpt.py, blocks.py),
# cited, or marked assumed; the GPU ceilings are in gpus.yaml's `defaults`, with theirs.
# Elementwise passes of one block, in vectors of d_model (D) and of the MLP's hidden width (H)
# read plus written per token, forward; the backward moves about twice as much (each op reads
# its saved input and the incoming gradient and writes one gradient).
RESIDUAL_ADD_PASSES_D = 6  # counted: two residual adds (2 reads + 1 write each)
RESIDUAL_SCALAR_PASSES_D = 6  # counted: x = l_resid * x + l_x0 * x0 before each block
BACKWARD_FACTOR = 2.0  # assumed: the argument above, not measured op by op
KERNELS_PER_BLOCK = 60  # assumed: forward + backward kernels of one block outside its GEMMs
# (eager); a GPU's elementwise time is its bytes over bandwidth unless launches take longer
# FlashAttention's backward does 2.5 forwards of work (it recomputes the scores): the count
# FlashAttention-2's own benchmark uses (Dao 2023, arXiv:2307.08691)
ATTENTION_BACKWARD = 2.5
DDP_EXPOSED = 0.05  # assumed: the share of DDP's all-reduce after the backward ends (last bucket)
# An FP8 linear's dynamic-scaled cast of each operand (model/fp8.py; torchao and Transformer
# Engine alike): the amax pass reads it, the scaled cast reads it again and writes one byte, per
# element; the backward's products need dy and x transposed (one byte read, one written each).
# What a fused cast moves at least; eager's extra passes are in the calibration.
FP8_CAST_READS = 2
FP8_TRANSPOSE_BYTES = 2


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
    frozen: bool = False  # a LoRA run's frozen weight: no weight-gradient product

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
    # this CPU's probe of the run's own work: bytes/s of its elementwise work (else bandwidth),
    # seconds of Muon's Newton–Schulz per step (else its FLOPs at the matmul rate)
    elementwise: float | None = None
    newton_schulz: float | None = None
    fp8_matmul: float | None = None
    interconnect: float | None = None  # bytes/s of ring bus bandwidth between GPUs
    # FLOP/s measured per GEMM and product (PRODUCTS), where probed
    gemm_rate: Callable[[Gemm, str], float] | None = None
    source: str = "assumed"
    calibration: float = 1.0  # measured / predicted step time of a bench on this device

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

    frozen = d.lora is not None  # every block matrix: the targets' updates are the adapters'

    def lin(name, k, n, count=m.n_layer):
        return Gemm(name, M, k, n, count, fp8 and min(k, n) >= m.fp8_min_dim, frozen)

    out = [
        lin("q", D, m.n_head * hd),
        lin("k+v", D, 2 * m.kv_heads * hd),
        lin("attention out", m.n_head * hd, D),
    ]
    inputs = MLPS[m.mlp].inputs  # modelled as one GEMM (model/blocks.py)
    out.append(lin(f"mlp {'+'.join(inputs)}", D, len(inputs) * m.hidden))
    out.append(lin("mlp c_proj", m.hidden, D))
    # the head stays in bf16 under fp8; the chunked loss makes its weight gradient in the
    # forward even when it is frozen (model/kernels.py), the plain loss only when it trains
    head_frozen = not d.head_trains and m.loss == "plain"
    out.append(Gemm("lm_head", M, D, m.padded_vocab, frozen=head_frozen))
    if d.lora is not None:  # each adapter: x A^T (rank wide), then (x A^T) B^T
        shapes = {p.module: p.shape for p in d.params if p.role == "matrix" and p.module}
        for module in d.lora.targets:
            rows, cols = shapes[module]
            out.append(Gemm(f"lora {module} A", M, cols, d.lora.rank, m.n_layer))
            out.append(Gemm(f"lora {module} B", M, d.lora.rank, rows, m.n_layer))
    return out


def attention_flops(d: Dims) -> float:
    """Causal attention of one micro-batch, forward + backward: the forward's two products over
    the lower triangle (2 x 2 x B x H x T^2/2 x hd) and a backward of ATTENTION_BACKWARD
    forwards (it recomputes the scores, FlashAttention-style, as the CPU kernel does too)."""
    m = d.model
    forward = 2.0 * d.micro_batch * m.n_head * d.seq_len**2 * m.head_dim
    return forward * (1 + ATTENTION_BACKWARD) * m.n_layer


def elementwise_bytes(d: Dims) -> float:
    """Bytes one micro-batch moves outside GEMMs and attention: norms, residuals, RoPE,
    activation functions, the loss's softmax, autocast's weight casts and the gradient
    accumulation into the parameters' dtype."""
    m, T = d.model, d.tokens
    es = d.act_bytes
    qk = (m.n_head + m.kv_heads) * m.head_dim
    norms = 2 * blocks.NORM_PASSES  # norm1 and norm2
    per_token = (norms + RESIDUAL_ADD_PASSES_D) * m.d_model + 2 * qk  # + RoPE on q and k
    if m.qk_norm:
        per_token += blocks.NORM_PASSES * qk
    if m.residual_scalars:
        per_token += RESIDUAL_SCALAR_PASSES_D * m.d_model
    per_token += MLPS[m.mlp].passes * m.hidden  # activation: inputs + output
    in_blocks = T * per_token * es * m.n_layer * (1 + BACKWARD_FACTOR)
    # loss: logits written, softmax read + written, gradient written, all in fp32 (4 bytes);
    # the softcap's tanh adds a pass each way
    logit_passes = 4 + (2 if m.softcap else 0)
    loss = T * m.padded_vocab * 4 * logit_passes
    nf4 = sum(p.numel for p in d.params if p.nf4)
    params = d.n_params - nf4
    casts: float = params * (4 + 2) if d.bf16 and not d.master_bf16 else 0  # fp32 -> bf16
    # QLoRA dequantizes each NF4 weight to bf16 in the forward and again in the backward
    casts += nf4 * (0.5 + 2) * 2
    # read + write the sum, read the new part: the trained parameters' gradients only
    accumulate = d.n_trainable * (d.param_bytes * 2 + es)
    return in_blocks + loss + casts + accumulate + fp8_cast_bytes(d)


def fp8_cast_bytes(d: Dims) -> float:
    """Bytes one micro-batch moves casting the FP8 linears' operands: x and w in the forward,
    dy in the backward, and the transposed copies of x and dy the weight gradient reads."""
    cast = FP8_CAST_READS * d.act_bytes + 1
    total = 0.0
    for g in gemms(d):
        if g.fp8:
            x, w, dy = g.m * g.k, g.k * g.n, g.m * g.n
            total += g.count * (cast * (x + w + dy) + FP8_TRANSPOSE_BYTES * (x + dy))
    return total


def elementwise_kernels(d: Dims) -> int:
    return KERNELS_PER_BLOCK * d.model.n_layer + 30  # + embedding, loss, final norm


def optimizer_work(d: Dims) -> tuple[float, float]:
    """(bytes, FLOPs) of clipping and one optimizer step on this device's share."""
    n = d.n_trainable  # a LoRA run steps its adapters only
    shard = d.world if d.strategy == "fsdp" else 1
    pb = d.param_bytes
    # each rule's bytes per element (GroupRule.traffic); clipping reads every gradient and
    # scales it; a MATRICES rule's arithmetic per bucket (Muon's Newton-Schulz)
    moved = sum(p.numel * d.rule(p).traffic(pb) for p in d.trainable)
    flops = sum(
        rule.bucket_flops(shape, d.matrix_owned(count)) for rule, shape, count in d.matrix_buckets()
    )
    return (moved + n * 3 * pb) / shard, flops


def communication_bytes(d: Dims, devices: int) -> tuple[float, float]:
    """(per step, per micro-batch) bytes each GPU sends over a ring: DDP all-reduces the
    gradients once per step (2 (n-1)/n of them); FSDP gathers the bf16 weights in the forward
    and the backward and reduce-scatters the gradients, every micro-batch ((n-1)/n each)."""
    if devices <= 1:
        return 0.0, 0.0
    ring = (devices - 1) / devices
    if d.strategy == "fsdp":
        return 0.0, d.n_params * (2 + 2 + d.param_bytes) * ring
    return d.n_trainable * d.param_bytes * 2 * ring, 0.0  # gradients: the trained ones only


def step_time(d: Dims, rates: Rates, devices: int = 1, recompute: float | None = None) -> StepTime:
    """Seconds of one optimizer step on each of `devices` data-parallel devices. `recompute` is
    the fraction of the blocks' forward run again in the backward: 1 under
    train.activation_checkpointing (the default), about 0.5 for selective checkpointing."""
    bw = rates.bandwidth
    redo = (1.0 if d.checkpointing else 0.0) if recompute is None else recompute
    # DPO's and RL's frozen reference runs a forward over the same rows (lm_head's included)
    ref = 1.0 if d.reference else 0.0
    gemm_s = 0.0
    for g in gemms(d):
        es = 1 if g.fp8 else d.act_bytes
        bytes_ = es * (g.m * g.k + g.k * g.n + g.m * g.n)
        for product in PRODUCTS:
            if g.frozen and product == "weight_grad":
                continue
            one = max(g.flops / g.count / rates.gemm(g, product), bytes_ / bw, rates.launch)
            # the recompute of checkpointed blocks runs the forward again (not the lm_head's)
            times = 1 + (redo if product == "forward" and g.name != "lm_head" else 0)
            times += ref if product == "forward" else 0
            gemm_s += times * one * g.count
    attn_s = attention_flops(d) * (1 + (redo + ref) / (1 + ATTENTION_BACKWARD)) / rates.attention
    elem_bw = rates.elementwise or bw
    elem_s = max(elementwise_bytes(d) / elem_bw, elementwise_kernels(d) * rates.launch)
    elem_s *= 1 + (redo + ref) / (1 + BACKWARD_FACTOR)
    opt_bytes, opt_flops = optimizer_work(d)
    backward = d.grad_accum * (gemm_s + attn_s + elem_s) * 2 / 3
    per_step, per_micro = communication_bytes(d, devices)
    link = rates.interconnect or 0.0
    comm = 0.0
    if link and per_micro:  # FSDP: prefetched gathers overlap the micro-batch's compute
        comm = d.grad_accum * max(0.0, per_micro / link - (gemm_s + attn_s + elem_s))
    elif link and per_step:  # DDP: buckets reduce during the last micro-batch's backward
        last = backward / d.grad_accum
        comm = max(per_step / link - last, per_step / link * DDP_EXPOSED)
    parts = {
        "GEMMs": d.grad_accum * gemm_s,
        "attention": d.grad_accum * attn_s,
        "elementwise": d.grad_accum * elem_s,
        "optimizer": opt_bytes / bw
        + (opt_flops / rates.matmul if rates.newton_schulz is None else rates.newton_schulz),
        "communication": comm,
    }
    return StepTime(parts, rates.calibration)


def tokens_per_second(d: Dims, rates: Rates, devices: int = 1) -> float:
    """Training tokens per second over all `devices` (each runs grad_accum micro-batches)."""
    return devices * d.tokens * d.grad_accum / step_time(d, rates, devices).seconds


def peak_flops(gpu, d: Dims) -> float:
    """A catalog GPU's datasheet FLOP/s in the run's compute dtype."""
    return (gpu.bf16_tflops if d.bf16 else gpu.fp32_tflops) * 1e12


def catalog_rates(gpu, catalog, d: Dims) -> Rates:
    """A catalog GPU's rates: its datasheet times the documented ceilings (gpus.yaml)."""
    c = catalog.defaults
    peak = peak_flops(gpu, d)
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


# ----------------------------------------------------------------------------------------------
# This CPU's rates, measured at a run's own shapes (`plan --device cpu`, `bench` on a CPU): each
# GEMM in its three products with the model's operand layouts, causal attention forward +
# backward as the model lays out q/k/v, a large add, a loop of tiny ops, Newton-Schulz per Muon
# bucket, the run's own model cut to two blocks (its elementwise rate). Each is the best of
# calls made in rounds over all of them (`best_of_rounds`), so the shapes of a plan and of the
# benches that calibrate it are timed through the same busy spells of a shared machine.

PROBE_SECONDS = 0.25  # per measurement: the best of repeats within it
# a best of one or two calls (the attention probe's at seq 1024) read 10-15% slow too often on a
# shared 2-core CPU, and a bench's calibration then moved the plan of another shape by as much
MIN_REPEATS = 5


# The largest shape the probe times: a GEMM's and attention's rates have flattened long before
# (the demo's shapes are 8k rows of seq 512-1024), and a plan of a billion tokens per
# micro-batch then probes in seconds, within a few hundred MiB, not for hours or out of memory.
PROBE_MAX_ROWS = 16384  # tokens per micro-batch
PROBE_MAX_SEQ = 4096
PROBE_ELEMENTS = 1 << 27  # per operand (the lm_head's output: rows x vocabulary)


def probe_dims(d: Dims) -> Dims:
    """The shape the probe times for `d`: its own, or capped at the sizes above."""
    seq = min(d.seq_len, PROBE_MAX_SEQ)
    rows = min(PROBE_MAX_ROWS, PROBE_ELEMENTS // d.model.padded_vocab)
    mb = max(1, min(d.micro_batch, rows // seq))
    return d if (mb, seq) == (d.micro_batch, d.seq_len) else replace(d, micro_batch=mb, seq_len=seq)


def device_key(device: torch.device) -> str:
    """What a measurement on this machine is filed under: the CPU model and thread count, or
    the CUDA device's name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    return f"cpu {cpu}, {torch.get_num_threads()} threads"


def best_of_rounds(fns: list, seconds: float | None = None) -> list[float]:
    """The fastest call of each of `fns` (after a warm-up), timed in rounds of one call each
    for about `seconds` apiece and at least MIN_REPEATS rounds, unless one round outlasts the
    window. A busy spell of a shared machine (seconds) then slows one round of every
    measurement, which the best of each skips, rather than all the repeats of a few."""
    for fn in fns:
        fn()  # warm-up: first-call allocations and kernel selection
    best = [float("inf")] * len(fns)
    budget = (PROBE_SECONDS if seconds is None else seconds) * len(fns)
    start, rounds = time.perf_counter(), 0

    def more() -> bool:
        if rounds == 0 or time.perf_counter() - start < budget:
            return True
        return rounds < MIN_REPEATS and sum(best) < budget  # unless one round outlasts it

    while more():
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
        rounds += 1
    return best


def _gemm_calls(m: int, k: int, n: int, dtype: torch.dtype) -> dict[str, object]:
    """The three products of a linear layer, with its operand layouts: x (m, k) times the
    weight W (n, k) transposed; the input gradient dy (m, n) times W; the weight gradient
    dy^T x."""
    x = torch.randn(m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype)
    dy = torch.randn(m, n, dtype=dtype)
    return {
        "forward": lambda: torch.nn.functional.linear(x, w),
        "input_grad": lambda: dy @ w,
        "weight_grad": lambda: dy.t() @ x,
    }


def _attention_call(d: Dims, dtype: torch.dtype):
    """Causal attention forward + backward of one layer on q, k and v laid out as the model
    passes them: (B, H, T, D) views of (B, T, H, D) storage."""
    m = d.model
    B, T, D = d.micro_batch, d.seq_len, m.head_dim

    def heads(n: int) -> torch.Tensor:
        return torch.randn(B, T, n, D, dtype=dtype).transpose(1, 2).requires_grad_(True)

    q, k, v = heads(m.n_head), heads(m.kv_heads), heads(m.kv_heads)
    grad = torch.randn(B, m.n_head, T, D, dtype=dtype)

    def step():
        with torch.enable_grad():
            causal_attention(q, k, v).backward(grad)

    return step


BANDWIDTH_ELEMENTS = 8 << 20  # fp32: 32 MiB per operand, far past the caches


def _bandwidth_call():
    """A large out-of-place add: two reads and one write of 32 MiB each."""
    a, b = torch.randn(BANDWIDTH_ELEMENTS), torch.randn(BANDWIDTH_ELEMENTS)
    out = torch.empty_like(a)
    return lambda: torch.add(a, b, out=out)


LAUNCH_OPS = 200  # tiny adds per launch measurement: the dispatch is all there is


def _launch_call():
    x = torch.zeros(4)
    return lambda: [x.add(1.0) for _ in range(LAUNCH_OPS)]


PROBE_LAYERS = 2  # one block with value embeddings, one without, as the model alternates them
NS_ELEMENTS = 1 << 22  # per Newton–Schulz call: the matrices of a larger bucket are sampled


def _layers_dims(d: Dims) -> Dims:
    """`d` with the model cut to PROBE_LAYERS blocks (and its RoPE tables to d's sequence, not
    max_seq_len's): what `_model_call` runs."""
    m = d.model.model_copy(update={"n_layer": PROBE_LAYERS, "max_seq_len": d.seq_len})
    params, buffers = model_tensors(m)
    return replace(d, model=m, params=params, buffers=buffers, grad_accum=1)


def _model_call(d: Dims):
    """Forward + backward of the run's own model (its kernels, loss, embeddings, autocast and
    autograd) at PROBE_LAYERS blocks: the elementwise work no probe of one op rates, which
    on a CPU runs far below the bandwidth of one large add (mixed dtypes, strided views,
    row reductions)."""
    m = _layers_dims(d).model
    model = m.build().to(torch.bfloat16 if d.master_bf16 else torch.float32)
    model.activation_checkpointing = d.checkpointing
    ids = torch.randint(m.vocab, (d.micro_batch, d.seq_len))
    cast = torch.autocast("cpu", torch.bfloat16) if d.bf16 else contextlib.nullcontext()

    def step():
        with torch.enable_grad(), cast:
            loss = model(ids, ids)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def _rate_of(rates: dict[tuple, float]) -> Callable[[Gemm, str], float]:
    """Rates.gemm_rate from the FLOP/s measured per (m, k, n, product)."""
    return lambda g, product: rates[(g.m, g.k, g.n, product)]


def measure_rates(ds: list[Dims]) -> list[Rates]:
    """This CPU's rates at the shapes of each of `ds` (capped: `probe_dims`), timed in the same
    rounds; a measurement two of them share is timed once. (A GPU's: `catalog_rates`.)"""
    # malloc as the Trainer sets it: with glibc's default the first probes of a process map
    # fresh, zeroed pages for every large tensor and read 10-100% slow (4x on attention)
    tune_cpu_allocator()
    calls: dict[tuple, object] = {}  # each measurement once, however many shapes need it
    plans = []
    for d in ds:
        dtype = torch.bfloat16 if d.bf16 else torch.float32
        pd = probe_dims(d)
        keys = {}  # (m, k, n, product) of d's GEMMs -> the measurement that times it
        for g, pg in zip(gemms(d), gemms(pd)):
            gemm = ("gemm", pg.m, pg.k, pg.n, dtype)
            if (*gemm, "forward") not in calls:
                for product, call in _gemm_calls(pg.m, pg.k, pg.n, dtype).items():
                    probe = (*gemm, product)
                    calls[probe] = call
            for product in PRODUCTS:  # d's shapes, and the probe's (its layers' model)
                probe = (*gemm, product)
                keys[(g.m, g.k, g.n, product)] = keys[(pg.m, pg.k, pg.n, product)] = probe
        m = pd.model
        attention: tuple = (
            "attention",
            pd.micro_batch,
            pd.seq_len,
            m.n_head,
            m.kv_heads,
            m.head_dim,
        )
        attention += (dtype,)
        if attention not in calls:
            calls[attention] = _attention_call(pd, dtype)
        layers: tuple = ("layers", pd.micro_batch, pd.seq_len, m.model_dump_json(), pd.bf16)
        layers += (pd.master_bf16, pd.checkpointing)
        if layers not in calls:
            calls[layers] = _model_call(pd)
        ns = []  # (measurement, matrices it times, matrices a step orthogonalises)
        for rule, shape, count in d.matrix_buckets():  # a MATRICES rule's (Muon's) arithmetic
            n = max(1, min(count, NS_ELEMENTS // (shape[-1] * shape[-2])))
            key = ("newton-schulz", shape, n, rule)
            if key not in calls:
                mats = torch.randn(n, *shape[-2:])
                calls[key] = lambda mats=mats, rule=rule: rule.bucket_work(mats)
            ns.append((key, n, d.matrix_owned(count)))
        plans.append((pd, keys, attention, layers, ns))
    calls[("bandwidth",)] = _bandwidth_call()
    calls[("launch",)] = _launch_call()
    with torch.no_grad():  # the attention call enables grad itself
        t = dict(zip(calls, best_of_rounds(list(calls.values()))))
    del calls  # the operands go now
    source = f"measured here ({device_key(torch.device('cpu'))})"
    out = []
    for d, keys, attention, layers, ns in plans:
        rate = {k: 2 * key[1] * key[2] * key[3] / t[key] for k, key in keys.items()}
        r = Rates(
            matmul=max(rate.values()),
            attention=attention_flops(d) / d.model.n_layer / t[attention],
            bandwidth=3 * BANDWIDTH_ELEMENTS * 4 / t[("bandwidth",)],
            launch=t[("launch",)] / LAUNCH_OPS,
            gemm_rate=_rate_of(rate),
            newton_schulz=sum(t[key] / n * owned for key, n, owned in ns),
            source=source,
        )
        # the elementwise rate that makes the modelled step of the probed layers last as long
        # as they ran: what the GEMM and attention probes do not account for is elementwise
        p = step_time(_layers_dims(d), r).parts
        rest = t[layers] - p["GEMMs"] - p["attention"]
        out.append(
            replace(r, elementwise=r.bandwidth * p["elementwise"] / max(rest, p["elementwise"]))
        )
    return out


# ----------------------------------------------------------------------------------------------
# Calibration. A GPU without a bench of its own: the published runs of calibration.yaml
# (plan/calibration.py). `littlelm bench` writes one record per run to
# CACHE/bench/ (CACHE = $LITTLELM_CACHE or ~/.cache/littlelm) and the run directory; its
# `speed_ratio` (measured / modelled step time) calibrates every run on the same GPU model or
# machine (`device_key`), its memory the same workload (`workload_key`) and micro-batch.


# ----------------------------------------------------------------------------------------------
# Bench records


def workload_key(cfg) -> str:
    """What MFU depends on: the model's shape and features, seq_len, precision, compile."""
    t = cfg.train
    return digest(
        {
            "model": to_tree(cfg.model),
            "seq_len": t.seq_len,
            "precision": "bf16" if t.precision == "auto" else t.precision,  # as plans GPUs
            "compile": t.compile,
        }
    )


def bench_dir() -> Path:
    return cache_root() / "bench"


def save_measurement(record: dict, run_dir: Path | None = None) -> Path:
    """Write `record` (plus a timestamp) to the bench cache and the run directory."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}
    stamp = record["time"].replace(":", "")
    who = str(record.get("gpu") or record["device"])
    name = f"{stamp}-{who}-{digest(record)[:8]}.json".replace(" ", "_").replace("/", "_")
    path = bench_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1)
    path.write_text(text)
    if run_dir is not None:
        with contextlib.suppress(OSError):
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "bench.json").write_text(text)
    return path


def load_measurements(directory: Path | None = None) -> list[dict]:
    """Every readable measurement, oldest first (unreadable files are skipped)."""
    d = directory or bench_dir()
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            rec = json.loads(f.read_text())
            if isinstance(rec, dict) and ("mfu" in rec or "speed_ratio" in rec):
                out.append(rec)
    return sorted(out, key=lambda r: str(r.get("time", "")))


def speed_calibrations(
    records: list[dict], gpu: str | None = None, device_key: str | None = None
) -> list[dict]:
    """The measurements on this GPU (catalog key) or machine (`device_key`) with a
    `speed_ratio`, oldest first: each calibrates every workload on that device."""
    return [
        r
        for r in records
        if (r.get("speed_ratio") or 0) > 0
        and ((gpu and r.get("gpu") == gpu) or (device_key and r.get("device_key") == device_key))
    ]


def measured_memory(records: list[dict], gpu: str, workload: str, micro_batch: int) -> dict | None:
    """The newest CUDA measurement of this workload at this micro-batch on `gpu`."""
    hits = [
        r
        for r in records
        if r.get("gpu") == gpu
        and r.get("workload") == workload
        and r.get("micro_batch") == micro_batch
        and r.get("peak_reserved")
    ]
    return hits[-1] if hits else None
