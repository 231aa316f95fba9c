"""How often bf16 changes a greedy chat reply: a lightly trained demo-shaped model (the demo's
base for a few steps, then the shipped SFT example for a few more), asked held-out questions by
`littlelm chat` (the command itself) in fp32 and in bf16. fp32 is what the transformers and
GGUF exports compute; the figure decides `chat` and `serve`'s default precision.

    python benchmarks/chat_precision.py [--out DIR] [--base-steps 40] [--sft-steps 100] [--prompts 50]
                                      [--open] [--max-tokens 32]

Each stage is skipped or resumed when DIR already holds it (training resumes by itself), so
the measurement may be run in pieces. On a CPU without bf16 units set LITTLELM_NATIVE_BF16=1 to
measure the default such a CPU would get (bf16 is then emulated: slower, the same figure).
Prints one JSON document: prompts, differing replies, and each precision's exact answers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def littlelm(*args: str, stdin: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "littlelm", *args]
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:2])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/littlelm-chat-precision"))
    ap.add_argument("--base-steps", type=int, default=40)
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--open", action="store_true", help="open questions, not the held-out task")
    a = ap.parse_args()
    out = a.out.resolve()
    data, runs = out / "chat_example", out / "runs"
    if not (data / "tasks" / "reverse.jsonl").is_file():
        example = [sys.executable, str(ROOT / "scripts" / "make_chat_example.py")]
        subprocess.run([*example, "--out", str(data)], check=True, capture_output=True)
    common = [f"run.out_dir={runs}"]
    littlelm("train", "demo", *common, "run.name=demo", f"train.max_steps={a.base_steps}")
    littlelm(
        "train",
        "sft_demo",
        *common,
        f"train.max_steps={a.sft_steps}",
        f"sft.base={runs / 'demo'}",
        f"data.tokenizer.path={runs / 'demo'}",
        f"data.sources.reverse.dataset={data / 'train.jsonl'}",
    )
    rows = [json.loads(line) for line in (data / "tasks" / "reverse.jsonl").open()][: a.prompts]
    if a.open:  # questions off the SFT task: longer, less certain replies, where ties compound
        modules = sorted(m for m in sys.stdlib_module_names if not m.startswith("_"))
        rows = [
            {"messages": [{"role": "user", "content": f"Write Python code that uses {m}."}]}
            for m in modules[: a.prompts]
        ]
    stdin = "".join(json.dumps({"messages": r["messages"]}) + "\n" for r in rows)
    replies = {}
    for precision in ("fp32", "bf16"):
        chat = ["chat", str(runs / "demo-sft"), "--precision", precision]
        text = littlelm(*chat, "--max-tokens", str(a.max_tokens), stdin=stdin)
        replies[precision] = [json.loads(line)["reply"] for line in text.splitlines()]
    differ = [i for i, (x, y) in enumerate(zip(*replies.values())) if x != y]
    exact = {
        p: sum(r.strip() == row.get("answer") for r, row in zip(rs, rows))
        for p, rs in replies.items()
    }
    report = {
        "prompts": len(rows),
        "differ": len(differ),
        "differ_share": len(differ) / len(rows),
        "exact_answers": exact,
        "base_steps": a.base_steps,
        "sft_steps": a.sft_steps,
        "questions": "open" if a.open else "held-out task",
        "max_tokens": a.max_tokens,
        "native_bf16_override": os.environ.get("LITTLELM_NATIVE_BF16"),
        "examples": [{"fp32": replies["fp32"][i], "bf16": replies["bf16"][i]} for i in differ[:3]],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
