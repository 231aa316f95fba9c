"""`littlelm serve` vs `littlelm chat` on the same model: time to first token and tokens/s.

    python benchmarks/serve.py                        # makes a demo-shaped SFT model itself
    python benchmarks/serve.py --run runs/demo-sft    # or measures yours

`chat` is littlelm chat's Chat in this process (a fresh conversation per question, as the server
starts one per request); `serve` is `littlelm serve RUN` in its own process, asked by the openai
client over loopback HTTP, streamed, one request at a time; `serve queued` sends --at-once
requests at once (they queue: one generation at a time), so its time to first token includes
the wait. Each round asks the questions each way in a block, the order alternating by round, so
that a shared CPU's drift falls on both; a second's pause between blocks lets the other
process's OpenMP threads, which spin a while after their work, go idle (asked in turn question
by question, chat read 43 tokens/s to serve's 104; in blocks with pauses, 158 to 130). Greedy replies of at most --max-tokens tokens; the two give
the same tokens (tests/test_serve.py), so the figures compare equal work. Time to first token:
from asking to the first text piece. Decode tokens/s: the tokens after the first over the time
after it. Overall: all tokens over the mode's wall time (queued clients overlap). Prints one
table (benchmarks/RESULTS.md).

The model it makes (in a child process): the demo's shape (6 layers x 256, 4 heads, 512-token
context) on a 300-token BPE vocabulary, 2 steps of base training and 1 of SFT on the tests'
reversal conversations, so that its greedy replies run to --max-tokens (a trained reply would
end after a few tokens, too few to time decoding); the shape, not the weights, sets the speed.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

QUESTIONS = ["Reverse: a b c", "Reverse: q w e r t", "Reverse: k x", "Reverse: m n o p"]


def make_run(root: Path) -> Path:
    """A demo-shaped SFT run (see the module docstring); returns its directory."""
    import os

    from test_chat import write_conversations

    from conftest import make_corpus, tiny_tree, write_config
    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    os.environ.setdefault("LITTLELM_CACHE", str(root / "cache"))
    shape = {"n_layer": 6, "d_model": 256, "n_head": 4, "max_seq_len": 512}
    corpus = make_corpus(root / "corpus.txt")
    base = tiny_tree(corpus, root / "runs", run={"name": "base"}, model=shape)
    base["data"]["tokenizer"] = {"name": "bpe", "vocab_size": 300, "train_chars": 5000}
    base["train"]["max_steps"] = 2
    Trainer(load_run(write_config(root / "base.yaml", base)), resume="never").fit()
    sft = tiny_tree(corpus, root / "runs", run={"name": "bench-sft"}, model=shape)
    sft["data"] = {
        "tokenizer": {"name": "saved", "path": str(root / "runs" / "base")},
        "sources": {
            "chat": {"name": "chat", "dataset": str(write_conversations(root / "c.jsonl"))}
        },
        "val_fraction": 0.1,
        "buffer_docs": 16,
    }
    sft["sft"] = {"base": str(root / "runs" / "base")}
    sft["train"].update(max_steps=1)
    sft["eval"] = {"every": 1000, "max_tokens": 512}
    sft["checkpoint"] = {"every": 1000}
    Trainer(load_run(write_config(root / "sft.yaml", sft)), resume="never").fit()
    return root / "runs" / "bench-sft"


class Timing:
    """One reply: time to first text piece, total time, tokens generated."""

    def __init__(self, first: float, total: float, tokens: int):
        self.first, self.total, self.tokens = first, total, tokens

    @property
    def decode(self) -> float:
        return (self.tokens - 1) / (self.total - self.first) if self.tokens > 1 else float("nan")


def chat_one(chat, autocast, q: str) -> Timing:
    chat.reset()  # a fresh conversation, as the server starts one per request
    first: list[float] = []
    t0 = time.perf_counter()
    with autocast:
        chat.reply(q, lambda _: first or first.append(time.perf_counter()))
    end = time.perf_counter()
    return Timing(first[0] - t0 if first else end - t0, end - t0, chat.generated)


def ask(client, model: str, q: str, max_tokens: int) -> Timing:
    t0 = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": q}], temperature=0,
        max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return Timing((first or end) - t0, end - t0, tokens)


def queued(client, model: str, max_tokens: int, at_once: int) -> list[Timing]:
    out: list[Timing] = []
    qs = [QUESTIONS[i % len(QUESTIONS)] for i in range(at_once)]
    threads = [
        threading.Thread(target=lambda q=q: out.append(ask(client, model, q, max_tokens)))
        for q in qs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return out


def start_server(run: Path, precision: str, max_tokens: int):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "littlelm", "serve", str(run), "--port", str(port)]
    cmd += ["--precision", precision, "--max-tokens", str(max_tokens), "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"littlelm serve exited: {proc.stdout.read()}")
            time.sleep(0.2)
    proc.kill()
    sys.exit("littlelm serve did not start within 120 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, help="an SFT run dir (default: make a demo-shaped one)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="fp32")
    ap.add_argument("--at-once", type=int, default=4, help="clients at once in the queued case")
    ap.add_argument("--make", type=Path, help=argparse.SUPPRESS)  # (the child that makes the run)
    args = ap.parse_args()

    import openai
    import torch

    from littlelm.eval.chat import Chat
    from littlelm.load import load_model
    from littlelm.train.device import autocast, inference_precision

    if args.make:
        print(make_run(args.make))
        return
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:  # made in a child: training leaves threads behind that would slow chat
            cmd = [sys.executable, __file__, "--make", tmp]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            run = Path(tmp) / "runs" / "bench-sft"
        model, tok, cfg = load_model(run, "cpu")
        cpu = torch.device("cpu")
        precision = inference_precision(args.precision, cfg.train.precision, cpu)
        chat = Chat(model, tok, max_tokens=args.max_tokens)
        proc, url = start_server(run, args.precision, args.max_tokens)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=600)
            name = client.models.list().data[0].id
            ask(client, name, QUESTIONS[0], args.max_tokens)  # warm both up
            chat_one(chat, autocast(cpu, precision), QUESTIONS[0])
            rows: dict[str, list[Timing]] = {"chat": [], "serve": [], "serve queued": []}
            wall = dict.fromkeys(rows, 0.0)
            for r in range(args.rounds):
                for mode in ("chat", "serve") if r % 2 == 0 else ("serve", "chat"):
                    time.sleep(1)  # the other process's idle threads stop spinning first
                    t0 = time.perf_counter()
                    for q in QUESTIONS:
                        if mode == "chat":
                            rows[mode].append(chat_one(chat, autocast(cpu, precision), q))
                        else:
                            rows[mode].append(ask(client, name, q, args.max_tokens))
                    wall[mode] += time.perf_counter() - t0
                t0 = time.perf_counter()
                rows["serve queued"] += queued(client, name, args.max_tokens, args.at_once)
                wall["serve queued"] += time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"{run.name}: {params:.1f}M parameters, {cfg.model.n_layer} x {cfg.model.d_model}, "
        f"vocab {tok.vocab_size}, {precision}, {torch.get_num_threads()} threads, "
        f"greedy, at most {args.max_tokens} tokens, {args.rounds} rounds x {len(QUESTIONS)} "
        f"questions; queued: {args.at_once} clients at once"
    )
    print(
        "| mode | replies | tokens / reply | time to first token, median (ms) | "
        "decode tokens/s, median | tokens/s overall |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, ts in rows.items():
        tokens = sum(t.tokens for t in ts)
        print(
            f"| {mode} | {len(ts)} | {tokens / len(ts):.1f} | "
            f"{1000 * statistics.median(t.first for t in ts):.1f} | "
            f"{statistics.median(t.decode for t in ts):.1f} | {tokens / wall[mode]:.1f} |"
        )


if __name__ == "__main__":
    main()
