"""Race littlelm against nanochat's recipe at the same shape and tokens per step.

    python benchmarks/race_nanochat.py --nanochat DIR [--corpus shakespeare stdlib]
        [--steps 240 480 900] [--more-steps 1200] [--seeds 0 1] [--only littlelm|nanochat]
        [--variant NAME]

Both sides train a byte-level GPT of 4 layers, d_model 128, 4 heads on 16 x 128 tokens per step,
on the first 90% of a corpus, and one evaluator scores both on the last 10% (text neither trained
on): the held-out bytes cut into 128-byte windows, each model predicting every byte after the
first from the bytes before it in its window, in nats per byte (littlelm reads each window after
its BOS, as its models always read text; nanochat's have none). Corpora:
Tiny Shakespeare (data/tinyshakespeare.txt) and the Python standard library's source as the demo
reads it (the `python_stdlib` source's files, sorted, joined, the first 1.2 MB).

littlelm runs `configs/shakespeare_char.yaml` through the command line with only the data path,
`train.max_steps` and `run.seed` changed and no held-out split of its own (`data.val_fraction=0`:
both tools train on all of the first 90%; the config's own split would hold out the end of the
training text, the text most like the evaluator's: 0.2 nats on Tiny Shakespeare at 480 steps),
or a named --variant (the ablations: the same config plus the overrides listed in VARIANTS).
Its training time is the run's `train_time`.

nanochat is never copied here: --nanochat names a checkout (by default it is cloned at PINNED into
benchmarks/out/nanochat). Its GPT (nanochat/gpt.py), MuonAdamW (nanochat/optim.py) and the three
schedules of scripts/base_train.py (get_lr_multiplier, get_muon_momentum, get_weight_decay, read
out of the script's source with `ast` and run with base_train's defaults: warmup 40, warmdown
0.65, final lr 0.05, unscaled learning rates, weight decay 0) are imported from the checkout.
Adaptations for a CPU, and nothing else: the device is the CPU; NANOCHAT_DTYPE=bfloat16 (its CPU
default is fp32; bf16 is what it computes in on a GPU and what littlelm's `auto` picks here); the
two optimizer steps it wraps in torch.compile run uncompiled (their original functions, the same
arithmetic); window_pattern "L" (its sliding windows are a FlashAttention-3 speed feature; at
seq 128 the short window would be the whole sequence anyway); its data are random 128-byte
windows of the training bytes (its own loader reads parquet shards of FineWeb), vocabulary 256.
Its training time is the sum of its steps' wall times.

Every cell (tool, corpus, steps, seed, variant) is written to benchmarks/out/race/ as JSON and
reused when present, so the grid runs in pieces. The table gives each cell's loss and training
time, and littlelm's time to reach nanochat's loss / nanochat's time: littlelm's (time, loss)
points over the budgets run (with --more-steps, longer littlelm runs too), interpolated linearly
in log time ('>' when no budget reached it).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"
CELLS = OUT / "race"
PINNED = "92d63d4e8bb4df75c3b71618f31ddde2378b2bcd"
SEQ, BATCH, WINDOWS = 128, 16, 512  # evaluator: 512 windows of 128 bytes = 64 KiB held out

# One factor at a time (the ablation table in RESULTS.md). The shipped config reads the text cut
# every 127 characters (each piece and its BOS fill a row) with Muon 0.03, a 40-step warmup and
# a cooldown over the last 65% to 5% of the lr (base_train's schedule shape).
# the config's schedule before 2026-12-05's layout change: Muon 0.06, warmup 10, cooldown 0.4 to 0
FAST = ["optimizer.lr=0.06", "schedule.warmup_steps=10", "schedule.cooldown_frac=0.4",
        "schedule.floor=0"]  # fmt: skip
# pieces of consecutive paragraphs of at most 256 characters, each after its BOS (cut at blank lines)
PIECES = ["data.sources.shakespeare.cut=paragraphs", "data.sources.shakespeare.max_chars=256"]
PARAGRAPHS = [*PIECES, "data.sources.shakespeare.split=paragraph"]  # one document per speech
OLD_SCALAR_LR = ["optimizer.scalar_lr=0.5"]  # the residual scalars' lr before 2026-12-05
VARIANTS: dict[str, list[str]] = {
    "shipped": [],
    "fast": FAST,  # the shipped layout at the old schedule
    "pieces_steady": PIECES,  # the shipped schedule on paragraph pieces
    "pieces": [*PIECES, *FAST],  # configs/shakespeare_char.yaml before the layout change
    "paragraphs": [*PARAGRAPHS, *FAST],
    "before": [*PARAGRAPHS, *FAST, *OLD_SCALAR_LR],  # the config before 2026-12-05
    "pieces_old_scalar_lr": [*PIECES, *FAST, *OLD_SCALAR_LR],
    # the text as one document cut into rows read in order (no pieces, no shuffle)
    "windows": [
        "data.sources.shakespeare.max_chars=null",
        "data.sources.shakespeare.cut=paragraphs",
    ],
    "group_lrs": ["optimizer.embedding_lr=0.3", "optimizer.lm_head_lr=0.008"],  # nanochat's
    "momentum": ["optimizer.momentum=0.97", "optimizer.momentum_warmup_steps=400"],
    "rope_base": ["model.rope_base=100000"],
}


def corpus_files(name: str) -> tuple[Path, Path]:
    """(train.txt, held.txt): the first 90% and the last 10% of the corpus, cut at a newline."""
    d = CELLS / "data" / name
    train, held = d / "train.txt", d / "held.txt"
    if train.exists() and held.exists():
        return train, held
    if name == "shakespeare":
        text = (ROOT / "data" / "tinyshakespeare.txt").read_text()
    elif name == "stdlib":
        import sysconfig

        lib = Path(sysconfig.get_paths()["stdlib"])
        parts, size = [], 0
        for f in sorted(lib.glob("*.py")):  # the top-level modules: stable across runs
            try:
                t = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            parts.append(t)
            size += len(t)
            if size > 1_200_000:
                break
        text = "\n\n".join(parts)[:1_200_000]
    else:
        sys.exit(f"unknown corpus {name!r}: pick shakespeare or stdlib")
    cut = text.rfind("\n", 0, int(len(text) * 0.9)) + 1
    d.mkdir(parents=True, exist_ok=True)
    train.write_text(text[:cut])
    held.write_text(text[cut:])
    return train, held


def held_windows(held: Path):
    """Consecutive windows of SEQ - 1 bytes (a BOS before one still fits a row of SEQ)."""
    import torch

    data = np.frombuffer(held.read_bytes(), np.uint8)
    w = SEQ - 1
    n = min(WINDOWS, len(data) // w)
    return torch.from_numpy(data[: n * w].astype(np.int64).reshape(n, w))


def evaluate(logits_of, windows, bos: int | None = None) -> float:
    """Mean nats per predicted byte over the held-out windows: one evaluator for both tools.
    Every byte of a window after its first is predicted from the bytes before it in the window;
    `bos`: the model's start token, put before each window as the model always reads text (the
    same bytes are scored, the BOS adds no text)."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad():
        for b in windows.split(64):
            x = b if bos is None else torch.cat([torch.full_like(b[:, :1], bos), b], 1)
            logits = logits_of(x).float()
            logits = logits[:, :-1] if bos is None else logits[:, 1:-1]
            total += F.cross_entropy(
                logits.reshape(-1, logits.size(-1)), b[:, 1:].reshape(-1), reduction="sum"
            ).item()
            count += b[:, 1:].numel()
    return total / count


def run_littlelm(corpus: str, steps: int, seed: int, variant: str) -> dict:
    train, held = corpus_files(corpus)
    name = f"littlelm-{variant}-{corpus}-{steps}-{seed}"
    runs = CELLS / "runs"
    cmd = [
        sys.executable, "-m", "littlelm", "train", str(ROOT / "configs" / "shakespeare_char.yaml"),
        f"data.sources.shakespeare.path={train}", f"train.max_steps={steps}",
        f"run.seed={seed}", f"run.name={name}", "eval.every=0", "eval.at_end=false",
        "data.val_fraction=0",  # the evaluator holds out the corpus's end: train on all of train
        "train.log_every=1000", "callbacks=[]",
        *VARIANTS[variant],
    ]  # fmt: skip
    runs.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(runs / "runs" / name, ignore_errors=True)  # an interrupted cell starts over
    done = subprocess.run(cmd, cwd=runs, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"littlelm failed (rc {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    from littlelm.load import load_model

    run = runs / "runs" / name
    end = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    model, tok, _ = load_model(run)
    windows = held_windows(held)
    # littlelm's models read text after their BOS (every document starts with it); nanochat's
    # here were trained on windows without one
    with_bos = evaluate(lambda b: model(b), windows, tok.bos_id)
    bare = evaluate(lambda b: model(b), windows)
    return {"loss": with_bos, "loss_no_bos": bare, "time": end["train_time"]}


def nanochat_schedules(checkout: Path, steps: int):
    """base_train.py's three schedule functions, read out of the script and run with its
    defaults (the script parses arguments and trains at import, so it cannot be imported)."""
    src = (checkout / "scripts" / "base_train.py").read_text()
    wanted = {"get_lr_multiplier", "get_muon_momentum", "get_weight_decay"}
    fns = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if len(fns) != 3:
        sys.exit(
            f"{checkout}/scripts/base_train.py lacks {sorted(wanted)}: use --nanochat at {PINNED}"
        )
    args = argparse.Namespace(warmup_steps=40, warmdown_ratio=0.65, final_lr_frac=0.05)
    ns: dict = {"math": math, "args": args, "num_iterations": steps, "weight_decay_scaled": 0.0}
    exec(compile(ast.Module(body=fns, type_ignores=[]), "base_train.py", "exec"), ns)
    return ns["get_lr_multiplier"], ns["get_muon_momentum"], ns["get_weight_decay"]


def window_starts(n: int, steps: int, seed: int, rows: bool):
    """Each step's BATCH window starts in n training bytes: random, or (`rows`) the fixed rows
    0, SEQ, 2·SEQ, ... taken pass after pass, each pass in a new shuffled order."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    starts = torch.arange(0, n - SEQ - 1, SEQ)
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        if rows:
            while len(order) < BATCH:  # the next pass, shuffled
                order = torch.cat([order, starts[torch.randperm(len(starts), generator=gen)]])
            ix, order = order[:BATCH], order[BATCH:]
        else:
            ix = torch.randint(n - SEQ - 1, (BATCH,), generator=gen)
        yield ix


def run_nanochat(checkout: Path, corpus: str, steps: int, seed: int, rows: bool = False) -> dict:
    """nanochat's recipe on random windows of the training bytes; `rows`: on fixed rows instead
    (the bytes cut every SEQ, each pass over them in a new shuffled order: what littlelm's
    prepared pieces give, so a second pass repeats the first's rows)."""
    os.environ["NANOCHAT_DTYPE"] = "bfloat16"
    sys.path.insert(0, str(checkout))
    import nanochat.optim as nopt
    import torch
    from nanochat.gpt import GPT, GPTConfig

    for fn in ("adamw_step_fused", "muon_step_fused"):  # uncompiled: the same function
        f = getattr(nopt, fn)
        setattr(nopt, fn, getattr(f, "_torchdynamo_orig_callable", f))
    lr_mult, momentum, wd = nanochat_schedules(checkout, steps)
    train, held = corpus_files(corpus)
    torch.manual_seed(seed)
    cfg = GPTConfig(sequence_len=SEQ, vocab_size=256, n_layer=4, n_head=4, n_kv_head=4,
                    n_embd=128, window_pattern="L")  # fmt: skip
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device="cpu")
    model.init_weights()
    opt = model.setup_optimizer(unembedding_lr=0.008, embedding_lr=0.3, matrix_lr=0.02,
                                weight_decay=0.0, scalar_lr=0.5)  # fmt: skip
    data = torch.from_numpy(np.frombuffer(train.read_bytes(), np.uint8).astype(np.int64))
    spent = 0.0
    for step, ix in enumerate(window_starts(len(data), steps, seed, rows)):
        x = torch.stack([data[i : i + SEQ] for i in ix])
        y = torch.stack([data[i + 1 : i + SEQ + 1] for i in ix])
        t0 = time.perf_counter()
        model(x, y).backward()
        m = lr_mult(step)
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"] * m
            if g["kind"] == "muon":
                g["momentum"], g["weight_decay"] = momentum(step), wd(step)
        opt.step()
        model.zero_grad(set_to_none=True)
        spent += time.perf_counter() - t0
    model.eval()
    loss = evaluate(lambda b: model(b), held_windows(held))
    return {"loss": loss, "time": spent}


def cell_name(tool: str, variant: str, corpus: str, steps: int, seed: int) -> str:
    """A cell's file name: nanochat's cells have no variant but `rows` (--nanochat-rows)."""
    if tool == "littlelm" or variant == "rows":
        return f"{tool}-{variant}-{corpus}-{steps}-{seed}"
    return f"{tool}-{corpus}-{steps}-{seed}"


def cell(tool: str, corpus: str, steps: int, seed: int, variant: str, checkout: Path | None):
    key = cell_name(tool, variant, corpus, steps, seed)
    path = CELLS / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    if tool == "littlelm":
        res = run_littlelm(corpus, steps, seed, variant)
    else:
        assert checkout is not None
        # a child process: nanochat's dtype is read from the environment at import
        code = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import race_nanochat as r, json; "
                f"print(json.dumps(r.run_nanochat(r.Path({str(checkout)!r}), {corpus!r}, {steps}, {seed}, {variant == 'rows'})))")  # fmt: skip
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"nanochat failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
        res = json.loads(done.stdout.strip().splitlines()[-1])
    res["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path.write_text(json.dumps(res))
    print(f"{key}: {res['loss']:.3f} nats/byte in {res['time']:.1f} s", file=sys.stderr)
    return res


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """littlelm's time to reach `target` loss: (time, loss) points interpolated in log time."""
    pts = sorted(points)
    for (t0, l0), (t1, l1) in zip([(pts[0][0] * 0.5, math.inf), *pts[:-1]], pts):
        if l1 <= target:
            if math.isinf(l0) or l0 == l1:
                return t1
            f = (l0 - target) / (l0 - l1)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None


def checkout_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    d = OUT / "nanochat"
    if not d.exists():
        subprocess.run(["git", "clone", "https://github.com/karpathy/nanochat", str(d)], check=True)
    subprocess.run(["git", "-C", str(d), "checkout", "-q", PINNED], check=True)
    return d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanochat", help="a nanochat checkout (default: clone it into benchmarks/out)")
    p.add_argument("--corpus", nargs="+", default=["shakespeare", "stdlib"])
    p.add_argument("--steps", nargs="+", type=int, default=[240, 480, 900])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument(
        "--more-steps",
        nargs="*",
        type=int,
        default=[],
        help="budgets littlelm alone also runs: points for its time to nanochat's loss where "
        "its run at the same budget falls short",
    )
    p.add_argument("--variant", nargs="+", default=["shipped"], choices=sorted(VARIANTS))
    p.add_argument(
        "--nanochat-rows",
        action="store_true",
        help="nanochat reads fixed rows in a shuffled order per pass, as littlelm's pieces, "
        "instead of random windows (its cells: nanochat-rows-*)",
    )
    p.add_argument("--only", choices=["littlelm", "nanochat"], help="run one side's cells only")
    p.add_argument("--table-only", action="store_true", help="print what is on disk, run nothing")
    a = p.parse_args()
    checkout = None if a.only == "littlelm" or a.table_only else checkout_dir(a.nanochat)
    res: dict = {}
    for corpus in a.corpus:
        for seed in a.seeds:
            for steps in sorted({*a.steps, *a.more_steps}):
                ours = "rows" if a.nanochat_rows else "-"
                for tool, variant in [("nanochat", ours)] + [("littlelm", v) for v in a.variant]:
                    if (a.only and tool != a.only) or (tool == "nanochat" and steps not in a.steps):
                        continue
                    key = (tool, variant, corpus, steps, seed)
                    f = CELLS / f"{cell_name(tool, variant, corpus, steps, seed)}.json"
                    if a.table_only:
                        if f.exists():
                            res[key] = json.loads(f.read_text())
                    else:
                        res[key] = cell(tool, corpus, steps, seed, variant, checkout)
    print_table(res, a)


def print_table(res: dict, a) -> None:
    for corpus in a.corpus:
        for variant in a.variant:
            print(f"\n{corpus}, nats/byte on held-out text (littlelm: {variant})\n")
            print(
                "| seed | steps | nanochat | littlelm | time to nanochat's loss / nanochat's time |"
            )
            print("| --- | --- | --- | --- | --- |")
            for seed in a.seeds:
                pts = [(r["time"], r["loss"]) for (t, v, c, s, sd), r in res.items()
                       if t == "littlelm" and v == variant and c == corpus and sd == seed]  # fmt: skip
                for steps in a.steps:
                    n = res.get(
                        ("nanochat", "rows" if a.nanochat_rows else "-", corpus, steps, seed)
                    )
                    l_ = res.get(("littlelm", variant, corpus, steps, seed))
                    fmt = lambda r: f"{r['loss']:.3f} in {r['time']:.1f} s" if r else "-"  # noqa: E731
                    ratio = "-"
                    if n and pts:
                        t = time_to(pts, n["loss"])
                        ratio = (
                            f"{t / n['time']:.2f}"
                            if t
                            else f"> {max(p[0] for p in pts) / n['time']:.2f}"
                        )
                    print(f"| {seed} | {steps} | {fmt(n)} | {fmt(l_)} | {ratio} |")


if __name__ == "__main__":
    main()
