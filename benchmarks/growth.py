"""Grow a trained model 1.5x in depth and keep training it with several learning-rate recipes
per origin tag (one lr for all, constant differential multipliers, ramps; `grow.lr_multipliers`),
beside a model of the grown size trained from scratch with the same total compute.

    python benchmarks/growth.py                      # every stage, then the table
    python benchmarks/growth.py --stage parent       # or one stage at a time (each a few
    python benchmarks/growth.py --stage one_lr       #   minutes on a 2-core CPU), then
    python benchmarks/growth.py --stage report       #   the table from what is on disk
    python benchmarks/growth.py --seed 1             # another seed: its own parent and runs
    python benchmarks/growth.py --device cuda        # on a GPU: a couple of minutes, and it
                                                     #   checks growth and its logit check there

Stages: `parent` trains a 4-layer model to the end of its schedule (cooled down, as a finished
model is), keeping its last checkpoint before the cooldown too; each grown variant (VARIANTS
below) grows it to 6 layers (new blocks interleaved, identity at step 0) and continues on the
data the parent had not seen yet (`from_stable` grows the checkpoint before the cooldown
instead, so nothing cooled is re-warmed, and continues the data from there); `scratch` trains the
6-layer model from random weights for as many FLOPs as parent + grown together; `report` prints
the table. `--seed` sets run.seed (model init, data order) for every stage; each seed has its
own directory under --out.

Corpus: the Python standard library of this interpreter (no download), byte-level tokens.
Loss jump, measured against the validation loss of the parent checkpoint grown (its final one,
or for `from_stable` the one before its cooldown):
- val jump: the largest validation loss in the first 200 steps after growth (every 10 steps, on
  the same 16k validation tokens the parent was last evaluated on) minus the parent's;
- max jump: the same over the whole continuation (a recipe may only postpone the rise);
- train jump: the largest 5-step mean of (the grown run's training loss minus the parent's loss
  on the very same batch) in the first 200 steps. Every grown run continues the parent's data
  stream, so the parent's loss on their batches is computed once by replaying that stream;
  pairing the batches removes batch-to-batch noise and catches spikes shorter than the eval
  interval.
At step 1 these differences are ~0 (the grown model computes the parent's function).
Acceptance (issue 18): val jump <= 0.01 and a final val loss at most one lr's.

The "new data" scenario (`--scenario newdata`, issue 35) is growth as the seed user grew: the
same parent (trained on the standard library, distribution A) is grown the same way but
continues on a mixture of A and Tiny Shakespeare (B, data/tinyshakespeare.txt, which it has never
seen; `--new-share` of the tokens, 0.7 by default), from the mixture's start
(`grow.continue_data: false`). Validation runs on A and on B separately through the whole
continuation (`eval.sets`, so `littlelm report` plots both curves). Recipes (NEWDATA below) at
equal tokens: one lr, the constant {old: 0.2, embedding: 0.5}, the seed user's ratios (old 1/30,
embeddings 1/6 of the new blocks' lr), a ramp from those ratios to 1 over the whole run, and the
grown shape from scratch on the same mixture. Per run: the jump on A (the highest val loss on A
in the first half minus the parent's, on the same windows), the final val loss on A (forgetting:
minus the parent's) and on B, and the area under each curve (the mean val loss over the
continuation's evaluations, trapezoidal: lower learned sooner or forgot less).

    python benchmarks/growth.py --scenario newdata --stage parent       # the same parent
    python benchmarks/growth.py --scenario newdata --stage one_lr       # one recipe at a time
    python benchmarks/growth.py --scenario newdata --stage report       # the table
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import yaml

from littlelm.components import register_all
from littlelm.data.build import build_data
from littlelm.load import find_checkpoint, load_model
from littlelm.model.gpt import flops_per_token
from littlelm.optim.schedule import DEFAULT_LR_MULTIPLIERS
from littlelm.schema import RunConfig, load_run
from littlelm.train.device import autocast
from littlelm.train.trainer import Trainer

register_all()  # an entry point: fill the registries before reading a config

SEQ, MICRO = 128, 16
WIDTH, PARENT_STEPS = 128, 600  # the default regime (--d-model, --parent-steps)
PARENT = {"n_layer": 4, "d_model": WIDTH, "n_head": WIDTH // 32, "max_seq_len": SEQ}
GROWN = {**PARENT, "n_layer": 6}
DIFFERENTIAL = {"old": 0.033, "new": 1.0, "embedding": 0.17}  # the recipe, as multipliers


def ramp(steps: int, old_end: float = 1.0, shape: str = "geometric") -> dict:
    """old 0.033 and embeddings 0.17 at step 0 (the differential recipe), brought up to
    `old_end` (embeddings to 1) over `steps` steps."""
    return {
        "old": {"start": 0.033, "end": old_end, "ramp_steps": steps, "shape": shape},
        "embedding": {"start": 0.17, "ramp_steps": steps, "shape": shape},
    }


# name: (label, optimizer.lr_multipliers, grow.lr_multipliers); grow's null = the default
VARIANTS: dict[str, tuple[str, dict, dict | None]] = {
    "one_lr": ("one lr for all", {}, {}),
    "differential": ("constant old .033 emb .17", DIFFERENTIAL, None),
    "fixed_0.2": ("constant old 0.2 emb 0.5", {}, {"old": 0.2, "embedding": 0.5}),
    "ramp_50": ("ramp 50 steps", {}, ramp(50)),
    "ramp_100": ("ramp 100 steps", {}, ramp(100)),
    "ramp_200": ("ramp 200 steps", {}, ramp(200)),
    "ramp_200_lin": ("ramp 200 steps, linear", {}, ramp(200, shape="linear")),
    "ramp_400": ("ramp 400 steps", {}, ramp(400)),
    "ramp_200_to_0.3": ("ramp 200 steps to old 0.3", {}, ramp(200, old_end=0.3)),
    "from_stable": ("one lr, parent before cooldown", {}, {}),
    "default": ("littlelm's default", {}, None),
}
COOLDOWN_FRAC = 0.4  # of every stage's schedule
PARENT_EVAL_EVERY = 60  # a divisor of the parent's cooldown start, so it is evaluated there
WINDOW = 200  # steps after growth in which the jump is measured
EVAL_TOKENS = 16_384
DEVICE = "cpu"  # --device
SEED = 0  # --seed
PRECISION = "auto"  # --precision
LONG_DOCS = "split"  # --long-docs: data.sources.*.long_docs of every stage


def tree(out: Path, name: str, model: dict, steps: int, eval_every: int) -> dict:
    return {
        "run": {"name": name, "out_dir": str(out), "seed": SEED, "device": DEVICE},
        "model": {"name": "gpt", **model},
        "data": {
            "tokenizer": {"name": "byte"},
            "sources": {
                "stdlib": {"name": "python_stdlib", "max_chars": 2000, "long_docs": LONG_DOCS}
            },
            "val_fraction": 0.02,
        },
        # AdamW lrs not scaled by sqrt(768 / d_model) (x2.45 at this width): with that scaling
        # the 6-layer model trained from scratch spiked twice (loss 1.58 -> 2.96 and 1.89 -> 5.96)
        "optimizer": {"name": "muon", "scale_lr_by_width": False},
        "schedule": {"name": "trapezoidal", "warmup_steps": 10, "cooldown_frac": COOLDOWN_FRAC},
        "train": {
            "micro_batch_size": MICRO,
            "seq_len": SEQ,
            "max_steps": steps,
            "log_every": 1,
            "precision": PRECISION,
        },
        "eval": {"every": eval_every, "max_tokens": EVAL_TOKENS},
        "checkpoint": {"every": 0, "at_end": True, "keep_last": 1},
    }


def config(out: Path, t: dict) -> RunConfig:
    path = out / f"{t['run']['name']}.yaml"
    path.write_text(yaml.safe_dump(t, sort_keys=False))
    return load_run(path)


def train(out: Path, t: dict) -> None:
    Trainer(config(out, t), resume="never").fit()


def stable_step(parent_steps: int) -> int:
    """The parent's last step at full lr: its cooldown starts after it."""
    return parent_steps - round(COOLDOWN_FRAC * parent_steps)


def parent_tree(out: Path, steps: int) -> dict:
    t = tree(out, "parent", PARENT, steps, PARENT_EVAL_EVERY)
    keep = stable_step(steps)  # the checkpoint before the cooldown, kept beside the final one
    t["checkpoint"] = {"every": keep, "at_end": True, "keep_last": 1, "keep_every": keep}
    return t


def grown_from(out: Path, name: str) -> Path:
    """The parent checkpoint a variant grows: the final one, or the one before the cooldown."""
    if name != "from_stable":
        return find_checkpoint(out / "parent")
    steps = max(r["step"] for r in records(out / "parent") if r["kind"] == "train")
    return out / "parent" / "checkpoints" / f"step_{stable_step(steps):06d}"


def grown_tree(out: Path, name: str, steps: int) -> dict:
    _, constant, by_origin = VARIANTS[name]
    t = tree(out, name, GROWN, steps, eval_every=10)
    t["grow"] = {"parent": str(grown_from(out, name)), "placement": "interleave"}
    if by_origin is not None:
        t["grow"]["lr_multipliers"] = by_origin
    t["optimizer"]["lr_multipliers"] = constant
    return t


def scratch_steps(out: Path, parent_steps: int, grown_steps: int) -> int:
    """Steps of the grown shape that cost as many FLOPs as parent + grown steps."""
    fp, fg = (
        flops_per_token(config(out, tree(out, name, model, 1, 0)).model, SEQ)
        for name, model in (("flops_parent", PARENT), ("flops_grown", GROWN))
    )
    return grown_steps + round(parent_steps * fp / fg)


def records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def parent_on_grown_batches(out: Path, checkpoint: Path) -> list[float]:
    """The loss of the parent `checkpoint` on each of the first WINDOW batches a run grown from
    it trains on (cached)."""
    cache = out / f"parent_on_grown_batches_{checkpoint.name}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    cfg = config(out, tree(out, "reference", PARENT, WINDOW, 0))  # the parent's data and seed
    device = torch.device(DEVICE)
    model, _, _ = load_model(checkpoint, device)
    data = build_data(cfg.data, log=lambda _: None)
    loader = data.loader(cfg.data, MICRO, SEQ, cfg.run.seed)
    loader.load_state_dict(json.loads((checkpoint / "state.json").read_text())["loader"])
    losses = []
    with torch.no_grad(), autocast(device, cfg.train.precision):
        for _ in range(WINDOW):
            x, y = loader.next_batch()
            losses.append(model(x.to(device), y.to(device)).item())
    cache.write_text(json.dumps(losses))
    return losses


def jumps(out: Path, name: str) -> tuple[float, float, float, float]:
    """(val jump in the first WINDOW steps, max val jump over the whole run, paired train jump,
    final val loss) of a grown run."""
    grown = grown_from(out, name)
    at = int(grown.name.removeprefix("step_"))
    ref_val = [
        r["val_loss"] for r in records(out / "parent") if r["kind"] == "eval" and r["step"] == at
    ]
    assert ref_val, f"the parent was not evaluated at step {at} (eval.every {PARENT_EVAL_EVERY})"
    ref_val = ref_val[-1]
    rec = records(out / name)
    vals = [r for r in rec if r["kind"] == "eval"]
    early = [r["val_loss"] for r in vals if r["step"] <= WINDOW]
    losses = [r["loss"] for r in rec if r["kind"] == "train" and r["step"] <= WINDOW]
    excess = [a - b for a, b in zip(losses, parent_on_grown_batches(out, grown))]
    smooth = [sum(excess[i : i + 5]) / 5 for i in range(len(excess) - 4)]
    whole = max(r["val_loss"] for r in vals)
    train_jump = max(smooth, default=float("nan"))  # nan: fewer than 5 steps
    return max(early) - ref_val, whole - ref_val, train_jump, vals[-1]["val_loss"]


def report(out: Path) -> None:
    if not (out / "parent" / "metrics.jsonl").is_file():
        print("no parent run yet: --stage parent")
        return
    parent = records(out / "parent")
    p_val = [r["val_loss"] for r in parent if r["kind"] == "eval"][-1]
    p_steps = max(r["step"] for r in parent if r["kind"] == "train")
    default = {k: v.model_dump() for k, v in DEFAULT_LR_MULTIPLIERS.items()}
    print(f"seed {SEED}: parent {PARENT['n_layer']} layers, {p_steps} steps, val {p_val:.4f}")
    print(f"littlelm's default grow.lr_multipliers: {default}")
    print(
        f"{'run':<30}{'steps':>6}{'val jump':>10}{'max jump':>10}{'train jump':>12}"
        f"{'final val':>11}{'train s':>9}  accepted"
    )
    one_lr = jumps(out, "one_lr")[3] if (out / "one_lr" / "metrics.jsonl").is_file() else None
    for name, (label, _, _) in VARIANTS.items():
        if not (out / name / "metrics.jsonl").is_file():
            print(f"{label:<30} (not run: --stage {name})")
            continue
        val_jump, max_jump, train_jump, final = jumps(out, name)
        rec = records(out / name)
        steps = max(r["step"] for r in rec if r["kind"] == "train")
        secs = rec[-1].get("train_time", 0.0)
        ok = "?" if one_lr is None else "yes" if val_jump <= 0.01 and final <= one_lr else "no"
        print(
            f"{label:<30}{steps:>6}{val_jump:>+10.4f}{max_jump:>+10.4f}{train_jump:>+12.4f}"
            f"{final:>11.4f}{secs:>9.0f}  {ok}"
        )
    if (out / "scratch" / "metrics.jsonl").is_file():
        rec = records(out / "scratch")
        final = [r["val_loss"] for r in rec if r["kind"] == "eval"][-1]
        steps = max(r["step"] for r in rec if r["kind"] == "train")
        secs = rec[-1].get("train_time", 0.0)
        label = "from scratch, same FLOPs"
        print(f"{label:<30}{steps:>6}{'':>10}{'':>10}{'':>12}{final:>11.4f}{secs:>9.0f}")


# The new-data scenario: name -> (label, grow.lr_multipliers; None: from scratch, "ramp": the
# seed user's ratios ramped to 1 over the whole run)
NEWDATA: dict[str, tuple[str, dict | str | None]] = {
    "one_lr": ("one lr for all (the default)", {}),
    "user": ("constant old 1/30 emb 1/6", {"old": DIFFERENTIAL["old"], "embedding": 0.17}),
    "ramp_run": ("ramp 1/30, 1/6 -> 1 over the run", "ramp"),
    "scratch": ("6 layers from scratch", None),
    "fixed_0.2": ("constant old 0.2 emb 0.5", {"old": 0.2, "embedding": 0.5}),
}
SHAKESPEARE = Path(__file__).resolve().parents[1] / "data" / "tinyshakespeare.txt"
NEW_STEPS, NEW_EVAL_EVERY = 300, 20  # the continuation (--grown-steps) and its eval interval
NEW_EVAL_TOKENS = 24_576  # shared by weight: 7,296 of A and 17,152 of B (whole windows), share 0.7
SETS = {"A": ["stdlib"], "B": ["shakespeare"]}  # the validation sets, by data source


def newdata_dir(out: Path, share: float) -> Path:
    return out / f"newdata-b{share:g}"


def newdata_tree(out: Path, name: str, steps: int, share: float) -> dict:
    """A run of the new-data scenario: the grown shape on the A + B mixture, grown from the
    parent (or from scratch), validated on A and B separately."""
    nd = newdata_dir(out, share)
    t = tree(nd, name, GROWN, steps, NEW_EVAL_EVERY)
    t["data"]["sources"] = {
        "stdlib": {**t["data"]["sources"]["stdlib"], "weight": round(1 - share, 6)},
        "shakespeare": {
            "name": "text",
            "path": str(SHAKESPEARE),
            "split": "paragraph",
            "weight": share,
            "long_docs": LONG_DOCS,
        },
    }
    t["eval"] = {"every": NEW_EVAL_EVERY, "max_tokens": NEW_EVAL_TOKENS, "sets": SETS}
    _, spec = NEWDATA.get(name, ("", None))
    if spec is not None:
        if spec == "ramp":
            spec = ramp(steps)
        t["grow"] = {
            "parent": str(find_checkpoint(out / "parent")),
            "placement": "interleave",
            "continue_data": False,  # other data than the parent's: the mixture from its start
            "lr_multipliers": spec,
        }
    return t


def parent_on_sets(out: Path, share: float) -> dict:
    """The parent's final checkpoint's validation on the scenario's windows of A and of B
    (what every grown run computes at its step 0; cached)."""
    nd = newdata_dir(out, share)
    cache = nd / "parent_on_sets.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    from littlelm.train.validation import validation_metrics

    cfg = config(nd, newdata_tree(out, "reference", 1, share))  # no grow: only its data section
    device = torch.device(DEVICE)
    model, _, _ = load_model(find_checkpoint(out / "parent"), device)
    data = build_data(cfg.data, log=lambda _: None)
    token_bytes = torch.from_numpy(data.tokenizer.token_bytes()).to(device)
    m = validation_metrics(
        model, data, cfg, token_bytes, device, autocast(device, cfg.train.precision)
    )
    sets = {k: v["loss"] for k, v in m["val_sets"].items()}
    cache.write_text(json.dumps(sets))
    return sets


def area(steps: list[int], values: list[float]) -> float:
    """The mean of a curve over its steps (trapezoidal area / span)."""
    if len(steps) < 2:
        return values[0] if values else float("nan")
    total = sum((b - a) * (u + v) / 2 for a, b, u, v in zip(steps, steps[1:], values, values[1:]))
    return total / (steps[-1] - steps[0])


def newdata_row(run: Path, parent: dict) -> dict:
    """One run's figures: jump on A (first half), final A and B, their areas, training time."""
    rec = records(run)
    evals = [r for r in rec if r["kind"] == "eval"]
    steps = [r["step"] for r in evals]
    a = [r["val_sets"]["A"]["loss"] for r in evals]
    b = [r["val_sets"]["B"]["loss"] for r in evals]
    half = max(steps) // 2
    return {
        "jump_A": max(v for s, v in zip(steps, a) if s <= half) - parent["A"],
        "final_A": a[-1],
        "forget_A": a[-1] - parent["A"],
        "final_B": b[-1],
        "area_A": area(steps, a),
        "area_B": area(steps, b),
        "steps": max(r["step"] for r in rec if r["kind"] == "train"),
        "train_s": rec[-1].get("train_time", 0.0),
    }


def newdata_report(out: Path, share: float) -> None:
    nd = newdata_dir(out, share)
    if not (out / "parent" / "metrics.jsonl").is_file():
        print("no parent run yet: --scenario newdata --stage parent")
        return
    parent = parent_on_sets(out, share)
    print(
        f"seed {SEED}, new data: parent {PARENT['n_layer']} layers on A (Python stdlib); "
        f"continuation on {1 - share:.0%} A + {share:.0%} B (Tiny Shakespeare); "
        f"parent val A {parent['A']:.4f}, B {parent['B']:.4f}"
    )
    print(
        f"{'run':<36}{'steps':>6}{'jump A':>9}{'final A':>9}{'forget A':>10}{'final B':>9}"
        f"{'area A':>9}{'area B':>9}{'train s':>9}"
    )
    rows = {}
    for name, (label, _) in NEWDATA.items():
        if not (nd / name / "metrics.jsonl").is_file():
            print(f"{label:<36} (not run: --scenario newdata --stage {name})")
            continue
        r = rows[name] = newdata_row(nd / name, parent)
        print(
            f"{label:<36}{r['steps']:>6}{r['jump_A']:>+9.4f}{r['final_A']:>9.4f}"
            f"{r['forget_A']:>+10.4f}{r['final_B']:>9.4f}{r['area_A']:>9.4f}{r['area_B']:>9.4f}"
            f"{r['train_s']:>9.0f}"
        )
    (nd / "table.json").write_text(json.dumps({"parent": parent, "runs": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--stage",
        default="all",
        nargs="+",
        choices=sorted({"all", "parent", *VARIANTS, *NEWDATA, "scratch", "report"}),
        help="stages to run, in the order given (all: parent, every variant, scratch)",
    )
    ap.add_argument(
        "--scenario",
        default="same",
        choices=["same", "newdata"],
        help="same: continue on the parent's data; newdata: on a mixture with Tiny Shakespeare",
    )
    ap.add_argument(
        "--new-share", type=float, default=0.7, help="newdata: share of tokens from B (0-1)"
    )
    ap.add_argument("--out", default="/tmp/littlelm-growth-bench", help="run directories")
    ap.add_argument("--seed", type=int, default=0, help="run.seed of every stage")
    ap.add_argument("--parent-steps", type=int, default=PARENT_STEPS)
    ap.add_argument(
        "--d-model",
        type=int,
        default=WIDTH,
        help="width of parent and grown model (heads of 32); 64 with --parent-steps 2400 trains "
        "the parent on ~20 tokens per parameter instead of ~1.4",
    )
    ap.add_argument(
        "--grown-steps", type=int, default=None, help=f"default 400, newdata {NEW_STEPS}"
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train")
    ap.add_argument("--precision", default="auto", help="train.precision of every stage")
    ap.add_argument(
        "--long-docs",
        default="split",
        choices=["split", "crop"],
        help="data.sources.*.long_docs: split (today's default) trains on every token; crop "
        "(the default before 2026-12-02) on the first row of each 2,000-character piece only, "
        "which is what the tables measured before then used",
    )
    args = ap.parse_args()
    global DEVICE, SEED, PRECISION, LONG_DOCS, PARENT, GROWN
    DEVICE, SEED, PRECISION, LONG_DOCS = args.device, args.seed, args.precision, args.long_docs
    out = Path(args.out)
    if LONG_DOCS != "split":  # other data: its own parent and runs
        out = out / f"long_docs-{LONG_DOCS}"
    if (args.d_model, args.parent_steps) != (WIDTH, PARENT_STEPS):  # another regime
        out = out / f"d{args.d_model}-p{args.parent_steps}"
    out = (out / f"seed{SEED}").resolve()
    PARENT = {**PARENT, "d_model": args.d_model, "n_head": args.d_model // 32}
    GROWN = {**PARENT, "n_layer": GROWN["n_layer"]}
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LITTLELM_CACHE", str(Path(args.out).resolve() / "cache"))
    if args.scenario == "newdata":
        if not 0 < args.new_share < 1:
            ap.error(f"--new-share must be between 0 and 1 (exclusive), got {args.new_share}")
        newdata(out, args)
        return
    args.grown_steps = args.grown_steps or 400
    stages = {
        "parent": lambda: train(out, parent_tree(out, args.parent_steps)),
        **{
            name: (lambda name=name: train(out, grown_tree(out, name, args.grown_steps)))
            for name in VARIANTS
        },
        "scratch": lambda: train(
            out,
            tree(
                out, "scratch", GROWN, scratch_steps(out, args.parent_steps, args.grown_steps), 100
            ),
        ),
    }
    order = list(stages) if "all" in args.stage else args.stage
    for name in order:
        if name in stages:
            stages[name]()
    report(out)


def newdata(out: Path, args) -> None:
    """The new-data scenario's stages, then its table."""
    steps, share = args.grown_steps or NEW_STEPS, args.new_share
    nd = newdata_dir(out, share)
    nd.mkdir(parents=True, exist_ok=True)
    stages = {
        "parent": lambda: train(out, parent_tree(out, args.parent_steps)),
        **{
            name: (lambda name=name: train(nd, newdata_tree(out, name, steps, share)))
            for name in NEWDATA
        },
    }
    unknown = [s for s in args.stage if s not in (*stages, "all", "report")]
    if unknown:
        raise SystemExit(
            f"--scenario newdata has no stage {', '.join(unknown)}: {', '.join(stages)}"
        )
    order = list(stages) if "all" in args.stage else args.stage
    for name in order:
        if name in stages:
            stages[name]()
    newdata_report(out, share)


if __name__ == "__main__":
    main()
