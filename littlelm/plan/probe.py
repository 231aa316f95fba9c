"""Measure this machine's rates for the step model (plan/speed.py) at a run's own shapes.

Every distinct GEMM of the model is timed at its real (m, k, n) and operand layouts (forward,
input gradient, weight gradient), causal attention forward + backward at the run's (batch,
heads, seq, head_dim) with the kernel and the layout the run uses, memory
bandwidth with a large add, and the host time per kernel with a loop of tiny ops. A few
seconds in all; `littlelm plan --device cpu` and `littlelm bench` call it.
"""

from __future__ import annotations

import platform
import time

import torch

from littlelm.model.attention import causal_attention
from littlelm.plan import speed
from littlelm.plan.shapes import Dims

PROBE_SECONDS = 0.25  # per measurement: the best of repeats within it
# a best of one or two calls (the attention probe's at seq 1024) read 10-15% slow too often on a
# shared 2-core CPU, and a bench's calibration then moved the plan of another shape by as much
MIN_REPEATS = 5


def device_key(device: torch.device) -> str:
    """What a measurement on this machine is filed under: the CPU model and thread count, or
    the CUDA device's name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    return f"cpu {cpu}, {torch.get_num_threads()} threads"


def best_seconds(fn, seconds: float = PROBE_SECONDS) -> float:
    """The fastest of repeated calls of `fn` over about `seconds` (after one warm-up), and of at
    least MIN_REPEATS calls unless one call alone outlasts `seconds` (such a call averages the
    machine's hiccups over its own length)."""
    fn()
    best, start, n = float("inf"), time.perf_counter(), 0
    while n == 0 or time.perf_counter() - start < seconds or (n < MIN_REPEATS and best < seconds):
        t = time.perf_counter()
        fn()
        best, n = min(best, time.perf_counter() - t), n + 1
    return best


def gemm_rates(d: Dims, dtype: torch.dtype) -> dict[tuple[int, int, int, str], float]:
    """FLOP/s of each distinct GEMM shape of one micro-batch, per product (speed.PRODUCTS), with
    the operands laid out as the model's linear layers have them: x (m, k) times the weight
    W (n, k) transposed; the input gradient dy (m, n) times W; the weight gradient dy^T x."""
    out = {}
    for g in speed.gemms(d):
        if (g.m, g.k, g.n, "forward") in out:
            continue
        x = torch.randn(g.m, g.k, dtype=dtype)
        w = torch.randn(g.n, g.k, dtype=dtype)
        dy = torch.randn(g.m, g.n, dtype=dtype)
        calls = {  # the operands bound now: each shape times its own tensors
            "forward": lambda x=x, w=w: torch.nn.functional.linear(x, w),
            "input_grad": lambda dy=dy, w=w: dy @ w,
            "weight_grad": lambda dy=dy, x=x: dy.t() @ x,
        }
        for product, call in calls.items():
            out[(g.m, g.k, g.n, product)] = 2 * g.m * g.k * g.n / best_seconds(call)
    return out


def attention_rate(d: Dims, dtype: torch.dtype) -> float:
    """FLOP/s of the run's causal attention (forward + backward) on one layer, on q, k and v
    laid out as the model passes them: (B, H, T, D) views of (B, T, H, D) storage."""
    m = d.model
    B, T, D = d.micro_batch, d.seq_len, m.head_dim

    def heads(n: int) -> torch.Tensor:
        return torch.randn(B, T, n, D, dtype=dtype).transpose(1, 2).requires_grad_(True)

    q, k, v = heads(m.n_head), heads(m.kv_heads), heads(m.kv_heads)
    grad = torch.randn(B, m.n_head, T, D, dtype=dtype)

    def step():
        causal_attention(q, k, v).backward(grad)

    return speed.attention_flops(d) / m.n_layer / best_seconds(step)


def bandwidth() -> float:
    """Bytes/s of a large out-of-place add (two reads and one write of 32 MiB each)."""
    a, b = torch.randn(8 << 20), torch.randn(8 << 20)
    out = torch.empty_like(a)
    return 3 * a.nbytes / best_seconds(lambda: torch.add(a, b, out=out))


def launch_seconds(n: int = 200) -> float:
    """Host time per kernel: tiny adds, so the dispatch is all there is."""
    x = torch.zeros(4)
    return best_seconds(lambda: [x.add(1.0) for _ in range(n)]) / n


def measure_rates(d: Dims, device: torch.device | None = None) -> speed.Rates:
    """This CPU's rates at the shapes of `d` (the CUDA path is `catalog_rates` + a bench)."""
    dtype = torch.bfloat16 if d.bf16 else torch.float32
    with torch.no_grad():
        gemm = gemm_rates(d, dtype)
    best = max(gemm.values())
    return speed.Rates(
        matmul=best,
        attention=attention_rate(d, dtype),
        bandwidth=bandwidth(),
        launch=launch_seconds(),
        gemm_rate=lambda g, product: gemm[(g.m, g.k, g.n, product)],
        source=f"measured here ({device_key(device or torch.device('cpu'))})",
    )
