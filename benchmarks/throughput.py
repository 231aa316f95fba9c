"""Training throughput: littlelm's step beside a naive reference GPT, each speed feature on and
off, at the same shapes, in one run; and the chunked loss's peak memory against the plain one.

    python benchmarks/throughput.py                          # headline: medium, ref/AdamW/Muon
    python benchmarks/throughput.py --variants reference littlelm --interleave --steps 12
    python benchmarks/throughput.py --sizes small medium large --variants all
    python benchmarks/throughput.py --loss-memory            # plain vs chunked loss, V=50304
    python benchmarks/throughput.py --device cuda            # GPU, all checks (< 10 min on an
                                                             #   H200): ~1B config, bf16 / fp8 /
                                                             #   compile / chunked / liger ...,
                                                             #   loss memory, FP8 demo loss
    python benchmarks/throughput.py --fp8-loss all --out DIR    # demo config, 200 steps: bf16,
                                                             #   FP8, both at a 2nd seed; final
                                                             #   val losses side by side

Every variant trains on the same random tokens at the same shapes. `reference` is the naive GPT
this file carries (plain PyTorch: RMSNorm, RoPE, SDPA, relu², untied head, F.cross_entropy on
the full logits, torch AdamW with its default implementation, autocast in `--precision` (bf16
where the hardware has it, else fp32), grad clip 1.0).
Every variant runs the trainer's step (littlelm.train.trainer's micro_step per micro-batch:
autocast, forward, backward; then apply_update: grad-norm clip 1.0, optimizer step); the
littlelm variants run it on littlelm's GPT with its default features (qk norm, value
embeddings, residual scalars, soft cap, chunked loss) unless a variant changes one.
Variants are timed in `--rounds` rounds (each variant rebuilt, warmed up and timed once per
round, in turn, each round starting one variant later), so the machine's slow spells fall on all
of them; the table shows every round and the median. With `--interleave` every variant is built
once and kept, and after `--warmup` steps each, `--steps` rounds each run one step of every
variant in turn: each round's ratio compares steps measured seconds apart, and the table gives
the median of those per-round ratios (and their range) beside the median step's tokens/s. This
is the method for small differences on a noisy machine (the rebuilt rounds spread by ±5-8%).
tokens/s counts the tokens of the timed optimizer steps; MFU = tokens/s · training FLOPs per
token / the device's peak in that precision (littlelm.train.device.peak_flops: the CUDA table, or the CPU
matmul probe). The CPU allocator tuning the trainer applies (tune_cpu_allocator) is applied
once for the whole process, so the reference gets it too.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import TypeAdapter
from torch import nn

from littlelm.components import register_all
from littlelm.hardware import auto_precision
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.optim.groups import OptimizerChoice
from littlelm.train.build import PARAM_DTYPES
from littlelm.train.device import autocast, peak_flops, tune_cpu_allocator
from littlelm.train.step import apply_update, micro_step, synchronize

register_all()  # an entry point: fill the registries before reading a config

# (n_layer, d_model, n_head, seq_len, micro_batch, vocab)
SIZES = {
    "small": (4, 256, 4, 512, 8, 8192),
    "medium": (8, 512, 8, 512, 8, 8192),  # the acceptance shape
    "large": (12, 768, 12, 512, 8, 8192),
    "1b": (20, 2048, 16, 2048, 8, 50304),  # GPU only: ~1.0B non-embedding parameters
}


@dataclass
class Variant:
    name: str
    model: dict = field(default_factory=dict)  # GPTConfig overrides
    optimizer: str = "adamw"
    accum: int = 1
    master_weights: str = "fp32"
    stochastic_rounding: bool = False
    checkpointing: bool = False
    compile: bool = False
    adamw_8bit: bool = False
    cuda_only: bool = False


VARIANTS = {
    "reference": Variant("reference"),
    "littlelm": Variant("littlelm"),
    "muon_accum8": Variant("muon_accum8", optimizer="muon", accum=8),
    "plain_loss": Variant("plain_loss", model={"loss": "plain"}),
    "bf16_weights": Variant("bf16_weights", master_weights="bf16"),
    "bf16_weights_sr": Variant("bf16_weights_sr", master_weights="bf16", stochastic_rounding=True),
    "checkpointing": Variant("checkpointing", checkpointing=True),
    "fp8": Variant("fp8", model={"fp8": True}),
    "compile": Variant("compile", compile=True),
    "compile_fp8": Variant("compile_fp8", model={"fp8": True}, compile=True),
    "liger_loss": Variant("liger_loss", model={"loss": "liger"}, cuda_only=True),
    "adamw_8bit": Variant("adamw_8bit", adamw_8bit=True, cuda_only=True),
    # the two kernel backends (model/kernels.py), whatever the device would pick by itself
    "cpu_backend": Variant("cpu_backend", model={"backend": "cpu"}),
    "cuda_backend": Variant("cuda_backend", model={"backend": "cuda"}),
    "cpu_backend_compile": Variant("cpu_backend_compile", model={"backend": "cpu"}, compile=True),
}
HEADLINE = ["reference", "littlelm", "muon_accum8"]
PRECISION = "bf16"  # --precision, made concrete for the device (littlelm/hardware.py)


# ----------------------------------------------------------------------------------------------
# The naive reference GPT


class RefBlock(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(F.rms_norm(x, (C,))).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head) for t in (q, k, v))  # (B,T,H,D)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # (B, H, T, D)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.relu(self.fc(F.rms_norm(x, (C,)))).square())


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, H, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RefGPT(nn.Module):
    def __init__(self, n_layer: int, d: int, n_head: int, seq: int, vocab: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(RefBlock(d, n_head) for _ in range(n_layer))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        hd = d // n_head
        inv = 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)
        ang = torch.outer(torch.arange(seq).float(), inv)  # (T, D/2)
        self.register_buffer("cos", ang.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin()[None, :, None, :], persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        dt = torch.bfloat16 if PRECISION == "bf16" else torch.float32  # the autocast's dtype
        cos, sin = self.cos.to(dt), self.sin.to(dt)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.lm_head(F.rms_norm(x, (x.size(-1),)))  # (B, T, V)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def ref_flops_per_token(n_layer: int, d: int, seq: int, vocab: int) -> int:
    return 6 * (n_layer * 12 * d * d + d * vocab) + 12 * n_layer * d * seq


# ----------------------------------------------------------------------------------------------
# Building and timing one variant


@dataclass
class Setup:
    step: object  # () -> None: one optimizer step
    tokens: int  # tokens per optimizer step
    flops_per_token: int


def build(v: Variant, size: tuple, device: torch.device, data) -> Setup:
    n_layer, d, n_head, seq, micro, vocab = size
    torch.manual_seed(0)
    x, y = data
    if v.name == "reference":
        with device:  # initialise on the device (fast on a GPU)
            model = RefGPT(n_layer, d, n_head, seq, vocab)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
        fwd = model
        flops = ref_flops_per_token(n_layer, d, seq, vocab)
    else:
        cfg = GPTConfig(
            n_layer=n_layer, d_model=d, n_head=n_head, max_seq_len=seq, vocab_size=vocab, **v.model
        )
        cfg.check_device(device)
        with device:
            model = GPT(cfg).to(dtype=PARAM_DTYPES[v.master_weights])
        model.activation_checkpointing = v.checkpointing
        opt_cfg = TypeAdapter(OptimizerChoice).validate_python(
            {"name": v.optimizer, "adamw_8bit": v.adamw_8bit}
        )
        opt = opt_cfg.build(model, v.stochastic_rounding)
        fwd = torch.compile(model) if v.compile else model
        flops = model.flops_per_token(seq)

    def step() -> None:  # the body of Trainer.train_step, with the trainer's own functions
        for _ in range(v.accum):
            micro_step(fwd, x, y, v.accum, autocast(device, PRECISION))
        apply_update(model, opt, 1.0)

    return Setup(step, micro * seq * v.accum, flops)


def time_variant(v, size, device, data, warmup: int, steps: int) -> tuple[float, int, float]:
    """(tokens/s of `steps` optimizer steps after `warmup` untimed ones, FLOPs per token, peak
    CUDA memory allocated in GiB over build and steps: NaN on a CPU)."""
    if device.type == "cuda":  # each variant's own peak: weights, optimizer state, activations
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    s = build(v, size, device, data)
    for _ in range(warmup):
        s.step()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        s.step()
    synchronize(device)
    rate = steps * s.tokens / (time.perf_counter() - t0)
    flops = s.flops_per_token
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else math.nan
    del s
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rate, flops, peak


def size_data(size: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    *_, seq, micro, vocab = size
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randint(0, vocab, (micro, seq), generator=g).to(device) for _ in range(2))


def size_title(name: str) -> str:
    n_layer, d, n_head, seq, micro, vocab = SIZES[name]
    return f"### {name}: {n_layer} layers × {d} ({n_head} heads), seq {seq}, batch {micro}, vocab {vocab}"


def run_interleaved(name: str, variants: list[str], args, device: torch.device, peak: float):
    """Every variant built once and kept; after --warmup steps each, --steps rounds in which
    each variant runs one optimizer step, in turn (the start rotating by one each round). A
    slow spell of the machine then falls on neighbouring steps of every variant, and each
    round gives a ratio of two steps measured seconds apart: `× reference` is the median of
    those per-round ratios, tokens/s the median step's."""
    size = SIZES[name]
    data = size_data(size, device)
    setups: dict[str, Setup] = {}
    failed: dict[str, str] = {}
    for vn in variants:
        try:
            setups[vn] = build(VARIANTS[vn], size, device, data)
            for _ in range(args.warmup + (2 if VARIANTS[vn].compile else 0)):
                setups[vn].step()
        except Exception as e:  # one failing feature (e.g. compile without a compiler)
            failed[vn] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
            setups.pop(vn, None)
            print(f"  {name} {vn}: failed: {failed[vn]}", file=sys.stderr, flush=True)
    names = list(setups)
    rates: dict[str, list[float]] = {v: [] for v in names}
    for r in range(args.steps):
        for vn in names[r % len(names) :] + names[: r % len(names)]:
            synchronize(device)
            t0 = time.perf_counter()
            setups[vn].step()
            synchronize(device)
            rates[vn].append(setups[vn].tokens / (time.perf_counter() - t0))
        print(
            f"  {name} round {r + 1}: " + ", ".join(f"{v} {rates[v][-1]:,.0f}" for v in names),
            file=sys.stderr,
            flush=True,
        )
    print(f"\n{size_title(name)} (interleaved, {args.steps} rounds)\n")
    print(
        "| variant | tokens/s (median step) | min-max | MFU | × reference | × littlelm | ref. ratio min-max |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")

    def ratio(vn: str, base: str) -> tuple[str, str]:
        if base not in rates:
            return "", ""
        each = sorted(a / b for a, b in zip(rates[vn], rates[base], strict=True))
        return f"{statistics.median(each):.3f}", f"{each[0]:.3f}-{each[-1]:.3f}"

    for vn in variants:
        if vn in failed:
            print(f"| {vn} | failed: {failed[vn]} | | | | | |")
            continue
        med = statistics.median(rates[vn])
        mfu = med * setups[vn].flops_per_token / peak if math.isfinite(peak) else float("nan")
        (ref, spread), (lit, _) = ratio(vn, "reference"), ratio(vn, "littlelm")
        lo, hi = min(rates[vn]), max(rates[vn])
        print(
            f"| {vn} | {med:,.0f} | {lo:,.0f}-{hi:,.0f} | {100 * mfu:.1f}% | {ref} | {lit} | {spread} |"
        )


def run_size(name: str, variants: list[str], args, device: torch.device, peak: float) -> None:
    if args.interleave:
        return run_interleaved(name, variants, args, device, peak)
    size = SIZES[name]
    data = size_data(size, device)
    rates: dict[str, list[float]] = {v: [] for v in variants}
    flops: dict[str, int] = {}
    peaks: dict[str, float] = {}  # GiB allocated, the largest over rounds (CUDA)
    failed: dict[str, str] = {}
    for r in range(args.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]  # rotate the start
        for vn in [v for v in order if v not in failed]:
            v = VARIANTS[vn]
            steps = max(1, args.steps // v.accum) if v.accum > 1 else args.steps
            warm = args.warmup + (2 if v.compile else 0)
            try:
                rate, flops[vn], peak_gib = time_variant(v, size, device, data, warm, steps)
            except Exception as e:  # one failing feature (e.g. compile without a compiler)
                failed[vn] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                print(f"  {name} {vn}: failed: {failed[vn]}", file=sys.stderr, flush=True)
                if device.type == "cuda":  # an OOM's leftovers must not crowd the next variant
                    gc.collect()
                    torch.cuda.empty_cache()
                continue
            rates[vn].append(rate)
            peaks[vn] = max(peaks.get(vn, 0.0), peak_gib)
            mfu = rate * flops[vn] / peak if math.isfinite(peak) else float("nan")
            # one line per variant as it finishes: a run cut short still leaves its figures
            print(
                f"  {name} {vn}: {rate:,.0f} tok/s, MFU {100 * mfu:.1f}%, peak {peak_gib:.2f} GiB",
                file=sys.stderr,
                flush=True,
            )
    print(f"\n{size_title(name)}\n")
    print(
        "| variant | tokens/s (median) | rounds | MFU | × reference | × littlelm "
        "| peak allocated (GiB) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    med = {vn: statistics.median(r) for vn, r in rates.items() if r}
    for vn in variants:
        if vn in failed:
            print(f"| {vn} | failed: {failed[vn]} | | | | | |")
            continue
        mfu = med[vn] * flops[vn] / peak if math.isfinite(peak) else float("nan")
        ref = f"{med[vn] / med['reference']:.3f}" if "reference" in med else ""
        lit = f"{med[vn] / med['littlelm']:.3f}" if "littlelm" in med else ""
        each = " / ".join(f"{r:,.0f}" for r in rates[vn])
        mem = f"{peaks[vn]:.2f}" if math.isfinite(peaks[vn]) else ""
        print(f"| {vn} | {med[vn]:,.0f} | {each} | {100 * mfu:.1f}% | {ref} | {lit} | {mem} |")


# ----------------------------------------------------------------------------------------------
# Loss memory: plain vs chunked


def loss_child(impl: str, vocab: int, rows: int, width: int, device: torch.device) -> dict:
    """Peak memory above the inputs, and time, of the loss's forward + backward (one process per
    implementation on a CPU, so ru_maxrss is this implementation's high-water mark)."""
    from littlelm.model.kernels import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    padded = (vocab + 63) // 64 * 64
    x = torch.randn(1, rows, width, generator=g).to(device, torch.bfloat16).requires_grad_()
    w = (torch.randn(padded, width, generator=g) * 0.02).to(device).requires_grad_()
    t = torch.randint(0, vocab, (1, rows), generator=g).to(device)
    w.grad = torch.zeros_like(w)  # the gradient buffer exists in training: not the loss's memory
    x.grad = torch.zeros_like(x)

    def once() -> None:
        with autocast(device, "bf16"):
            loss = linear_cross_entropy(x, w, t, vocab, 15.0, "mean", impl, 256)
        loss.backward()

    synchronize(device)
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        base = current_rss()
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        once()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"impl": impl, "peak_bytes": peak, "seconds": statistics.median(times[1:])}


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def loss_memory(args, device: torch.device) -> None:
    vocab, rows, width = 50304, 8192, args.loss_width
    results = {}
    for impl in ["plain", "chunked"] + (["liger"] if device.type == "cuda" else []):
        cmd = [sys.executable, __file__, "--loss-child", impl, "--device", device.type]
        cmd += ["--loss-width", str(width)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"  {impl}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        results[impl] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n### loss forward + backward: vocab {vocab}, B·T {rows}, width {width}, bf16\n")
    print("| loss | peak memory above inputs | × plain | seconds | tokens/s | × plain speed |")
    print("| --- | --- | --- | --- | --- | --- |")
    plain = results.get("plain")
    for impl, r in results.items():
        mem = f"{r['peak_bytes'] / plain['peak_bytes']:.3f}" if plain else ""
        spd = f"{plain['seconds'] / r['seconds']:.3f}" if plain else ""
        gib = r["peak_bytes"] / 2**30
        tok = rows / r["seconds"]
        print(f"| {impl} | {gib:.2f} GiB | {mem} | {r['seconds']:.3f} | {tok:,.0f} | {spd} |")


# ----------------------------------------------------------------------------------------------
# FP8 vs bf16 loss on the demo config


def fp8_runs(args) -> dict[str, list[str]]:
    """Run name -> its overrides: bf16 and fp8 at the default seed (same init, same data), and
    both again at --spread-seed."""
    seed = [f"run.seed={args.spread_seed}"]
    return {
        "bf16": ["model.fp8=false"],
        "fp8": ["model.fp8=true"],
        f"bf16-seed{args.spread_seed}": ["model.fp8=false", *seed],
        f"fp8-seed{args.spread_seed}": ["model.fp8=true", *seed],
    }


def fp8_loss(args, device: torch.device) -> None:
    """Train the demo config for --fp8-steps steps with model.fp8 off and on (same seed, same
    data), and both again at a second seed (the bf16 seed-to-seed spread is what the FP8 gap is
    judged against); compare the final validation losses. --stop-after N trains at most N more steps per run and
    call, resuming from the checkpoints next time (to split a CPU run into short locked
    commands; resumes are exact)."""
    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    runs = fp8_runs(args)
    names = list(runs)
    todo = {"seed": names[2:], "both": names[:2], "all": names, "report": []}.get(
        args.fp8_loss, [args.fp8_loss]
    )
    for key in todo:
        overrides = [
            f"run.name=fp8check-{key}",
            f"run.out_dir={args.out}",
            f"run.device={device.type}",
            f"train.max_steps={args.fp8_steps}",
            "callbacks=[]",
            *runs[key],
            *args.override,
        ]
        Trainer(load_run("demo", overrides)).fit(stop_after=args.stop_after)
    fp8_report(args, runs, device)


def final_losses(path: Path, steps: int) -> tuple[float, float, float] | None:
    """(final val loss, mean train loss of the last 5 records, last tokens/s) of a finished
    run's metrics.jsonl; None while it has not reached `steps`."""
    if not path.is_file():
        return None
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    if not (train and train[-1]["step"] == steps and evals and evals[-1]["step"] == steps):
        return None
    last = [r["loss"] for r in train[-5:]]
    return evals[-1]["val_loss"], sum(last) / len(last), train[-1]["tok_per_s"]


def bf16_eval_of_fp8(args, device: torch.device) -> float:
    """Validation loss of the fp8 run's final checkpoint with its FP8 linears computing in
    bf16: how much of the FP8 gap is the FP8 forward at evaluation time."""
    from littlelm.model.bpb import evaluate_loss
    from littlelm.model.fp8 import FP8Linear
    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    overrides = [
        "run.name=fp8check-fp8",
        f"run.out_dir={args.out}",
        f"run.device={device.type}",
        f"train.max_steps={args.fp8_steps}",
        "callbacks=[]",
        "model.fp8=true",
        *args.override,
    ]
    t = Trainer(load_run("demo", overrides))
    assert t.step == args.fp8_steps, t.step
    for m in t.model.modules():
        if isinstance(m, FP8Linear):
            m.__class__ = nn.Linear  # same weight; F.linear under bf16 autocast
    c = t.cfg  # the batches Trainer.evaluate uses; not logged to the run's metrics
    batches = t.data.val_batches(
        c.eval.batch_size or c.train.micro_batch_size, c.train.seq_len, c.eval.max_tokens
    )
    token_bytes = torch.from_numpy(t.data.tokenizer.token_bytes()).to(t.device)
    return evaluate_loss(t.model, batches, token_bytes, t.device, t.autocast)["val_loss"]


def fp8_report(args, runs: dict[str, list[str]], device: torch.device) -> None:
    rows = {}
    for name in runs:
        found = final_losses(args.out / f"fp8check-{name}" / "metrics.jsonl", args.fp8_steps)
        if found:
            rows[name] = found
    print(f"\n### demo config, {args.fp8_steps} steps, bf16 vs FP8 ({' '.join(args.override)})\n")
    print("| run | final val loss | mean train loss, last 5 records | tokens/s (last) |")
    print("| --- | --- | --- | --- |")
    for name, (val, train_loss, tok) in rows.items():
        print(f"| {name} | {val:.4f} | {train_loss:.4f} | {tok:,.0f} |")
    s = args.spread_seed
    pairs = [(f"bf16-seed{s}", "bf16", f"bf16 seed {s} vs bf16 seed 1337 (run-to-run spread)")]
    pairs += [("fp8", "bf16", "FP8 vs bf16, seed 1337 (target: within ±2%)")]
    pairs += [(f"fp8-seed{s}", f"bf16-seed{s}", f"FP8 vs bf16, seed {s} (target: within ±2%)")]
    print()
    for a, b, what in pairs:
        if a in rows and b in rows:
            print(f"{what}: final val loss {100 * (rows[a][0] / rows[b][0] - 1):+.2f}%")
    if "bf16" in rows and "fp8" in rows:
        val = bf16_eval_of_fp8(args, device)
        rel = val / rows["bf16"][0] - 1
        print(
            f"FP8-trained weights evaluated with bf16 matmuls: val loss {val:.4f}, "
            f"{100 * rel:+.2f}% vs bf16"
        )


# ----------------------------------------------------------------------------------------------


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return platform.processor() or "cpu"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "bf16", "fp32"],
        help="every variant's autocast (and the peak MFU is against); auto: bf16 where the "
        "hardware computes it natively, fp32 elsewhere (as train.precision)",
    )
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), help="default: medium (1b on cuda)")
    p.add_argument("--variants", nargs="+", help=f"names from {list(VARIANTS)}, or 'all'")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps per round")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per round")
    p.add_argument("--rounds", type=int, help="default: 2 (1 on cuda)")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="build every variant once and alternate their steps (--steps rounds); ratios are "
        "medians of per-round ratios",
    )
    p.add_argument("--loss-memory", action="store_true", help="plain vs chunked loss only")
    p.add_argument("--loss-width", type=int, default=768, help="hidden width for --loss-memory")
    p.add_argument("--loss-child", help=argparse.SUPPRESS)
    p.add_argument(
        "--fp8-loss",
        choices=["bf16", "fp8", "seed", "both", "all", "report"],
        help="demo config: bf16 and FP8 (both), both at --spread-seed (seed), all, one, report",
    )
    p.add_argument("--spread-seed", type=int, default=7, help="with --fp8-loss: 2nd seed")
    p.add_argument("--fp8-steps", type=int, default=200)
    p.add_argument("--stop-after", type=int, help="with --fp8-loss: at most this many steps")
    p.add_argument("--out", type=Path, default=Path("/tmp/littlelm-throughput"))
    p.add_argument("--override", nargs="*", default=[], help="with --fp8-loss: KEY=VALUE ...")
    args = p.parse_args()
    device = torch.device(args.device)
    if args.loss_child:
        print(json.dumps(loss_child(args.loss_child, 50304, 8192, args.loss_width, device)))
        return
    if device.type == "cpu":
        tune_cpu_allocator()
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else cpu_name()
    global PRECISION
    PRECISION = auto_precision(args.precision, device.type)
    peak = peak_flops(device, precision=PRECISION)
    print(
        f"{name}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{PRECISION} peak {peak / 1e12:.3g} TFLOP/s, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("command: python " + " ".join(sys.argv))
    if args.loss_memory or args.fp8_loss:
        if args.loss_memory:
            loss_memory(args, device)
        if args.fp8_loss:
            fp8_loss(args, device)
        return
    sizes = args.sizes or (["1b"] if cuda else ["medium"])
    variants = args.variants or (list(VARIANTS) if cuda else HEADLINE)
    if variants == ["all"]:
        variants = list(VARIANTS)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    variants = [v for v in variants if cuda or not VARIANTS[v].cuda_only]
    args.rounds = args.rounds or (1 if cuda else 2)
    for s in sizes:
        run_size(s, variants, args, device, peak)
    if cuda and not args.sizes and not args.variants:  # the whole GPU check in one command
        loss_memory(args, device)
        args.fp8_loss = "all"
        fp8_loss(args, device)


if __name__ == "__main__":
    main()
