"""Continued pretraining of an imported model: which optimizer, at which lrs, per seed.

    python benchmarks/continue_import.py [--seeds 0 1 2 3] [--steps 120] [--parent-steps 400]
                                         [--parent adamw|muon]

The models `littlelm import` reads were trained with AdamW (Llama, SmolLM, Qwen), so the parent
here is too: a tiny Llama-like GPT (2 layers x 64 wide, byte tokenizer) trained with AdamW at
`--parent-steps` steps on the test suite's word corpus, exported as LlamaForCausalLM, imported
back and continued on the same data with each setting below, evaluating every 2 steps on the
same held-out tokens. The first row is what `littlelm import` writes in train.yaml. Every seed
(run.seed) trains its own parent and continuations. Prints one table per seed and one of the
means (docs/interop.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_corpus, tiny_tree, write_config
from littlelm.components import register_all
from littlelm.interop.hf import export, import_model
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

LLAMA = dict(mlp="swiglu", qk_norm=False, softcap=None, residual_scalars=False, value_embeds=False)
PARENT_LR = 3e-3  # AdamW, every role: a tiny model trained briefly (littlelm's default is 3e-4)


def muon(fraction: float, warmup: int) -> list[str]:
    """`fraction` of the from-scratch Muon defaults, not width-scaled."""
    return [
        "optimizer.name=muon",
        f"optimizer.lr={0.02 * fraction}",
        f"optimizer.embedding_lr={0.2 * fraction}",
        f"optimizer.lm_head_lr={0.004 * fraction}",
        f"optimizer.scalar_lr={0.002 * fraction}",
        "optimizer.scale_lr_by_width=false",
        f"schedule.warmup_steps={warmup}",
    ]


def adamw(lr: float, warmup: int) -> list[str]:
    """AdamW at one lr for every role (betas 0.9, 0.95), not width-scaled."""
    return [
        "optimizer.name=adamw",
        *(f"optimizer.{k}={lr}" for k in ("lr", "embedding_lr", "lm_head_lr", "scalar_lr")),
        "optimizer.scale_lr_by_width=false",
        f"schedule.warmup_steps={warmup}",
    ]


MUON_BEFORE = {"lr": 0.0007, "embedding_lr": 0.007, "lm_head_lr": 0.00015, "scalar_lr": 0.015}
SETTINGS = {
    "written by littlelm import": [],
    "Muon as import wrote it before (about a thirtieth of its defaults), warmup 20": [
        "optimizer.name=muon",
        *(f"optimizer.{k}={v}" for k, v in MUON_BEFORE.items()),
        "optimizer.scale_lr_by_width=false",
        "schedule.warmup_steps=20",
    ],
    "Muon, a tenth of its defaults, warmup 20": muon(1 / 10, 20),
    "AdamW 3e-3 (the parent's peak), warmup 20": adamw(3e-3, 20),
    "AdamW 1e-3 (a third of the parent's peak), warmup 20": adamw(1e-3, 20),
}


def parent_run(root: Path, corpus: Path, seed: int, steps: int, optimizer: str) -> Path:
    tree = tiny_tree(
        corpus,
        root / "runs",
        run={"name": f"parent{seed}", "seed": seed},
        model={**LLAMA, "d_model": 64, "n_head": 4},
        train={"max_steps": steps, "log_every": 50},
        eval={"every": 0},
        checkpoint={"every": 0},
        schedule={"warmup_steps": 10},
    )
    if optimizer == "adamw":
        tree["optimizer"] = {"name": "adamw", "lr": PARENT_LR, "scale_lr_by_width": False}
    else:
        tree["optimizer"] = {"name": "muon"}  # the from-scratch defaults, width-scaled
    parent = Trainer(load_run(write_config(root / f"parent{seed}.yaml", tree)), resume="never")
    parent.fit()
    return parent.run_dir


def continue_once(imp: Path, corpus: Path, name: str, seed: int, steps: int, extra: list[str]):
    over = [
        "data.sources.main.name=text",
        f"data.sources.main.path={corpus}",
        "data.sources.main.split=paragraph",
        "run.device=cpu",
        f"run.name={name}",
        f"run.seed={seed}",
        f"train.max_steps={steps}",
        "train.micro_batch_size=4",
        "train.seq_len=32",
        "train.log_every=100",
        "eval.every=2",
        "checkpoint.every=0",
        *extra,
    ]
    t = Trainer(load_run(imp / "train.yaml", over), resume="never")
    callbacks, t.callbacks = t.callbacks, []  # no metrics file before the start
    start = t.evaluate()["val_loss"]  # the imported weights, before any step
    t.callbacks = callbacks
    t.fit()
    lines = (t.run_dir / "metrics.jsonl").read_text().splitlines()
    val = {r["step"]: r["val_loss"] for r in map(json.loads, lines) if "val_loss" in r}
    early = min(20, steps)
    worst = max(v for s, v in val.items() if s <= early)
    return start, val[2], val[early], worst, val[steps]


def print_table(title: str, rows: list[tuple[str, tuple]], steps: int) -> None:
    early = min(20, steps)
    print(f"\n{title}\n")
    print(
        f"| continuation settings | val loss before | step 2 | step {early} | max over 1-{early} "
        f"| step {steps} |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, v in rows:
        print(f"| {name} | " + " | ".join(f"{x:.4f}" for x in v) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--steps", type=int, default=120, help="continuation steps")
    ap.add_argument("--parent-steps", type=int, default=400)
    ap.add_argument("--parent", choices=["adamw", "muon"], default="adamw")
    args = ap.parse_args()
    register_all()  # an entry point: fill the registries before reading a config
    root = Path(tempfile.mkdtemp(prefix="continue-import-"))
    os.environ["LITTLELM_CACHE"] = str(root / "cache")  # its tokenized shards stay with it
    corpus = make_corpus(root / "corpus.txt", docs=400)
    per_seed: dict[str, list[tuple]] = {name: [] for name in SETTINGS}
    for seed in args.seeds:
        run = parent_run(root, corpus, seed, args.parent_steps, args.parent)
        export(run, root / f"hf{seed}")
        import_model(root / f"hf{seed}", root / f"imp{seed}")
        opt = yaml.safe_load((root / f"imp{seed}" / "train.yaml").read_text())["optimizer"]
        rows = []
        for i, (name, extra) in enumerate(SETTINGS.items()):
            label = f"{name} ({opt['name']} lr {opt['lr']:g})" if not extra else name
            v = continue_once(
                root / f"imp{seed}", corpus, f"continue{seed}-{i}", seed, args.steps, extra
            )
            per_seed[name].append(v)
            rows.append((label, v))
        print_table(f"seed {seed}, parent trained with {args.parent}", rows, args.steps)
    means = [(n, tuple(map(statistics.mean, zip(*vs)))) for n, vs in per_seed.items()]
    print_table(f"mean over seeds {args.seeds}", means, args.steps)


if __name__ == "__main__":
    main()
