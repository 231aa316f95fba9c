# PYTHON_ARGCOMPLETE_OK  (lets `register-python-argcomplete littlelm` complete this CLI)
"""Command line: one function per verb, argument parsing only.

    littlelm train [CONFIG] [key=value ...] [--resume auto|never|PATH] [--nproc N]
    littlelm config show CONFIG [key=value ...] [--flat]
    littlelm data prepare CONFIG [key=value ...] [--out DIR] [--only LABEL ...] [--workers N] [--no-verify]
    littlelm data inspect DIR [--samples N] [--chars N] [--no-verify]
    littlelm list
    littlelm sample CHECKPOINT --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--seed S]
    littlelm grow PARENT --to RUN.yaml [key=value ...]
    littlelm report RUN_DIR [RUN_DIR ...] [--out DIR] [--price-per-hour DOLLARS]
    littlelm eval CHECKPOINT [--bundle DIR] [--tasks a,b] [--max-per-task N] [--truncation MODE]
    littlelm eval CHECKPOINT --harness TASKS [--include DIR] [--num-fewshot N]   (lm_eval)
    littlelm export CHECKPOINT [--out DIR] [--max-shard-size 5GB] [--gguf FILE] [--gguf-type f16]
    littlelm import HF_DIR --out RUN_DIR
    littlelm eval-bundle [--dest DIR] [--url URL] [--sha256 HEX] [--force]
    littlelm plan CONFIG [key=value ...] [--gpu NAME ...] [--tokens N] [--devices N] [--json]
                  [--gpus FILE] [--chart OUT.png] [--no-trace] [--device cpu] [--price-per-hour D]
    littlelm bench CONFIG [key=value ...] [--steps N] [--json]
    littlelm sweep CONFIG [key=value ...] --set KEY=v1,v2 [--set ...] [--grid|--zip]
                   [--budget 30m|2h|$5|500M] [--seeds N] [--devices 0,1] [--name NAME]

CONFIG is a YAML path or the name of a packaged config (`demo`, `shakespeare_char`); it
defaults to `demo`. key=value overrides may also follow the options (`train demo --nproc 2
run.name=ddp`); any other unknown word is an error. `littlelm VERB --help` shows defaults and
examples; shell completion comes from argcomplete. User errors print one message and exit non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings

from littlelm.errors import LittleLMError

DEFAULT_CONFIG = "demo"
TYPES_GGUF = ("f32", "f16")  # gguf_export.TYPES, not imported (kept cheap); a test holds them equal


def _split_config(items: list[str]) -> tuple[str, list[str]]:
    """['run.yaml', 'a=1'] -> ('run.yaml', ['a=1']); a leading override means the default config."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return DEFAULT_CONFIG, items


def cmd_train(args: argparse.Namespace) -> int:
    from littlelm.console import Console
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
        console = Console()  # what the run prints (littlelm/console.py)
        trainer = Trainer(cfg, resume=args.resume, parallel=parallel, callbacks=(console,))
        result = trainer.fit()
        console.report(trainer, result)
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
    _, result = prepare_data(cfg, out, args.only, verify="sizes" if args.no_verify else "checksums")
    if out is not None:
        print(prepared_snippet(result))
    return 0


def prepared_snippet(result: dict) -> str:
    """The data section that trains on what was just prepared."""
    import json

    ours = [d for src, d, _ in result.values() if not getattr(src, "foreign", False)]
    lines = [
        "train on it with this data section in a run file:",
        "data:",
        f"  tokenizer: {{name: saved, path: {ours[0]}}}"
        if ours
        else "  tokenizer: (this config's: the one that made the token files)",
        "  sources:",
    ]
    for label, (src, directory, _) in result.items():
        if getattr(src, "foreign", False):  # other tools' token files are used where they are
            lines.append(f"    {label}: {json.dumps(src.cfg.model_dump(exclude_defaults=True))}")
            continue
        lines.append(f"    {label}: {{name: shards, path: {directory}, weight: {src.cfg.weight}}}")
    return "\n".join(lines)


def cmd_data_inspect(args: argparse.Namespace) -> int:
    from pathlib import Path

    from littlelm.data.inspect import inspect_dataset, inspect_tokens
    from littlelm.data.prepare import MANIFEST

    path = Path(args.directory)
    ours = (path if path.is_dir() else path.parent) / MANIFEST
    if args.format or not ours.is_file():  # token files another tool wrote
        inspect_tokens(path, args.format, args.dtype, args.separator, args.column)
        return 0
    inspect_dataset(path, args.samples, args.chars, not args.no_verify, seq_len=args.seq_len)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from littlelm.schema import components

    for kind, rows in components().items():
        print(f"{kind}s:")
        for name, doc in rows:
            print(f"  {name:<16} {doc}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from littlelm.load import load_model
    from littlelm.model.generate import check_sampling, fit_prompt, generate
    from littlelm.train.device import autocast, inference_precision, pick_device

    top_k = args.top_k or None  # 0 = no top-k filter
    check_sampling(args.max_tokens, args.temperature, top_k)
    device = pick_device(args.device)
    model, tok, cfg = load_model(args.checkpoint, device)
    prompt, max_tokens, note = fit_prompt(
        [tok.bos_id, *tok.encode(args.prompt)], args.max_tokens, model.cfg.max_seq_len
    )
    if note:
        print(f"warning: {note}", file=sys.stderr)
    with autocast(device, inference_precision("auto", cfg.train.precision, device)):
        ids = generate(model, prompt, max_tokens, args.temperature, top_k, args.seed, tok.bos_id)
    print(args.prompt + tok.decode(ids))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from littlelm.eval import chat

    return chat.run(
        args.checkpoint, args.prompt, args.system, args.temperature, args.top_k or None,
        args.top_p, args.max_tokens, args.seed, args.device, args.precision,
    )  # fmt: skip


def cmd_chat_tokens(args: argparse.Namespace) -> int:
    from littlelm.interop.chat_tokens import add_chat_tokens

    r = add_chat_tokens(args.checkpoint, args.out)
    print(f"{r['summary']}\nwrote {r['checkpoint']}; fine-tune from it (docs/post-training.md)")
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
    from littlelm.report.compare import is_sweep_dir, write_sweep_report

    if len(args.run_dirs) == 1 and is_sweep_dir(args.run_dirs[0]):  # a sweep: its comparison
        path, table = write_sweep_report(args.run_dirs[0], args.price_per_hour)
        print(table)
    else:
        path = write_report(args.run_dirs, args.out, args.price_per_hour)
    print(f"wrote {path} and its plots ({path.parent})")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from littlelm.eval.core import EvalOptions
    from littlelm.eval.run import parse_labels, run_eval

    if args.chat is not None:
        from littlelm.eval.chat_eval import run_chat_eval

        labels, n, dev = parse_labels(args.tasks), args.max_per_task, args.device
        run_chat_eval(args.checkpoint, args.chat, labels, n, 64, dev, args.precision, args.out)
        return 0
    if args.harness is not None:
        from littlelm.interop.harness import run_harness

        tasks = parse_labels(args.harness) or []
        run_harness(
            args.checkpoint,
            tasks,
            args.include,
            args.max_per_task,
            args.num_fewshot,
            args.device,
            args.precision,
            args.out,
            chat=args.apply_chat_template,
        )
        return 0
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


def cmd_export(args: argparse.Namespace) -> int:
    from littlelm.interop.hf import export

    r = export(args.checkpoint, args.out, args.max_shard_size, args.gguf, args.gguf_type)
    if r["gguf"] is not None:
        print(f"wrote {r['gguf']} ({r['arch']}, {args.gguf_type}): llama-cli -m {r['gguf']}")
    if r["out"] is None:
        return 0
    print(f"exported {r['checkpoint']} to {r['out']} as {r['arch']}: {r['reason']}")
    remote = ", trust_remote_code=True" if r["arch"] == "littlelm" else ""
    print(f"load it: AutoModelForCausalLM.from_pretrained({str(r['out'])!r}{remote})")
    print(f"and its tokenizer: AutoTokenizer.from_pretrained({str(r['out'])!r}{remote})")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from littlelm.interop.hf import import_model

    r = import_model(args.hf_dir, args.out)
    m = r["config"]
    print(
        f"imported {args.hf_dir} ({r['arch']}: {m.n_layer} layers x {m.d_model}, "
        f"{m.n_head} heads ({m.kv_heads} kv), {r['params']:,} parameters) into {r['checkpoint']}"
    )
    print(r["tokenizer"])
    if r["window"]:
        print(
            f"context: {m.max_seq_len} tokens, its sliding window (full attention over at most "
            "the window is the windowed attention exactly)"
        )
    print(
        f"train it (continued-pretraining lrs and warmup): littlelm train {r['out'] / 'train.yaml'} "
        "data.sources.main.name=text data.sources.main.path=corpus.txt "
        "data.sources.main.split=paragraph"
    )
    print(f"grow it: grow.parent={r['checkpoint']} in a run with a larger model (docs/growth.md)")
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


def _price(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be dollars per hour, 0 or more, got {text}")
    return value


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from littlelm.plan.cost import load_catalog
    from littlelm.plan.planner import make_plan
    from littlelm.plan.report import plan_json, print_plan
    from littlelm.schema import load_run
    from littlelm.train.growth import complete_growth

    config, overrides = _split_config(args.items)
    with _stdout_to_stderr(args.json):
        cfg = complete_growth(load_run(config, overrides, world_size=args.devices))  # grow's parent
        catalog = load_catalog(args.gpus or [])
        plan = make_plan(
            cfg,
            catalog,
            args.gpu,
            args.tokens,
            args.devices,
            not args.no_trace,
            local=args.device == "cpu",
            price_per_hour=args.price_per_hour,
        )
        if args.chart:
            from littlelm.plan.report import plan_chart

            plan_chart(plan, args.chart)
            print(f"chart written to {args.chart}")  # on stderr with --json
    if args.json:
        print(json.dumps(plan_json(plan), indent=1))
    else:
        print_plan(plan, detail=args.detail)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from littlelm.plan.bench import run_bench
    from littlelm.plan.report import print_bench
    from littlelm.schema import load_run
    from littlelm.train.growth import complete_growth

    config, overrides = _split_config(args.items)
    with _stdout_to_stderr(args.json):
        result = run_bench(
            complete_growth(load_run(config, overrides)), args.steps
        )  # grown: the parent's shape
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_bench(result)
    return 0


@contextlib.contextmanager
def _stdout_to_stderr(active: bool):
    """With `--json`, stdout carries the one JSON document only: whatever the verb prints on the
    way (data preparation's progress line, a calibration note, a subprocess's or a C library's
    output) goes to stderr, both Python's `sys.stdout` and file descriptor 1."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cmd_sweep(args: argparse.Namespace) -> int:
    from littlelm.report.compare import write_sweep_report
    from littlelm.sweep import SweepOptions, run_sweep

    config, overrides = _split_config(args.items)
    opts = SweepOptions(
        base=config,
        overrides=overrides,
        sets=args.set or [],
        zip=args.zip,
        budget=args.budget,
        seeds=args.seeds,
        devices=args.devices.split(",") if args.devices else None,
        name=args.name,
        price_per_hour=args.price_per_hour,
    )
    sweep_dir = run_sweep(opts)
    path, table = write_sweep_report(sweep_dir, args.price_per_hour)
    print(f"{table}\nwrote {path} and its plots ({path.parent})")
    return 0


def _positive(text: str) -> int:
    value = int(float(text))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


class _Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' line breaks and appends each option's default to its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text  # nothing to show, or the help already says it in words
        return f"{text} (default: %(default)s)"


def _verb(sub, name: str, help: str, examples: str = "", **kw) -> argparse.ArgumentParser:
    """A verb's parser: help shown with defaults, examples under it."""
    epilog = f"examples:\n{examples}" if examples else None
    return sub.add_parser(name, help=help, formatter_class=_Help, epilog=epilog, **kw)


def _items(p: argparse.ArgumentParser, what: str = "run file or packaged config") -> None:
    """CONFIG then key=value overrides; more overrides may follow the options."""
    p.add_argument(
        "items",
        nargs="*",
        metavar="CONFIG [key=value ...]",
        help=f"{what} (default {DEFAULT_CONFIG}), then key=value overrides, "
        "which may also come after the options",
    ).completer = _complete_config
    p.set_defaults(overrides_to="items")


def _complete_config(prefix: str, **_) -> list[str]:
    """Shell completion of CONFIG: packaged configs, YAML files and directories."""
    from pathlib import Path

    packaged = Path(__file__).parent / "configs"  # schema.PACKAGED_CONFIGS, without importing it
    names = [str(f.relative_to(packaged).with_suffix("")) for f in packaged.rglob("*.yaml")]
    here = Path(prefix).parent if prefix else Path(".")
    files = [
        str(p) + ("/" if p.is_dir() else "")
        for p in (here.iterdir() if here.is_dir() else [])
        if p.is_dir() or p.suffix in (".yaml", ".yml")
    ]
    return [c for c in [*sorted(names), *files] if c.startswith(prefix)]


def _add_train(sub) -> None:
    t = _verb(
        sub,
        "train",
        "train (or resume) a run",
        "  littlelm train demo\n"
        "  littlelm train run.yaml train.max_steps=500 optimizer.lr=3e-3\n"
        "  littlelm train demo --resume never train.max_steps=5\n"
        "  littlelm train run.yaml --nproc 2 run.name=ddp",
    )
    _items(t)
    t.add_argument(
        "--resume",
        default="auto",
        help="auto (newest complete checkpoint of the run), never (start fresh; "
        "refused over existing checkpoints), or a checkpoint path",
    )
    t.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="train with N processes on this machine (runs torchrun; one per GPU)",
    )
    t.set_defaults(fn=cmd_train)


def _add_config(sub) -> None:
    c = sub.add_parser("config", help="inspect run files")
    csub = c.add_subparsers(dest="config_verb", required=True, metavar="ACTION")
    show = _verb(
        csub,
        "show",
        "print the merged, validated, resolved config",
        "  littlelm config show demo\n  littlelm config show run.yaml model.n_layer=8 --flat",
    )
    _items(show)
    show.add_argument("--flat", action="store_true", help="one dotted key per line")
    show.set_defaults(fn=cmd_config_show)


def _add_data(sub) -> None:
    d = sub.add_parser("data", help="prepare and inspect token shards")
    dsub = d.add_subparsers(dest="data_verb", required=True, metavar="ACTION")
    prep = _verb(
        dsub,
        "prepare",
        "tokenize a config's data sources into shards (resumable, every core)",
        "  littlelm data prepare demo\n  littlelm data prepare run.yaml --out shards/ --only web",
    )
    _items(prep, "run or data file")
    prep.add_argument(
        "--out", help="write each source to OUT/LABEL (default: the cache `littlelm train` uses)"
    )
    prep.add_argument("--only", nargs="+", metavar="LABEL", help="prepare only these sources")
    prep.add_argument(
        "--workers",
        type=int,
        help="tokenizing processes (default: one per core, one per 64 MB of input at most)",
    )
    prep.add_argument(
        "--no-verify",
        action="store_true",
        help="check an already prepared dataset's shard sizes and headers only, not every "
        "checksum (damaged shards are rebuilt either way)",
    )
    prep.set_defaults(fn=cmd_data_prepare)
    insp = _verb(
        dsub,
        "inspect",
        "summarise and check a prepared dataset",
        "  littlelm data inspect shards/web --samples 3\n"
        "  littlelm data inspect fineweb10B/   # nanoGPT/llm.c .bin, Megatron, .npy, parquet",
    )
    insp.add_argument(
        "directory",
        help="a dataset directory written by `littlelm data prepare`, or token files another "
        "tool wrote (nanoGPT/llm.c .bin, .npy, Megatron PREFIX, parquet; docs/data.md)",
    )
    insp.add_argument(
        "--format",
        choices=["nanogpt", "array", "megatron", "parquet"],
        help="token files' format (default: from the files; a headerless .bin needs array)",
    )
    insp.add_argument("--dtype", choices=["uint16", "uint32"], help="a headerless .bin's tokens")
    insp.add_argument(
        "--separator",
        type=int,
        help="id between documents (nanogpt, array); default 50256 for GPT-2 nanogpt files",
    )
    insp.add_argument("--column", default="input_ids", help="parquet: the token-id column")
    insp.add_argument("--samples", type=int, default=1, help="decoded sample documents to print")
    insp.add_argument("--chars", type=int, default=400, help="characters of each sample")
    insp.add_argument(
        "--no-verify", action="store_true", help="skip reading every shard's checksum"
    )
    insp.add_argument(
        "--seq-len", type=_positive, help="conversations: count those too long for this seq_len"
    )
    insp.set_defaults(fn=cmd_data_inspect)


def _add_list(sub) -> None:
    _verb(sub, "list", "list every registered component").set_defaults(fn=cmd_list)


def _add_sample(sub) -> None:
    s = _verb(
        sub,
        "sample",
        "generate text from a checkpoint",
        '  littlelm sample runs/demo --prompt "ROMEO:" --max-tokens 100 --temperature 0',
    )
    s.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    s.add_argument("--prompt", default="", help="text to continue")
    s.add_argument("--max-tokens", type=int, default=200, help="tokens to generate")
    s.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    s.add_argument("--top-k", type=int, default=50, help="0 = no top-k filter")
    s.add_argument("--seed", type=int, default=0, help="sampling seed")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    s.set_defaults(fn=cmd_sample)


def _add_chat(sub) -> None:
    c = _verb(
        sub,
        "chat",
        "talk to a fine-tuned model (docs/post-training.md)",
        '  littlelm chat runs/demo-sft\n  littlelm chat runs/demo-sft --prompt "What is 12+30?"\n'
        "  littlelm chat runs/demo-sft < conversations.jsonl   # one JSON reply per line",
    )
    c.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    c.add_argument("--prompt", help="answer this one user turn and exit")
    c.add_argument("--system", help="system message starting the conversation")
    c.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply")
    c.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    c.add_argument("--top-k", type=int, default=0, help="0 = no top-k filter")
    c.add_argument("--top-p", type=float, help="nucleus sampling: keep this share of the mass")
    c.add_argument("--seed", type=int, default=0, help="sampling seed")
    c.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    c.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="matmul precision: auto = the one the model trained in where the device computes "
        "it natively, else fp32; fp32 gives the replies an fp32 transformers run of the export "
        "gives",
    )
    c.set_defaults(fn=cmd_chat)
    t = _verb(
        sub,
        "chat-tokens",
        "give a model trained before the chat tokens existed littlelm's chat format",
        "  littlelm chat-tokens runs/old --out runs/old-chat",
    )
    t.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    t.add_argument("--out", required=True, help="the new run directory (must not exist)")
    t.set_defaults(fn=cmd_chat_tokens)
    v = _verb(
        sub,
        "serve",
        "serve a model over an OpenAI-compatible HTTP API, with a chat page at / "
        "(docs/post-training.md)",
        "  littlelm serve runs/demo-sft\n"
        "  littlelm serve runs/demo-sft --port 9000 --api-key KEY --host 0.0.0.0",
    )
    v.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    v.add_argument("--port", type=int, default=8000, help="port to listen on")
    v.add_argument(
        "--api-key",
        default=os.environ.get("LITTLELM_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 requests (default: $LITTLELM_API_KEY)",
    )
    v.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    v.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="matmul precision, as for littlelm chat")  # fmt: skip
    v.add_argument("--max-tokens", type=int, default=512,
                   help="reply length when a request gives no max_tokens")  # fmt: skip
    v.add_argument("--name", help="the model's name in the API (default: the run's name)")
    v.set_defaults(fn=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from littlelm.eval.serve import serve

    return serve(
        args.checkpoint, args.host, args.port, args.api_key, args.device, args.precision,
        args.max_tokens, args.name,
    )  # fmt: skip


def _add_grow(sub) -> None:
    g = _verb(
        sub,
        "grow",
        "check growing a checkpoint into a run's larger model (docs/growth.md)",
        "  littlelm grow runs/small --to big.yaml train.max_steps=2000",
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
    g.set_defaults(fn=cmd_grow, overrides_to="to")


def _add_report(sub) -> None:
    r = _verb(
        sub,
        "report",
        "write a Markdown report with plots of one or more runs",
        "  littlelm report runs/demo\n"
        "  littlelm report runs/a runs/b --out cmp/ --price-per-hour 2.5",
    )
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


def _add_plan(sub) -> None:
    pl = _verb(
        sub,
        "plan",
        "memory, speed and cost of a run on each GPU of a catalog",
        "  littlelm plan demo\n"
        "  littlelm plan run.yaml --gpu H100-SXM --price-per-hour 1.99   # your price per GPU-hour\n"
        "  littlelm plan demo --device cpu --price-per-hour 0.10   # this machine, at its price\n"
        "  littlelm plan run.yaml --gpu H100-SXM --devices 8 --chart plan.png\n"
        "  littlelm plan run.yaml --json model.n_layer=24",
    )
    _items(pl)
    pl.add_argument("--gpu", action="append", help="plan for this catalog GPU (repeatable)")
    pl.add_argument("--tokens", type=_positive, help="token budget (default: the config's)")
    pl.add_argument("--devices", type=_positive, default=1, help="data-parallel GPUs (DDP)")
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
        "--price-per-hour",
        type=_price,
        metavar="DOLLARS",
        help="what you pay per device-hour: the price of each GPU named with --gpu and, with "
        "--device cpu, of this machine; with neither, of every catalog GPU",
    )
    pl.add_argument(
        "--detail", action="store_true", help="memory by category, trace check, every remedy"
    )
    pl.set_defaults(fn=cmd_plan)


def _add_bench(sub) -> None:
    b = _verb(
        sub,
        "bench",
        "run real steps, a save and a resume; measure them",
        "  littlelm bench demo --steps 8\n  littlelm bench run.yaml --json model.n_layer=4",
    )
    _items(b)
    b.add_argument("--steps", type=_positive, default=4, help="steps before and after resume")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(fn=cmd_bench)


def _add_eval(sub) -> None:
    e = _verb(
        sub,
        "eval",
        "score a checkpoint on CORE or other in-context tasks",
        "  littlelm eval-bundle && littlelm eval runs/demo --max-per-task 100\n"
        "  littlelm eval runs/demo --tasks copa,piqa --out scores.json\n"
        "  littlelm eval runs/demo --bundle my_tasks/ --task-file my_tasks/tasks.yaml",
    )
    e.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    e.add_argument(
        "--bundle",
        help="task directory: the CORE eval bundle (default: the one `eval-bundle` fetched), "
        "llm-foundry's scripts/eval, or a directory with its own tasks.yaml",
    )
    e.add_argument("--tasks", help="comma-separated task labels (default: all)")
    e.add_argument(
        "--task-file",
        help="task list YAML to use instead of the directory's: `tasks:`, or the `icl_tasks:` "
        "of llm-foundry, DCLM and nanochat",
    )
    e.add_argument(
        "--max-per-task", type=_positive, help="score this many items per task (default: all)"
    )
    e.add_argument(
        "--truncation",
        choices=["crop", "drop_shots"],
        default="crop",
        help="fit long prompts by cropping after BOS or by dropping whole examples",
    )
    e.add_argument("--batch-tokens", type=_positive, default=16384, help="tokens per forward")
    e.add_argument(
        "--warn-share",
        type=_share,
        default=0.01,
        help="warn when more than this share of a task's prompts exceed the context",
    )
    e.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="matmul precision: auto = the one the model trained in where the device computes "
        "it natively, else fp32",
    )
    e.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    e.add_argument("--out", help="also write results and per-item decisions to this JSON file")
    e.add_argument(
        "--harness",
        metavar="TASKS",
        help="score with lm-evaluation-harness instead: comma-separated lm_eval task names "
        "(pip install -e '.[harness]' in a clone); --max-per-task becomes its --limit",
    )
    e.add_argument("--include", metavar="DIR", help="with --harness: your own lm_eval task YAMLs")
    e.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="with --harness: ask in the model's chat format (a fine-tuned model)",
    )
    e.add_argument(
        "--chat",
        metavar="DIR",
        help="chat tasks instead: a directory with tasks.yaml (docs/post-training.md), asked in "
        "the model's chat format; --tasks and --max-per-task apply",
    )
    e.add_argument(
        "--num-fewshot", type=int, help="with --harness: examples per prompt (default: the task's)"
    )
    e.set_defaults(fn=cmd_eval)


def _add_interop(sub) -> None:
    ex = _verb(
        sub,
        "export",
        "write a Hugging Face model directory (transformers, vLLM, llama.cpp)",
        "  littlelm export runs/demo --out hf/demo\n"
        "  littlelm export runs/demo/checkpoints/step_000160 --out hf/demo --max-shard-size 2GB\n"
        "  littlelm export runs/llama_like --gguf llama_like.gguf   # for llama.cpp",
        description="Export a checkpoint as stock LlamaForCausalLM / Qwen3ForCausalLM when its\n"
        "features allow, else with littlelm's modeling file (trust_remote_code=True); see\n"
        "docs/interop.md. A Hugging Face model directory comes in the other way: littlelm import.",
    )
    ex.add_argument("checkpoint", help="checkpoint directory or run directory (newest checkpoint)")
    ex.add_argument("--out", help="Hugging Face directory to create (must not exist or be empty)")
    ex.add_argument(
        "--gguf", metavar="FILE", help="also (or instead) write a GGUF file for llama.cpp"
    )
    ex.add_argument(
        "--gguf-type",
        choices=TYPES_GGUF,
        default="f16",
        help="storage of the GGUF's weight matrices",
    )
    ex.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="largest safetensors file (e.g. 500MB, 2GB); bigger weights are split into shards "
        "with an index",
    )
    ex.set_defaults(fn=cmd_export)
    im = _verb(
        sub,
        "import",
        "read a Hugging Face Llama/Mistral/Qwen2/Qwen3/SmolLM directory into a littlelm run",
        "  littlelm import ~/SmolLM2-135M --out runs/smol\n"
        "  littlelm train runs/smol/train.yaml   # after adding data sources to it",
        description="Convert a local model directory (config.json, *.safetensors, tokenizer.json)\n"
        "into RUN_DIR/checkpoints/step_000000 and RUN_DIR/train.yaml.",
    )
    im.add_argument("hf_dir", help="a directory written by save_pretrained or `hf download`")
    im.add_argument("--out", required=True, help="run directory to create")
    im.set_defaults(fn=cmd_import)


def _add_sweep(sub) -> None:
    w = _verb(
        sub,
        "sweep",
        "run variants of a config (at equal budget) and compare them (docs/budget.md)",
        "  littlelm sweep demo --set model.n_layer=4,6 --budget 10m\n"
        "  littlelm sweep demo --set train.seq_len=256,512 --set model.n_layer=4,6 --seeds 2",
    )
    _items(w)
    w.add_argument(
        "--set",
        action="append",
        metavar="KEY=v1,v2",
        help="a key and the values to try (repeatable)",
    )
    mode = w.add_mutually_exclusive_group()
    mode.add_argument("--grid", action="store_true", help="every combination (default)")
    mode.add_argument("--zip", action="store_true", help="the i-th values of every key together")
    w.add_argument("--budget", help="every variant's budget: 90s, 30m, 2h, $5 or 500M (tokens)")
    w.add_argument("--seeds", type=_positive, default=1, help="repeats of each variant")
    w.add_argument("--devices", help="GPU indices to run variants side by side, e.g. 0,1,2,3")
    w.add_argument("--name", help="sweep directory name under run.out_dir (default sweep-CONFIG)")
    w.add_argument(
        "--price-per-hour",
        type=float,
        metavar="DOLLARS",
        help="dollars per GPU-hour, for a $ budget and the table's cost column",
    )
    w.set_defaults(fn=cmd_sweep)


def _add_eval_bundle(sub) -> None:
    from littlelm.eval.bundle import BUNDLE_SHA256, BUNDLE_URL

    b = _verb(
        sub,
        "eval-bundle",
        "download the public CORE eval bundle",
        "  littlelm eval-bundle\n  littlelm eval-bundle --dest ~/eval_bundle --force",
    )
    b.add_argument("--dest", help="directory to create (default: LITTLELM_CACHE/eval_bundle)")
    b.add_argument("--url", default=BUNDLE_URL, help="where to download the zip from")
    b.add_argument(
        "--sha256", default=BUNDLE_SHA256, help="expected sha256 of the zip (none = no check)"
    )
    b.add_argument("--force", action="store_true", help="replace an existing bundle")
    b.set_defaults(fn=cmd_eval_bundle)


VERBS = (
    _add_train,
    _add_config,
    _add_data,
    _add_list,
    _add_sample,
    _add_chat,
    _add_grow,
    _add_report,
    _add_eval,
    _add_eval_bundle,
    _add_plan,
    _add_bench,
    _add_interop,
    _add_sweep,
)

EXAMPLES = """\
examples:
  littlelm train demo                          # train the packaged demo model
  littlelm train run.yaml train.max_steps=500  # key=value overrides, anywhere after CONFIG
  littlelm plan run.yaml --gpu H100-SXM        # memory, speed and cost before renting a GPU
  littlelm report runs/demo                    # Markdown report with plots
  littlelm VERB --help                         # a verb's options, defaults and examples

shell completion (bash/zsh): eval "$(register-python-argcomplete littlelm)"
"""


def build_parser() -> argparse.ArgumentParser:
    from littlelm import __version__

    p = argparse.ArgumentParser(
        prog="littlelm",
        description="Train small language models from one YAML file.",
        epilog=EXAMPLES,
        formatter_class=_Help,
    )
    p.add_argument("--version", action="version", version=f"littlelm {__version__}")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for add in VERBS:
        add(sub)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse, taking key=value words found after the options as more overrides."""
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # only when the shell asks for completions
        import argcomplete

        argcomplete.autocomplete(parser)
    args, extra = parser.parse_known_args(argv)
    target = getattr(args, "overrides_to", None)
    for word in extra:
        if target is None or word.startswith("-") or "=" not in word:
            hint = "; overrides are written key=value" if target else ""
            parser.error(
                f"unrecognized argument {word!r} for `littlelm {_verb_name(args)}` "
                f"(see `littlelm {_verb_name(args)} --help`){hint}"
            )
        getattr(args, target).append(word)
    return args


def _verb_name(args: argparse.Namespace) -> str:
    words = [getattr(args, k, None) for k in ("verb", "config_verb", "data_verb")]
    return " ".join(w for w in words if w)


def plain_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as one `warning: ...` line, without Python's file, line and source line."""
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    from littlelm.components import register_all

    args = parse_args(argv)
    warnings.filterwarnings("once")
    warnings.formatwarning = plain_warning
    try:
        register_all()  # the CLI is an entry point: every verb may read a config or checkpoint
        return args.fn(args)
    except LittleLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
