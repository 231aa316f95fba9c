"""The verbs that use a trained model: sample, chat, serve, eval (CORE, chat tasks, or
lm-evaluation-harness through interop/harness.py) and eval-bundle; each a typed function whose
docstring is its --help (cli.py registers them)."""

from __future__ import annotations

import sys
from typing import Annotated, Literal, cast

from cyclopts import Parameter
from cyclopts.validators import Number

from littlelm.cli_args import Checkpoint, Device, Positive, Precision

# Each verb imports what it runs inside its body: `littlelm VERB --help` and tab completion import
# none of it.


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
    precision: Precision = "fp32",
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
        precision: fp32 gives the replies the transformers and GGUF exports give; bf16 (or auto: the run's precision where the device computes it natively) is faster on bf16 hardware and changes a greedy reply now and then
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


def serve(
    checkpoint: Checkpoint,
    /,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: Annotated[str | None, Parameter(env_var="LITTLELM_API_KEY")] = None,
    device: Device = "auto",
    precision: Precision = "fp32",
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
        precision: as chat's: fp32 answers as the exports do, bf16 or auto for speed
        max_tokens: reply length when a request gives no max_tokens
        name: the model's name in the API (default: the run's name)
    """
    from littlelm.eval.serve import serve

    return serve(checkpoint, host, port, api_key, device, precision, max_tokens, name)


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

    harness_only = {
        "--include": include is not None,
        "--apply-chat-template": apply_chat_template,
        "--num-fewshot": num_fewshot is not None,
    }
    stray = [flag for flag, given in harness_only.items() if given]
    if harness is None and stray:  # silently ignored, they would score other tasks than asked
        from littlelm.errors import EvalError

        raise EvalError(
            f"{' and '.join(stray)} {'applies' if len(stray) == 1 else 'apply'} only with "
            "--harness TASKS (lm-evaluation-harness); "
            "for your own tasks.yaml and JSONL files use --bundle DIR"
        )
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
