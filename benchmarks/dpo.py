"""DPO after SFT on the synthetic reversal task (scripts/make_chat_example.py): does preference
tuning raise the chosen-over-rejected log-prob margin and the win rate on held-out pairs over the
SFT model it starts from?

    python benchmarks/dpo.py                       # seeds 1 and 2, then the table
    python benchmarks/dpo.py --seeds 1 --out DIR   # one seed, runs kept under DIR
    python benchmarks/dpo.py --task near-miss      # the example's own pairs

Per seed (run.seed: model init and data order; the example data is the same for both):
1. SFT: a tiny model (2 layers, d_model 64, a 288-token BPE tokenizer trained on the
   conversations, with the chat tokens) trained from random weights on the reversal
   conversations, `--sft-steps` steps: the SFT model.
2. DPO from it (`sft.base`: the model tuned and the reference) on preference pairs,
   `--dpo-steps` steps. `--task` picks them:
   - `style` (the default): a preference the SFT conversations do not teach. Both replies are
     the right reversal followed by one more letter (a closing no conversation has); the chosen
     one closes with the reversal's first letter, the rejected one with another letter of it
     (drawn at random). SFT never saw a closing, so its ranking of the two is near chance and
     the win rate has room to rise. Written by this script to DATA/style_prefs.jsonl from the
     prompts of prefs.jsonl (a prompt whose letters are all the same is left out).
   - `near-miss`: the example's prefs.jsonl (chosen: the reversal; rejected: a near miss); the
     SFT model already ranks every chosen reply first there, so only the margin can grow.
The held-out pairs are the DPO run's validation split (data.val_fraction of the pairs, never
trained on). Before DPO's first step the run evaluates them with the SFT model itself (policy =
reference), and again at its end. Figures over the held-out pairs:
- logp margin: the mean of log p(chosen) - log p(rejected) (summed over each reply's tokens);
- win rate: the share of pairs whose chosen reply the model rates above the rejected one;
- reward accuracy: the share with a positive DPO reward margin (policy vs reference: 0 for
  the SFT model by construction);
- val loss: DPO's loss (log 2 = 0.6931 for the SFT model).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from littlelm.schema import load_run  # noqa: E402  # after the repository is on the path
from littlelm.train.trainer import Trainer  # noqa: E402

MODEL = {"name": "gpt", "n_layer": 2, "d_model": 64, "n_head": 2, "max_seq_len": 64}


def sft_tree(out: Path, data: Path, seed: int, steps: int) -> dict:
    return {
        "run": {"name": f"sft-{seed}", "out_dir": str(out), "seed": seed, "device": "cpu"},
        "model": MODEL,
        "data": {
            "tokenizer": {"name": "bpe", "vocab_size": 288, "train_chars": 200_000},
            "sources": {"reverse": {"name": "chat", "dataset": str(data / "train.jsonl")}},
            "val_fraction": 0.02,
            "cache_dir": str(out / "cache"),
        },
        "optimizer": {"name": "muon"},
        "schedule": {"name": "trapezoidal", "warmup_steps": 10, "cooldown_frac": 0.4},
        "train": {"micro_batch_size": 16, "seq_len": 64, "max_steps": steps, "log_every": 50},
        "eval": {"every": 0, "at_end": True},
        "checkpoint": {"every": 0},
    }


def style_pairs(prefs: Path, dest: Path) -> None:
    """Write the `style` pairs (the docstring) from the prompts of the example's pairs."""
    rng = random.Random(0)  # the same pairs for every seed and run
    rows = []
    for line in prefs.read_text().splitlines():
        row = json.loads(line)
        answer = row["chosen"][0]["content"]
        others = [c for c in answer.split() if c != answer[0]]
        if not others:  # "a a a": no other letter to close with
            continue
        chosen, rejected = f"{answer} {answer[0]}", f"{answer} {rng.choice(others)}"
        rows.append(
            {
                "prompt": row["prompt"],
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))


def dpo_tree(
    out: Path, prefs: Path, seed: int, steps: int, beta: float, lr: float, task: str
) -> dict:
    sft = out / f"sft-{seed}"
    return {
        "run": {"name": f"dpo-{task}-{seed}", "out_dir": str(out), "seed": seed, "device": "cpu"},
        "model": MODEL,
        "data": {
            "tokenizer": {"name": "saved", "path": str(sft)},
            "sources": {"prefs": {"name": "preference", "dataset": str(prefs)}},
            "val_fraction": 0.1,
            "cache_dir": str(out / "cache"),
        },
        "sft": {"base": str(sft)},
        "dpo": {"beta": beta},
        "optimizer": {"name": "adamw", "lr": lr},
        "schedule": {"name": "trapezoidal", "warmup_steps": 10, "cooldown_frac": 0.4},
        "train": {"micro_batch_size": 16, "seq_len": 32, "max_steps": steps, "log_every": 25},
        "eval": {"every": 0, "at_end": True},
        "checkpoint": {"every": 0},
    }


def run(tree: dict, path: Path) -> Trainer:
    path.write_text(yaml.safe_dump(tree))
    return Trainer(load_run(str(path)), resume="never")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", default="1,2", help="comma-separated run seeds")
    ap.add_argument("--out", default="runs/bench-dpo", help="where the data and runs go")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--dpo-steps", type=int, default=100)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-3, help="DPO's AdamW lr")
    ap.add_argument("--task", choices=("style", "near-miss"), default="style", help="the pairs")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    data = out / "data"
    if not (data / "prefs.jsonl").is_file():
        script = str(ROOT / "scripts" / "make_chat_example.py")
        sizes = ["--train", "5000", "--pairs", "3000"]
        subprocess.run([sys.executable, script, "--out", str(data), *sizes], check=True)
    prefs = data / "prefs.jsonl"
    if args.task == "style":
        prefs = data / "style_prefs.jsonl"
        style_pairs(data / "prefs.jsonl", prefs)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        if not (out / f"sft-{seed}" / "checkpoints").is_dir():
            run(sft_tree(out, data, seed, args.sft_steps), out / f"sft-{seed}.yaml").fit()
        tree = dpo_tree(out, prefs, seed, args.dpo_steps, args.beta, args.lr, args.task)
        # a rerun measures afresh: the trainer refuses to start over a finished run's checkpoints
        shutil.rmtree(out / tree["run"]["name"], ignore_errors=True)
        trainer = run(tree, out / f"dpo-{args.task}-{seed}.yaml")
        t = trainer
        before = t.objective.validate()  # the SFT model: policy = reference before the first step
        after = trainer.fit()
        rows.append((seed, before, after))
    print(
        f"\nDPO after SFT ({args.sft_steps} steps), {args.dpo_steps} steps on the {args.task} "
        f"pairs (beta {args.beta}, AdamW lr {args.lr}), held-out pairs (SFT -> DPO)\n"
    )
    print("| seed | pairs | logp margin | win rate | reward accuracy | val loss |")
    print("|---|---|---|---|---|---|")
    for seed, b, a in rows:
        print(
            f"| {seed} | {a['val_pairs']} | {b['val_logp_margin']:.2f} -> {a['val_logp_margin']:.2f}"
            f" | {b['val_win_rate']:.3f} -> {a['val_win_rate']:.3f}"
            f" | {b['val_reward_accuracy']:.3f} -> {a['val_reward_accuracy']:.3f}"
            f" | {b['val_loss']:.4f} -> {a['val_loss']:.4f} |"
        )


if __name__ == "__main__":
    main()
