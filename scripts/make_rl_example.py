"""Write the RL example: two-digit additions, for SFT then RL with a verifiable reward
(configs/rl_sft.yaml, configs/rl_demo.yaml, docs/post-training.md).

    python scripts/make_rl_example.py [--out data/rl_example] [--sft 4000] [--prompts 2000]
                                      [--test 200] [--hedge 0.7] [--seed 0]

The task: add two numbers of two digits, answering with the sum alone,

    user:       37+48
    assistant:  85

The SFT data is right about the sums but mostly hedges: a `--hedge` fraction of its replies add
" or so" after the sum (`85 or so`), which the held-out task's exact match and RL's numeric
reward count as wrong (the answer must be the number). So an SFT model that has learnt to add
still fails most held-out questions by its wording, and RL, rewarded for the bare number, has a
lesson that carries from prompt to prompt: drop the hedge (and get the sums right).

It writes

    OUT/sft.jsonl            {"messages": [...]} rows: the SFT data (source `chat`)
    OUT/prompts.jsonl        {"question": ..., "answer": ...} rows: RL's prompts (rl.prompts)
    OUT/tasks/tasks.yaml     the held-out set as a chat evaluation task (`littlelm eval --chat`)
    OUT/tasks/add.jsonl      {"question": ..., "answer": ...} rows, in neither file above

Seeded: the same arguments write the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def item(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a}+{b}", str(a + b)


def draw(rng: random.Random, n: int, avoid: dict[str, str]) -> dict[str, str]:
    """`n` distinct questions not in `avoid`."""
    out: dict[str, str] = {}
    while len(out) < n:
        q, a = item(rng)
        if q not in avoid:
            out[q] = a
    return out


HEDGE = " or so"


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="data/rl_example", help="output directory")
    ap.add_argument("--sft", type=int, default=4000, help="SFT conversations")
    ap.add_argument("--prompts", type=int, default=2000, help="RL prompts")
    ap.add_argument("--test", type=int, default=200, help="held-out questions")
    ap.add_argument("--hedge", type=float, default=0.7, help="SFT replies that hedge the sum")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    test = draw(rng, args.test, {})  # held out first: neither SFT nor RL sees these
    sft = draw(rng, args.sft, test)
    prompts = draw(rng, args.prompts, test)
    hedged = {q: a + HEDGE if rng.random() < args.hedge else a for q, a in sft.items()}
    write_rows(
        out / "sft.jsonl",
        [
            {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in hedged.items()
        ],
    )
    write_rows(out / "prompts.jsonl", [{"question": q, "answer": a} for q, a in prompts.items()])
    write_rows(out / "tasks" / "add.jsonl", [{"question": q, "answer": a} for q, a in test.items()])
    (out / "tasks" / "tasks.yaml").write_text(
        "# littlelm eval RUN --chat DIR (docs/post-training.md): held-out two-digit additions\n"
        "tasks:\n  - {label: add, file: add.jsonl, kind: generative}\n"
    )
    print(
        f"wrote {len(sft):,} SFT conversations ({sum(a.endswith(HEDGE) for a in hedged.values()):,} "
        f"hedged), {len(prompts):,} RL prompts and {len(test)} held-out questions to {out}"
    )


if __name__ == "__main__":
    main()
