"""The verbs that move models in and out of littlelm: export, import, chat-tokens; each a typed
function whose docstring is its --help (cli.py registers them)."""

from __future__ import annotations

from littlelm.cli_args import Checkpoint

# Each verb imports what it runs inside its body: `littlelm VERB --help` and tab completion import
# none of it.


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
