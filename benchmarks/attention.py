"""Causal attention: PyTorch's SDPA beside littlelm's blocked kernel (model/kernels.py), forward
and backward time and error against float64, at the shapes of the throughput benchmark.

    python benchmarks/attention.py                 # CPU, bf16: the shapes below
    python benchmarks/attention.py --block 64 256  # other query-block sizes beside the default
    python benchmarks/attention.py --device cuda   # the same on a GPU (littlelm uses SDPA there)

Inputs are laid out as the model passes them: (B, T, H, D) storage seen as (B, H, T, D). Each
kernel runs `--steps` forward + backward passes after one warm-up, alternated with the others
(median times). The error is ‖x − x64‖ / ‖x64‖ of the output and of each input gradient, where
x64 is SDPA's result in float64 on the same inputs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from littlelm.model.kernels import BLOCK, blocked_causal_attention
from littlelm.train.device import tune_cpu_allocator
from littlelm.train.step import synchronize

# name: (batch, seq, heads, kv heads, head dim)
SHAPES = {
    "medium (8 × 512, 8 heads of 64)": (8, 512, 8, 8, 64),
    "demo (16 × 512, 4 heads of 64)": (16, 512, 4, 4, 64),
    "large (8 × 512, 12 heads of 64)": (8, 512, 12, 12, 64),
    "gqa (8 × 1024, 8 query / 2 kv heads of 64)": (8, 1024, 8, 2, 64),
}


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=q.size(1) != k.size(1)
    )


def inputs(shape, dtype, device, seed=0):
    B, T, H, Hkv, D = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, h, D, generator=g) for h in (H, Hkv, Hkv))
    grad = torch.randn(B, H, T, D, generator=g)
    return [t.to(device, dtype) for t in (q, k, v, grad)]


def run(fn, q, k, v, grad, device):
    """(forward seconds, backward seconds, output, input gradients)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    synchronize(device)
    t0 = time.perf_counter()
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    synchronize(device)
    t1 = time.perf_counter()
    out.backward(grad)
    synchronize(device)
    return t1 - t0, time.perf_counter() - t1, out.detach(), [t.grad for t in (q, k, v)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def measure(shape, kernels: dict, dtype, device, steps: int) -> list[str]:
    q, k, v, grad = inputs(shape, dtype, device)
    exact = run(sdpa, *(t.double() for t in (q, k, v, grad)), device)
    rows, times = {}, {name: [] for name in kernels}
    for name, fn in kernels.items():
        _, _, out, grads = run(fn, q, k, v, grad, device)  # warm-up, and the errors
        rows[name] = [rel(out, exact[2])] + [rel(a, b) for a, b in zip(grads, exact[3])]
    for i in range(steps):
        names = list(kernels)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            times[name].append(run(kernels[name], q, k, v, grad, device)[:2])
    lines = []
    base = None
    for name in kernels:
        fwd = statistics.median(t[0] for t in times[name]) * 1e3
        bwd = statistics.median(t[1] for t in times[name]) * 1e3
        base = base or fwd + bwd
        errs = " | ".join(f"{e:.2%}" for e in rows[name])
        lines.append(
            f"| {name} | {fwd:.1f} | {bwd:.1f} | {fwd + bwd:.1f} | {base / (fwd + bwd):.2f} | {errs} |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--block", type=int, nargs="*", default=[], help="extra query-block sizes")
    p.add_argument("--shapes", nargs="*", choices=[s.split()[0] for s in SHAPES])
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if device.type == "cpu":
        tune_cpu_allocator()
    kernels = {"sdpa": sdpa, f"blocked {BLOCK}": blocked_causal_attention}
    for b in args.block:
        kernels[f"blocked {b}"] = lambda q, k, v, b=b: blocked_causal_attention(q, k, v, b)
    print(
        f"device {device}, {args.dtype}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    for title, shape in SHAPES.items():
        if args.shapes and title.split()[0] not in args.shapes:
            continue
        print(f"\n### {title}\n")
        print(
            "| kernel | forward ms | backward ms | total ms | × sdpa | error out | dq | dk | dv |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for line in measure(shape, kernels, dtype, device, args.steps):
            print(line, flush=True)


if __name__ == "__main__":
    main()
