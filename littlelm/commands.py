"""The verbs of `littlelm`: one typed function each, whose docstring is its `--help` (cli.py
turns them into the command line with cyclopts). Each imports what it runs inside its body, so
that parsing a command line, `--help` and tab completion import none of it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, cast

from cyclopts import Parameter, Token
from cyclopts.validators import Number


def _configs(context: Any) -> list[str]:
    """Shell completion of CONFIG: packaged configs, YAML files and directories."""
    from pathlib import Path

    packaged = Path(__file__).parent / "configs"  # schema.PACKAGED_CONFIGS, without importing it
    names = sorted(str(f.relative_to(packaged).with_suffix("")) for f in packaged.rglob("*.yaml"))
    here = Path(context.incomplete).parent if context.incomplete else Path(".")
    files = (
        [
            f"{p}/" if p.is_dir() else str(p)
            for p in here.iterdir()
            if p.suffix in (".yaml", ".yml") or p.is_dir()
        ]
        if here.is_dir()
        else []
    )
    return [*names, *files]


def _override(type_: Any, value: str) -> None:
    if "=" not in value or value.startswith("-"):
        raise ValueError(f"{value!r} is not an override: overrides are written key=value")


def _int(type_: Any, tokens: Sequence[Token]) -> int:
    return int(float(tokens[0].value))  # 2e9 tokens, 1_000 steps


Config = Annotated[str, Parameter(completer=_configs, help="run file or packaged config")]
Overrides = Annotated[
    str, Parameter(validator=_override, help="key=value overrides, anywhere on the line")
]
Checkpoint = Annotated[
    str, Parameter(help="checkpoint directory or run directory (newest checkpoint)")
]
Positive = Annotated[int, Parameter(converter=_int, validator=Number(gte=1))]
Device = Annotated[str, Parameter(help="auto, cpu, cuda, cuda:1, mps")]
Precision = Annotated[
    Literal["auto", "bf16", "fp32"],
    Parameter(
        help="matmul precision: auto = the one the model trained in where the device computes it natively, else fp32"
    ),
]
Dollars = Annotated[float | None, Parameter(validator=Number(gte=0, lt=float("inf")))]
Json = Annotated[
    bool, Parameter(help="print one JSON object on stdout (anything else goes to stderr)")
]


def _split(config: str, overrides: Sequence[str]) -> tuple[str, list[str]]:
    """A leading override means the default config: `train a=1` is `train demo a=1`."""
    return ("demo", [config, *overrides]) if "=" in config else (config, list(overrides))


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """With `--json`, stdout carries the one JSON document only: whatever the verb prints on the
    way (progress, a subprocess's or a C library's output) goes to stderr, Python's and fd 1's."""
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


def train(
    config: Config = "demo",
    /,
    *overrides: Overrides,
    resume: str = "auto",
    nproc: int | None = None,
) -> int:
    """Train (or resume) a run.

    examples:
      littlelm train demo
      littlelm train run.yaml train.max_steps=500 optimizer.lr=3e-3
      littlelm train demo --resume never train.max_steps=5
      littlelm train run.yaml --nproc 2 run.name=ddp

    Args:
        resume: auto (newest complete checkpoint of the run), never (start fresh; refused over existing checkpoints), or a checkpoint path
        nproc: train with N processes on this machine (runs torchrun; one per GPU)
    """
    from littlelm.console import Console
    from littlelm.schema import load_run
    from littlelm.train import distributed
    from littlelm.train.device import pick_device
    from littlelm.train.trainer import Trainer

    name, items = _split(config, overrides)
    env = distributed.detect_env()
    if nproc is not None:
        cfg = load_run(name, items, world_size=nproc)  # report config errors once
        distributed.launch(nproc, ["train", config, *overrides, "--resume", resume], cfg.run.device)
    cfg = load_run(name, items, world_size=env.world_size)
    with distributed.session(cfg.distributed, pick_device(cfg.run.device), env) as parallel:
        console = Console()  # what the run prints (littlelm/console.py)
        trainer = Trainer(cfg, resume=resume, parallel=parallel, callbacks=(console,))
        result = trainer.fit()
        console.report(trainer, result)
    return 0 if result["finished"] or result.get("stopped_by") else 1


def show(config: Config = "demo", /, *overrides: Overrides, flat: bool = False) -> None:
    """Print the merged, validated, resolved config.

    examples:
      littlelm config show demo
      littlelm config show run.yaml model.n_layer=8 --flat

    Args:
        flat: one dotted key per line
    """
    from littlelm.config import dump_yaml, flatten, to_tree
    from littlelm.schema import load_run

    cfg = load_run(*_split(config, overrides))
    print(
        "\n".join(f"{k}: {v!r}" for k, v in flatten(to_tree(cfg)).items())
        if flat
        else dump_yaml(cfg),
        end="\n" if flat else "",
    )


def prepare(
    config: Config = "demo",
    /,
    *overrides: Overrides,
    out: str | None = None,
    only: Annotated[list[str] | None, Parameter(consume_multiple=True)] = None,
    workers: int | None = None,
    no_verify: bool = False,
) -> None:
    """Tokenize a config's data sources into shards (resumable, every core).

    examples:
      littlelm data prepare demo
      littlelm data prepare run.yaml --out shards/ --only web

    Args:
        config: run or data file
        out: write each source to OUT/LABEL (default: the cache `littlelm train` uses)
        only: prepare only these sources (labels)
        workers: tokenizing processes (default: one per core, one per 64 MB of input at most)
        no_verify: check an already prepared dataset's shard sizes and headers only, not every checksum (damaged shards are rebuilt either way)
    """
    from pathlib import Path

    from littlelm.data.build import prepare_data, prepared_section
    from littlelm.schema import load_data_config

    name, items = _split(config, overrides)
    cfg = load_data_config(
        name, [*items, f"data.workers={workers}"] if workers is not None else items
    )
    _, result = prepare_data(
        cfg, Path(out) if out else None, only, verify="sizes" if no_verify else "checksums"
    )
    if out is not None:
        print(prepared_section(result))


def inspect(
    directory: str,
    /,
    *,
    format: Literal["nanogpt", "array", "megatron", "parquet"] | None = None,
    dtype: Literal["uint16", "uint32"] | None = None,
    separator: int | None = None,
    column: str = "input_ids",
    samples: int = 1,
    chars: int = 400,
    no_verify: bool = False,
    seq_len: Positive | None = None,
) -> None:
    """Summarise and check a prepared dataset.

    examples:
      littlelm data inspect shards/web --samples 3
      littlelm data inspect fineweb10B/   # nanoGPT/llm.c .bin, Megatron, .npy, parquet

    Args:
        directory: a dataset directory written by `littlelm data prepare`, or token files another tool wrote (nanoGPT/llm.c .bin, .npy, Megatron PREFIX, parquet; docs/data.md)
        format: token files' format (default: from the files; a headerless .bin needs array)
        dtype: a headerless .bin's tokens
        separator: id between documents (nanogpt, array); default 50256 for GPT-2 nanogpt files
        column: parquet: the token-id column
        samples: decoded sample documents to print
        chars: characters of each sample
        no_verify: skip reading every shard's checksum
        seq_len: conversations: count those too long for this seq_len
    """
    from pathlib import Path

    from littlelm.data.inspect import inspect_dataset, inspect_tokens
    from littlelm.data.prepare import MANIFEST

    path = Path(directory)
    if format or not ((path if path.is_dir() else path.parent) / MANIFEST).is_file():
        inspect_tokens(path, format, dtype, separator, column)  # token files another tool wrote
    else:
        inspect_dataset(path, samples, chars, not no_verify, seq_len=seq_len)


def list_() -> None:
    """List every registered component."""
    from littlelm.schema import components

    for kind, rows in components().items():
        print(f"{kind}s:\n" + "".join(f"  {name:<16} {doc}\n" for name, doc in rows), end="")


def sample(
    checkpoint: Checkpoint,
    /,
    *,
    prompt: str = "",
    max_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 50,
    seed: int = 0,
    device: Device = "auto",
) -> None:
    """Generate text from a checkpoint.

    examples:
      littlelm sample runs/demo --prompt "ROMEO:" --max-tokens 100 --temperature 0

    Args:
        prompt: text to continue
        max_tokens: tokens to generate
        temperature: 0 = greedy
        top_k: 0 = no top-k filter
        seed: sampling seed
    """
    from littlelm.load import load_model
    from littlelm.model.generate import check_sampling, fit_prompt, generate
    from littlelm.model.gpt import GPT
    from littlelm.train.device import autocast, inference_precision, pick_device

    check_sampling(max_tokens, temperature, top_k or None)
    dev = pick_device(device)
    loaded, tok, cfg = load_model(checkpoint, dev)
    model = cast(GPT, loaded)  # load_model builds the run's registered model: the GPT
    ids, max_tokens, note = fit_prompt(
        [tok.bos_id, *tok.encode(prompt)], max_tokens, model.cfg.max_seq_len
    )
    if note:
        print(f"warning: {note}", file=sys.stderr)
    with autocast(dev, inference_precision("auto", cfg.train.precision, dev)):
        out = generate(model, ids, max_tokens, temperature, top_k or None, seed, tok.bos_id)
    print(prompt + tok.decode(out))


def chat(
    checkpoint: Checkpoint,
    /,
    *,
    prompt: str | None = None,
    system: str | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float | None = None,
    seed: int = 0,
    device: Device = "auto",
    precision: Precision = "auto",
) -> int:
    """Talk to a fine-tuned model (docs/post-training.md).

    examples:
      littlelm chat runs/demo-sft
      littlelm chat runs/demo-sft --prompt "What is 12+30?"
      littlelm chat runs/demo-sft < conversations.jsonl   # one JSON reply per line

    Args:
        prompt: answer this one user turn and exit
        system: system message starting the conversation
        max_tokens: most tokens per reply
        temperature: 0 = greedy
        top_k: 0 = no top-k filter
        top_p: nucleus sampling: keep this share of the mass
        seed: sampling seed
        precision: as above; fp32 gives the replies an fp32 transformers run of the export gives
    """
    from littlelm.eval import chat

    return chat.run(
        checkpoint,
        prompt,
        system,
        temperature,
        top_k or None,
        top_p,
        max_tokens,
        seed,
        device,
        precision,
    )


def chat_tokens(checkpoint: Checkpoint, /, *, out: str) -> None:
    """Give a model trained before the chat tokens existed littlelm's chat format.

    examples:
      littlelm chat-tokens runs/old --out runs/old-chat

    Args:
        out: the new run directory (must not exist)
    """
    from littlelm.interop.chat_tokens import add_chat_tokens

    r = add_chat_tokens(checkpoint, out)
    print(f"{r['summary']}\nwrote {r['checkpoint']}; fine-tune from it (docs/post-training.md)")


def serve(
    checkpoint: Checkpoint,
    /,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: Annotated[str | None, Parameter(env_var="LITTLELM_API_KEY")] = None,
    device: Device = "auto",
    precision: Precision = "auto",
    max_tokens: int = 512,
    name: str | None = None,
) -> int:
    """Serve a model over an OpenAI-compatible HTTP API, with a chat page at / (docs/post-training.md).

    examples:
      littlelm serve runs/demo-sft
      littlelm serve runs/demo-sft --port 9000 --api-key KEY --host 0.0.0.0

    Args:
        host: address to listen on (0.0.0.0: all)
        port: port to listen on
        api_key: require 'Authorization: Bearer KEY' on /v1 requests
        max_tokens: reply length when a request gives no max_tokens
        name: the model's name in the API (default: the run's name)
    """
    from littlelm.eval.serve import serve

    return serve(checkpoint, host, port, api_key, device, precision, max_tokens, name)


def grow(parent: Checkpoint, /, *overrides: Overrides, to: Config) -> None:
    """Check growing a checkpoint into a run's larger model (docs/growth.md).

    Build RUN's model from PARENT as `littlelm train` would with grow.parent=PARENT, check that
    it computes the parent's function, and print where each block comes from and the learning
    rate of every parameter group. Writes nothing.

    examples:
      littlelm grow runs/small --to big.yaml train.max_steps=2000

    Args:
        to: run file (or packaged config) of the grown model; the overrides apply to it
    """
    from littlelm.schema import load_run
    from littlelm.train.growth import preview_growth

    items = [f"grow.parent={parent}", *overrides]
    print(
        "\n".join(
            [
                *preview_growth(load_run(to, items)),
                f"train it: littlelm train {to} {' '.join(items)}",
            ]
        )
    )


def report(
    run_dirs: list[str], /, *, out: str | None = None, price_per_hour: Dollars = None
) -> None:
    """Write a Markdown report with plots of one or more runs (a sweep's: its comparison).

    examples:
      littlelm report runs/demo
      littlelm report runs/a runs/b --out cmp/ --price-per-hour 2.5

    Args:
        run_dirs: run directories to report on
        out: output directory (default RUN_DIR/report for one run, ./report-A-vs-B for several)
        price_per_hour: what the machine costs per hour (all its GPUs), to state each run's cost
    """
    from pathlib import Path

    from littlelm.report import write_report
    from littlelm.report.compare import is_sweep_dir, write_sweep_report

    if len(run_dirs) == 1 and is_sweep_dir(run_dirs[0]):
        path, table = write_sweep_report(run_dirs[0], price_per_hour)
        print(table)
    else:
        path = write_report([*map(Path, run_dirs)], out, price_per_hour)
    print(f"wrote {path} and its plots ({path.parent})")


def eval_(
    checkpoint: Checkpoint,
    /,
    *,
    bundle: str | None = None,
    tasks: str | None = None,
    task_file: str | None = None,
    max_per_task: Positive | None = None,
    truncation: Literal["crop", "drop_shots"] = "crop",
    batch_tokens: Positive = 16384,
    warn_share: Annotated[float, Parameter(validator=Number(gte=0, lte=1))] = 0.01,
    precision: Precision = "auto",
    device: Device = "auto",
    out: str | None = None,
    harness: str | None = None,
    include: str | None = None,
    apply_chat_template: bool = False,
    chat: str | None = None,
    num_fewshot: int | None = None,
) -> None:
    """Score a checkpoint on CORE or other in-context tasks.

    examples:
      littlelm eval-bundle && littlelm eval runs/demo --max-per-task 100
      littlelm eval runs/demo --tasks copa,piqa --out scores.json
      littlelm eval runs/demo --bundle my_tasks/ --task-file my_tasks/tasks.yaml

    Args:
        bundle: task directory: the CORE eval bundle (default: the one `eval-bundle` fetched), llm-foundry's scripts/eval, or a directory with its own tasks.yaml
        tasks: comma-separated task labels (default: all)
        task_file: task list YAML to use instead of the directory's: `tasks:`, or the `icl_tasks:` of llm-foundry, DCLM and nanochat
        max_per_task: score this many items per task (default: all)
        truncation: fit long prompts by cropping after BOS or by dropping whole examples
        batch_tokens: tokens per forward
        warn_share: warn when more than this share of a task's prompts exceed the context
        out: also write results and per-item decisions to this JSON file
        harness: score with lm-evaluation-harness instead: comma-separated lm_eval task names (pip install -e '.[harness]' in a clone); --max-per-task becomes its --limit
        include: with --harness: a directory of your own lm_eval task YAMLs
        apply_chat_template: with --harness: ask in the model's chat format (a fine-tuned model)
        chat: chat tasks instead: a directory with tasks.yaml (docs/post-training.md), asked in the model's chat format; --tasks and --max-per-task apply
        num_fewshot: with --harness: examples per prompt (default: the task's)
    """
    from littlelm.eval.core import EvalOptions
    from littlelm.eval.run import parse_labels, run_eval

    if chat is not None:
        from littlelm.eval.chat_eval import run_chat_eval

        run_chat_eval(
            checkpoint, chat, parse_labels(tasks), max_per_task, 64, device, precision, out
        )
    elif harness is not None:
        from littlelm.interop.harness import run_harness

        run_harness(
            checkpoint,
            parse_labels(harness) or [],
            include,
            max_per_task,
            num_fewshot,
            device,
            precision,
            out,
            chat=apply_chat_template,
        )
    else:
        opts = EvalOptions(max_per_task, truncation, batch_tokens, warn_share)
        run_eval(checkpoint, bundle, parse_labels(tasks), task_file, opts, device, precision, out)


def eval_bundle(
    *,
    dest: str | None = None,
    url: str | None = None,
    sha256: str | None = None,
    force: bool = False,
) -> None:
    """Download the public CORE eval bundle.

    examples:
      littlelm eval-bundle
      littlelm eval-bundle --dest ~/eval_bundle --force

    Args:
        dest: directory to create (default: LITTLELM_CACHE/eval_bundle)
        url: where to download the zip from (default: the public bundle's)
        sha256: expected sha256 of the zip (default: the public bundle's; none = no check)
        force: replace an existing bundle
    """
    from pathlib import Path

    from littlelm.eval.bundle import BUNDLE_SHA256, BUNDLE_URL, download_bundle

    sha = None if sha256 == "none" else (sha256 or BUNDLE_SHA256)
    download_bundle(Path(dest) if dest else None, url or BUNDLE_URL, sha, force)


def plan(
    config: Config = "demo",
    /,
    *overrides: Overrides,
    gpu: list[str] | None = None,
    tokens: Positive | None = None,
    devices: Positive = 1,
    gpus: list[str] | None = None,
    json: Json = False,
    chart: str | None = None,
    no_trace: bool = False,
    device: Literal["cpu"] | None = None,
    price_per_hour: Dollars = None,
    detail: bool = False,
) -> None:
    """Memory, speed and cost of a run on each GPU of a catalog.

    examples:
      littlelm plan demo
      littlelm plan run.yaml --gpu H100-SXM --price-per-hour 1.99   # your price per GPU-hour
      littlelm plan demo --device cpu --price-per-hour 0.10   # this machine, at its price
      littlelm plan run.yaml --gpu H100-SXM --devices 8 --chart plan.png
      littlelm plan run.yaml --json model.n_layer=24

    Args:
        gpu: plan for this catalog GPU (repeatable)
        tokens: token budget (default: the config's)
        devices: data-parallel GPUs (DDP)
        gpus: extra GPU catalog YAML (repeatable)
        chart: write a memory and cost chart to this PNG
        no_trace: skip the FakeTensorMode trace
        device: also predict the run on this machine's CPU (rates probed here, in seconds)
        price_per_hour: what you pay per device-hour: the price of each GPU named with --gpu and, with --device cpu, of this machine; with neither, of every catalog GPU
        detail: memory by category, trace check, every remedy
    """
    import json as js
    from pathlib import Path

    from littlelm.plan.cost import load_catalog
    from littlelm.plan.planner import make_plan
    from littlelm.plan.report import plan_chart, plan_json, print_plan
    from littlelm.schema import load_run
    from littlelm.train.growth import complete_growth

    with _stdout_to_stderr(json):
        cfg = complete_growth(
            load_run(*_split(config, overrides), world_size=devices)
        )  # grow's parent
        p = make_plan(
            cfg,
            load_catalog([*map(Path, gpus or [])]),
            gpu,
            tokens,
            devices,
            not no_trace,
            local=device == "cpu",
            price_per_hour=price_per_hour,
        )
        if chart:
            plan_chart(p, chart)
            print(f"chart written to {chart}")  # on stderr with --json
    print(js.dumps(plan_json(p), indent=1)) if json else print_plan(p, detail=detail)


def bench(
    config: Config = "demo", /, *overrides: Overrides, steps: Positive = 4, json: Json = False
) -> None:
    """Run real steps, a save and a resume; measure them.

    examples:
      littlelm bench demo --steps 8
      littlelm bench run.yaml --json model.n_layer=4

    Args:
        steps: steps before and after resume
    """
    import json as js

    from littlelm.plan.bench import run_bench
    from littlelm.plan.report import print_bench
    from littlelm.schema import load_run
    from littlelm.train.growth import complete_growth

    with _stdout_to_stderr(json):  # grown: the parent's shape
        result = run_bench(complete_growth(load_run(*_split(config, overrides))), steps)
    print(js.dumps(result, indent=1)) if json else print_bench(result)


def export(
    checkpoint: Checkpoint,
    /,
    *,
    out: str | None = None,
    gguf: str | None = None,
    gguf_type: str = "f16",
    max_shard_size: str = "5GB",
) -> None:
    """Write a Hugging Face model directory (transformers, vLLM, llama.cpp).

    As stock LlamaForCausalLM / Qwen3ForCausalLM when the model's features allow, else with
    littlelm's modeling file (trust_remote_code=True); see docs/interop.md. A Hugging Face model
    directory comes in the other way: littlelm import.

    examples:
      littlelm export runs/demo --out hf/demo
      littlelm export runs/demo/checkpoints/step_000160 --out hf/demo --max-shard-size 2GB
      littlelm export runs/llama_like --gguf llama_like.gguf   # for llama.cpp

    Args:
        out: Hugging Face directory to create (must not exist or be empty)
        gguf: also (or instead) write a GGUF file (FILE) for llama.cpp
        gguf_type: storage of the GGUF's weight matrices (f16 or f32)
        max_shard_size: largest safetensors file (e.g. 500MB, 2GB); bigger weights are split into shards with an index
    """
    from littlelm.errors import CheckpointError
    from littlelm.interop.gguf_export import TYPES
    from littlelm.interop.hf import export

    if gguf_type not in TYPES:  # the exporter's own list: the parser keeps no copy of it
        raise CheckpointError(f"--gguf-type {gguf_type}: GGUF weights are stored as {' or '.join(TYPES)}")  # fmt: skip
    r = export(checkpoint, out, max_shard_size, gguf, gguf_type)
    if r["gguf"] is not None:
        print(f"wrote {r['gguf']} ({r['arch']}, {gguf_type}): llama-cli -m {r['gguf']}")
    if r["out"] is not None:
        remote = ", trust_remote_code=True" if r["arch"] == "littlelm" else ""
        print(f"exported {r['checkpoint']} to {r['out']} as {r['arch']}: {r['reason']}")
        print(f"load it: AutoModelForCausalLM.from_pretrained({str(r['out'])!r}{remote})")
        print(f"and its tokenizer: AutoTokenizer.from_pretrained({str(r['out'])!r}{remote})")


def import_(hf_dir: str, /, *, out: str) -> None:
    """Read a Hugging Face Llama/Mistral/Qwen2/Qwen3/SmolLM directory into a littlelm run.

    Convert a local model directory (config.json, *.safetensors, tokenizer.json) into
    RUN_DIR/checkpoints/step_000000 and RUN_DIR/train.yaml.

    examples:
      littlelm import ~/SmolLM2-135M --out runs/smol
      littlelm train runs/smol/train.yaml   # after adding data sources to it

    Args:
        hf_dir: a directory written by save_pretrained or `hf download`
        out: run directory to create
    """
    from littlelm.interop.hf import import_model

    r = import_model(hf_dir, out)
    m, src = r["config"], "data.sources.main"
    print(
        f"imported {hf_dir} ({r['arch']}: {m.n_layer} layers x {m.d_model}, {m.n_head} heads ({m.kv_heads} kv), {r['params']:,} parameters) into {r['checkpoint']}\n{r['tokenizer']}"
    )
    if r["window"]:
        print(
            f"context: {m.max_seq_len} tokens, its sliding window (full attention over at most the window is the windowed attention exactly)"
        )
    print(
        f"train it (continued-pretraining lrs and warmup): littlelm train {r['out'] / 'train.yaml'} {src}.name=text {src}.path=corpus.txt {src}.split=paragraph"
    )
    print(f"grow it: grow.parent={r['checkpoint']} in a run with a larger model (docs/growth.md)")


def sweep(
    config: Config = "demo",
    /,
    *overrides: Overrides,
    set: list[str] | None = None,
    grid: bool = False,
    zip: bool = False,
    budget: str | None = None,
    seeds: Positive = 1,
    devices: str | None = None,
    name: str | None = None,
    price_per_hour: Dollars = None,
) -> None:
    """Run variants of a config (at equal budget) and compare them (docs/budget.md).

    examples:
      littlelm sweep demo --set model.n_layer=4,6 --budget 10m
      littlelm sweep demo --set train.seq_len=256,512 --set model.n_layer=4,6 --seeds 2

    Args:
        set: KEY=v1,v2: a key and the values to try (repeatable)
        grid: every combination (the default)
        zip: the i-th values of every key together
        budget: every variant's budget: 90s, 30m, 2h, $5 or 500M (tokens)
        seeds: repeats of each variant
        devices: GPU indices to run variants side by side, e.g. 0,1,2,3
        name: sweep directory name under run.out_dir (default sweep-CONFIG)
        price_per_hour: dollars per GPU-hour, for a $ budget and the table's cost column
    """
    from littlelm.errors import ConfigError
    from littlelm.report.compare import write_sweep_report
    from littlelm.sweep import SweepOptions, run_sweep

    if grid and zip:
        raise ConfigError(
            ["--grid and --zip: give one (--grid, every combination, is the default)"]
        )
    base, items = _split(config, overrides)
    opts = SweepOptions(
        base,
        items,
        set or [],
        zip,
        budget,
        seeds,
        devices.split(",") if devices else None,
        name,
        price_per_hour,
    )
    path, table = write_sweep_report(run_sweep(opts), price_per_hour)
    print(f"{table}\nwrote {path} and its plots ({path.parent})")
