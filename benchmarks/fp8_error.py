"""FP8 error per layer on a trained model: forward, input-gradient and weight-gradient GEMMs of
every block linear, under several FP8 scaling recipes, against float64, with bf16 beside them.

    python benchmarks/fp8_error.py RUN_DIR [--step N] [--layers]

RUN_DIR is a run directory of a GPT config (for example one of `throughput.py --fp8-loss`'s
bf16 runs); its checkpoint (the newest, or step N) is loaded and one micro-batch of its training
data is run forward and backward in bf16 autocast, capturing each block linear's input x and
output gradient dy. Each recipe is then emulated in float64: operands quantised to fp8 and back
(exactly what torch._scaled_mm multiplies, up to its fp32 accumulation), multiplied, and compared
with the float64 product of the unquantised operands (relative Frobenius error).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from littlelm.components import register_all
from littlelm.data.build import build_data
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.device import autocast

register_all()  # an entry point: fill the registries before reading a config

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
BF16 = (None, None, False)  # (fp8 dtype or None for bf16, amax dim or None for tensorwise, pow2)


def tw(dtype, pow2=False):
    return (dtype, None, pow2)


# operand specs: forward x, w; input gradient dy, w; weight gradient dy, x
RECIPES = {
    "bf16 (for reference)": [BF16] * 6,
    "tensorwise, e5m2 gradients": [tw(E4), tw(E4), tw(E5), tw(E4), tw(E5), tw(E4)],
    "same, power-of-two scales": [tw(E4, 1), tw(E4, 1), tw(E5, 1), tw(E4, 1), tw(E5, 1), tw(E4, 1)],
    "tensorwise, e4m3 gradients, power-of-two (default)": [tw(E4, 1)] * 6,
    # rowwise: x and dy per token (row), w per output row (forward) / input column (dgrad);
    # for the weight gradient dy per output channel and x per input channel (amax over tokens)
    "rowwise, e4m3, power-of-two": [
        (E4, -1, True),
        (E4, 1, True),
        (E4, -1, True),
        (E4, 0, True),
        (E4, 0, True),
        (E4, 0, True),
    ],
    "e4m3, weight gradient in bf16": [tw(E4, 1)] * 4 + [BF16] * 2,
}


def fake_quant(t: torch.Tensor, spec) -> torch.Tensor:
    """float64 copy of t as the GEMM sees it: rounded to bf16, or scaled, cast to fp8, unscaled."""
    dtype, dim, pow2 = spec
    if dtype is None:
        return t.bfloat16().double()
    t = t.double()
    fmax = torch.finfo(dtype).max
    amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    scale = fmax / amax.clamp(min=1e-12)
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (t * scale).clamp(-fmax, fmax).float().to(dtype).double() / scale


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


class Recorder(nn.Linear):
    """A bf16 linear that keeps its input and, after backward, its output gradient."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        self.x = x.detach().reshape(-1, x.shape[-1])  # (B·T, in)

        def keep(g: torch.Tensor) -> None:
            self.g = g.detach().reshape(-1, g.shape[-1])  # (B·T, out)

        y.register_hook(keep)
        return y


def capture(run_dir: Path, step: int | None) -> tuple[dict[str, Recorder], float, Path]:
    cfg = load_run(run_dir / "config.yaml", ["callbacks=[]", "model.fp8=false"])
    found = ckpt.list_checkpoints(run_dir / "checkpoints")
    path = found[-1] if step is None else ckpt.step_dir(run_dir / "checkpoints", step)
    model = cfg.model.build()
    ckpt.load_model_tensors(model, ckpt.load_checkpoint(path, with_optimizer=False).model, path)
    layers = {}
    for name, m in model.named_modules():
        if type(m) is nn.Linear and name.startswith("blocks.") and "ve_gate" not in name:
            m.__class__ = Recorder
            layers[name] = m
    t = cfg.train
    data = build_data(cfg.data, log=lambda *_: None)
    x, y = data.loader(cfg.data, t.micro_batch_size, t.seq_len, cfg.run.seed, 0, 1).next_batch()
    with autocast(torch.device("cpu"), t.precision):
        loss = model(x, y)
    loss.backward()
    return layers, loss.item(), path


def errors(m: Recorder, spec) -> tuple[float, float, float]:
    x64, g64, w64 = m.x.double(), m.g.double(), m.weight.detach().double()
    q = [fake_quant(t, s) for t, s in zip((m.x, m.weight, m.g, m.weight, m.g, m.x), spec)]
    return (
        rel(q[0] @ q[1].T, x64 @ w64.T),  # y = x wᵀ  (B·T, out)
        rel(q[2] @ q[3], g64 @ w64),  # dx = dy w  (B·T, in)
        rel(q[4].T @ q[5], g64.T @ x64),  # dw = dyᵀ x  (out, in)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    p.add_argument("--layers", action="store_true", help="also print every layer")
    args = p.parse_args()
    layers, loss, path = capture(args.run_dir, args.step)
    print(f"{path}: {len(layers)} block linears, batch loss {loss:.4f}\n")
    mean = {r: [0.0, 0.0, 0.0] for r in RECIPES}
    rows = []
    for name, m in layers.items():
        for r, spec in RECIPES.items():
            e = errors(m, spec)
            rows.append(f"| {name} | {r} | " + " | ".join(f"{100 * v:.2f}%" for v in e) + " |")
            mean[r] = [a + b / len(layers) for a, b in zip(mean[r], e)]
    print("| recipe (mean over layers) | forward | input gradient | weight gradient |")
    print("| --- | --- | --- | --- |")
    for r, e in mean.items():
        print(f"| {r} | " + " | ".join(f"{100 * v:.2f}%" for v in e) + " |")
    if args.layers:
        print("\n| layer | recipe | forward | input gradient | weight gradient |")
        print("| --- | --- | --- | --- | --- |")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
