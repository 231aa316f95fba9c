"""Measure this machine's rates for the step model (plan/speed.py) at a run's own shapes.

Every distinct GEMM of the model is timed at its real (m, k, n) and operand layouts (forward,
input gradient, weight gradient), causal attention forward + backward at the run's (batch,
heads, seq, head_dim) with the kernel and the layout the run uses, memory
bandwidth with a large add, and the host time per kernel with a loop of tiny ops. Each is the
best of calls made in rounds over all of them (`best_of_rounds`), so that the shapes of a plan and
of the benches that calibrate it are timed through the same busy spells of a shared machine. A
few seconds per shape; `littlelm plan --device cpu` and `littlelm bench` call it. Every operand
is held until the rounds end: the probe's memory is the sum of the run's GEMM operands (the
lm_head's gradient the largest), not one GEMM's.
"""

from __future__ import annotations

import platform
import time
from dataclasses import replace

import torch

from littlelm.model.kernels import causal_attention
from littlelm.plan import speed
from littlelm.plan.shapes import Dims
from littlelm.train.device import tune_cpu_allocator

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
    """The fastest call of each of `fns` (after one warm-up each), timed in rounds (each function
    once per round) for about `seconds` apiece and at least MIN_REPEATS rounds, unless one round
    alone outlasts the whole window (such calls average the machine's hiccups over their own
    length). A busy spell of a shared machine, which lasts seconds, then slows one round of
    every measurement rather than all the repeats of a few, and the best of each skips it.
    Rates compared with each other (a bench's shapes and a plan's) share rounds for the same
    reason."""
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


def measure_rates(d: Dims, device: torch.device | None = None) -> speed.Rates:
    """This CPU's rates at the shapes of `d` (the CUDA path is `catalog_rates` + a bench)."""
    return measure_rates_many([d], device)[0]


def measure_rates_many(ds: list[Dims], device: torch.device | None = None) -> list[speed.Rates]:
    """This CPU's rates at the shapes of each of `ds`, timed in the same rounds (a shape two of
    them share is timed once)."""
    # malloc as the Trainer sets it: with glibc's default the first probes of a process map
    # fresh, zeroed pages for every large tensor and read 10-100% slow (4x on attention)
    tune_cpu_allocator()
    calls: dict[tuple, object] = {}  # each measurement once, however many shapes need it
    plans = []
    for d in ds:
        dtype = torch.bfloat16 if d.bf16 else torch.float32
        pd = probe_dims(d)
        gemms = {}
        for g, pg in zip(speed.gemms(d), speed.gemms(pd)):
            shape = ("gemm", pg.m, pg.k, pg.n, dtype)
            if (*shape, "forward") not in calls:
                for product, call in _gemm_calls(pg.m, pg.k, pg.n, dtype).items():
                    calls[(*shape, product)] = call
            for product in speed.PRODUCTS:
                gemms[(g.m, g.k, g.n, product)] = (*shape, product)
        m = pd.model
        attention = (
            "attention",
            pd.micro_batch,
            pd.seq_len,
            m.n_head,
            m.kv_heads,
            m.head_dim,
            dtype,
        )
        if attention not in calls:
            calls[attention] = _attention_call(pd, dtype)
        plans.append((pd, gemms, attention))
    calls[("bandwidth",)] = _bandwidth_call()
    calls[("launch",)] = _launch_call()
    with torch.no_grad():  # the attention call enables grad itself
        t = dict(zip(calls, best_of_rounds(list(calls.values()))))
    del calls  # the operands go now
    source = f"measured here ({device_key(device or torch.device('cpu'))})"
    out = []
    for d, gemms, attention in plans:
        rate = {k: 2 * key[1] * key[2] * key[3] / t[key] for k, key in gemms.items()}
        out.append(
            speed.Rates(
                matmul=max(rate.values()),
                attention=speed.attention_flops(d) / d.model.n_layer / t[attention],
                bandwidth=3 * BANDWIDTH_ELEMENTS * 4 / t[("bandwidth",)],
                launch=t[("launch",)] / LAUNCH_OPS,
                gemm_rate=lambda g, product, rate=rate: rate[(g.m, g.k, g.n, product)],
                source=source,
            )
        )
    return out
