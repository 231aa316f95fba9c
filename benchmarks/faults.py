"""Kill a training run with SIGKILL at random moments and check that it recovers exactly.

    python benchmarks/faults.py [--kills 10] [--seed 0] [--steps 300] [--every 25]
    python benchmarks/faults.py --nproc 2      # torchrun, gloo, DDP with ZeRO-1 AdamW
    python benchmarks/faults.py --sft          # the runs are SFT (docs/post-training.md)
    python benchmarks/faults.py --lora         # the runs train LoRA adapters on a frozen base
    python benchmarks/faults.py --rl --steps 100   # the runs are RL from an SFT run (rl:)
    python benchmarks/faults.py --dpo          # the runs are DPO from a base run (dpo:)
    python benchmarks/faults.py --dpo --lora   # ... on LoRA adapters (also --rl --lora)

1. Trains a small config (2 layers, d_model 64, byte tokenizer, synthetic text) without
   interruption: the reference. With `--nproc N` (N > 1) both runs are `littlelm train ...
   --nproc N` (torchrun, DDP, sharded Muon, and ZeRO-1 AdamW unless `--no-zero1`).
2. Trains the same config again in a fresh run directory and SIGKILLs it at `--kills` random
   moments, then runs `littlelm train` again (it resumes by itself). About four kills in ten
   land inside a checkpoint save: the run has LITTLELM_FAULT_SAVE_DELAY set, so each save pauses
   between its file writes and between its rename and the pruning, and the kill comes at a
   random moment of that window after rank 0's temporary directory appears. Saves are written
   in the background (checkpoint.async_save=true; `--sync`: false), so most of those kills land
   while training has moved on past the step being saved, inside the background write (a save
   due while another is written is skipped: a kill aimed at it lands in the one in flight).
   The others land at a random moment of a random step. With `--nproc N` each kill hits one victim, in turn from a
   shuffled list (one process: always the process):
   - all: every process of the run (a node dying); all are stopped (SIGSTOP) and then
     SIGKILLed, so none sees another die first;
   - rank r: one worker only (an OOM kill); torchrun must then stop the other workers and exit
     non-zero;
   - torchrun: the launcher only (a supervisor or a hand that kills one pid); its workers must
     not train on as orphans: they get SIGTERM from the kernel, save, and exit.
   The run (every process it had) must end within `--teardown-limit` seconds of the kill; one
   that does not is reported as hung (or its surviving workers as orphans) and killed so that
   the benchmark goes on.
3. Prints one row per kill (victim, step reached, checkpoint resumed from, steps lost, how the
   run stopped, what the save left behind) and checks: every kill recovered from the newest
   complete checkpoint, no kill lost more than one checkpoint interval (two with background
   saves: the interval, and the steps trained while its save was written), every run ended in time
   with no process left (a rank kill with a non-zero exit), the final weights are bitwise equal
   to the reference's, and so is every logged per-step loss.

4. Three more cases, each on a run of its own (one process each, except the live run, which
   has `--nproc` processes):
   - disk full at start: `littlelm train` with ENOSPC injected into its first write to the run
     directory (the run lock's pid; os.pwrite patched in the process, as tests/ simulate it,
     since a small full filesystem needs root): exit 2, one `error:` line, no traceback;
   - bench beside a live run: while a run named `prod-bench` trains, `littlelm bench
     run.name=prod` (whose result directory would be that run) must refuse with exit 2, and
     `littlelm bench` of the live run's own name must work in a directory of its own; the live
     run keeps training, its checkpoints and metrics intact;
   - a second SIGTERM during teardown: the live run is then sent SIGTERM (rank 0 with
     `--nproc`), and once the stop's checkpoint is written, SIGTERM again every 10 ms until it
     exits: exit 0, as documented, with that checkpoint complete and every step logged once.

5. Four cases on budgets and sweeps (issue 36), always one process per run, each on time
   budgets of seconds (train.budget.hours), checking that nothing is lost (every step logged
   once, the earlier records kept, one end record, the newest checkpoint at the last step):
   - budget raised after its end: a 6 s budget run to its end, run again (nothing to do; it
     advises a raised train.budget.hours), then with that advice: it resumes from its final
     checkpoint, the lr back on the plateau, and trains further;
   - stale budget.json: that run's checkpoints deleted, its budget.json (counting more than the
     budget) left: the same command starts the budget afresh and trains a whole run (not one
     step at lr 0 called done), saying why;
   - budget raised in its cooldown: SIGTERM once progress passes 0.9 of 12 s, resumed with 36 s:
     the start-up says the schedule is refitted; every resumed lr_mult is the trapezoid's at its
     logged progress, and that progress follows the new budget's time (no lr frozen at the
     cooldown's value);
   - sweep kill before an end record: a sweep of two variants whose first is SIGKILLed after its
     final checkpoint is in place and before its end record (the save pauses after its rename,
     LITTLELM_FAULT_SAVE_DELAY): the sweep exits 2; the same command completes that variant
     without training it again (weights bitwise as saved); a third run skips both.

With `--sft` the two runs are supervised fine-tuning instead: a base run (BPE tokenizer with the
chat tokens) is trained first, and both runs start from it (`grow.parent`) on synthetic
conversations (the `chat` source), with the loss on the assistant's tokens only and
conversations packed whole with padding; everything above is checked the same way.

With `--lora` the two runs train LoRA adapters (rank 8, dropout 0.1: the dropout draws from
the RNG a resume must restore) on a frozen base run trained first, continuing its pretraining
(`grow.parent`, the same shape; with `--sft` too: SFT from the base): their checkpoints hold the
adapters alone and every resume loads the base again from its checkpoint, checked by its
fingerprint; everything above is checked the same way (the final weights compared are the
adapters).
With `--rl` the two runs are RL with verifiable rewards (train/rl.py): the base is an SFT run
on those conversations (150 steps from random weights, so that sampled replies are right some
of the time), and both runs start from it (`sft.base`) with `rl:` groups sampled at temperature
1 and scored by exact match; besides the losses and weights, every logged step's mean reward
must be bitwise equal: a resumed run samples exactly the replies of the uninterrupted one.
With `--dpo` the two runs are DPO (train/dpo.py) from a base run with the chat tokens (30
steps), on synthetic preference pairs (reversals: the chosen reply reversed, the rejected not),
against the frozen reference (the base, read again at every resume). `--lora` with `--dpo` or
`--rl` trains adapters on the base instead of every weight (the reference stays the base).

Exit status 0 only when every check passes. On 2 CPU cores the default run takes about one
minute, `--nproc 2` (10 kills, 200 steps) about two, and the cases of steps 4 and 5 about three
more. `--device cuda` trains on GPUs instead
(for a borrowed GPU node): recoveries, lost steps and teardowns are checked the same way;
weights and losses are compared and the largest difference printed, but bitwise equality is not
required there, since some CUDA kernels are not deterministic. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from littlelm.train.checkpoint import files as ckpt

STEP_LINE = re.compile(r"^step (\d+)/\d+ \|")
RESUMED = re.compile(r"^resumed from \S+ \(step (\d+),")
STOPPED = re.compile(r"^stopped by SIGTERM at step (\d+);")
WORDS = [
    *[
        "the",
        "model",
        "reads",
        "a",
        "token",
        "and",
        "predicts",
        "the",
        "next",
        "one",
        "while",
        "the",
        "optimizer",
        "adjusts",
    ],
    *[
        "every",
        "weight",
        "a",
        "small",
        "network",
        "learns",
        "quickly",
        "when",
        "the",
        "data",
        "is",
        "clean",
        "def",
        "main",
    ],
    *[
        "return",
        "value",
        "print",
        "import",
        "class",
        "self",
        "none",
        "true",
        "false",
        "for",
        "while",
        "if",
        "else",
    ],
]


def sft_data(work: Path) -> tuple[dict, dict]:
    """(the base's tokenizer, the SFT runs' data section and sft section), for --sft."""
    chats = work / "chats.jsonl"
    if not chats.exists():
        rng = random.Random(1)
        rows = []
        for _ in range(4000):
            letters = [rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))]
            q, a = f"Reverse: {' '.join(letters)}", " ".join(reversed(letters))
            rows.append(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
        chats.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = work / "runs" / "base"
    data = {
        "tokenizer": {"name": "saved", "path": str(base)},
        "sources": {"chat": {"name": "chat", "dataset": str(chats)}},
        "val_fraction": 0.05,
        "buffer_docs": 64,
    }
    return data, {"base": str(base)}


def rl_section(work: Path) -> dict:
    """The RL runs' rl: section (--rl), its prompts written beside the conversations."""
    prompts = work / "prompts.jsonl"
    if not prompts.exists():
        rng = random.Random(2)
        rows = []
        for _ in range(500):
            letters = [rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))]
            q, a = f"Reverse: {' '.join(letters)}", " ".join(reversed(letters))
            rows.append({"question": q, "answer": a})
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "prompts": str(prompts),
        "group_size": 4,
        "prompts_per_step": 4,
        "max_new_tokens": 16,
        "kl_coef": 0.05,
        "iterations": 2,  # kills land between a batch's two optimizer steps too (batch in state)
        "reward": "exact",
    }


def dpo_data(work: Path) -> tuple[dict, dict]:
    """(the DPO runs' data section, their sft section), for --dpo: reversal pairs."""
    pairs = work / "pairs.jsonl"
    if not pairs.exists():
        rng = random.Random(3)
        rows = []
        for _ in range(3000):
            letters = [rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))]
            good = " ".join(reversed(letters))
            bad = " ".join(letters) if letters != letters[::-1] else good + " a"
            rows.append(
                {"prompt": f"Reverse: {' '.join(letters)}", "chosen": good, "rejected": bad}
            )
        pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = work / "runs" / "base"
    data = {
        "tokenizer": {"name": "saved", "path": str(base)},
        "sources": {"prefs": {"name": "preference", "dataset": str(pairs)}},
        "val_fraction": 0.05,
    }
    return data, {"base": str(base)}


def make_run(work: Path, name: str, args: argparse.Namespace, steps: int | None = None) -> Path:
    rng = random.Random(0)
    corpus = work / "corpus.txt"
    if not corpus.exists():
        paras = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 80))) + "."
            for _ in range(3000)
        ]
        corpus.write_text("\n\n".join(paras) + "\n")
    tree = {
        "run": {"name": name, "out_dir": str(work / "runs"), "seed": 0, "device": args.device},
        "model": {"name": "gpt", "n_layer": 2, "d_model": 64, "n_head": 2, "max_seq_len": 64},
        "data": {
            "tokenizer": {"name": "byte"},
            "sources": {"text": {"name": "text", "path": str(corpus), "split": "paragraph"}},
            "val_fraction": 0.05,
            "buffer_docs": 64,
        },
        "optimizer": {"name": "muon"},
        "schedule": {"name": "trapezoidal", "warmup_steps": 10},
        "train": {
            "micro_batch_size": 8,
            "seq_len": 64,
            "max_steps": steps or args.steps,
            "log_every": 1,
        },
        "eval": {"every": 0, "at_end": False},
        "checkpoint": {"every": args.every, "keep_last": 2, "async_save": not args.sync},
    }
    if (args.sft or args.dpo) and name == "base":  # a BPE tokenizer with the chat tokens
        tree["data"]["tokenizer"] = {"name": "bpe", "vocab_size": 400, "train_chars": 200_000}
    if (args.sft or args.lora or args.dpo) and name == "base":
        tree["train"]["max_steps"] = 30
        tree["checkpoint"] = {"every": 30}
    elif args.sft:
        tree["data"], tree["sft"] = sft_data(work)
    elif args.dpo:
        tree["data"], tree["sft"] = dpo_data(work)
        tree["dpo"] = {"beta": 0.1}
        tree["optimizer"] = {"name": "adamw", "lr": 3e-4}
    if args.lora and name != "base":  # adapters on the base (--sft's, or continued pretraining)
        tree["lora"] = {"rank": 8, "dropout": 0.1, "lr": 0.003}
        if not (args.sft or args.dpo or args.rl):  # those start from sft.base already
            tree["grow"] = {"parent": str(work / "runs" / "base")}
    if args.rl and name == "base":  # the SFT model RL starts from: conversations from random
        tree["data"], _ = sft_data(work)
        # the conversations' few letters make few merges: bytes, BOS, chat tokens and some
        tree["data"]["tokenizer"] = {"name": "bpe", "vocab_size": 270, "train_chars": 200_000}
        tree["train"]["max_steps"] = 150
        tree["checkpoint"] = {"every": 150}
    elif args.rl:
        tree["data"], tree["sft"] = sft_data(work)
        tree["rl"] = rl_section(work)
        tree["optimizer"] = {"name": "adamw", "lr": 3e-4}
    if args.nproc > 1:
        tree["distributed"] = {"shard_adamw": args.zero1}
    for item in args.set or []:  # --set train.precision=fp32 ...
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process, from /proc."""
    table = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            table[int(d.name)] = (int(ppid), state)
    return table


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` that still run (zombies and vanished processes do not)."""
    table = process_table()
    return [p for p in pids if p in table and table[p][1] not in "ZX"]


class Child:
    """`littlelm train CONFIG [--nproc N]` in its own session; stdout and stderr collected by
    threads. With --nproc the process execs torchrun, whose workers are its children."""

    def __init__(self, config: Path, env: dict, nproc: int):
        nprocs = ["--nproc", str(nproc)] if nproc > 1 else []
        self.p = subprocess.Popen(
            [sys.executable, "-m", "littlelm", "train", str(config), *nprocs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=lambda s=s, k=k: k.extend(s), daemon=True)
            for s, k in ((self.p.stdout, self.out), (self.p.stderr, self.err))
        ]
        for r in self.readers:
            r.start()

    def tree(self) -> list[int]:
        """This process and every live descendant (torchrun's workers and their children)."""
        table = process_table()
        found, todo = [], [self.p.pid]
        while todo:
            pid = todo.pop()
            if pid in table and table[pid][1] not in "ZX":
                found.append(pid)
            todo += [c for c, (parent, _) in table.items() if parent == pid]
        return found

    def worker(self, rank: int) -> int:
        """The pid of torchrun's worker process with RANK=rank."""
        for pid, (parent, _) in process_table().items():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if parent == self.p.pid and f"RANK={rank}".encode() in environ:
                return pid
        raise RuntimeError(f"no worker with RANK={rank} under pid {self.p.pid}")

    def kill(self, victim: str | int) -> list[int]:
        """SIGKILL every process of the run at once (all stopped first, so none sees another
        die), torchrun alone, or one worker rank. Returns the run's processes just before."""
        procs = self.tree()
        if victim == "all":
            for pid in procs:
                os.kill(pid, signal.SIGSTOP)
            for pid in procs:
                os.kill(pid, signal.SIGKILL)
        else:
            os.kill(self.p.pid if victim == "torchrun" else self.worker(victim), signal.SIGKILL)
        return procs

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.out))

    def last_step(self) -> int:
        for line in reversed(self.out):
            m = STEP_LINE.match(line)
            if m:
                return int(m.group(1))
        return 0

    def resumed_step(self) -> int | None:
        for line in self.out:
            m = RESUMED.match(line)
            if m:
                return int(m.group(1))
        return None

    def drain(self, timeout: float | None = None) -> int | None:
        """Wait for the exit status (None: still running after `timeout` seconds)."""
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for r in self.readers:
            r.join()
        return rc


@dataclass
class Kill:
    kind: str  # "step" or "save"
    target: int  # the step (or the checkpoint step whose save is hit)
    victim: str | int  # "all" (every process of the run), "torchrun", or one worker rank

    def moment(self) -> str:
        return (
            f"in save of step {self.target}" if self.kind == "save" else f"after step {self.target}"
        )

    def who(self, nproc: int) -> str:
        if isinstance(self.victim, int):
            return f"rank {self.victim}"
        if self.victim == "torchrun":
            return "torchrun"
        return "all processes" if nproc > 1 else "the process"


def plan(kills: int, steps: int, every: int, seed: int, nproc: int) -> list[Kill]:
    """Kill moments (about 4 in 10 inside a save) and victims (all, rank 0, ..., torchrun in
    turn, shuffled)."""
    rng = random.Random(seed)
    n_save = max(1, round(kills * 0.4))
    saves = rng.sample(range(every, steps + 1, every), n_save)
    others = [s for s in range(2, steps) if s not in saves]
    moments = [("save", s) for s in saves] + [
        ("step", s) for s in rng.sample(others, kills - n_save)
    ]
    kinds: list[str | int] = ["all", *range(nproc), "torchrun"] if nproc > 1 else ["all"]
    victims = (kinds * kills)[:kills]
    rng.shuffle(victims)
    return sorted((Kill(k, s, v) for (k, s), v in zip(moments, victims)), key=lambda k: k.target)


def wait_for(child: Child, test, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while not test():
        if child.p.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def strike(child: Child, kill: Kill, root: Path, rng: random.Random, window: float) -> list[int]:
    """Wait for the kill's moment and deliver it; returns the run's processes just before the
    kill (empty if the run ended first)."""
    if kill.kind == "save":
        pattern = f"step_{kill.target:06d}.tmp-*"
        skipped = f"checkpoint of step {kill.target} skipped"  # the save in flight is the target
        if not wait_for(child, lambda: any(root.glob(pattern)) or child.said(skipped)):
            return []
        time.sleep(rng.uniform(0, window))
    else:
        if not wait_for(child, lambda: child.last_step() >= kill.target):
            return []
        time.sleep(rng.uniform(0, 0.05))  # somewhere inside a following step
    return child.kill(kill.victim)


@dataclass
class Outcome:
    kill: Kill
    reached: int  # the last step the run logged
    start: int = 0  # the step the next run resumed from
    teardown: float = 0.0  # seconds from the kill until every process of the run had ended
    rc: int | None = None  # the killed run's exit status (None: still running at the limit)
    left: int = 0  # processes of the run still alive at the limit (hung or orphaned)
    partial: tuple[str, ...] = ()  # temporary directories the kill left
    good: bool = False  # resumed from the newest complete checkpoint and trained on

    @property
    def lost(self) -> int:
        return self.reached - self.start

    @property
    def stopped(self) -> bool:
        """Every process ended in time; a rank kill must also end torchrun non-zero."""
        return not self.left and (not isinstance(self.kill.victim, int) or self.rc not in (0, None))

    def how(self, limit: float) -> str:
        if self.rc is None:
            return f"HUNG > {limit:.0f}s"
        if self.left:
            return f"{self.left} ORPHANS > {limit:.0f}s"
        if self.kill.victim == "all":
            return "killed"
        if self.kill.victim == "torchrun":
            return f"workers ended in {self.teardown:.1f}s"
        return f"exit {self.rc} in {self.teardown:.1f}s"


def collect(child: Child, kill: Kill, procs: list[int], root: Path, limit: float) -> Outcome:
    """Wait (at most `limit` s) until every process the run had is gone; kill what is left."""
    t0 = time.monotonic()
    while alive(procs) and time.monotonic() - t0 < limit:
        time.sleep(0.05)
    try:  # a dying process shows as a zombie before its last thread is gone and it can be reaped
        rc = child.p.wait(max(1.0, t0 + limit - time.monotonic()))
    except subprocess.TimeoutExpired:
        rc = None
    out = Outcome(kill, child.last_step(), teardown=time.monotonic() - t0, rc=rc)
    left = alive(procs)
    out.left = len(left)
    for pid in left:  # a hang or orphans: reported; cleared away for the next run
        os.kill(pid, signal.SIGKILL)
    child.drain()
    out.partial = tuple(sorted(d.name for d in root.glob("*.tmp-*"))) if root.is_dir() else ()
    return out


def recovers(child: Child, expect: int) -> bool:
    """The new child resumed from the newest complete checkpoint and trained on (or finished)."""
    wait_for(child, lambda: child.last_step() > expect or child.p.poll() is not None)
    start = child.resumed_step() or 0
    return start == expect and (child.last_step() > start or child.p.wait() == 0)


def losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert len(steps) == len(set(steps)), "a step is logged twice in metrics.jsonl"
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def rewards(run_dir: Path) -> dict[int, float]:
    """Each logged step's mean RL reward (--rl; log_every is 1)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["rl_reward"] for r in records if "rl_reward" in r}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt.latest_checkpoint(run_dir / "checkpoints") / "model.safetensors")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nproc", type=int, default=1, help="processes per run (>1: torchrun)")
    ap.add_argument("--kills", type=int, default=10, help="SIGKILLs to deliver")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments and victims")
    ap.add_argument("--steps", type=int, help="training steps (default 300; 200 with --nproc)")
    ap.add_argument("--every", type=int, help="checkpoint interval (default 25; 20 with --nproc)")
    ap.add_argument("--save-delay", type=float, default=0.1, help="seconds per pause in a save")
    ap.add_argument(
        "--sync",
        action="store_true",
        help="checkpoint.async_save=false: training waits for each save",
    )
    ap.add_argument(
        "--zero1",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --nproc: distributed.shard_adamw (ZeRO-1 AdamW moments)",
    )
    ap.add_argument(
        "--teardown-limit",
        type=float,
        default=60,
        help="seconds torchrun may take to stop the run after a rank is killed",
    )
    ap.add_argument(
        "--workdir",
        default=f"/tmp/littlelm-faults-{os.getpid()}",
        help="runs, data cache and configs go here (kept afterwards)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (bitwise check) or cuda")
    ap.add_argument("--sft", action="store_true", help="SFT runs from a base run (conversations)")
    ap.add_argument("--lora", action="store_true", help="LoRA runs on a frozen base run")
    ap.add_argument("--rl", action="store_true", help="RL runs from an SFT run (rl:, exact match)")
    ap.add_argument(
        "--dpo", action="store_true", help="DPO runs from a base run (preference pairs)"
    )
    ap.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="config override, e.g. train.precision=fp32",
    )
    ap.add_argument(
        "--no-cases",
        dest="cases",
        action="store_false",
        help="skip the extra cases (steps 4 and 5)",
    )
    args = ap.parse_args()
    multi = args.nproc > 1
    args.steps = args.steps or (200 if multi else 300)
    args.every = args.every or (20 if multi else 25)
    return args


def faulted_run(args: argparse.Namespace, cfg: Path, env: dict) -> tuple[list[Outcome], int]:
    """Train `cfg` through every planned kill; returns the outcomes and the final exit status."""
    root = cfg.parent / "runs" / "faulted" / "checkpoints"
    env = {**env, ckpt.FAULT_DELAY_ENV: str(args.save_delay)}
    rng = random.Random(args.seed + 1)
    window = 5 * args.save_delay  # 4 file writes + the rename-to-prune gap
    rows = []
    child = Child(cfg, env, args.nproc)
    for i, kill in enumerate(plan(args.kills, args.steps, args.every, args.seed, args.nproc), 1):
        procs = strike(child, kill, root, rng, window)
        if not procs:
            raise SystemExit(f"kill {i}: the run ended before its moment\n" + "".join(child.err))
        out = collect(child, kill, procs, root, args.teardown_limit)
        newest = ckpt.latest_checkpoint(root, warn=False)
        expect = ckpt.checkpoint_step(newest) if newest else 0
        child = Child(cfg, env, args.nproc)
        out.good = recovers(child, expect)
        out.start = child.resumed_step() or 0
        rows.append(out)
    return rows, child.drain()


def littlelm(args: list[str], env: dict, code: str | None = None) -> subprocess.CompletedProcess:
    """`littlelm ARGS` in a process of its own (with `code` run first, to inject a fault)."""
    main = f"import sys; from littlelm.cli import main; sys.exit(main({args!r}))"
    cmd = [sys.executable, "-c", f"{code}\n{main}" if code else main]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def clean_error(r: subprocess.CompletedProcess) -> bool:
    """Exit 2 with an `error:` line and no traceback."""
    return r.returncode == 2 and "error: " in r.stderr and "Traceback" not in r.stderr


def last_error(r: subprocess.CompletedProcess) -> str:
    lines = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    return (lines[-1] if lines else r.stderr.strip()[-200:])[:150]


DISK_FULL = (
    "import errno, os\n"
    "def full(*a):\n"
    "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
    "os.pwrite = full"
)


def disk_full_at_start(args, work: Path, env: dict) -> tuple[str, str, bool]:
    cfg = make_run(work, "diskfull", args)
    r = littlelm(["train", str(cfg)], env, DISK_FULL)
    run_dir = work / "runs" / "diskfull"
    left = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    ok = clean_error(r) and "free disk space" in r.stderr and left in ([], [".lock"])
    return "disk full at start", f"exit {r.returncode}: {last_error(r)}", ok


def bench_beside_live_run(args, live: Child, cfg: Path, env: dict) -> tuple[str, str, bool]:
    """Two benches while `live` (run.name prod-bench) trains; then the live run must be whole."""
    run_dir = cfg.parent / "runs" / "prod-bench"
    wait_for(live, lambda: ckpt.latest_checkpoint(run_dir / "checkpoints", warn=False) is not None)
    before = len((run_dir / "metrics.jsonl").read_text().splitlines())
    into = littlelm(["bench", str(cfg), "run.name=prod", "--steps", "2"], env)
    own = littlelm(["bench", str(cfg), "--steps", "2"], env)
    alive_after = live.p.poll() is None
    after = len((run_dir / "metrics.jsonl").read_text().splitlines())
    whole = ckpt.latest_checkpoint(run_dir / "checkpoints", warn=False) is not None
    ok = clean_error(into) and own.returncode == 0 and alive_after and after > before and whole
    text = (
        f"bench run.name=prod: exit {into.returncode} ({last_error(into)}); bench of the live "
        f"run's name: exit {own.returncode} (in prod-bench-bench); live run "
        f"{'still training' if alive_after else 'ENDED'}, metrics {before} -> {after} lines, "
        f"checkpoints {'kept' if whole else 'LOST'}"
    )
    return "bench beside a live run", text, ok


def sigterm_in_teardown(args, live: Child, cfg: Path) -> tuple[str, str, bool]:
    """SIGTERM the live run; once its stop checkpoint exists, SIGTERM it again until it ends."""
    root = cfg.parent / "runs" / "prod-bench" / "checkpoints"
    had = {d.name for d in ckpt.list_checkpoints(root, warn=False)}
    workers = [p for p in live.tree() if p != live.p.pid] if args.nproc > 1 else [live.p.pid]
    os.kill(live.worker(0) if args.nproc > 1 else live.p.pid, signal.SIGTERM)
    saved = lambda: {d.name for d in ckpt.list_checkpoints(root, warn=False)} - had  # noqa: E731
    wait_for(live, lambda: saved() or any("stopped by SIGTERM" in x for x in live.out), 120)
    sent = 0
    while live.p.poll() is None:
        for pid in alive(workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                sent += 1
        time.sleep(0.01)
    rc = live.drain()
    stop = next((int(m.group(1)) for x in live.out if (m := STOPPED.match(x))), None)
    newest = ckpt.latest_checkpoint(root, warn=False)
    steps = sorted(losses(root.parent))
    ok = (
        rc == 0
        and stop is not None
        and newest is not None
        and ckpt.checkpoint_step(newest) == stop
        and steps == list(range(1, stop + 1))
    )
    text = (
        f"stopped at step {stop}, {sent} more SIGTERM(s) in teardown: exit {rc}; newest "
        f"checkpoint {newest.name if newest else None}, steps logged 1..{steps[-1] if steps else 0}"
    )
    return "second SIGTERM in teardown", text, ok


# -- budgets and sweeps (issue 36): each case on runs of its own, one process -------------------

ADVICE = re.compile(r"add (train\.budget\.hours=\S+) to the command")


def budget_run(work: Path, name: str, args: argparse.Namespace, seconds: float) -> Path:
    """The small config on a time budget of `seconds` (no max_steps), checkpointed at its end
    (and at a stop) only, one process."""
    cfg = make_run(work, name, args)
    tree = yaml.safe_load(cfg.read_text())
    tree["train"].pop("max_steps", None)
    tree["train"]["budget"] = {"hours": seconds / 3600}
    tree["checkpoint"] = {"every": 1_000_000, "keep_last": 2}
    tree.pop("distributed", None)
    cfg.write_text(yaml.safe_dump(tree))
    return cfg


def hours(seconds: float) -> str:
    return f"train.budget.hours={seconds / 3600!r}"


def records(run_dir: Path, kind: str | None = None) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return [r for r in rows if kind is None or r["kind"] == kind]


def steps_once(train: list[dict]) -> bool:
    """Every step from 1 to the last logged exactly once, in order."""
    return [r["step"] for r in train] == list(range(1, len(train) + 1))


def said(r: subprocess.CompletedProcess) -> str:
    return r.stdout + r.stderr


def budget_raised_after_its_end(args, work: Path, env: dict) -> tuple[str, str, bool]:
    """Issue 36.1: a time-budget run trained to its end is run again (nothing to do: it advises
    a raised train.budget.hours), then with that advice: it must resume from its final
    checkpoint and train further, the first session's records kept."""
    cfg, run_dir = budget_run(work, "budget-end", args, 6), work / "runs" / "budget-end"
    first = littlelm(["train", str(cfg)], env)
    before = records(run_dir, "train")
    n1 = len(before)
    again = littlelm(["train", str(cfg)], env)
    advice = ADVICE.search(said(again))
    idle = records(run_dir, "train") == before
    if first.returncode or again.returncode or not advice:
        why = f"exit {first.returncode} then {again.returncode}, advice {bool(advice)}"
        return "budget raised after its end", f"setup: {why}: {last_error(again)}", False
    more = littlelm(["train", str(cfg), advice.group(1)], env)
    train, ends = records(run_dir, "train"), records(run_dir, "end")
    newest = ckpt.latest_checkpoint(run_dir / "checkpoints", warn=False)
    n2 = len(train)
    resumed = f"(step {n1}," in said(more) and "refitted to the new budget" in said(more)
    ok = (
        idle
        and more.returncode == 0
        and resumed
        and n2 > n1
        and steps_once(train)
        and train[:n1] == before  # the first session's records as they were
        and train[n1]["lr_mult"] == 1.0  # back on the plateau, not at the cooldown's end
        and len(ends) == 1
        and ends[0]["step"] == n2
        and ends[0]["finished"]
        and newest is not None
        and ckpt.checkpoint_step(newest) == n2
    )
    text = (
        f"6s budget to step {n1}; rerun: exit {again.returncode}, "
        f"{'nothing trained' if idle else 'TRAINED'}, advice `{advice.group(1)}`; with it: exit "
        f"{more.returncode}, {'resumed from step ' + str(n1) if resumed else 'NOT RESUMED'}, lr "
        f"x{train[n1]['lr_mult'] if n2 > n1 else float('nan'):.3f} at step {n1 + 1}, trained to "
        f"step {n2} (steps 1..{n2} logged {'once' if steps_once(train) else 'NOT once'}, "
        f"{len(ends)} end record(s)), newest checkpoint step {newest and ckpt.checkpoint_step(newest)}"
    )
    return "budget raised after its end", text, ok


def trapezoid(progress: float, cooldown: float = 0.4) -> float:
    """What the cases' schedule (trapezoidal, floor 0, past its warmup) gives at `progress`."""
    return 1.0 if progress <= 1 - cooldown else 1.0 - (progress - (1 - cooldown)) / cooldown


def budget_raised_in_cooldown(args, work: Path, env: dict) -> tuple[str, str, bool]:
    """Issue 36.2: SIGTERM once the schedule's progress passes 0.9 of a 12 s budget, resumed with
    36 s: the schedule refits to the new budget (the lr back to the plateau, not frozen at the
    cooldown's multiplier), and the start-up says so. Every resumed step's lr_mult is checked
    against the trapezoid at its logged progress, and that progress against the share of the
    new budget's time spent (so the cooldown starts at 60% of it and ends at its end)."""
    seconds, raised = 12, 36
    cfg, run_dir = budget_run(work, "budget-cool", args, seconds), work / "runs" / "budget-cool"
    live = Child(cfg, env, 1)

    def cooling() -> bool:
        with contextlib.suppress(OSError, ValueError):
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            return bool(lines) and json.loads(lines[-1]).get("budget_progress", 0) > 0.9
        return False

    hit = wait_for(live, cooling, 300)
    if hit:
        os.kill(live.p.pid, signal.SIGTERM)
    rc = live.drain(120)
    stop = next((int(m.group(1)) for x in live.out if (m := STOPPED.match(x))), None)
    before = records(run_dir, "train")
    if not hit or rc != 0 or stop is None or not before:
        why = "the run ended before progress 0.9" if not hit else f"exit {rc}, stop {stop}"
        return "budget raised in its cooldown", f"setup: {why}", False
    p0, lr0 = before[-1]["budget_progress"], before[-1]["lr_mult"]
    more = littlelm(["train", str(cfg), hours(raised)], env)
    train = records(run_dir, "train")
    resumed = train[len(before) :]
    told = re.search(r"train\.budget changed \([^)]*\).*refitted[^\n]*", said(more))
    off = [  # steps whose multiplier is not the schedule's at their progress
        r["step"] for r in resumed if abs(r["lr_mult"] - trapezoid(r["budget_progress"])) > 1e-6
    ]
    # the time share of the new budget each step reached: what progress must follow (a progress
    # stuck at the old budget's would pass the check above with a frozen lr)
    share = [r["budget_spent"] / raised for r in resumed]
    drift = max((abs(r["budget_progress"] - x) for r, x in zip(resumed, share)), default=1.0)
    frozen = [r["step"] for r, x in zip(resumed, share) if x <= 0.55 and r["lr_mult"] < 1.0]
    plateau = [r for r in resumed if r["lr_mult"] == 1.0]
    end = records(run_dir, "end")
    ok = (
        more.returncode == 0
        and f"(step {stop}," in said(more)
        and told is not None
        and "-> x1.000)" in told.group(0)
        and len(resumed) > 0
        and resumed[0]["lr_mult"] == 1.0
        and not off
        and not frozen
        and drift < 0.03
        and resumed[-1]["budget_progress"] == 1.0
        and resumed[-1]["lr_mult"] == 0.0
        and steps_once(train)
        and train[: len(before)] == before
        and len(end) == 1
    )
    cool_from = plateau[-1]["budget_progress"] if plateau else float("nan")
    text = (
        f"SIGTERM at progress {p0:.2f} (lr x{lr0:.3f}) of {seconds}s, stopped at step {stop}; "
        f"resumed with {raised}s: exit {more.returncode}, start-up "
        f"{'says ' + repr(told.group(0)[:90]) if told else 'SAYS NOTHING'}...; lr "
        f"x{resumed[0]['lr_mult'] if resumed else float('nan'):.3f} at step {stop + 1}, plateau "
        f"to progress {cool_from:.2f}, cooled to x{resumed[-1]['lr_mult'] if resumed else 0:.3f}"
        f" at step {train[-1]['step']}; {len(resumed) - len(off)}/{len(resumed)} lr_mults are "
        f"the trapezoid's at their progress, which follows the new budget's time (largest gap "
        f"{drift:.3f}); {len(frozen)} step(s) below x1 before 55% of it"
    )
    return "budget raised in its cooldown", text, ok


def stale_budget_ledger(args, work: Path, env: dict) -> tuple[str, str, bool]:
    """Issue 36.3: the checkpoints of the finished run of `budget_raised_after_its_end` are
    deleted, its budget.json (which counts more than the 6 s budget) left; the same command must
    start the budget afresh and train a whole run, not one step at lr 0 called done."""
    cfg, run_dir = work / "budget-end.yaml", work / "runs" / "budget-end"
    if not records(run_dir, "end"):
        return "stale budget.json", "setup: the run of the case before did not finish", False
    ledger = json.loads((run_dir / "budget.json").read_text())
    old = len(records(run_dir, "train"))
    shutil.rmtree(run_dir / "checkpoints")
    r = littlelm(["train", str(cfg)], env)
    train, end = records(run_dir, "train"), records(run_dir, "end")
    now = json.loads((run_dir / "budget.json").read_text())
    told = "belongs to checkpoints that are gone" in said(r)
    newest = ckpt.latest_checkpoint(run_dir / "checkpoints", warn=False)
    ok = (
        r.returncode == 0
        and told
        and ledger["spent"] > 6
        and len(train) > 20
        and steps_once(train)
        and max(x["lr_mult"] for x in train) == 1.0
        and len(end) == 1
        and end[0]["finished"]
        and now["spent"] < 2 * 6  # this run's own time, not the stale ledger's plus it
        and newest is not None
        and ckpt.checkpoint_step(newest) == len(train)
    )
    text = (
        f"budget.json counted {ledger['spent']:.1f}s (to step {ledger['step']}) of a 6s budget; "
        f"checkpoints deleted; same command: exit {r.returncode}, "
        f"{'says the ledger belongs to gone checkpoints' if told else 'SAYS NOTHING'}, trained "
        f"steps 1..{len(train)} afresh (lr up to x{max((x['lr_mult'] for x in train), default=0):.3f}; "
        f"the old run's {old} step records replaced), spent {now['spent']:.1f}s, "
        f"{'finished' if end and end[0]['finished'] else 'NOT FINISHED'}"
    )
    return "stale budget.json", text, ok


def sweep_killed_before_end_record(args, work: Path, env: dict) -> tuple[str, str, bool]:
    """Issue 36.8: a sweep of two variants (model.n_layer=1,2; 40 steps, saved at the end only)
    whose first variant is SIGKILLed between its final checkpoint and its end record: the save
    pauses after the rename (LITTLELM_FAULT_SAVE_DELAY), and the kill comes once step_000040 is
    in place with no end record written. The sweep says that variant did not finish (exit 2);
    the same command completes it without training it again (its weights bitwise as saved, each
    step logged once, one end record), and a third run skips both."""
    base = make_run(work, "sweep-base", args, steps=40)
    tree = yaml.safe_load(base.read_text())
    tree["checkpoint"] = {"every": 1_000_000, "keep_last": 2}
    tree.pop("distributed", None)
    base.write_text(yaml.safe_dump(tree))
    cmd = [sys.executable, "-m", "littlelm", "sweep", str(base), "--set", "model.n_layer=1,2"]
    cmd += ["--name", "sweep-kill"]
    sweep_dir = work / "runs" / "sweep-kill"
    victim_dir = sweep_dir / "n_layer=1"
    final = victim_dir / "checkpoints" / "step_000040"
    log = work / "sweep-kill.out"
    with open(log, "w") as out:
        sweep = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, ckpt.FAULT_DELAY_ENV: "1.0"},
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while not final.is_dir() and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    variants = [c for c, (ppid, _) in process_table().items() if ppid == sweep.pid]
    in_window = final.is_dir() and not records(victim_dir, "end") and len(variants) == 1
    if in_window:
        os.kill(variants[0], signal.SIGKILL)
    try:
        rc1 = sweep.wait(300)
    except subprocess.TimeoutExpired:
        os.killpg(sweep.pid, signal.SIGKILL)
        rc1 = None
    said1 = log.read_text()
    if not in_window:
        return "sweep kill before an end record", "setup: the kill missed its moment", False
    saved = load_file(final / "model.safetensors")
    train_before = records(victim_dir, "train")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    third = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    after = load_file(ckpt.latest_checkpoint(victim_dir / "checkpoints") / "model.safetensors")
    same = saved.keys() == after.keys() and all(torch.equal(saved[k], after[k]) for k in saved)
    train, end = records(victim_dir, "train"), records(victim_dir, "end")
    completed = "variant n_layer=1: finished" in said(again)
    skipped = said(third).count("already finished, skipped") == 2
    ok = (
        rc1 == 2
        and "did not finish" in said1
        and again.returncode == 0
        and completed
        and third.returncode == 0
        and skipped
        and same
        and train == train_before
        and len(train) == 40
        and steps_once(train)
        and len(end) == 1
        and end[0]["step"] == 40
        and end[0].get("completed_on_resume") is True
        and len(records(sweep_dir / "n_layer=2", "end")) == 1
    )
    text = (
        f"variant n_layer=1 SIGKILLed with step_000040 saved, no end record: sweep exit {rc1} "
        f"({'did not finish' if 'did not finish' in said1 else '?'}); same command: exit "
        f"{again.returncode}, n_layer=1 {'finished' if completed else 'NOT FINISHED'} "
        f"({'end record appended' if end and end[0].get('completed_on_resume') else 'no end record'}"
        f", weights {'bitwise as saved' if same else 'CHANGED'}, steps 1..{len(train)} logged "
        f"{'once' if steps_once(train) and train == train_before else 'NOT once'}); third run: "
        f"exit {third.returncode}, {'both skipped' if skipped else 'NOT SKIPPED'}"
    )
    return "sweep kill before an end record", text, ok


def extra_cases(args, work: Path, env: dict) -> list[tuple[str, str, bool]]:
    """The cases of steps 4 and 5, each with its wall time."""
    rows = []
    for case in (
        disk_full_at_start,
        budget_raised_after_its_end,
        stale_budget_ledger,  # on the run the case before finished
        budget_raised_in_cooldown,
        sweep_killed_before_end_record,
    ):
        t0 = time.monotonic()
        try:
            row = case(args, work, env)
        except Exception as e:  # a case that breaks is a failed row; the others still run
            row = case.__name__.replace("_", " "), f"CRASHED: {type(e).__name__}: {e}", False
        rows.append(timed(row, t0))
    cfg = make_run(work, "prod-bench", args, steps=100_000)
    t0 = time.monotonic()
    live = Child(cfg, env, args.nproc)
    try:
        rows.append(timed(bench_beside_live_run(args, live, cfg, env), t0))
        t0 = time.monotonic()
        rows.append(timed(sigterm_in_teardown(args, live, cfg), t0))
    finally:
        for pid in alive(live.tree()):
            os.kill(pid, signal.SIGKILL)
    return rows


def timed(row: tuple[str, str, bool], t0: float) -> tuple[str, str, bool]:
    return row[0], f"{row[1]} [{time.monotonic() - t0:.0f}s]", row[2]


def report(args: argparse.Namespace, rows: list[Outcome]) -> None:
    multi = args.nproc > 1
    setup = (
        f"{args.nproc} processes (torchrun, DDP, sharded Muon, ZeRO-1 AdamW {'on' if args.zero1 else 'off'})"
        if multi
        else "1 process"
    )
    print(
        f"\nfaults: {args.kills} SIGKILLs, {setup}, {args.steps} steps, checkpoint every "
        f"{args.every} steps, save pauses {args.save_delay}s, "
        f"{'synchronous' if args.sync else 'background'} saves, seed {args.seed}"
    )
    print(
        "| kill | moment | victim | step reached | resumed from | steps lost | run stopped "
        "| left by the kill | recovered |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, r in enumerate(rows, 1):
        stop = r.how(args.teardown_limit)
        print(
            f"| {i} | {r.kill.moment()} | {r.kill.who(args.nproc)} | {r.reached} | {r.start} "
            f"| {r.lost} | {stop} | {', '.join(r.partial) or '-'} | {'yes' if r.good else 'NO'} |"
        )


def main() -> int:
    args = parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LITTLELM_CACHE": str(work / "cache")}
    t0 = time.monotonic()

    if args.sft or args.lora or args.rl or args.dpo:  # the base model the runs start from
        base = Child(make_run(work, "base", args), env, 1)
        if base.drain() != 0:
            print("".join(base.out + base.err))
            return 1
    ref_cfg = make_run(work, "reference", args)
    ref = Child(ref_cfg, env, args.nproc)
    if ref.drain() != 0:
        print("".join(ref.out + ref.err))
        return 1
    ref_time = time.monotonic() - t0
    cfg = make_run(work, "faulted", args)
    rows, rc = faulted_run(args, cfg, env)
    total = time.monotonic() - t0
    report(args, rows)

    a, b = final_weights(work / "runs" / "reference"), final_weights(work / "runs" / "faulted")
    weights_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    la, lb = losses(work / "runs" / "reference"), losses(work / "runs" / "faulted")
    losses_equal = la == lb and len(la) == args.steps
    ra, rb = rewards(work / "runs" / "reference"), rewards(work / "runs" / "faulted")
    rewards_equal = ra == rb and len(ra) == (args.steps if args.rl else 0)
    w_diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    l_diff = max(abs(la[k] - lb.get(k, float("inf"))) for k in la)
    recovered = sum(r.good for r in rows)
    worst = max(r.lost for r in rows)
    bound = args.every if args.sync else 2 * args.every  # + the steps trained during a write
    stopped = sum(r.stopped for r in rows)
    behind = sum(r.kill.kind == "save" and r.reached > r.kill.target for r in rows)
    print(
        f"\nrecoveries: {recovered}/{args.kills} ({sum(r.kill.kind == 'save' for r in rows)} "
        f"kills aimed inside a save, {behind} of them inside a background write, training "
        f"past the step saved; {sum(1 for r in rows if r.partial)} left a half-written "
        "checkpoint directory)\n"
        f"steps lost per kill: max {worst}, mean {sum(r.lost for r in rows) / len(rows):.1f} "
        f"(checkpoint interval {args.every}; bound {bound})\n"
        f"runs that ended in time with no process left (a rank kill: non-zero exit): {stopped}/"
        f"{len(rows)}"
    )
    for victim in ("rank", "torchrun"):
        times = [r.teardown for r in rows if victim in r.kill.who(args.nproc)]
        if times:
            print(
                f"  after a kill of {'one rank' if victim == 'rank' else 'torchrun alone'}: "
                f"slowest end {max(times):.1f}s (limit {args.teardown_limit:.0f}s)"
            )
    print(
        f"final run exit status: {rc}\n"
        f"final weights bitwise equal to the uninterrupted run: {'yes' if weights_equal else 'NO'}"
        f" (largest difference {w_diff:.3g})\n"
        f"per-step losses ({len(lb)} steps) bitwise equal: {'yes' if losses_equal else 'NO'}"
        f" (largest difference {l_diff:.3g})\n"
        f"wall time: {total:.0f}s (uninterrupted run {ref_time:.0f}s)"
    )
    if args.rl:
        same = "yes" if rewards_equal else "NO"
        print(f"per-step RL mean rewards ({len(rb)} steps) bitwise equal: {same}")
    exact = (weights_equal and losses_equal and (rewards_equal or not args.rl)) or (
        args.device != "cpu"
    )
    cases = extra_cases(args, work, env) if args.cases else []
    for name, text, ok in cases:
        print(f"{name}: {'ok' if ok else 'FAILED'}: {text}")
    passed = (
        recovered == args.kills
        and worst <= bound
        and stopped == len(rows)
        and rc == 0
        and exact
        and all(ok for _, _, ok in cases)
    )
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
