"""Export/import parity: max |littlelm logit - transformers logit| per feature combination.

    python benchmarks/interop.py

Builds tiny GPTs (3 layers x 32 wide, every weight random: no identity blocks), exports each
with `littlelm export`'s code, loads it with transformers, and compares fp32 logits on 2 x 80
random tokens and 32 greedy tokens; then builds tiny random Llama and Qwen3 models with
transformers, imports them and compares the other way. Prints one table (docs/interop.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_interop import FEATURES, VOCAB, hf_load, make_checkpoint, save_hf

from littlelm.components import register_all
from littlelm.interop.hf import export, import_model
from littlelm.load import load_model
from littlelm.model.generate import generate


def export_row(root: Path, name: str) -> tuple:
    path, model = make_checkpoint(root / name, **FEATURES[name])
    info = export(path, root / name / "hf")
    hf = hf_load(root / name / "hf")
    ids = torch.randint(0, VOCAB, (2, 80), generator=torch.Generator().manual_seed(1))
    prompt = [256, *b"def f(x):"]
    with torch.no_grad():
        a, b = model(ids), hf(ids).logits
        same = (
            generate(model, prompt, 32, 0.0, None, 0, None)
            == hf.generate(
                torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False
            )[0, len(prompt) :].tolist()
        )
    gap, top = (a - b).abs().max().item(), a.abs().max().item()
    return f"export {name}", type(hf).__name__ + f" ({info['arch']})", gap, top, same


def import_row(root: Path, kind: str) -> tuple:
    hf = save_hf(kind, root / f"hf_{kind}")
    model, _, _ = load_model(import_model(root / f"hf_{kind}", root / f"run_{kind}")["checkpoint"])
    ids = torch.randint(0, VOCAB, (2, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(ids), hf(ids).logits[..., :VOCAB]
    return (
        f"import {kind}",
        type(hf).__name__,
        (a - b).abs().max().item(),
        a.abs().max().item(),
        None,
    )


def main() -> None:
    register_all()  # an entry point: fill the registries before building a config
    with tempfile.TemporaryDirectory() as d:
        rows = [export_row(Path(d), n) for n in FEATURES]
        rows += [import_row(Path(d), k) for k in ("llama", "qwen3")]
    print("| direction | class | max abs logit gap | largest logit | 32 greedy tokens equal |")
    print("| --- | --- | --- | --- | --- |")
    for what, cls, gap, top, same in rows:
        eq = "-" if same is None else ("yes" if same else "NO")
        print(f"| {what} | {cls} | {gap:.2g} | {top:.3g} | {eq} |")


if __name__ == "__main__":
    main()
