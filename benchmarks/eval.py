"""Evaluation harness: speed, agreement with the reference scorer, truncation. Prints tables.

    python benchmarks/eval.py speed      CKPT --bundle TASKS_DIR   # bf16 and fp32
    python benchmarks/eval.py reference  CKPT --bundle TASKS_DIR   # every decision
    python benchmarks/eval.py truncation CKPT --bundle TASKS_DIR   # crop vs drop

speed: the whole task directory at --max-per-task items per task (the issue's target: the demo
model, 500 items per task of the dev suite, at most 2 minutes on a 2-core CPU).
reference: per-item decisions of the fast harness (crop mode) against the slow per-prompt scorer
(littlelm.eval.reference) in fp32, where both compute the same numbers up to float
reassociation, so every decision must agree; also how many bf16 decisions differ from them.
truncation: the dev suite's siqa at 10 shots (its DCLM setting), whose prompts exceed a
512-token context, under both truncation modes, each checked against the reference.
--device cuda runs any part on a GPU (the harness's CUDA path has not been run yet: for the lead).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from littlelm.components import register_all
from littlelm.eval.core import EvalOptions, evaluate_suite, evaluate_task, load_suite
from littlelm.eval.reference import reference_decisions
from littlelm.eval.tasks import load_task_list, resolve_bundle
from littlelm.load import load_model
from littlelm.train.device import pick_device

register_all()  # an entry point: fill the registries before reading a config

DEVICE = torch.device("cpu")  # set from --device in main()


def precision(name: str):
    if name == "bf16":
        return torch.autocast(DEVICE.type, dtype=torch.bfloat16)
    return torch.autocast(DEVICE.type, enabled=False)


def speed(model, tok, suite, args) -> None:
    print("| precision | tasks | items | prompts | prompts cut | wall s | items/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for prec in ("bf16", "fp32"):
        opts = EvalOptions(max_per_task=args.max_per_task, batch_tokens=args.batch_tokens)
        t0 = time.perf_counter()
        with precision(prec):
            res = evaluate_suite(model, tok, suite, opts, log=lambda m: None)
        wall = time.perf_counter() - t0
        items = sum(t.items for t in res.tasks)
        prompts = sum(t.truncation.prompts for t in res.tasks)
        cut = sum(t.truncation.prompts_over for t in res.tasks)
        print(
            f"| {prec} | {len(res.tasks)} | {items} | {prompts} | {cut} | {wall:.1f} | {items / wall:.1f} |"
        )
        if prec == "bf16":
            per_task = ", ".join(f"{t.label} {t.seconds:.1f}" for t in res.tasks)
    print(f"\nbf16 seconds per task: {per_task}")


def reference(model, tok, suite, args) -> None:
    print(
        "| task | items | fp32 fast = reference | bf16 fast = fp32 reference | fast fp32 s | reference s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    total = same = same16 = 0
    for task, data in suite:
        opts = EvalOptions(max_per_task=args.max_per_task, batch_tokens=args.batch_tokens)
        with precision("fp32"):
            fast = evaluate_task(model, tok, task, data, opts)
            t0 = time.perf_counter()
            ref = reference_decisions(model, tok, task, data, fast.items)
            ref_s = time.perf_counter() - t0
        with precision("bf16"):
            fast16 = evaluate_task(model, tok, task, data, opts)
        agree = sum(a == b for a, b in zip(fast.decisions, ref))
        agree16 = sum(a == b for a, b in zip(fast16.decisions, ref))
        total, same, same16 = total + fast.items, same + agree, same16 + agree16
        print(
            f"| {task.label} | {fast.items} | {agree} | {agree16} | {fast.seconds:.1f} | {ref_s:.1f} |"
        )
    print(f"| all | {total} | {same} | {same16} | | |")
    if same != total:
        print(f"MISMATCH: {total - same} fp32 decisions differ from the reference", file=sys.stderr)
        raise SystemExit(1)


def truncation(model, tok, suite, args) -> None:
    siqa = next((t for t, _ in suite if t.label == "siqa"), None)
    if siqa is None:
        raise SystemExit("truncation needs the dev suite's siqa task")
    data = next(d for t, d in suite if t.label == "siqa")
    task = siqa.model_copy(update={"label": "siqa_10shot", "num_fewshot": 10})
    print(f"context {model.cfg.max_seq_len} tokens; {task.label}, {args.max_per_task} items\n")
    print("| mode | acc | prompts cut | how | fast s | = reference (fp32) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode in ("crop", "drop_shots"):
        opts = EvalOptions(
            max_per_task=args.max_per_task, truncation=mode, batch_tokens=args.batch_tokens
        )
        with precision("bf16"):
            res = evaluate_task(model, tok, task, data, opts)
        with precision("fp32"):
            fast = evaluate_task(model, tok, task, data, opts)
            ref = reference_decisions(model, tok, task, data, fast.items, mode)
        agree = sum(a == b for a, b in zip(fast.decisions, ref))
        rep = res.truncation
        print(
            f"| {mode} | {res.accuracy:.3f} | {100 * rep.share:.1f}% | {rep.details() or '-'} "
            f"| {res.seconds:.1f} | {agree}/{fast.items} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["speed", "reference", "truncation"])
    p.add_argument("checkpoint")
    p.add_argument("--bundle", required=True, help="task directory (CORE bundle or subset)")
    p.add_argument("--max-per-task", type=int, default=500)
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (the lead's GPU check)")
    args = p.parse_args()
    global DEVICE
    DEVICE = pick_device(args.device)
    model, tok, _ = load_model(args.checkpoint, DEVICE)
    listed, data_dir = resolve_bundle(Path(args.bundle))
    suite = load_suite(load_task_list(listed), data_dir)
    print(
        f"{args.part}: {args.checkpoint}, {data_dir}, torch {torch.__version__}, {DEVICE}, "
        f"{torch.get_num_threads()} threads\n"
    )
    {"speed": speed, "reference": reference, "truncation": truncation}[args.part](
        model, tok, suite, args
    )


if __name__ == "__main__":
    main()
