"""Check the planner and the kernel backends on a real GPU: bench three runs, print predicted vs
measured; then time the two backends' kernels against each other.

    python benchmarks/gpu_check.py [--steps 2] [--out gpu_check.json] [--only small,1b,largest]
                                   [--backends 1b|none]

Needs one CUDA GPU (about 8 minutes on an H200, most of it writing and reading the two big
checkpoints) and no download: the data is this interpreter's standard library with a 32k BPE
tokenizer trained on it. The three runs:

    small    the demo model (10M parameters), micro-batch 16 x 512
    1b       a 1.0B Llama-style model (16 x 2048, SwiGLU, fp32 AdamW), seq 2048
    largest  configs/plans/3b_grow (3.1B, fp32 AdamW) at the largest micro-batch the plan says
             fits this GPU: the plan's fit boundary itself is under test

Each run is `littlelm bench` in its own process (steps, a checkpoint save, a resume that loads
the optimizer state, more steps; grad_accum 2 so the gradients stay alive across micro-batches
as in real runs). The table puts the plan's predictions beside the measurements. The script
checks itself and exits non-zero when a bench fails or runs out of memory, when the resume did
not happen, or when a measured peak (allocated or reserved) is more than --tolerance (10%)
away from the prediction. Tokens/s is reported against the catalog's assumed MFU, not checked:
the measured MFU is what bench stores for plan to use.

The runs use `model.backend: auto`, which on CUDA must pick the cuda backend (PyTorch's SDPA,
F.rms_norm and autograd; model/kernels.py): the script checks that each bench ran it. They run
eager (`train.compile=false`) because the planner models the eager step. Then, unless
`--backends none`, `benchmarks/throughput.py --device cuda` times, interleaved at the --backends
size, the cpu backend's kernels (blocked attention is CPU-only, so SDPA plus the hand-written
backward ops and chunked loss), the cuda backend's, and each compiled: the measurement that
decides whether the cuda backend's defaults stay (docs/speed.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from littlelm.components import register_all  # noqa: E402
from littlelm.plan.cost import load_catalog, needed_gib  # noqa: E402
from littlelm.plan.memory import Dims  # noqa: E402
from littlelm.schema import load_run  # noqa: E402

register_all()  # an entry point: fill the registries before reading a config

GIB = 2**30
DATA = [
    "data.sources={stdlib: {name: python_stdlib}}",
    "data.tokenizer={name: bpe, vocab_size: 32768, train_chars: 20000000}",
    "data.val_fraction=0.01",
]
RUNS = {
    "small": ("demo", ["train.micro_batch_size=16", "train.seq_len=512"]),
    "1b": (
        "plans/3b_grow",
        [
            "model.n_layer=16",
            "model.d_model=2048",
            "model.n_head=16",
            "model.n_kv_head=8",
            "model.mlp_hidden=5632",
            "train.micro_batch_size=8",
        ],
    ),
    "largest": ("plans/3b_grow", []),
}


def overrides_for(name: str, config: str, extra: list[str], micro_batch: int | None) -> list[str]:
    out = [*DATA, *extra, "run.out_dir=runs/gpu_check", f"run.name={name}", "run.device=cuda"]
    out += ["model.backend=auto", "train.compile=false"]  # auto must mean cuda; plan = eager
    if micro_batch is not None:
        out.append(f"train.micro_batch_size={micro_batch}")
    cfg = load_run(config, out)
    # two micro-batches per step, whatever the micro-batch: gradients alive as in real runs
    per_micro = cfg.train.micro_batch_size * cfg.train.seq_len
    return [*out, f"train.batch_tokens={2 * per_micro}", "train.grad_accum=null"]


def choose_micro_batch(config: str, extra: list[str], gpu) -> int:
    """The largest micro-batch (two per step) the plan says fits this GPU."""
    catalog = load_catalog()
    best = 1
    for mb in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
        more = ["train.batch_tokens=null", "train.grad_accum=2", f"train.micro_batch_size={mb}"]
        d = Dims.of(load_run(config, [*DATA, *extra, *more]))
        if needed_gib(d, gpu, catalog) <= gpu.memory_gib:
            best = mb
    return best


def bench(name: str, overrides: list[str], config: str, steps: int, timeout: int) -> dict:
    cmd = [sys.executable, "-m", "littlelm", "bench", config, *overrides, "--json"]
    cmd += ["--steps", str(steps)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"name": name, "error": " | ".join(tail), "wall_s": time.perf_counter() - t0}
    result = json.loads(done.stdout[done.stdout.index("{") :])
    return {"name": name, **result}


def check(r: dict, steps: int, tol: float) -> list[str]:
    if "error" in r:
        oom = "out of memory" in r["error"].lower()
        return [("OOM: the plan said it fits" if oom else "bench failed") + f": {r['error']}"]
    bad = []
    if r.get("backend") != "cuda":
        bad.append(f"model.backend=auto ran the {r.get('backend')} backend on CUDA, not cuda")
    if r["resumed_to_step"] != 2 * steps:
        bad.append(f"resume did not reach step {2 * steps}")
    for what in ("allocated", "reserved"):
        ratio = r[f"peak_{what}"] / r[f"predicted_{what}"]
        if abs(ratio - 1) > tol:
            bad.append(f"peak {what} measured/predicted = {ratio:.3f}")
    return bad


def table(results: list[dict]) -> str:
    head = (
        "| run | params | micro-batch | reserved pred / meas (GiB) | ratio | allocated pred / "
        "meas (GiB) | ratio | tok/s pred / meas | ratio | MFU meas | outside PyTorch (GiB) |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | | | failed: {r['error'][:80]} | | | | | | | |")
            continue
        pr, mr = r["predicted_reserved"] / GIB, r["peak_reserved"] / GIB
        pa, ma = r["predicted_allocated"] / GIB, r["peak_allocated"] / GIB
        pt = r.get("predicted_tok_s")
        lines.append(
            f"| {r['name']} | {r['parameters'] / 1e9:.2f}B | {r['micro_batch']} x {r['seq_len']} "
            f"| {pr:.2f} / {mr:.2f} | {mr / pr:.3f} | {pa:.2f} / {ma:.2f} | {ma / pa:.3f} "
            f"| {pt or 0:,.0f} / {r['tok_s']:,.0f} | {r['tok_s'] / pt if pt else float('nan'):.3f} "
            f"| {r['mfu']:.1%} | {r['outside_pytorch'] / GIB:.2f} |"
        )
    return "\n".join(lines)


def time_backends(size: str) -> list[str]:
    """throughput.py's interleaved table of the two backends, eager and compiled; a failure
    (one variant not running) is returned as a problem, the speeds are for the reader."""
    # littlelm = model.backend auto = cuda here; the table's "× littlelm" column compares to it
    variants = ["littlelm", "cpu_backend", "compile", "cpu_backend_compile"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--device", "cuda"]
    cmd += ["--sizes", size, "--variants", *variants, "--interleave", "--steps", "6"]
    cmd += ["--warmup", "2"]
    print("backends:", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    print(done.stdout[-4000:], flush=True)
    if done.returncode != 0:
        return [f"throughput.py exit {done.returncode}: {done.stderr.strip()[-300:]}"]
    ran = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")]
    return [
        f"{v} did not run" for v in variants if v not in ran or f"| {v} | failed" in done.stdout
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2, help="steps before and after the resume")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed memory error")
    p.add_argument("--only", default="small,1b,largest", help="comma-separated run names")
    p.add_argument("--timeout", type=int, default=420, help="seconds per bench")
    p.add_argument("--out", default="gpu_check.json", help="where to write the raw results")
    p.add_argument("--backends", default="1b", help="size for the backend timing, or none")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0)
    gpu = load_catalog().identify(device)
    if gpu is None:
        print(f"{device} is not in the GPU catalog: add it (docs/planning.md)", file=sys.stderr)
        return 2
    print(f"{device} = catalog {gpu.name}; torch {torch.__version__}", flush=True)
    results, failures = [], {}
    for name in args.only.split(","):
        config, extra = RUNS[name]
        mb = choose_micro_batch(config, extra, gpu) if name == "largest" else None
        r = bench(name, overrides_for(name, config, extra, mb), config, args.steps, args.timeout)
        results.append(r)
        failures[name] = check(r, args.steps, args.tolerance)
        print(f"{name}: {'ok' if not failures[name] else '; '.join(failures[name])}", flush=True)
    print(table(results))
    Path(args.out).write_text(json.dumps({"device": device, "results": results}, indent=1))
    if args.backends != "none":
        failures["backends"] = time_backends(args.backends)
    bad = {k: v for k, v in failures.items() if v}
    print("PASS" if not bad else f"FAIL: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
