"""Export/import parity: max |littlelm logit - transformers logit| per feature combination;
with --chat, an SFT'd model's chat behaviour in transformers and llama.cpp.

    python benchmarks/interop.py
    python benchmarks/interop.py --chat [--rows 16]

Builds tiny GPTs (3 layers x 32 wide, every weight random: no identity blocks), exports each
with `littlelm export`'s code, loads it with transformers, and compares fp32 logits on 2 x 80
random tokens and 32 greedy tokens; then builds tiny random Llama and Qwen3 models with
transformers, imports them and compares the other way. Prints one table (docs/interop.md).

--chat SFTs three models on the reversal conversations of tests/test_chat.py (the models of
tests/test_chat_export.py, trained longer): the littlelm architecture and a Llama-shaped one
with littlelm's tokenizer and chat format, and an imported Qwen3 with a Qwen-style tokenizer and a
ChatML template that writes no BOS. For each: the run's reported val loss against the masked
mean computed here from the model's logits over the same held-out windows; then, on 50 held-out
conversations (questions the SFT data never asks; a third with a system message, a fifth with
an earlier exchange), the ids transformers' `apply_chat_template` renders on the export against
littlelm's, the replies of `littlelm chat --precision fp32` (run as a command) against
transformers' plain `generate()` on the export and, for the archs llama.cpp computes, against
llama-cpp-python's `create_chat_completion` on the GGUF with no chat handler given (its prompt
ids against littlelm's, BOS once). Prints one table (benchmarks/RESULTS.md, docs/interop.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_chat import reversal, sft_trees
from test_chat_export import LLAMA, chatml_sft_tree
from test_interop import FEATURES, VOCAB, hf_load, make_checkpoint, save_hf

from conftest import write_config
from littlelm.components import register_all
from littlelm.data.chat import chat_format
from littlelm.interop.hf import export, import_model
from littlelm.load import load_model
from littlelm.model.generate import generate
from littlelm.model.kernels import IGNORE
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
SFT_STEPS = 150  # enough that replies differ by question and end at the end-of-turn token
PROMPTS = 50
NEW = 16  # new tokens at most per reply (a reversal answer is under 10)


def export_row(root: Path, name: str) -> tuple:
    path, model = make_checkpoint(root / name, **FEATURES[name])
    info = export(path, root / name / "hf")
    hf = hf_load(root / name / "hf")
    ids = torch.randint(0, VOCAB, (2, 80), generator=torch.Generator().manual_seed(1))
    prompt = [256, *b"def f(x):"]
    with torch.no_grad():
        a, b = model(ids), hf(ids).logits
        same = (
            generate(model, prompt, 32, 0.0, None, 0, None)
            == hf.generate(
                torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False
            )[0, len(prompt) :].tolist()
        )
    gap, top = (a - b).abs().max().item(), a.abs().max().item()
    return f"export {name}", type(hf).__name__ + f" ({info['arch']})", gap, top, same


def import_row(root: Path, kind: str) -> tuple:
    hf = save_hf(kind, root / f"hf_{kind}")
    model, _, _ = load_model(import_model(root / f"hf_{kind}", root / f"run_{kind}")["checkpoint"])
    ids = torch.randint(0, VOCAB, (2, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(ids), hf(ids).logits[..., :VOCAB]
    return (
        f"import {kind}",
        type(hf).__name__,
        (a - b).abs().max().item(),
        a.abs().max().item(),
        None,
    )


def sft(root: Path, kind: str, rows: int) -> tuple[Path, dict]:
    """Train the SFT run of `kind` (`rows` rows per step); (its run dir, its reported val loss
    and the masked mean computed here over the same held-out windows)."""
    root.mkdir(parents=True)
    if kind == "chatml":
        tree = chatml_sft_tree(root)
    else:
        _, tree = sft_trees(root, **(LLAMA if kind == "llama" else {}))
    # rows that hold every conversation (the tests' 32 leave the longest out), and every held-out
    # window evaluated (the tests cap it at 512 tokens)
    tree["train"].update(max_steps=SFT_STEPS, log_every=50, seq_len=64, micro_batch_size=rows)
    tree["eval"].update(every=0, max_tokens=None)  # once, at the end
    tree["checkpoint"]["every"] = 10_000
    trainer = Trainer(load_run(write_config(root / "sft.yaml", tree)), resume="never")
    reported = trainer.fit()
    c, model = trainer.cfg, trainer.model
    nats, kept = 0.0, 0
    with torch.no_grad():  # the same windows the run evaluated, its loss code left out
        batches = trainer.data.val_batches(
            c.eval.batch_size or c.train.micro_batch_size, c.train.seq_len, c.eval.max_tokens
        )
        for x, y in batches:
            with trainer.autocast:  # the precision the run evaluated in
                logits = model(x)
            logits = logits.double()
            nats += F.cross_entropy(
                logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum"
            ).item()
            kept += int((y != IGNORE).sum())
    loss = {
        "reported": reported["val_loss"],
        "independent": nats / kept,
        "tokens": (reported["val_tokens"], kept),
    }
    return root / "runs" / "sft", loss


def held_out(root: Path, n: int) -> list[list[dict]]:
    """`n` conversations to answer whose questions the SFT data (root / c.jsonl) never asks."""
    seen = {
        m["content"]
        for line in (root / "c.jsonl").read_text().splitlines()
        for m in json.loads(line)["messages"]
    }
    rng, out = random.Random(1234), []
    while len(out) < n:
        q, _ = reversal(rng)
        if q in seen:
            continue
        seen.add(q)
        msgs = [{"role": "user", "content": q}]
        if len(out) % 5 == 1:  # an earlier exchange first
            q0, a0 = reversal(rng)
            msgs = [{"role": "user", "content": q0}, {"role": "assistant", "content": a0}, *msgs]
        if len(out) % 3 == 0:
            msgs = [{"role": "system", "content": "Be brief."}, *msgs]
        out.append(msgs)
    return out


def littlelm_chat(run: Path, conversations: list[list[dict]]) -> list[str]:
    """The replies of `littlelm chat RUN --precision fp32`, the command itself, one per line."""
    lines = "".join(json.dumps({"messages": m}) + "\n" for m in conversations)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "littlelm", "chat", str(run), "--precision", "fp32"]
    cmd += ["--max-tokens", str(NEW)]
    out = subprocess.run(cmd, input=lines, capture_output=True, text=True, env=env, check=True)
    return [json.loads(line)["reply"] for line in out.stdout.splitlines()]


def chat_row(root: Path, kind: str, rows: int) -> dict:
    import transformers

    t0 = time.time()
    run, loss = sft(root, kind, rows)
    convs = held_out(root, PROMPTS)
    replies = littlelm_chat(run, convs)
    _, tok, _ = load_model(run, "cpu")
    fmt = chat_format(tok)
    prompts = [fmt.encode(m, add_generation_prompt=True) for m in convs]
    info = export(run, root / "hf_out")
    remote = info["arch"] == "littlelm"  # exported with littlelm's modeling file
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        root / "hf_out", trust_remote_code=remote
    )
    hf_tok = transformers.AutoTokenizer.from_pretrained(root / "hf_out", trust_remote_code=remote)
    hf.eval()
    row = {"kind": kind, "class": type(hf).__name__, "arch": info["arch"], "loss": loss}
    row["distinct"] = len(set(replies))
    ids_same = gen_same = stopped = 0
    for msgs, prompt, want in zip(convs, prompts, replies, strict=True):
        ids = hf_tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        ids_same += ids == prompt
        with torch.no_grad():  # no arguments past the length: generation_config.json decides
            out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW)[0, len(ids) :].tolist()
        stopped += fmt.end in out
        text = hf_tok.decode(out[:-1] if out and out[-1] == fmt.end else out)
        gen_same += text == want
    row.update(ids=ids_same, generate=gen_same, stopped=stopped)
    if info["arch"] != "littlelm":
        row.update(gguf_rows(root, run, convs, prompts, replies, tok.bos_id))
    row["seconds"] = time.time() - t0
    return row


def gguf_rows(root, run, convs, prompts, replies, bos: int) -> dict:
    import llama_cpp

    export(run, None, gguf=root / "model.gguf", gguf_type="f32")
    llm = llama_cpp.Llama(str(root / "model.gguf"), n_ctx=128, verbose=False)
    seen, real = [], llm.create_completion

    def spy(prompt, *args, **kwargs):  # the ids the chat handler hands the model
        seen.append(list(prompt))
        return real(prompt, *args, **kwargs)

    llm.create_completion = spy
    prompt_same = reply_same = one_bos = 0
    for msgs, prompt, want in zip(convs, prompts, replies, strict=True):
        r = llm.create_chat_completion(messages=msgs, temperature=0.0, max_tokens=NEW)
        prompt_same += seen[-1] == prompt
        one_bos += seen[-1][0] == bos and seen[-1].count(bos) == 1
        reply_same += r["choices"][0]["message"]["content"] == want
    handler = llm.chat_format
    llm.close()
    return {"gguf_prompt": prompt_same, "gguf_bos": one_bos, "gguf": reply_same, "handler": handler}


def chat_table(rows: int) -> None:
    import llama_cpp
    import transformers

    with tempfile.TemporaryDirectory() as d:
        os.environ["LITTLELM_CACHE"] = str(Path(d) / "cache")  # its shards stay with it
        table = [chat_row(Path(d) / kind, kind, rows) for kind in ("littlelm", "llama", "chatml")]
    print(
        f"transformers {transformers.__version__}, llama-cpp-python {llama_cpp.__version__}, "
        f"torch {torch.__version__}; {PROMPTS} held-out conversations, {SFT_STEPS} SFT steps "
        f"of {rows} rows\n"
    )
    print(
        "| model | export | val loss reported | masked mean here | abs diff | "
        "apply_chat_template ids == littlelm | generate() == chat --precision fp32 | "
        "generate() stopped at end | GGUF prompt == littlelm (one BOS) | "
        "GGUF chat completion == chat | distinct replies |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    n = PROMPTS
    for r in table:
        loss = r["loss"]
        gguf = "no GGUF form (littlelm arch)"
        if "gguf" in r:
            gguf = f"{r['gguf_prompt']}/{n} ({r['gguf_bos']}/{n}), {r['handler']}"
        print(
            f"| {r['kind']} | {r['class']} | {loss['reported']:.6f} | {loss['independent']:.6f} "
            f"| {abs(loss['reported'] - loss['independent']):.1e} | {r['ids']}/{n} | "
            f"{r['generate']}/{n} | {r['stopped']}/{n} | {gguf} | "
            f"{r.get('gguf', '-')}{'/' + str(n) if 'gguf' in r else ''} | {r['distinct']} |"
        )
    for r in table:
        print(f"{r['kind']}: {r['seconds']:.0f} s; val targets {r['loss']['tokens']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chat", action="store_true", help="the SFT chat-export table instead")
    ap.add_argument(
        "--rows", type=int, default=16, help="SFT rows per step (of 64 tokens; default 16)"
    )
    args = ap.parse_args()
    register_all()  # an entry point: fill the registries before building a config
    if args.chat:
        chat_table(args.rows)
        return
    with tempfile.TemporaryDirectory() as d:
        rows = [export_row(Path(d), n) for n in FEATURES]
        rows += [import_row(Path(d), k) for k in ("llama", "qwen3")]
    print("| direction | class | max abs logit gap | largest logit | 32 greedy tokens equal |")
    print("| --- | --- | --- | --- | --- |")
    for what, cls, gap, top, same in rows:
        eq = "-" if same is None else ("yes" if same else "NO")
        print(f"| {what} | {cls} | {gap:.2g} | {top:.3g} | {eq} |")


if __name__ == "__main__":
    main()
