"""Continued pretraining of an imported model: val loss over the first steps, per lr setting.

    python benchmarks/continue_import.py

Trains a tiny Llama-like GPT (2 layers x 64 wide, byte tokenizer) for 150 steps on the test
suite's word corpus, exports it as LlamaForCausalLM, imports it back and continues it on the
same data with each setting below (the first row is what `littlelm import` writes in train.yaml),
evaluating every 2 steps on the same held-out tokens. Prints one table (docs/interop.md).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_corpus, tiny_tree, write_config
from littlelm.components import register_all
from littlelm.interop.hf import export, import_model
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

LLAMA = dict(mlp="swiglu", qk_norm=False, softcap=None, residual_scalars=False, value_embeds=False)
STEPS = 60


def lrs(fraction: float, warmup: int, width_scaled: bool) -> list[str]:
    """Overrides for `fraction` of the from-scratch Muon defaults."""
    return [
        f"optimizer.lr={0.02 * fraction}",
        f"optimizer.embedding_lr={0.2 * fraction}",
        f"optimizer.lm_head_lr={0.004 * fraction}",
        f"optimizer.scalar_lr={0.5 * fraction}",
        f"optimizer.scale_lr_by_width={width_scaled}",
        f"schedule.warmup_steps={warmup}",
    ]


SETTINGS = {
    "written by littlelm import (a thirtieth, not width-scaled, warmup 20)": [],
    "from-scratch defaults, width-scaled, no warmup": lrs(1, 0, True),
    "a tenth, width-scaled, warmup 20": lrs(0.1, 20, True),
    "a tenth, not width-scaled, warmup 50": lrs(0.1, 50, False),
}


def main() -> None:
    register_all()  # an entry point: fill the registries before reading a config
    root = Path(tempfile.mkdtemp(prefix="continue-import-"))
    os.environ["LITTLELM_CACHE"] = str(root / "cache")  # its tokenized shards stay with it
    corpus = make_corpus(root / "corpus.txt", docs=400)
    tree = tiny_tree(
        corpus,
        root / "runs",
        model={**LLAMA, "d_model": 64, "n_head": 4},
        train={"max_steps": 150, "log_every": 50},
        eval={"every": 0},
        checkpoint={"every": 0},
        schedule={"warmup_steps": 10},
    )
    tree["optimizer"] = {"name": "muon"}
    parent = Trainer(load_run(write_config(root / "parent.yaml", tree)), resume="never")
    parent.fit()
    export(parent.run_dir, root / "hf")
    import_model(root / "hf", root / "imp")
    rows = []
    for i, (name, extra) in enumerate(SETTINGS.items()):
        over = [
            "data.sources.main.name=text",
            f"data.sources.main.path={corpus}",
            "data.sources.main.split=paragraph",
            "run.device=cpu",
            f"run.name=continue{i}",
            f"train.max_steps={STEPS}",
            "train.micro_batch_size=4",
            "train.seq_len=32",
            "train.log_every=100",
            "eval.every=2",
            "checkpoint.every=0",
            *extra,
        ]
        t = Trainer(load_run(root / "imp" / "train.yaml", over), resume="never")
        callbacks, t.callbacks = t.callbacks, []  # no metrics file before the start
        start = t.evaluate()["val_loss"]  # the imported weights, before any step
        t.callbacks = callbacks
        t.fit()
        lines = (t.run_dir / "metrics.jsonl").read_text().splitlines()
        val = {r["step"]: r["val_loss"] for r in map(json.loads, lines) if "val_loss" in r}
        worst = max(v for s, v in val.items() if s <= 20)
        rows.append((name, start, val[2], val[20], worst, val[STEPS]))
    print(
        "| continuation settings | val loss before | step 2 | step 20 | max over 1-20 | step 60 |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, *v in rows:
        print(f"| {name} | " + " | ".join(f"{x:.4f}" for x in v) + " |")


if __name__ == "__main__":
    main()
