"""RL with verifiable rewards after SFT, on two-digit additions (issue 49; docs/post-training.md):
make the data, train the SFT model (configs/rl_sft.yaml) and RL from it (configs/rl_demo.yaml)
for each seed, score both on the held-out additions, print the table.

    python benchmarks/rl.py                        # seeds 1 and 2, under benchmarks/out/rl
    python benchmarks/rl.py --seeds 1 --out /tmp/rl --rl-steps 50
    python benchmarks/rl.py --report               # the table from what is on disk
    python benchmarks/post_tasks.py --tasks mul --sft 3000 --out benchmarks/out/tasks
    python benchmarks/rl.py --task benchmarks/out/tasks/mul --out benchmarks/out/rl-mul \
        --sft-set train.max_steps=1500 --rl-set rl.iterations=2 --tag -it2

--task DIR takes an unshipped task of benchmarks/post_tasks.py (DIR/sft.jsonl, DIR/prompts.jsonl:
RL's prompts, none in the SFT data, DIR/tasks: held-out questions in neither) in place of the
additions. Every piece is kept under --out and reused: a finished SFT or RL run is resumed at its
end (nothing to do), a held-out score is read from its file (OUT/scores/RUN.json), so a
measurement can be made in several short runs (one seed, one variant at a time).

Columns, per seed (run.seed of both the SFT run and the RL run):
- SFT pass@1, RL pass@1: held-out accuracy, greedy replies (`littlelm eval --chat`, 200 sums
  neither SFT nor RL saw), of the SFT model and of the RL run's last checkpoint;
- reward first / last: the RL run's mean reward (its sampled replies, temperature 1) over its
  first and last logged records (rl.py logs the mean of log_every steps);
- KL last: mean k3 KL to the SFT model per reply token, over the last record;
- sample s/step, learn s/step: seconds per RL step sampling (and scoring) the groups, and
  computing the loss and gradients (the optimizer update is in neither);
- val loss SFT / RL: validation loss on the SFT conversations, before and after RL.

The model is configs/rl_sft.yaml's: 2 layers, 64 wide, 2 heads (0.16M parameters with
embeddings), a 262-token BPE tokenizer (bytes, BOS, the chat tokens and one merge).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "train" and "rl_reward" in r]


def last_val(run: Path) -> float | None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    vals = [r["val_loss"] for r in map(json.loads, lines) if "val_loss" in r]
    return vals[-1] if vals else None


def held_out(run: Path, tasks: Path) -> tuple[float, float]:
    """(exact match, the share of replies that are a bare number: the format) of `run`'s greedy
    replies to the held-out questions, computed once and kept beside the runs."""
    from littlelm.eval.chat_eval import run_chat_eval

    kept = run.parent.parent / "scores" / f"{run.name}.json"
    if kept.is_file() and json.loads(kept.read_text())["checkpoint"] == newest(run):
        saved = json.loads(kept.read_text())
        return saved["accuracy"], saved["format"]
    kept.parent.mkdir(parents=True, exist_ok=True)
    detail = kept.with_suffix(".eval.json")  # every reply, for the format share below
    (result,) = run_chat_eval(run, tasks, device="cpu", out=detail)
    (replies,) = json.loads(detail.read_text())["decisions"].values()
    bare = sum(d["reply"].strip().isdigit() for d in replies) / len(replies)
    kept.write_text(
        json.dumps({"checkpoint": newest(run), "accuracy": result.accuracy, "format": bare})
    )
    return result.accuracy, bare


def newest(run: Path) -> str:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))[-1]


def train(config: str, overrides: list[str], resume: str = "never") -> None:
    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    Trainer(load_run(ROOT / "configs" / config, overrides), resume=resume).fit()


def run_seed(seed: int, args) -> dict:
    out = Path(args.out)
    sft, rl = f"rl-sft-s{seed}{args.sft_tag}", f"rl-demo-s{seed}{args.tag}"
    common = [f"run.seed={seed}", f"run.out_dir={out / 'runs'}"]
    data = Path(args.task) if args.task else out / "data" / "rl_example"
    paths = [f"data.sources.add.dataset={data / 'sft.jsonl'}"]
    if not args.report:
        # a run already finished under --out is kept (resumed at its end: nothing to do)
        train("rl_sft.yaml", [*common, *paths, f"run.name={sft}", *args.sft_set], "auto")
        base = str(out / "runs" / sft)
        train(
            "rl_demo.yaml",
            [
                *common,
                *paths,
                f"run.name={rl}",
                f"sft.base={base}",
                f"data.tokenizer.path={base}",
                f"rl.prompts={data / 'prompts.jsonl'}",
                *([f"train.max_steps={args.rl_steps}"] if args.rl_steps else []),
                *args.rl_set,
            ],
            "auto",
        )
    tasks = data / "tasks"
    rows = records(out / "runs" / rl)
    sft_pass1, sft_format = held_out(out / "runs" / sft, tasks)
    rl_pass1, rl_format = held_out(out / "runs" / rl, tasks)
    return {
        "seed": seed,
        "sft_pass1": sft_pass1,
        "rl_pass1": rl_pass1,
        "sft_format": sft_format,
        "rl_format": rl_format,
        "reward_first": rows[0]["rl_reward"],
        "reward_last": rows[-1]["rl_reward"],
        "kl_last": rows[-1]["rl_kl"],
        "sample_s": sum(r["rl_sample_s"] for r in rows) / len(rows),
        "learn_s": sum(r["rl_learn_s"] for r in rows) / len(rows),
        "val_sft": last_val(out / "runs" / sft),
        "val_rl": last_val(out / "runs" / rl),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "rl"))
    ap.add_argument("--seeds", default="1,2", help="comma-separated run.seed values")
    ap.add_argument("--rl-steps", type=int, default=None, help="RL steps (default: the config's)")
    ap.add_argument("--tag", default="", help="suffix of the RL runs' names (variants)")
    ap.add_argument("--sft-tag", default="", help="suffix of the SFT runs' names (variants)")
    ap.add_argument("--task", default=None, help="a post_tasks.py task directory (default: sums)")
    ap.add_argument("--report", action="store_true", help="only the table, from the runs on disk")
    ap.add_argument("--sft-set", nargs="*", default=[], help="extra overrides of the SFT run")
    ap.add_argument("--rl-set", nargs="*", default=[], help="extra overrides of the RL run")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.report and not args.task:
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "make_rl_example.py"), "--out",
             str(out / "data" / "rl_example")],
            check=True,
        )  # fmt: skip
    os.environ.setdefault("LITTLELM_CACHE", str(out / "cache"))  # tokenized data, per --out
    rows = [run_seed(int(s), args) for s in args.seeds.split(",")]
    head = (
        f"{'seed':>4} {'SFT pass@1':>10} {'RL pass@1':>9} {'SFT fmt':>7} {'RL fmt':>6} "
        f"{'reward first':>12} {'reward last':>11} "
        f"{'KL last':>8} {'sample s/step':>13} {'learn s/step':>12} {'val SFT':>8} {'val RL':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['seed']:>4} {r['sft_pass1']:>10.3f} {r['rl_pass1']:>9.3f} "
            f"{r['sft_format']:>7.3f} {r['rl_format']:>6.3f} "
            f"{r['reward_first']:>12.3f} {r['reward_last']:>11.3f} {r['kl_last']:>8.4f} "
            f"{r['sample_s']:>13.3f} {r['learn_s']:>12.3f} {r['val_sft']:>8.4f} {r['val_rl']:>7.4f}"
        )
    (out / f"table{args.tag}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
