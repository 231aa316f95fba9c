"""Write the shipped post-training example: synthetic conversations a 10M base model cannot
answer, for SFT of the demo's base model (docs/post-training.md).

    python scripts/make_chat_example.py [--out data/chat_example] [--train 20000] [--test 200]

The task: reverse a short sequence of letters given in a fixed format,

    user:       Reverse: k q x m
    assistant:  m x q k

3 to 6 lowercase letters, separated by spaces. It writes

    OUT/train.jsonl          {"messages": [...]} rows, the SFT data (source `chat`)
    OUT/tasks/tasks.yaml     the held-out set as a chat evaluation task (`littlelm eval --chat`)
    OUT/tasks/reverse.jsonl  {"messages": [user turn], "answer": ...} rows, none in train.jsonl

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="data/chat_example", help="output directory")
    ap.add_argument("--train", type=int, default=20000, help="training conversations")
    ap.add_argument("--test", type=int, default=200, help="held-out questions")
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
    print(f"wrote {len(rows):,} training conversations and {len(test)} held-out questions to {out}")


if __name__ == "__main__":
    main()
