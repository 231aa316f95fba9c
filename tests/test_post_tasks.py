"""benchmarks/post_tasks.py: the unshipped tasks that LoRA, DPO and RL are measured on. What the
measurements rest on: held-out questions in no training file, RL's prompts unseen by SFT, right
answers, and near misses that are wrong."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def answer(task: str, question: str) -> str:
    if task == "mul":
        a, b = question.split("*")
        return str(int(a) * int(b))
    if task == "rev":
        return " ".join(reversed(question.removeprefix("Reverse: ").split()))
    return " ".join(sorted(question.removeprefix("Sort: ").split()))


def test_tasks_are_disjoint_right_and_seeded(tmp_path):
    def write(out):
        cmd = [sys.executable, str(ROOT / "benchmarks/post_tasks.py"), "--out", str(out)]
        subprocess.run(
            [*cmd, "--sft", "200", "--pairs", "300", "--prompts", "150", "--test", "50"],
            check=True,
            capture_output=True,
        )

    write(tmp_path / "a")
    write(tmp_path / "b")
    for task in ("mul", "sort", "rev"):
        d = tmp_path / "a" / task
        sft = {
            r["messages"][0]["content"]: r["messages"][1]["content"] for r in rows(d / "sft.jsonl")
        }
        prompts = {r["question"]: r["answer"] for r in rows(d / "prompts.jsonl")}
        test = {r["question"]: r["answer"] for r in rows(d / "tasks" / f"{task}.jsonl")}
        assert (len(sft), len(prompts), len(test)) == (200, 150, 50)
        assert not (
            sft.keys() & prompts.keys() or sft.keys() & test.keys() or prompts.keys() & test.keys()
        )
        for q, a in {**sft, **prompts, **test}.items():
            assert a == answer(task, q), (q, a)
        pairs = rows(d / "prefs.jsonl")
        assert len(pairs) == 300
        for p in pairs:
            q = p["prompt"][0]["content"]
            assert q in sft and p["chosen"][0]["content"] == sft[q] != p["rejected"][0]["content"]
        assert "file: " + task + ".jsonl" in (d / "tasks" / "tasks.yaml").read_text()
        for name in ("sft.jsonl", "prefs.jsonl", "prompts.jsonl", f"tasks/{task}.jsonl"):
            assert (d / name).read_bytes() == (tmp_path / "b" / task / name).read_bytes()


def test_too_many_questions_is_refused(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks/post_tasks.py"),
        "--out",
        str(tmp_path),
        "--tasks",
        "mul",
        "--sft",
        "8000",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0 and "ask for fewer" in done.stderr
