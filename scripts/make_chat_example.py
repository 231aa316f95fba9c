"""Write the shipped post-training example: synthetic conversations a 10M base model cannot
answer, for SFT of the demo's base model, and preference pairs on the same task for DPO after it
(docs/post-training.md).

    python scripts/make_chat_example.py [--out data/chat_example] [--train 20000] [--test 200]
                                        [--pairs 5000]

The task: reverse a short sequence of letters given in a fixed format,

    user:       Reverse: k q x m
    assistant:  m x q k

3 to 6 lowercase letters, separated by spaces. It writes

    OUT/train.jsonl          {"messages": [...]} rows, the SFT data (source `chat`)
    OUT/tasks/tasks.yaml     the held-out set as a chat evaluation task (`littlelm eval --chat`)
    OUT/tasks/reverse.jsonl  {"messages": [user turn], "answer": ...} rows, none in train.jsonl
    OUT/prefs.jsonl          {"prompt": [user turn], "chosen": [reply], "rejected": [reply]}
                             rows (HF's conversational preference layout), the DPO data (source
                             `preference`): the chosen reply is the reversal, the rejected one a
                             near miss (the letters as given, two neighbours swapped in the
                             reversal, or one letter of it dropped), none on a held-out question

Seeded: the same arguments write the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path


def item(rng: random.Random) -> tuple[str, str]:
    letters = [rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6))]
    return f"Reverse: {' '.join(letters)}", " ".join(reversed(letters))


def near_miss(rng: random.Random, answer: str, given: str) -> str:
    """A wrong reply close to `answer` (the reversal of `given`)."""
    letters = answer.split()
    while True:
        kind = rng.choice(("as given", "swap", "drop"))
        if kind == "as given":
            wrong = given.split()
        elif kind == "swap":
            i = rng.randrange(len(letters) - 1)
            wrong = [*letters[:i], letters[i + 1], letters[i], *letters[i + 2 :]]
        else:
            i = rng.randrange(len(letters))
            wrong = letters[:i] + letters[i + 1 :]
        if wrong != letters:
            return " ".join(wrong)


def pairs(rng: random.Random, n: int, test: dict[str, str]) -> list[dict]:
    rows = []
    while len(rows) < n:
        q, a = item(rng)
        if q in test:
            continue
        rows.append(
            {
                "prompt": [{"role": "user", "content": q}],
                "chosen": [{"role": "assistant", "content": a}],
                "rejected": [{"role": "assistant", "content": near_miss(rng, a, q.split(": ")[1])}],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="data/chat_example", help="output directory")
    ap.add_argument("--train", type=int, default=20000, help="training conversations")
    ap.add_argument("--test", type=int, default=200, help="held-out questions")
    ap.add_argument("--pairs", type=int, default=5000, help="preference pairs (DPO)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    test: dict[str, str] = {}
    while len(test) < args.test:  # held out first: the training set never holds these
        q, a = item(rng)
        test[q] = a
    rows = []
    while len(rows) < args.train:
        q, a = item(rng)
        if q not in test:
            rows.append(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "tasks" / "reverse.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": q}], "answer": a}) + "\n"
            for q, a in test.items()
        )
    )
    (out / "tasks" / "tasks.yaml").write_text(
        "# littlelm eval RUN --chat DIR (docs/post-training.md): held-out letter reversals\n"
        "tasks:\n  - {label: reverse, file: reverse.jsonl, kind: generative}\n"
    )
    # the pairs from their own RNG: the conversations above stay what they were before pairs
    prefs = pairs(random.Random(f"pairs-{args.seed}"), args.pairs, test)
    (out / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prefs))
    print(
        f"wrote {len(rows):,} training conversations, {len(test)} held-out questions and "
        f"{len(prefs):,} preference pairs to {out}"
    )


if __name__ == "__main__":
    main()
