"""LoRA SFT against full SFT on the shipped example: trainable parameters, step time, held-out
exact match.

    python scripts/make_chat_example.py && littlelm train demo     # the base, runs/demo
    python benchmarks/lora.py [--steps 300] [--rank 16] [--lr 0.001] [--targets all_linear]

Both runs are configs/sft_demo.yaml (300 steps from runs/demo) as `littlelm train sft_demo`
runs it; the LoRA one adds the `lora:` section. Each is trained unless its run directory
(runs/bench-sft-full, runs/bench-sft-lora-r{rank}-lr{lr}) holds a finished run, and resumes
when one was stopped (SIGTERM saves: the benchmark may be run in pieces), then scored by
`littlelm eval RUN --chat data/chat_example/tasks` (200 held-out questions, greedy). Step time
is the run's training time (evaluations and saves left out) over its steps; val loss is the
masked loss on the held-out 2% of the conversations at the end. Run from the
repository root. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from littlelm.components import register_all
from littlelm.eval.chat_eval import run_chat_eval
from littlelm.model.lora import trainable_count
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

TASKS = "data/chat_example/tasks"


def train(name: str, overrides: list[str]) -> dict | None:
    """Train (or finish) the run; its end record, or None when it was stopped before the end."""
    cfg = load_run("sft_demo", [f"run.name={name}", *overrides])
    end = end_record(cfg.run_dir())
    if end is None:
        trainer = Trainer(cfg)
        result = trainer.fit()
        if not result.get("finished"):
            return None
        end = end_record(cfg.run_dir())
    assert end is not None, "a finished run wrote its end record"
    model = Trainer(cfg).model  # resumed at its end: the model as trained (adapters on)
    end["trainable"] = trainable_count(model)
    end["total"] = sum(p.numel() for p in model.parameters())
    return end


def end_record(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    ends = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "end"]
    return ends[-1] if ends and ends[-1].get("finished") else None


def exact_match(run_dir: Path) -> float:
    """Held-out exact match (`eval --chat`), kept in the run directory once measured."""
    out = run_dir / "bench_chat_eval.json"
    if not out.is_file():
        run_chat_eval(run_dir, TASKS, device="cpu", out=out)
    return json.loads(out.read_text())["tasks"][0]["accuracy"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--targets", default="all_linear")
    args = p.parse_args()
    register_all()
    if not Path("runs/demo").is_dir() or not Path(TASKS).is_dir():
        print(
            "needs the base runs/demo and data/chat_example: python scripts/make_chat_example.py "
            "&& littlelm train demo",
            file=sys.stderr,
        )
        return 2
    steps = [f"train.max_steps={args.steps}"]
    variants = {
        "full SFT": ("bench-sft-full", steps),
        f"LoRA r{args.rank} {args.targets} lr {args.lr:g}": (
            f"bench-sft-lora-r{args.rank}-{args.targets}-lr{args.lr:g}",
            [
                *steps,
                f"lora.rank={args.rank}",
                f"lora.alpha={2 * args.rank}",
                f"lora.lr={args.lr}",
                f"lora.targets={args.targets}",
            ],
        ),
    }
    rows = []
    for label, (name, overrides) in variants.items():
        end = train(name, overrides)
        if end is None:
            print(f"{label}: stopped before its end; run the benchmark again to finish it")
            return 1
        acc = exact_match(Path("runs") / name)
        rows.append((label, end, acc))
    full_acc = rows[0][2]
    print(
        f"\n{'run':<34}{'trainable':>12}{'of total':>10}{'s/step':>8}{'val loss':>10}"
        f"{'exact match':>13}{'vs full':>9}"
    )
    for label, end, acc in rows:
        share = end["trainable"] / end["total"]
        ratio = acc / full_acc if full_acc else float("nan")
        print(
            f"{label:<34}{end['trainable']:>12,}{share:>10.1%}{end['train_time'] / end['step']:>8.3f}"
            f"{end.get('val_loss', float('nan')):>10.4f}{acc:>13.3f}{ratio:>9.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
