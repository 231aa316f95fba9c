"""Write post-training tasks that littlelm does not ship, for measuring LoRA, DPO and RL on data
their defaults were not tuned on (docs/post-training.md, benchmarks/RESULTS.md).

    python benchmarks/post_tasks.py [--out benchmarks/out/tasks] [--sft 600] [--pairs 2000]
                                    [--prompts 1000] [--test 120] [--seed 0]

Two tasks, each a chat question with one right short answer:

    mul     a 2- or 3-digit number times a digit    user: 47*6        assistant: 282
    sort    3 to 6 digits, ascending                user: Sort: 5 1 9 1  assistant: 1 1 5 9
    rev     3 to 7 letters, reversed                user: Reverse: k q b  assistant: b q k

For each task, under OUT/TASK/:

    sft.jsonl            {"messages": [...]} rows, the SFT data (source `chat`)
    prefs.jsonl          {"prompt", "chosen", "rejected"} rows (source `preference`): the right
                         answer against a near miss (one digit off, two neighbours swapped...)
    prompts.jsonl        {"question", "answer"} rows, RL's prompts (rl.prompts): none in
                         sft.jsonl, so RL is measured on questions SFT never saw
    tasks/tasks.yaml     the held-out set as a chat evaluation task (`littlelm eval --chat`)
    tasks/TASK.jsonl     {"question", "answer"} rows, in none of the files above

The held-out questions are drawn first and every other file leaves them out; the SFT questions
and RL's prompts are disjoint too. Seeded: the same arguments write the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path


def mul(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 999), rng.randint(2, 9)  # 7,920 questions: room for all three sets
    return f"{a}*{b}", str(a * b)


def sort(rng: random.Random) -> tuple[str, str]:
    digits = [rng.choice("0123456789") for _ in range(rng.randint(3, 6))]
    return f"Sort: {' '.join(digits)}", " ".join(sorted(digits))


def rev(rng: random.Random) -> tuple[str, str]:
    letters = [rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 7))]
    return f"Reverse: {' '.join(letters)}", " ".join(reversed(letters))


# each task draws from its own generator (write_task): a task added changes no other's files
TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "mul": mul,
    "sort": sort,
    "rev": rev,
}


def near_miss(rng: random.Random, answer: str) -> str:
    """A wrong answer close to `answer`: one character changed, two neighbours swapped, or one
    dropped (spaces kept where the answer has them)."""
    spaced = " " in answer
    parts = answer.split() if spaced else list(answer)
    while True:
        kind = rng.choice(("change", "swap", "drop"))
        wrong = list(parts)
        if kind == "change":
            i = rng.randrange(len(wrong))
            wrong[i] = rng.choice("0123456789")
        elif kind == "swap" and len(wrong) > 1:
            i = rng.randrange(len(wrong) - 1)
            wrong[i], wrong[i + 1] = wrong[i + 1], wrong[i]
        elif kind == "drop" and len(wrong) > 1:
            del wrong[rng.randrange(len(wrong))]
        text = (" " if spaced else "").join(wrong)
        if text != answer:
            return text


def draw(make, rng: random.Random, n: int, taken: set[str]) -> dict[str, str]:
    """`n` questions not in `taken` and not repeated (all added to `taken`)."""
    out: dict[str, str] = {}
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 10_000:
            raise SystemExit(
                f"error: cannot draw {n} more distinct questions (the task has too few left); "
                "ask for fewer with --sft/--prompts/--test"
            )
        q, a = make(rng)
        if q not in taken:
            taken.add(q)
            out[q] = a
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_task(out: Path, name: str, args) -> None:
    make = TASKS[name]
    rng = random.Random(f"{name}-{args.seed}")
    taken: set[str] = set()
    test = draw(make, rng, args.test, taken)  # held out first: no other file holds these
    sft = draw(make, rng, args.sft, taken)
    prompts = draw(make, rng, args.prompts, taken)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    write_jsonl(
        out / "sft.jsonl",
        [
            {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in sft.items()
        ],
    )
    # pairs on the SFT questions (a preference set is usually on prompts SFT saw), drawn with
    # replacement, each with its own near miss
    prng, questions = random.Random(f"{name}-pairs-{args.seed}"), list(sft)
    pairs = []
    for _ in range(args.pairs):
        q = prng.choice(questions)
        pairs.append(
            {
                "prompt": [{"role": "user", "content": q}],
                "chosen": [{"role": "assistant", "content": sft[q]}],
                "rejected": [{"role": "assistant", "content": near_miss(prng, sft[q])}],
            }
        )
    write_jsonl(out / "prefs.jsonl", pairs)
    write_jsonl(out / "prompts.jsonl", [{"question": q, "answer": a} for q, a in prompts.items()])
    write_jsonl(
        out / "tasks" / f"{name}.jsonl", [{"question": q, "answer": a} for q, a in test.items()]
    )
    (out / "tasks" / "tasks.yaml").write_text(
        f"# littlelm eval RUN --chat DIR (docs/post-training.md): held-out {name} questions\n"
        f"tasks:\n  - {{label: {name}, file: {name}.jsonl, kind: generative}}\n"
    )
    print(
        f"{name}: {len(sft):,} SFT conversations, {len(pairs):,} preference pairs, "
        f"{len(prompts):,} RL prompts, {len(test)} held-out questions -> {out}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="benchmarks/out/tasks", help="output directory")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))
    ap.add_argument("--sft", type=int, default=600, help="SFT conversations per task")
    ap.add_argument("--pairs", type=int, default=2000, help="preference pairs per task")
    ap.add_argument("--prompts", type=int, default=1000, help="RL prompts per task")
    ap.add_argument("--test", type=int, default=120, help="held-out questions per task")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = [n for n in args.tasks.split(",") if n]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise SystemExit(f"error: unknown task(s) {unknown}; choose from {sorted(TASKS)}")
    for name in names:
        write_task(Path(args.out) / name, name, args)


if __name__ == "__main__":
    main()
