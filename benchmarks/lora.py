"""LoRA SFT against full SFT at equal steps: trainable parameters, held-out loss, held-out exact
match, and LoRA's exact match as a share of full SFT's.

    python scripts/make_chat_example.py && littlelm train demo     # the base, runs/demo
    python benchmarks/lora.py                                      # the shipped example
    python benchmarks/post_tasks.py                                # tasks littlelm does not ship
    python benchmarks/lora.py --task benchmarks/out/tasks/mul --task benchmarks/out/tasks/sort \\
        [--seeds 0,1] [--steps 120] [--lora ''] [--lora lr=3e-3,targets=attention] [--base DIR]

Every run is configs/sft_demo.yaml from the base (`--base`, runs/demo by default) as `littlelm
train sft_demo` runs it, at `--steps` and each `--seeds` seed; a `--task` directory (what
post_tasks.py writes) swaps in its sft.jsonl as the data and its tasks/ as the held-out set.
Each task and seed trains full SFT (the config's Muon) and one LoRA run per `--lora`: a
comma-separated list of `lora:` keys over littlelm's defaults (the empty string: the defaults
alone, the default). A run is trained unless its directory holds a finished run
(runs/bench-lora-TASK-N-sSEED-VARIANT-STEPS: N the task's conversations, VARIANT `full` or the
resolved rank, alpha, lr, targets and any other key off its default, so a changed default
trains anew), and resumes when one was stopped (SIGTERM saves: run the benchmark in pieces);
its held-out score, `littlelm eval RUN --chat TASK/tasks` (greedy), is kept in the run
directory once measured. Val loss is the masked loss on the held-out 2% of the conversations
at the end. Run from the repository root. Prints one table, with each variant's mean over the
seeds (its share of full SFT: the ratio of the mean exact matches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from littlelm.components import register_all
from littlelm.eval.chat_eval import run_chat_eval
from littlelm.model.lora import LoRAConfig, trainable_count
from littlelm.schema import load_run
from littlelm.train.build import build_model, with_lora
from littlelm.train.trainer import Trainer

EXAMPLE = Path("data/chat_example")
DEFAULTS = LoRAConfig().model_dump()


@dataclass(frozen=True)
class Task:
    name: str
    data: Path  # the SFT conversations (source `chat`)
    held_out: Path  # a directory with tasks.yaml (`littlelm eval --chat`)

    @property
    def key(self) -> str:
        """The task's name and its number of conversations (`post_tasks.py --sft`), so runs on
        two sizes of one task are two runs."""
        with self.data.open("rb") as f:
            return f"{self.name}-{sum(1 for _ in f)}"


def task_of(arg: str | None) -> Task:
    if arg is None:  # the shipped example (scripts/make_chat_example.py)
        return Task("example", EXAMPLE / "train.jsonl", EXAMPLE / "tasks")
    root = Path(arg)
    return Task(root.name, root / "sft.jsonl", root / "tasks")


def train(name: str, overrides: list[str]) -> tuple[dict, Path, str] | None:
    """Train (or finish) the run: its end record (with the trainable count), its directory and
    its variant's label; None when it was stopped before the end."""
    cfg = load_run("sft_demo", [f"run.name={name}", *overrides])
    end = end_record(cfg.run_dir())
    if end is None:
        result = Trainer(cfg).fit()
        if not result.get("finished"):
            return None
        end = end_record(cfg.run_dir())
    assert end is not None, "a finished run wrote its end record"
    # the run's model as built (adapters on, before its base is copied in): what it trains
    end["trainable"] = trainable_count(with_lora(cfg, build_model(cfg, torch.device("cpu"))))
    return end, cfg.run_dir(), label(cfg)


def end_record(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    ends = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "end"]
    return ends[-1] if ends and ends[-1].get("finished") else None


def label(cfg) -> str:
    if cfg.lora is None:
        return "full SFT"
    lo = cfg.lora
    targets = lo.targets if isinstance(lo.targets, str) else "+".join(lo.targets)
    named = {"rank", "alpha", "lr", "targets"}
    others = [  # the other keys where they are not littlelm's defaults
        f"{k}={v}" for k, v in lo.model_dump().items() if k not in named and v != DEFAULTS[k]
    ]
    return " ".join([f"LoRA r{lo.rank} a{lo.alpha:g} lr{lo.lr:g} {targets}", *others])


def variant_name(base: list[str], spec: str) -> str:
    """The run-name part of a LoRA variant: its resolved values (so a changed default is a new
    run, never a stale one reused)."""
    cfg = load_run("sft_demo", [*base, "lora={}", *lora_overrides(spec)])
    return label(cfg).replace(" ", "-").replace("LoRA-", "lora-")


def lora_overrides(spec: str) -> list[str]:
    items = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in items if "=" not in s]
    if bad:
        raise SystemExit(f"error: --lora {spec!r}: {bad} is not KEY=VALUE (e.g. lr=3e-3,rank=8)")
    return ["lora={}", *(f"lora.{s}" for s in items)]


def exact_match(run_dir: Path, held_out: Path) -> float:
    """Held-out exact match (`eval --chat`), kept in the run directory once measured."""
    out = run_dir / "bench_chat_eval.json"
    if not out.is_file():
        run_chat_eval(run_dir, held_out, device="cpu", out=out)
    return json.loads(out.read_text())["tasks"][0]["accuracy"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", action="append", help="a post_tasks.py task directory (repeat)")
    p.add_argument("--seeds", default="1337", help="comma-separated run.seed values")
    p.add_argument("--steps", type=int, help="train.max_steps (300 on the example, else 120)")
    p.add_argument("--lora", action="append", help="a LoRA variant, KEY=VALUE,... (repeat)")
    p.add_argument("--base", default="runs/demo", help="the base model's run directory")
    args = p.parse_args()
    register_all()
    tasks = [task_of(t) for t in args.task] if args.task else [task_of(None)]
    missing = [str(t.data) for t in tasks if not t.data.is_file()]
    missing += [str(t.held_out) for t in tasks if not (t.held_out / "tasks.yaml").is_file()]
    if not (Path(args.base) / "config.yaml").is_file():
        missing.append(args.base)
    if missing:
        print(
            f"error: missing {', '.join(missing)}: the base is `littlelm train demo` (or --base "
            "DIR), the example `python scripts/make_chat_example.py`, task directories "
            "`python benchmarks/post_tasks.py`",
            file=sys.stderr,
        )
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s]
    steps = args.steps or (120 if args.task else 300)
    specs = args.lora or [""]
    rows = []
    for task in tasks:
        for seed in seeds:
            base = [
                f"train.max_steps={steps}",
                f"run.seed={seed}",
                f"sft.base={args.base}",
                f"data.tokenizer.path={args.base}",
                f"data.sources.reverse.dataset={task.data}",
            ]
            runs = {"full": base} | {
                variant_name(base, s): [*base, *lora_overrides(s)] for s in specs
            }
            full_acc = None
            for key, overrides in runs.items():
                done = train(f"bench-lora-{task.key}-s{seed}-{key}-{steps}", overrides)
                if done is None:
                    print(f"{task.key} seed {seed} {key}: stopped before its end; run again")
                    return 1
                end, run_dir, name = done
                acc = exact_match(run_dir, task.held_out)
                full_acc = acc if full_acc is None else full_acc
                ratio = acc / full_acc if full_acc else float("nan")  # full SFT: first
                rows.append((task.key, str(seed), name, end, acc, ratio))
    print_table(rows, steps)
    return 0


def print_table(rows: list, steps: int) -> None:
    """One row per run, then (with several seeds) each variant's means, its share of full SFT's
    the ratio of the mean exact matches."""
    print(
        f"\n{steps} steps each\n{'task':<14}{'seed':>6}  {'variant':<36}{'trainable':>12}"
        f"{'val loss':>10}{'exact match':>13}{'vs full':>9}"
    )
    for task, seed, name, end, acc, ratio in rows:
        print(
            f"{task:<14}{seed:>6}  {name:<36}{end['trainable']:>12,}"
            f"{end.get('val_loss', float('nan')):>10.4f}{acc:>13.3f}{share(ratio):>9}"
        )
    if len({r[1] for r in rows}) < 2:
        return
    groups: dict[tuple[str, str], list] = {}
    for task, _, name, end, acc, _ in rows:
        groups.setdefault((task, name), []).append((end.get("val_loss", float("nan")), acc))
    for (task, name), vals in groups.items():
        loss, acc = (statistics.fmean(v) for v in zip(*vals, strict=True))
        full = statistics.fmean(a for _, a in groups[task, "full SFT"])
        ratio = acc / full if full else float("nan")
        print(
            f"{task:<14}{'mean':>6}  {name:<36}{'':>12}{loss:>10.4f}{acc:>13.3f}{share(ratio):>9}"
        )


def share(ratio: float) -> str:
    return "-" if ratio != ratio else f"{ratio:.1%}"  # NaN: full SFT answered none


if __name__ == "__main__":
    sys.exit(main())
