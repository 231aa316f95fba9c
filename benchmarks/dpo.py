"""DPO after SFT on the synthetic reversal task (scripts/make_chat_example.py): does preference
tuning raise the chosen-over-rejected log-prob margin and the win rate on held-out pairs over the
SFT model it starts from?

    python benchmarks/dpo.py                       # seeds 1 and 2, then the table
    python benchmarks/dpo.py --seeds 1 --out DIR   # one seed, runs kept under DIR
    python benchmarks/dpo.py --task near-miss      # the example's own pairs
    python benchmarks/dpo.py --task DIR --base runs/demo [--lrs 1e-5,5e-5,2e-4 --rpo 0,1]
                                                   # a task post_tasks.py wrote (below)

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

`--task DIR`, a task benchmarks/post_tasks.py wrote (DIR/sft.jsonl, prefs.jsonl, tasks/): does
DPO raise the preference without breaking the model, at each lr, with and without rpo_alpha?
1. SFT from the trained base `--base` (its shape and tokenizer; sft_demo's optimizer, rows of
   64 tokens), `--sft-steps` steps on DIR/sft.jsonl: OUT/TASK/sft-TASK-Nsteps.
2. For each lr of `--lrs`, rpo_alpha of `--rpo` and seed of `--seeds` (run.seed: the pairs'
   order), DPO from it on DIR/prefs.jsonl, `--dpo-steps` steps (AdamW, β `--beta`, `--loss`),
   OUT/TASK/dpo-after... named by every value it trains with.
3. Each model, the SFT one included, scored on the held-out questions (DIR/tasks, in no
   training file): exact match (`littlelm eval RUN --chat DIR/tasks`, greedy), win rate (the
   right answer against a near miss made as post_tasks.py makes them, by summed log-prob) and
   the right answer's mean log-prob (its collapse is the failure rpo_alpha is for).
Resumable in pieces: a finished run and its scores (RUN/bench_heldout.json) are kept and
reused, `--limit N` trains at most N runs per call; each call prints the table of those done.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def run(tree: dict, path: Path, resume: str = "never") -> Trainer:
    path.write_text(yaml.safe_dump(tree))
    return Trainer(load_run(str(path)), resume=resume)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", default="1,2", help="comma-separated run seeds")
    ap.add_argument("--out", default="runs/bench-dpo", help="where the data and runs go")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--dpo-steps", type=int, default=100)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-3, help="DPO's AdamW lr")
    ap.add_argument(
        "--task",
        default="style",
        help="the pairs: style, near-miss, or a task directory benchmarks/post_tasks.py wrote",
    )
    ap.add_argument("--base", default="runs/demo", help="--task DIR: the base run SFT starts from")
    ap.add_argument("--lrs", default="1e-5,5e-5,2e-4", help="--task DIR: DPO's AdamW lrs")
    ap.add_argument("--rpo", default="0,1", help="--task DIR: the dpo.rpo_alpha values")
    ap.add_argument("--loss", default="sigmoid", choices=("sigmoid", "ipo"), help="dpo.loss")
    ap.add_argument("--limit", type=int, default=1000, help="--task DIR: new runs per call")
    args = ap.parse_args()
    if args.task not in ("style", "near-miss"):
        sys.exit(post_task(args))
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
        # plain DPO, as these figures were first measured (docs/post-training.md)
        tree["dpo"].update(loss=args.loss, rpo_alpha=0.0)
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


# ---- `--task DIR`: a task benchmarks/post_tasks.py wrote (mul, sort), from a trained base -----


def post_task_sft_tree(base: Path, task: Path, out: Path, steps: int) -> dict:
    """SFT of the base on the task's conversations (sft_demo's settings, shorter rows)."""
    return {
        "run": {"name": sft_name(task, steps), "out_dir": str(out), "seed": 1, "device": "cpu"},
        "model": base_model(base),
        "data": {
            "tokenizer": {"name": "saved", "path": str(base)},
            "sources": {"task": {"name": "chat", "dataset": str(task / "sft.jsonl")}},
            "val_fraction": 0.02,
            "cache_dir": str(out / "cache"),
        },
        "sft": {"base": str(base)},
        "optimizer": {"name": "muon"},
        "schedule": {"name": "trapezoidal", "warmup_steps": 10, "cooldown_frac": 0.4},
        "train": {"micro_batch_size": 16, "seq_len": 64, "max_steps": steps, "log_every": 50},
        "eval": {"every": 0, "at_end": True},
        "checkpoint": {"every": 0},
    }


def post_task_dpo_tree(sft: Path, task: Path, out: Path, name: str, v: dict, args) -> dict:
    return {
        "run": {"name": name, "out_dir": str(out), "seed": v["seed"], "device": "cpu"},
        "model": base_model(sft),
        "data": {
            "tokenizer": {"name": "saved", "path": str(sft)},
            "sources": {"prefs": {"name": "preference", "dataset": str(task / "prefs.jsonl")}},
            "val_fraction": 0.05,
            "cache_dir": str(out / "cache"),
        },
        "sft": {"base": str(sft)},
        "dpo": {"beta": args.beta, "loss": args.loss, "rpo_alpha": v["rpo"]},
        "optimizer": {"name": "adamw", "lr": v["lr"]},
        "schedule": {"name": "trapezoidal", "warmup_steps": 10, "cooldown_frac": 0.4},
        "train": {
            "micro_batch_size": 16,
            "seq_len": 32,
            "max_steps": args.dpo_steps,
            "log_every": 10,
        },
        "eval": {"every": 0, "at_end": True},
        "checkpoint": {"every": 0},
    }


def sft_name(task: Path, steps: int) -> str:
    return f"sft-{task.name}-{steps}steps"


def dpo_name(args, v: dict) -> str:
    """A DPO run's directory, named by every value it trains with (a changed setting trains a
    new run rather than reusing one measured with another)."""
    return (
        f"dpo-after{args.sft_steps}-{args.loss}-beta{args.beta:g}-lr{v['lr']:g}-rpo{v['rpo']:g}"
        f"-{args.dpo_steps}steps-s{v['seed']}"
    )


def base_model(run_dir: Path) -> dict:
    """The model section of a run's config.yaml (an SFT or DPO run has its base's shape)."""
    return yaml.safe_load((run_dir / "config.yaml").read_text())["model"]


def heldout_pairs(task: Path) -> list[tuple[str, str, str]]:
    """(question, answer, near miss) for each held-out question: the pairs the win rate is
    measured on, made as post_tasks.py makes its training pairs, from questions DPO never saw."""
    from post_tasks import near_miss  # benchmarks/ is on the path: this script's directory

    rng = random.Random(f"heldout-pairs-{task.name}")  # the same pairs for every run
    (rows_file,) = (task / "tasks").glob("*.jsonl")
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    return [(r["question"], r["answer"], near_miss(rng, r["answer"])) for r in rows]


def heldout_scores(run_dir: Path, task: Path) -> dict:
    """Held-out exact match (`littlelm eval RUN --chat TASK/tasks`, greedy), win rate (chosen =
    the right answer over a near miss) and the mean log-prob of the right answer (summed over its
    reply tokens, fp32), kept in the run directory once measured."""
    out = run_dir / "bench_heldout.json"
    if out.is_file():
        return json.loads(out.read_text())
    import torch

    from littlelm.data.chat import chat_format
    from littlelm.data.preference import Pair, pair_rows
    from littlelm.eval.chat_eval import run_chat_eval
    from littlelm.load import load_model
    from littlelm.train.dpo import sequence_logps

    (result,) = run_chat_eval(run_dir, task / "tasks", device="cpu")
    model, tok, _ = load_model(run_dir, "cpu")
    fmt = chat_format(tok)
    pairs = [
        Pair(
            *(
                np.array(
                    fmt.encode(
                        [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
                    )
                )
                for r in (good, bad)
            )
        )
        for q, good, bad in heldout_pairs(task)
    ]
    row_len = max(max(len(p.chosen), len(p.rejected)) for p in pairs)
    with torch.no_grad():
        x, y = pair_rows(pairs, row_len, tok.bos_id, fmt)
        chosen, rejected = sequence_logps(model, x, y).float().chunk(2)
    scores = {
        "exact_match": result.accuracy,
        "win_rate": float((chosen > rejected).float().mean()),
        "logp_chosen": float(chosen.mean()),
        "questions": len(pairs),
    }
    out.write_text(json.dumps(scores))
    return scores


def train_once(tree: dict, out: Path) -> bool:
    """Train the run unless its directory holds a finished one; False when it stopped early."""
    run_dir = out / tree["run"]["name"]
    if finished(run_dir):
        return True
    trainer = run(tree, out / f"{tree['run']['name']}.yaml", resume="auto")
    return bool(trainer.fit().get("finished"))


def finished(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    ends = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "end"]
    return bool(ends and ends[-1].get("finished"))


def post_task(args) -> int:
    """The `--task DIR` benchmark (module docstring): SFT, then each DPO variant, each scored on
    the held-out questions; at most `--limit` new runs per call, the table of those done."""
    task, base = Path(args.task).resolve(), Path(args.base).resolve()
    out = Path(args.out).resolve() / task.name
    problems = []
    if not (task / "prefs.jsonl").is_file() or not (task / "tasks").is_dir():
        problems.append(
            f"{task} is not a task benchmarks/post_tasks.py wrote (no prefs.jsonl or tasks/): "
            f"run python benchmarks/post_tasks.py --out {task.parent}"
        )
    if not (base / "config.yaml").is_file():
        problems.append(f"no base run at {base}: train one (littlelm train demo) or give --base")
    if problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    left = args.limit
    sft_tree_ = post_task_sft_tree(base, task, out, args.sft_steps)
    sft = out / sft_tree_["run"]["name"]
    if not finished(sft):
        left -= 1
        if not train_once(sft_tree_, out):
            print("SFT stopped before its end; run the benchmark again to finish it")
            return 1
    rows = [("SFT", None, heldout_scores(sft, task))]
    variants = [
        {"lr": float(lr), "rpo": float(rpo), "seed": int(seed)}
        for lr in args.lrs.split(",")
        for rpo in args.rpo.split(",")
        for seed in args.seeds.split(",")
    ]
    pending = 0
    for v in variants:
        name = dpo_name(args, v)
        run_dir = out / name
        if not (finished(run_dir) and (run_dir / "bench_heldout.json").is_file()):
            if left <= 0:
                pending += 1
                continue
            left -= 1
            if not train_once(post_task_dpo_tree(sft, task, out, name, v, args), out):
                print(f"{name} stopped before its end; run the benchmark again to finish it")
                return 1
        rows.append((name, v, heldout_scores(run_dir, task)))
    print(
        f"\n{task.name}: SFT {args.sft_steps} steps from {base}, then DPO {args.dpo_steps} steps "
        f"({args.loss}, beta {args.beta}, AdamW) on {task / 'prefs.jsonl'}; held-out questions "
        f"({rows[0][2]['questions']}, none trained on)\n"
    )
    print("| run | lr | rpo_alpha | seed | exact match | win rate | chosen log-prob |")
    print("|---|---|---|---|---|---|---|")
    for name, v, s in rows:
        lr, rpo, seed = (f"{v['lr']:g}", f"{v['rpo']:g}", v["seed"]) if v else ("", "", "")
        print(
            f"| {name} | {lr} | {rpo} | {seed} | {s['exact_match']:.3f} | {s['win_rate']:.3f} | "
            f"{s['logp_chosen']:.2f} |"
        )
    if pending:
        print(f"\n{pending} run(s) not done yet: run the same command again")
    return 0


if __name__ == "__main__":
    main()
