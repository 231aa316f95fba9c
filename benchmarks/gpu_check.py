"""Every CUDA path of littlelm, run once on a real GPU, one line each: planner memory against
measurement, speed and MFU of each feature at ~1B, the losses' memory, FP8 against bf16 over a
short run, an SFT run and a chat reply.

    python benchmarks/gpu_check.py [--data DIR] [--only SECTIONS] [--deadline 540] [--out DIR]
    python benchmarks/gpu_check.py --dry-run        # the same sections at toy sizes on the CPU

Needs one CUDA GPU and no download. The sections, in order (each in its own process, with its
own time limit; a failure is reported and the next section runs):

    env            device, torch, CUDA, compute capability, which optional kernels import
    bench-small    the demo model (10M parameters), micro-batch 16 x 512
    bench-1b       a 1.0B Llama-style model (16 x 2048, SwiGLU, fp32 AdamW), micro-batch 8 x 2048
    speed-1b       benchmarks/throughput.py at its 1b size (20 x 2048, vocab 50304, 8 x 2048):
                   tokens/s, MFU and peak memory of the default step (bf16, cuda backend,
                   chunked loss), FP8, compiled, compiled FP8, Liger's loss, the plain loss,
                   bitsandbytes' 8-bit AdamW, activation checkpointing, bf16 master weights
    loss-memory    plain vs chunked vs Liger loss, forward + backward, vocab 50304, 8192 rows
    fp8-loss       the demo-shaped model for 200 steps in bf16 and in FP8, at two seeds
    sft            SFT of the fp8-loss section's bf16 model on the shipped chat task, then
                   `littlelm chat --prompt` and `littlelm eval --chat` on the GPU
    qlora          `littlelm bench` of that SFT as QLoRA (lora.quantize=nf4: bitsandbytes'
                   4-bit base, adapters trained): steps, a save and a resume, its peak memory
                   against the plan's; --dry-run: the refusal on the CPU, named
    bench-largest  configs/plans/3b_grow (3.1B, fp32 AdamW) at the largest micro-batch the plan
                   says fits this GPU: the plan's fit boundary itself is under test

Each bench is `littlelm bench` (steps, a checkpoint save, a resume that loads the optimizer
state, more steps; grad_accum 2 so the gradients stay alive across micro-batches as in real
runs), eager (`train.compile=false`, the planner models the eager step) with `model.backend:
auto`, which on CUDA must pick the cuda backend. A bench fails the check when it fails or runs
out of memory, when the resume did not happen, or when a measured peak (allocated or reserved)
is more than --tolerance (10%) away from the plan's prediction.

Data: by default the benches train a 32k BPE on this interpreter's standard library (about a
minute); `--data DIR` names shards `littlelm data prepare` made instead (and the tokenizer saved
with them), which skips that on the GPU machine. Everything lands in --out: gpu_check.json (the
raw results, rewritten after every section) and gpu_check.log (every section's output).
--deadline bounds the whole script: a section that cannot finish before it is skipped, said so.

Multi-GPU paths (DDP, FSDP2 with NCCL) need two GPUs and are not in this script.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from littlelm.components import register_all  # noqa: E402
from littlelm.plan.cost import load_catalog, needed_gib  # noqa: E402
from littlelm.plan.dims import Dims  # noqa: E402
from littlelm.schema import load_run  # noqa: E402

register_all()  # an entry point: fill the registries before reading a config

GIB = 2**30
STDLIB_DATA = [
    "data.sources={stdlib: {name: python_stdlib}}",
    "data.tokenizer={name: bpe, vocab_size: 32768, train_chars: 20000000}",
    "data.val_fraction=0.01",
]
BENCHES = {
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
TOY = ["model.n_layer=2", "model.d_model=128", "model.n_head=4", "model.n_kv_head=2"]
TOY += ["model.mlp_hidden=256"]
# --dry-run: the same sections on the CPU at toy sizes, to catch a broken script before renting
DRY_BENCHES = {
    "small": ("demo", ["model.n_layer=2", "train.micro_batch_size=2", "train.seq_len=64"]),
    "1b": (
        "plans/3b_grow",
        [*TOY, "train.micro_batch_size=2", "train.seq_len=64"],
    ),
    "largest": (
        "plans/3b_grow",
        [*TOY, "train.seq_len=64"],
    ),
}
# eager ones first: the compiled ones spend most of the section's time compiling
SPEED_VARIANTS = [
    "littlelm",
    "fp8",
    "liger_loss",
    "adamw_8bit",
    "checkpointing",
    "bf16_weights",
    "compile",
    "compile_fp8",
]
# the time each section may take on an H200 (seconds), cut to what is left of --deadline
LIMITS = {
    "env": 60,
    "bench-small": 120,
    "bench-1b": 150,
    "speed-1b": 210,
    "loss-memory": 90,
    "fp8-loss": 180,
    "sft": 150,
    "qlora": 120,
    "bench-largest": 300,
}


class Check:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = self.out / "gpu_check.log"
        self.results: dict[str, dict] = {}
        self.t0 = time.monotonic()
        self.device = "cpu" if args.dry_run else "cuda"
        self.runs = ROOT / "runs" / "gpu_check"

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.t0)

    def say(self, text: str) -> None:
        print(text, flush=True)
        with self.log.open("a") as f:
            f.write(text + "\n")

    def record(self, name: str, result: dict) -> None:
        self.results[name] = result
        line = result.get("line", "")
        self.say(f"== {name}: {'ok' if result.get('ok') else 'FAIL'} ({result['s']:.0f} s) {line}")
        doc = {"device": self.results.get("env", {}).get("device"), "sections": self.results}
        (self.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))

    def sh(self, cmd: list[str], limit: float, env: dict | None = None) -> tuple[int, str]:
        """Run `cmd` from the repository root, its output into the log; (rc, output). rc 124
        when it ran past `limit` seconds (what it printed by then is kept)."""
        self.say("$ " + " ".join(cmd))
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        try:
            done = subprocess.run(
                cmd,
                cwd=ROOT,
                env=full_env,
                capture_output=True,
                text=True,
                timeout=max(1.0, limit),
            )
            rc, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"") + (e.stderr or b"")
            rc, text = 124, out.decode(errors="replace") if isinstance(out, bytes) else out
        with self.log.open("a") as f:
            f.write(text + f"\n[exit {rc}]\n")
        return rc, text

    def data_overrides(self) -> list[str]:
        if self.args.data:
            d = self.args.data
            return [
                f"data.tokenizer={{name: saved, path: {d}}}",
                f"data.sources={{d: {{name: shards, path: {d}}}}}",
            ]
        return STDLIB_DATA

    def common(self) -> list[str]:
        return [*self.data_overrides(), f"run.out_dir={self.runs}", f"run.device={self.device}"]

    # ------------------------------------------------------------------------------------------

    def env(self) -> dict:
        info = {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": sys.version.split()[0],
        }
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            info["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
            gpu = load_catalog().identify(info["device"])
            info["catalog"] = gpu.name if gpu else None
        else:
            info["device"] = "cpu"
        for mod in ("liger_kernel", "bitsandbytes", "torchao", "triton"):
            spec = importlib.util.find_spec(mod)
            info[mod] = spec is not None
        # the optional kernels must load, not just be found: import them for real
        for mod in ("liger_kernel.transformers", "bitsandbytes"):
            if importlib.util.find_spec(mod.split(".")[0]):
                try:
                    __import__(mod)
                except Exception as e:
                    info[f"{mod} import"] = f"{type(e).__name__}: {e}"[:200]
        ok = self.args.dry_run or (info.get("catalog") is not None)
        line = ", ".join(f"{k} {v}" for k, v in info.items())
        return {"ok": ok, "line": line, **info}

    def choose_micro_batch(self, config: str, extra: list[str]) -> int:
        """The largest micro-batch (two per step) the plan says fits this GPU."""
        if self.args.dry_run:
            return 2
        catalog = load_catalog()
        gpu = catalog.identify(torch.cuda.get_device_name(0))
        best = 1
        for mb in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
            more = ["train.batch_tokens=null", "train.grad_accum=2", f"train.micro_batch_size={mb}"]
            d = Dims.of(load_run(config, [*self.data_overrides(), *extra, *more]))
            if needed_gib(d, gpu, catalog) <= gpu.memory_gib:
                best = mb
        return best

    def bench(self, name: str, limit: float) -> dict:
        config, extra = (DRY_BENCHES if self.args.dry_run else BENCHES)[name]
        over = [*self.common(), *extra, f"run.name={name}"]
        over += ["model.backend=auto", "train.compile=false"]  # auto must mean cuda; plan = eager
        if name == "largest":
            over.append(f"train.micro_batch_size={self.choose_micro_batch(config, extra)}")
        cfg = load_run(config, over)
        per_micro = cfg.train.micro_batch_size * cfg.train.seq_len
        # two micro-batches per step, whatever the micro-batch: gradients alive as in real runs
        over += [f"train.batch_tokens={2 * per_micro}", "train.grad_accum=null"]
        steps = str(self.args.steps)
        cmd = [sys.executable, "-m", "littlelm", "bench", config, *over, "--json", "--steps", steps]
        rc, text = self.sh(cmd, limit)
        if rc != 0:
            oom = "out of memory" in text.lower()
            tail = " | ".join(text.strip().splitlines()[-4:])[-400:]
            what = "OOM: the plan said it fits" if oom else f"bench exit {rc}"
            return {"ok": False, "line": f"{what}: {tail}"}
        r = json.loads(text[text.index("{") : text.rindex("}") + 1])
        r.pop("config", None)
        bad = []
        if r.get("backend") != self.device and not self.args.dry_run:
            bad.append(f"model.backend=auto ran the {r.get('backend')} backend on CUDA")
        if r["resumed_to_step"] != 2 * self.args.steps:
            bad.append(f"resume did not reach step {2 * self.args.steps}")
        if self.args.dry_run:  # the CPU bench predicts other quantities; the script ran
            line = f"{r['parameters'] / 1e6:.1f}M, {r['tok_s']:,.0f} tok/s (dry run)"
            return {"ok": not bad, "line": "; ".join([line, *bad]), **r}
        parts = []
        for what in ("allocated", "reserved"):
            ratio = r[f"peak_{what}"] / r[f"predicted_{what}"]
            parts.append(
                f"{what} {r[f'predicted_{what}'] / GIB:.2f} pred / {r[f'peak_{what}'] / GIB:.2f} "
                f"meas GiB ({ratio:.3f})"
            )
            if abs(ratio - 1) > self.args.tolerance:
                bad.append(f"peak {what} measured/predicted = {ratio:.3f}")
        pt = r.get("predicted_tok_s") or float("nan")
        line = (
            f"{r['parameters'] / 1e9:.2f}B mb {r['micro_batch']}x{r['seq_len']}: "
            + ", ".join(parts)
            + f"; {r['tok_s']:,.0f} tok/s (pred {pt:,.0f}), MFU {r['mfu']:.1%}, "
            f"outside PyTorch {r['outside_pytorch'] / GIB:.2f} GiB, wall {r['wall_s']:.0f} s"
        )
        return {"ok": not bad, "line": "; ".join([line, *bad]), **r}

    def speed(self, limit: float) -> dict:
        cmd = [sys.executable, "benchmarks/throughput.py", "--device", self.device]
        if self.args.dry_run:
            cmd += ["--sizes", "small", "--variants", "littlelm", "plain_loss", "checkpointing"]
            cmd += ["bf16_weights", "--steps", "1", "--warmup", "1", "--rounds", "1"]
        else:
            cmd += ["--sizes", "1b", "--variants", *SPEED_VARIANTS]
            cmd += ["--steps", "4", "--warmup", "1", "--rounds", "1"]
        rc, text = self.sh(cmd, limit)
        rows = {}
        for m in re.finditer(
            r"^  \S+ (\w+): ([\d,]+) tok/s, MFU ([\d.na]+)%, peak ([\d.na]+) GiB", text, re.M
        ):
            rows[m.group(1)] = {
                "tok_s": float(m.group(2).replace(",", "")),
                "mfu": m.group(3),
                "peak_gib": m.group(4),
            }
        failed = dict(re.findall(r"^  \S+ (\w+): failed: (.*)$", text, re.M))
        base = rows.get("littlelm", {}).get("tok_s")
        parts = []
        for v, r in rows.items():
            x = f" x{r['tok_s'] / base:.2f}" if base else ""
            parts.append(f"{v} {r['tok_s']:,.0f} tok/s{x} MFU {r['mfu']}% {r['peak_gib']} GiB")
        parts += [f"{v} FAILED {why[:120]}" for v, why in failed.items()]
        ok = rc == 0 and not failed and bool(rows)
        head = "" if rc == 0 else f"exit {rc}; "
        return {"ok": ok, "line": head + "; ".join(parts), "variants": rows, "failed": failed}

    def loss_memory(self, limit: float) -> dict:
        cmd = [sys.executable, "benchmarks/throughput.py", "--device", self.device]
        cmd += ["--loss-memory"] + (["--loss-width", "64"] if self.args.dry_run else [])
        rc, text = self.sh(cmd, limit)
        rows = re.findall(
            r"^\| (\w+) \| ([\d.]+) GiB \| ([\d.]*) \| ([\d.]+) \| ([\d,]+) \|", text, re.M
        )
        line = "; ".join(f"{i} {g} GiB ({x}x plain) {t} tok/s" for i, g, x, _, t in rows)
        want = {"plain", "chunked"} | (set() if self.args.dry_run else {"liger"})
        ok = rc == 0 and want <= {r[0] for r in rows}
        return {"ok": ok, "line": (f"exit {rc}; " if rc else "") + line, "rows": rows}

    def fp8_loss(self, limit: float) -> dict:
        steps = "20" if self.args.dry_run else "200"
        which = "both" if self.args.dry_run else "all"
        cmd = [sys.executable, "benchmarks/throughput.py", "--device", self.device]
        cmd += ["--fp8-loss", which, "--fp8-steps", steps, "--out", str(self.runs / "fp8")]
        over = [*self.data_overrides(), "eval.every=50"]
        if self.args.dry_run:  # FP8 needs a GPU: the CPU runs both as bf16
            over += ["model.n_layer=2", "train.micro_batch_size=2", "train.seq_len=64"]
            over += ["eval.every=10", "eval.max_tokens=512"]
        cmd += ["--override", *over]
        if self.args.dry_run:  # model.fp8 would be refused on the CPU: run bf16 twice
            cmd = [c.replace("model.fp8=true", "model.fp8=false") for c in cmd]
        rc, text = self.sh(cmd, limit)
        vals = re.findall(r"^(FP8 vs bf16.*|bf16 seed .*|FP8-trained .*)$", text, re.M)
        rows = re.findall(
            r"^\| (fp8check-\S+|bf16\S*|fp8\S*) \| ([\d.]+) \| ([\d.]+) \| ([\d,]+) \|", text, re.M
        )
        line = (
            "; ".join(f"{n} val {v}" for n, v, _, _ in rows)
            + ("; " if vals else "")
            + "; ".join(vals)
        )
        return {"ok": rc == 0 and len(rows) >= 2, "line": (f"exit {rc}; " if rc else "") + line}

    def sft(self, limit: float) -> dict:
        t0 = time.monotonic()
        base = self.runs / "fp8" / "fp8check-bf16"
        if not (base / "config.yaml").exists() and not any(base.glob("*")):
            return {
                "ok": False,
                "line": f"no base model at {base}: the fp8-loss section did not run",
            }
        chat = self.runs / "chat"
        rc, text = self.sh(
            [
                sys.executable,
                "scripts/make_chat_example.py",
                "--out",
                str(chat),
                "--train",
                "4000",
                "--test",
                "50",
            ],
            limit,
        )
        if rc:
            return {"ok": False, "line": f"make_chat_example exit {rc}: {text[-300:]}"}
        over = [
            f"grow.parent={base}",
            f"data.tokenizer.path={base}",
            f"data.sources.reverse.dataset={chat / 'train.jsonl'}",
            f"run.out_dir={self.runs}",
            "run.name=sft",
            f"run.device={self.device}",
            "train.max_steps=60" if not self.args.dry_run else "train.max_steps=4",
            "eval.every=30" if not self.args.dry_run else "eval.every=2",
            "checkpoint.every=0",
            "--resume",
            "never",
        ]
        if self.args.dry_run:
            over += ["model.n_layer=2", "train.micro_batch_size=2", "train.seq_len=64"]
        rc, text = self.sh([sys.executable, "-m", "littlelm", "train", "sft_demo", *over], limit)
        if rc:
            return {
                "ok": False,
                "line": f"SFT exit {rc}: {' | '.join(text.strip().splitlines()[-3:])}",
            }
        val = re.findall(r"val[_ ]loss[ =:]+([\d.]+)", text)
        run = self.runs / "sft"
        left = limit - (time.monotonic() - t0)
        rc, reply = self.sh(
            [
                sys.executable,
                "-m",
                "littlelm",
                "chat",
                str(run),
                "--prompt",
                "Reverse: k q x m",
                "--device",
                self.device,
            ],
            left,
        )
        if rc:
            return {"ok": False, "line": f"chat exit {rc}: {reply[-300:]}"}
        left = limit - (time.monotonic() - t0)
        rc, ev = self.sh(
            [
                sys.executable,
                "-m",
                "littlelm",
                "eval",
                str(run),
                "--chat",
                str(chat / "tasks"),
                "--device",
                self.device,
            ],
            left,
        )
        score = re.findall(r"(reverse\S*.*)$", ev, re.M)
        line = (
            f"SFT val loss {val[-1] if val else '?'}; chat reply {reply.strip().splitlines()[-1][:60]!r}; "
            f"eval --chat exit {rc}: {(score[-1] if score else ev.strip()[-120:])[:120]}"
        )
        return {"ok": rc == 0, "line": line}

    def qlora(self, limit: float) -> dict:
        """QLoRA of the sft section's base, benched: the NF4 base must build, train, save and
        resume, and its measured peak meet the plan's. On the CPU (--dry-run) the run must be
        refused with the fix named, not crash."""
        base = self.runs / "fp8" / "fp8check-bf16"
        chat = self.runs / "chat"
        if not (chat / "train.jsonl").exists():
            return {"ok": False, "line": f"no {chat / 'train.jsonl'}: the sft section did not run"}
        over = [
            f"sft.base={base}",
            f"data.tokenizer.path={base}",
            f"data.sources.reverse.dataset={chat / 'train.jsonl'}",
            f"run.out_dir={self.runs}",
            "run.name=qlora",
            f"run.device={self.device}",
            "lora={quantize: nf4}",
            "model.backend=auto",
            "train.compile=false",
            "train.batch_tokens=4096",  # two micro-batches of 16 x 128
            "train.grad_accum=null",
        ]
        if self.args.dry_run:
            over += ["model.n_layer=2", "train.micro_batch_size=2", "train.seq_len=64"]
        steps = str(self.args.steps)
        cmd = [sys.executable, "-m", "littlelm", "bench", "sft_demo", *over, "--json"]
        rc, text = self.sh([*cmd, "--steps", steps], limit)
        if self.args.dry_run:  # the CPU must refuse QLoRA, naming the fix
            named = "needs a CUDA GPU" in text and "lora.quantize=none" in text
            line = "refused on the CPU with the fix named" if named else f"exit {rc}: {text[-300:]}"
            return {"ok": rc != 0 and named, "line": line}
        if rc != 0:
            tail = " | ".join(text.strip().splitlines()[-4:])[-400:]
            return {"ok": False, "line": f"bench exit {rc}: {tail}"}
        r = json.loads(text[text.index("{") : text.rindex("}") + 1])
        r.pop("config", None)
        bad = []
        if r["resumed_to_step"] != 2 * self.args.steps:
            bad.append(f"resume did not reach step {2 * self.args.steps}")
        ratio = r["peak_allocated"] / r["predicted_allocated"]
        if abs(ratio - 1) > self.args.tolerance:
            bad.append(f"peak allocated measured/predicted = {ratio:.3f}")
        line = (
            f"QLoRA {r['parameters'] / 1e6:.1f}M: allocated {r['predicted_allocated'] / GIB:.3f} "
            f"pred / {r['peak_allocated'] / GIB:.3f} meas GiB ({ratio:.3f}); "
            f"{r['tok_s']:,.0f} tok/s (pred {r.get('predicted_tok_s') or float('nan'):,.0f})"
        )
        return {"ok": not bad, "line": "; ".join([line, *bad]), **r}

    # ------------------------------------------------------------------------------------------

    def run(self) -> int:
        sections = {
            "env": lambda limit: self.env(),
            "bench-small": lambda limit: self.bench("small", limit),
            "bench-1b": lambda limit: self.bench("1b", limit),
            "speed-1b": self.speed,
            "loss-memory": self.loss_memory,
            "fp8-loss": self.fp8_loss,
            "sft": self.sft,
            "qlora": self.qlora,
            "bench-largest": lambda limit: self.bench("largest", limit),
        }
        only = self.args.only.split(",") if self.args.only else list(sections)
        unknown = set(only) - set(sections)
        if unknown:
            print(
                f"unknown sections {sorted(unknown)}; choose from {list(sections)}", file=sys.stderr
            )
            return 2
        for name in [s for s in sections if s in only]:
            limit = min(LIMITS[name], self.left() - 5)
            if limit < (LIMITS[name] if name == "bench-largest" else 20):  # no half a 3B bench
                self.record(name, {"ok": False, "s": 0, "line": "skipped: --deadline reached"})
                continue
            t0 = time.monotonic()
            try:
                result = sections[name](limit)
            except Exception as e:  # one broken section must not hide the others' figures
                result = {"ok": False, "line": f"{type(e).__name__}: {e}"[:400]}
            result["s"] = time.monotonic() - t0
            self.record(name, result)
        bad = [k for k, v in self.results.items() if not v.get("ok")]
        self.say("PASS" if not bad else f"FAIL: {', '.join(bad)}")
        return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", help="shards made by `littlelm data prepare` (default: the stdlib)")
    p.add_argument("--only", help="comma-separated sections (default: all, in order)")
    p.add_argument("--steps", type=int, default=3, help="bench steps before and after the resume")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed planner memory error")
    p.add_argument("--deadline", type=float, default=540, help="seconds for the whole script")
    p.add_argument("--out", default="gpu_check_out", help="folder for gpu_check.json and .log")
    p.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU")
    args = p.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check needs a CUDA GPU (torch.cuda.is_available() is False); "
            "--dry-run runs its sections at toy sizes on the CPU",
            file=sys.stderr,
        )
        return 2
    return Check(args).run()


if __name__ == "__main__":
    raise SystemExit(main())
