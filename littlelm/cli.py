"""Command line: one function per verb, argument parsing only.

    littlelm train [CONFIG] [key=value ...] [--resume auto|never|PATH] [--nproc N]
    littlelm config show CONFIG [key=value ...] [--flat]
    littlelm data prepare CONFIG [key=value ...] [--out DIR] [--only LABEL ...] [--workers N]
    littlelm data inspect DIR [--samples N] [--chars N] [--no-verify]
    littlelm list
    littlelm sample CHECKPOINT --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--seed S]
    littlelm grow PARENT --to RUN.yaml [key=value ...]
    littlelm report RUN_DIR [RUN_DIR ...] [--out DIR] [--price-per-hour DOLLARS]
    littlelm eval CHECKPOINT [--bundle DIR] [--tasks a,b] [--max-per-task N] [--truncation MODE]
    littlelm eval-bundle [--dest DIR] [--url URL] [--sha256 HEX] [--force]
    littlelm plan CONFIG [key=value ...] [--gpu NAME ...] [--tokens N] [--devices N] [--json]
                  [--gpus FILE] [--chart OUT.png] [--no-trace]
    littlelm bench CONFIG [key=value ...] [--steps N] [--json]

CONFIG is a YAML path or the name of a packaged config (`demo`, `shakespeare_char`); it
defaults to `demo`. User errors print one message and exit non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from littlelm.errors import LittleLMError

DEFAULT_CONFIG = "demo"


def _split_config(items: list[str]) -> tuple[str, list[str]]:
    """['run.yaml', 'a=1'] -> ('run.yaml', ['a=1']); a leading override means the default config."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return DEFAULT_CONFIG, items


def cmd_train(args: argparse.Namespace) -> int:
    from littlelm.schema import load_run
    from littlelm.train import distributed
    from littlelm.train.device import pick_device
    from littlelm.train.trainer import Trainer

    config, overrides = _split_config(args.items)
    env = distributed.detect_env()
    if args.nproc is not None:
        cfg = load_run(config, overrides, world_size=args.nproc)  # report config errors once
        distributed.launch(
            args.nproc, ["train", *args.items, "--resume", args.resume], cfg.run.device
        )
    cfg = load_run(config, overrides, world_size=env.world_size)
    with distributed.session(cfg.distributed, pick_device(cfg.run.device), env) as parallel:
        result = Trainer(cfg, resume=args.resume, parallel=parallel).fit()
    return 0 if result["finished"] or result.get("stopped_by") else 1


def cmd_config_show(args: argparse.Namespace) -> int:
    from littlelm.config import dump_yaml, flatten, to_tree
    from littlelm.schema import load_run

    config, overrides = _split_config(args.items)
    cfg = load_run(config, overrides)
    if args.flat:
        for key, value in flatten(to_tree(cfg)).items():
            print(f"{key}: {value!r}")
    else:
        print(dump_yaml(cfg), end="")
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from littlelm.data.build import prepare_data
    from littlelm.schema import load_data_config

    config, overrides = _split_config(args.items)
    if args.workers is not None:
        overrides = [*overrides, f"data.workers={args.workers}"]
    cfg = load_data_config(config, overrides)
    out = Path(args.out) if args.out else None
    _, result = prepare_data(cfg, out, args.only)
    if out is not None:
        print(prepared_snippet(result))
    return 0


def prepared_snippet(result: dict) -> str:
    """The data section that trains on what was just prepared."""
    first = next(iter(result.values()))[1]
    lines = [
        "train on it with this data section in a run file:",
        "data:",
        f"  tokenizer: {{name: saved, path: {first}}}",
        "  sources:",
    ]
    for label, (src, directory, _) in result.items():
        lines.append(f"    {label}: {{name: shards, path: {directory}, weight: {src.cfg.weight}}}")
    return "\n".join(lines)


def cmd_data_inspect(args: argparse.Namespace) -> int:
    from littlelm.data.inspect import inspect_dataset

    inspect_dataset(args.directory, args.samples, args.chars, not args.no_verify)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    import littlelm.components  # noqa: F401
    from littlelm.registry import Registry

    for kind, reg in Registry.all.items():
        print(f"{kind}s:")
        for e in reg.entries():
            print(f"  {e.name:<16} {e.doc}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from littlelm.eval.generate import check_sampling, fit_prompt, generate
    from littlelm.load import load_model
    from littlelm.train.device import autocast, pick_device

    top_k = args.top_k or None  # 0 = no top-k filter
    check_sampling(args.max_tokens, args.temperature, top_k)
    device = pick_device(args.device)
    model, tok, cfg = load_model(args.checkpoint, device)
    prompt, max_tokens, note = fit_prompt(
        [tok.bos_id, *tok.encode(args.prompt)], args.max_tokens, model.cfg.max_seq_len
    )
    if note:
        print(f"warning: {note}", file=sys.stderr)
    with torch.no_grad(), autocast(device, cfg.train.precision):
        ids = generate(model, prompt, max_tokens, args.temperature, top_k, args.seed, tok.bos_id)
    print(args.prompt + tok.decode(ids))
    return 0


def cmd_grow(args: argparse.Namespace) -> int:
    from littlelm.schema import load_run
    from littlelm.train.growth import preview_growth

    run, *rest = args.to  # --to RUN.yaml key=value ...
    overrides = [f"grow.parent={args.parent}", *rest]
    cfg = load_run(run, overrides)
    for line in preview_growth(cfg):
        print(line)
    print(f"train it: littlelm train {run} {' '.join(overrides)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from littlelm.report import write_report

    path = write_report(args.run_dirs, args.out, args.price_per_hour)
    print(f"wrote {path} and its plots ({path.parent})")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from littlelm.eval.core import EvalOptions
    from littlelm.eval.run import parse_labels, run_eval

    opts = EvalOptions(
        max_per_task=args.max_per_task,
        truncation=args.truncation,
        batch_tokens=args.batch_tokens,
        warn_share=args.warn_share,
    )
    run_eval(
        args.checkpoint,
        args.bundle,
        parse_labels(args.tasks),
        args.task_file,
        opts,
        args.device,
        args.precision,
        args.out,
    )
    return 0


def cmd_eval_bundle(args: argparse.Namespace) -> int:
    from littlelm.eval.bundle import download_bundle

    sha = None if args.sha256 == "none" else args.sha256
    download_bundle(args.dest, args.url, sha, args.force)
    return 0


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a share between 0 and 1, got {value}")
    return value


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from littlelm.plan.catalog import load_catalog
    from littlelm.plan.planner import make_plan
    from littlelm.plan.report import plan_json, print_plan
    from littlelm.schema import load_run

    config, overrides = _split_config(args.items)
    cfg = load_run(config, overrides, world_size=args.devices)
    catalog = load_catalog(args.gpus or [])
    plan = make_plan(
        cfg,
        catalog,
        args.gpu,
        args.tokens,
        args.devices,
        not args.no_trace,
        local=args.device == "cpu",
        price_per_hour=args.price_per_hour or 0.0,
    )
    if args.json:
        print(json.dumps(plan_json(plan), indent=1))
    else:
        print_plan(plan, detail=args.detail)
    if args.chart:
        from littlelm.plan.chart import plan_chart

        plan_chart(plan, args.chart)
        if not args.json:
            print(f"chart written to {args.chart}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from littlelm.plan.bench import print_bench, run_bench
    from littlelm.schema import load_run

    config, overrides = _split_config(args.items)
    cfg = load_run(config, overrides)
    result = run_bench(cfg, args.steps)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_bench(result)
    return 0


def _positive(text: str) -> int:
    value = int(float(text))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="littlelm", description="Train small language models from one YAML file."
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    t = sub.add_parser("train", help="train (or resume) a run")
    t.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG [key=value ...]",
        help=f"run file or packaged config (default {DEFAULT_CONFIG}), then overrides",
    )
    t.add_argument(
        "--resume",
        default="auto",
        help="auto (newest complete checkpoint of the run, default), never (start fresh; "
        "refused over existing checkpoints), or a checkpoint path",
    )
    t.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="train with N processes on this machine (runs torchrun; one per GPU)",
    )
    t.set_defaults(fn=cmd_train)

    c = sub.add_parser("config", help="inspect run files")
    csub = c.add_subparsers(dest="config_verb", required=True, metavar="ACTION")
    show = csub.add_parser("show", help="print the merged, validated, resolved config")
    show.add_argument("items", nargs="*", metavar="CONFIG [key=value ...]")
    show.add_argument("--flat", action="store_true", help="one dotted key per line")
    show.set_defaults(fn=cmd_config_show)

    d = sub.add_parser("data", help="prepare and inspect token shards")
    dsub = d.add_subparsers(dest="data_verb", required=True, metavar="ACTION")
    prep = dsub.add_parser(
        "prepare", help="tokenize a config's data sources into shards (resumable, every core)"
    )
    prep.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG [key=value ...]",
        help="run or data file, then overrides",
    )
    prep.add_argument(
        "--out", help="write each source to OUT/LABEL (default: the cache `littlelm train` uses)"
    )
    prep.add_argument("--only", nargs="+", metavar="LABEL", help="prepare only these sources")
    prep.add_argument(
        "--workers",
        type=int,
        help="tokenizing processes (default: one per core, one per 64 MB of input at most)",
    )
    prep.set_defaults(fn=cmd_data_prepare)
    insp = dsub.add_parser("inspect", help="summarise and check a prepared dataset")
    insp.add_argument("directory", help="a dataset directory written by `littlelm data prepare`")
    insp.add_argument("--samples", type=int, default=1, help="decoded sample documents to print")
    insp.add_argument("--chars", type=int, default=400, help="characters of each sample")
    insp.add_argument(
        "--no-verify", action="store_true", help="skip reading every shard's checksum"
    )
    insp.set_defaults(fn=cmd_data_inspect)

    ls = sub.add_parser("list", help="list every registered component")
    ls.set_defaults(fn=cmd_list)

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    s.add_argument("--prompt", default="", help="text to continue")
    s.add_argument("--max-tokens", type=int, default=200)
    s.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    s.add_argument("--top-k", type=int, default=50, help="0 = no top-k filter")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="auto")
    s.set_defaults(fn=cmd_sample)

    g = sub.add_parser(
        "grow",
        help="check growing a checkpoint into a run's larger model (docs/growth.md)",
        description="Build RUN's model from PARENT as `littlelm train` would with "
        "grow.parent=PARENT, check that it computes the parent's function, and print where each "
        "block comes from and the learning rate of every parameter group. Writes nothing.",
    )
    g.add_argument("parent", help="checkpoint directory or run directory (newest checkpoint)")
    g.add_argument(
        "--to",
        required=True,
        nargs="+",
        metavar="RUN.yaml [key=value ...]",
        help="run file (or packaged config) of the grown model, then its overrides",
    )
    g.set_defaults(fn=cmd_grow)

    r = sub.add_parser("report", help="write a Markdown report with plots of one or more runs")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to report on")
    r.add_argument(
        "--out",
        help="output directory (default RUN_DIR/report for one run, ./report-A-vs-B for several)",
    )
    r.add_argument(
        "--price-per-hour",
        type=float,
        metavar="DOLLARS",
        help="what the machine costs per hour (all its GPUs), to state each run's cost",
    )
    r.set_defaults(fn=cmd_report)

    _add_eval(sub)
    pl = sub.add_parser("plan", help="memory, speed and cost of a run on each GPU of a catalog")
    pl.add_argument("items", nargs="*", metavar="CONFIG [key=value ...]")
    pl.add_argument("--gpu", action="append", help="plan for this catalog GPU (repeatable)")
    pl.add_argument("--tokens", type=_positive, help="token budget (default: the config's)")
    pl.add_argument(
        "--devices", type=_positive, default=1, help="data-parallel GPUs (DDP); default 1"
    )
    pl.add_argument("--gpus", action="append", help="extra GPU catalog YAML (repeatable)")
    pl.add_argument("--json", action="store_true", help="print one JSON object")
    pl.add_argument("--chart", metavar="OUT.png", help="write a memory and cost chart")
    pl.add_argument("--no-trace", action="store_true", help="skip the FakeTensorMode trace")
    pl.add_argument(
        "--device",
        choices=["cpu"],
        help="also predict the run on this machine's CPU (rates probed here, in seconds)",
    )
    pl.add_argument(
        "--price-per-hour", type=float, help="what this machine costs per hour (with --device)"
    )
    pl.add_argument(
        "--detail", action="store_true", help="memory by category, trace check, every remedy"
    )
    pl.set_defaults(fn=cmd_plan)

    b = sub.add_parser("bench", help="run real steps, a save and a resume; measure them")
    b.add_argument("items", nargs="*", metavar="CONFIG [key=value ...]")
    b.add_argument("--steps", type=_positive, default=4, help="steps before and after resume")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(fn=cmd_bench)
    return p


def _add_eval(sub) -> None:
    from littlelm.eval.bundle import BUNDLE_SHA256, BUNDLE_URL

    e = sub.add_parser("eval", help="score a checkpoint on CORE or other in-context tasks")
    e.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    e.add_argument(
        "--bundle",
        help="task directory: the CORE eval bundle (default: the one `eval-bundle` fetched) "
        "or a directory with its own tasks.yaml",
    )
    e.add_argument("--tasks", help="comma-separated task labels (default: all)")
    e.add_argument("--task-file", help="task list YAML to use instead of the directory's")
    e.add_argument(
        "--max-per-task", type=_positive, help="score this many items per task (default: all)"
    )
    e.add_argument(
        "--truncation",
        choices=["crop", "drop_shots"],
        default="crop",
        help="fit long prompts by cropping after BOS (default) or by dropping whole examples",
    )
    e.add_argument("--batch-tokens", type=_positive, default=16384, help="tokens per forward")
    e.add_argument(
        "--warn-share",
        type=_share,
        default=0.01,
        help="warn when more than this share of a task's prompts exceed the context",
    )
    e.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    e.add_argument("--device", default="auto")
    e.add_argument("--out", help="also write results and per-item decisions to this JSON file")
    e.set_defaults(fn=cmd_eval)

    b = sub.add_parser("eval-bundle", help="download the public CORE eval bundle")
    b.add_argument("--dest", help="directory to create (default: LITTLELM_CACHE/eval_bundle)")
    b.add_argument("--url", default=BUNDLE_URL)
    b.add_argument(
        "--sha256", default=BUNDLE_SHA256, help="expected sha256 of the zip ('none' = no check)"
    )
    b.add_argument("--force", action="store_true", help="replace an existing bundle")
    b.set_defaults(fn=cmd_eval_bundle)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("once")
    try:
        return args.fn(args)
    except LittleLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
