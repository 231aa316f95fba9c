"""`littlelm export` and `littlelm import`: littlelm checkpoints <-> Hugging Face model directories.

Export writes what `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads: config.json,
generation_config.json, safetensors weights (sharded above --max-shard-size, with
model.safetensors.index.json), the tokenizer (tokenizer.json + tokenizer_config.json), and for
models no stock class computes, modeling_littlelm.py and blocks.py (arch.py says which is which and why).

Stock exports store transformers' names and conventions: RMSNorms without a gain get a gain of
ones; the embedding RMSNorm (littlelm's default) is folded into the embedding table, which is
exact because it acts on each row alone (rms_norm(wte)[ids] == rms_norm(wte[ids])), and unties
a tied lm_head; vocabulary padding rows are cut (transformers would let them win a greedy pick).
Remote-code exports store littlelm's tensors as they are.

Import reads a local Llama / Mistral / Qwen3 / SmolLM directory (or a littlelm export) into a
littlelm run directory: RUN_DIR/checkpoints/step_000000 (weights, tokenizer, state.json), which
`grow.parent` grows and RUN_DIR/train.yaml continues (a same-shape grow is an init-from).
Every output is written into a temporary directory and renamed into place: a failed export or
import leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from littlelm.config import to_tree, validate
from littlelm.errors import CheckpointError, LittleLMError
from littlelm.interop import arch as A
from littlelm.interop.hf_tokenizer import (
    export_rules,
    export_tokenizer,
    import_tokenizer,
    stop_ids,
)
from littlelm.interop.peft_export import (
    ADAPTER_DIR,
    BASE_DIR,
    adapter_problem,
    token_rows,
    write_adapter,
)
from littlelm.load import find_checkpoint, load_model
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.model.kernels import rms_norm
from littlelm.schema import RunConfig
from littlelm.train.checkpoint import files as ckpt

# the transformers model of remote-code exports, and the blocks file it imports (relatively:
# transformers copies both into its module cache)
MODELING_FILES = [
    Path(__file__).parent.parent / "model" / name for name in ("modeling_littlelm.py", "blocks.py")
]


def check_parent(path: Path, flag: str) -> None:
    """The folders above `path` are created when missing (for --out and --gguf alike): the
    nearest one that exists must be a directory this process can write into."""
    above = path.absolute().parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise LittleLMError(
            f"{flag} {path}: {above} is not a directory, so nothing can be written "
            f"under it; choose another {flag}"
        )
    if not os.access(above, os.W_OK | os.X_OK):
        raise LittleLMError(
            f"{flag} {path}: cannot write into {above} (permission denied); choose another "
            f"{flag}, in a directory you can write to"
        )


def first_missing(path: Path) -> Path | None:
    """The outermost folder above `path` that does not exist yet: what writing `path` creates."""
    missing = None
    for above in path.absolute().parents:
        if above.exists():
            break
        missing = above
    return missing


def check_out(out: Path) -> None:
    """--out must be a new path or an empty directory, and not a symbolic link: the result is
    renamed into place, which would replace a link rather than fill its target."""
    check_parent(out, "--out")
    if out.is_symlink():
        target = os.readlink(out)
        raise LittleLMError(
            f"--out {out} is a symbolic link (to {target}); littlelm writes --out by renaming a "
            "finished directory into place, which would replace the link: give a new path, or "
            "the link's target if it is an empty directory"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LittleLMError(
            f"{out} already exists and is not empty; choose another --out or remove it"
        )


@contextmanager
def staged(out: Path):
    """A temporary sibling of `out`, renamed to `out` when the block succeeds, else removed."""
    out = Path(out)
    check_out(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    made = first_missing(out)
    try:
        tmp.mkdir(parents=True)
        yield tmp
        if out.exists():
            out.rmdir()
        tmp.rename(out)
        made = None
    except OSError as e:  # a full disk, a device that takes no files: said, not a traceback
        raise LittleLMError(
            f"cannot write {out}: {e.strerror or e}; choose another --out"
        ) from None
    finally:
        shutil.rmtree(made or tmp, ignore_errors=True)  # the folders it made, on a failure


# ----------------------------------------------------------------------------------------------
# Export


def export(
    source: str | Path,
    out: str | Path | None,
    max_shard_size: str = "5GB",
    gguf: str | Path | None = None,
    gguf_type: str = "f16",
) -> dict:
    """Export a checkpoint (or a run's newest) to the Hugging Face directory `out` and/or the
    GGUF file `gguf`; returns a summary for the CLI."""
    if (Path(source) / "config.json").is_file() and not (Path(source) / "state.json").is_file():
        raise CheckpointError(
            f"{source} is a Hugging Face model directory, not a littlelm checkpoint: it is "
            f"exported already; to train or evaluate it with littlelm, bring it in with "
            f"`littlelm import {source} --out runs/NAME`"
        )
    if out is None and gguf is None:
        raise CheckpointError("nothing to write: give --out DIR (Hugging Face) or --gguf FILE")
    if out is not None:
        check_out(Path(out))  # before the work
    if gguf is not None:
        check_parent(Path(gguf), "--gguf")
    path = find_checkpoint(source)
    model, tok, cfg = load_model(path, "cpu")  # a LoRA run's merged (load.py)
    assert isinstance(model, GPT), "export maps GPT's tensors, the one model there is"
    arch, reason, config, hf_tensors = hf_form(model, tok)
    if gguf is not None:
        from littlelm.interop.gguf_export import write_gguf

        with staged_file(Path(gguf)) as tmp:
            write_gguf(model, tok, hf_tensors, arch, tmp, gguf_type)
    adapter, note = None, None
    if out is not None:
        extra = None
        if cfg.lora is not None:  # the adapters alone too, for PEFT (interop/peft_export.py)
            lora = cfg.lora
            note = adapter_problem(lora)
            if note is None:
                adapter = Path(out) / ADAPTER_DIR

                def extra(tmp: Path) -> None:
                    # the base the adapter goes on, beside it, named by the path it will have
                    base = write_base(path, tmp, arch, max_shard_size)
                    ids = json.loads((path / "state.json").read_text()).get("lora_tokens", [])
                    tied = bool(config.get("tie_word_embeddings"))
                    rows = token_rows(hf_tensors, ids, model.cfg, arch, tied)
                    where = Path(out).resolve() / base
                    write_adapter(path, tmp, model.cfg, arch, lora, where, rows, ids)

        write_hf_dir(Path(out), tok, hf_tensors, config, arch, max_shard_size, extra)
    return {
        "checkpoint": path,
        "arch": arch,
        "reason": reason,
        "out": out,
        "gguf": gguf,
        "adapter": adapter,  # a LoRA run's PEFT adapter (DIR/adapter), or None
        "adapter_note": note,  # why a LoRA run's export has none
    }


def hf_form(model: GPT, tok) -> tuple[str, str, dict, dict[str, torch.Tensor]]:
    """(architecture, why, config.json, tensors by their names there) of `model`'s export."""
    m = model.cfg
    arch, reason = A.export_arch(m)
    tensors = ckpt.model_tensors(model)
    if arch == "littlelm":
        config, hf_tensors = A.remote_config(m, tok.bos_id), remote_tensors(tensors, m)
    else:
        config, hf_tensors = A.stock_config(m, arch, tok.bos_id), stock_tensors(tensors, m, arch)
    config["torch_dtype"] = str(tensors["wte.weight"].dtype).removeprefix("torch.")
    config["eos_token_id"] = export_rules(tok)[1]  # an imported tokenizer's own eos
    return arch, reason, config, hf_tensors


def write_hf_dir(
    out: Path, tok, hf_tensors: dict, config: dict, arch: str, shard: str, extra=None
) -> None:
    """The export directory `out`, written whole or not at all; `extra(tmp)` adds files to it
    (a LoRA run's adapter)."""
    with staged(out) as tmp:
        fill_hf_dir(tmp, tok, hf_tensors, config, arch, shard)
        if extra is not None:
            extra(tmp)


def write_base(checkpoint: Path, tmp: Path, arch: str, shard: str) -> str:
    """A LoRA checkpoint's base, exported into the folder BASE_DIR of the export `tmp` (being
    written), for PEFT's adapter to name (AutoPeftModelForCausalLM loads what it names).
    Returns the folder's name."""
    base_path = Path(json.loads((checkpoint / "state.json").read_text())["lora_base"]["path"])
    base, tok, _ = load_model(base_path, "cpu")
    assert isinstance(base, GPT), "a LoRA run's base is a GPT"
    base_arch, _, config, tensors = hf_form(base, tok)
    assert base_arch == arch, "LoRA keeps the base's shape: the same architecture"
    (tmp / BASE_DIR).mkdir()
    fill_hf_dir(tmp / BASE_DIR, tok, tensors, config, arch, shard)
    return BASE_DIR


def fill_hf_dir(tmp: Path, tok, hf_tensors: dict, config: dict, arch: str, shard: str) -> None:
    """A Hugging Face model directory's files in the existing folder `tmp`."""
    export_tokenizer(tok, tmp)  # first: a refused tokenizer writes nothing else
    write_weights(hf_tensors, tmp, shard)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    # plain generate() stops at a reply's end (chat models) or at a document's end (BOS)
    stops = stop_ids(tok)
    eos = stops if len(stops) > 1 else stops[0]
    # pad: a stop id (the document's end), never a BOS that is not one: given no attention
    # mask, generate() masks every pad id in the prompt unless pad is an eos, hiding its BOS
    gen = {"bos_token_id": tok.bos_id, "eos_token_id": eos, "pad_token_id": stops[-1]}
    gen["do_sample"] = False
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if arch == "littlelm":
        for path in MODELING_FILES:
            shutil.copy(path, tmp / path.name)


@contextmanager
def staged_file(out: Path):
    """A temporary sibling of the file `out`, renamed to it when the block succeeds; its folder
    is created when missing, as --out's is."""
    if out.exists() or out.is_symlink():
        raise LittleLMError(f"{out} already exists; choose another --gguf or remove it")
    check_parent(out, "--gguf")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    made = first_missing(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        tmp.rename(out)
        made = None
    except OSError as e:
        raise LittleLMError(
            f"cannot write {out}: {e.strerror or e}; choose another --gguf"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
        if made is not None:  # a failure: the folders it made go too
            shutil.rmtree(made, ignore_errors=True)


def remote_tensors(tensors: dict[str, torch.Tensor], m: GPTConfig) -> dict:
    """littlelm tensors -> modeling_littlelm.py's: the backbone's under `model.`, lm_head at the
    top, the vocabulary's padding rows cut from wte and lm_head (no token reaches them)."""
    V = m.vocab_size
    out = {}
    for name, t in tensors.items():
        if name in ("wte.weight", "lm_head.weight"):
            t = t[:V].clone()  # a copy: safetensors refuses a slice of a larger tensor
        out[name if name == "lm_head.weight" else f"{A.REMOTE_PREFIX}{name}"] = t
    return out


def stock_tensors(tensors: dict[str, torch.Tensor], m: GPTConfig, arch: str) -> dict:
    """littlelm tensors -> a stock architecture's names and conventions (module docstring)."""
    t = dict(tensors)
    V = m.vocab_size
    wte = t["wte.weight"][:V].clone()  # a copy: safetensors refuses a slice of a larger tensor
    if m.tie_embeddings:
        t["lm_head.weight"] = wte
    t["lm_head.weight"] = t["lm_head.weight"][:V].clone()
    t["wte.weight"] = rms_norm(wte, eps=m.norm_eps) if m.embed_norm else wte
    if m.tie_embeddings and not m.embed_norm:
        del t["lm_head.weight"]  # tie_word_embeddings: transformers shares the table
    ones = {"norm_f.weight": m.d_model}
    for i in range(m.n_layer):
        ones |= {f"blocks.{i}.norm1.weight": m.d_model, f"blocks.{i}.norm2.weight": m.d_model}
        if m.qk_norm:
            ones |= {f"blocks.{i}.attn.q_norm.weight": m.head_dim}
            ones |= {f"blocks.{i}.attn.k_norm.weight": m.head_dim}
    for name, dim in ones.items():
        t.setdefault(name, torch.ones(dim))  # a norm without a gain = a gain of ones
    table = A.names(arch, m)
    return {table[k]: v for k, v in t.items()}


def write_weights(tensors: dict[str, torch.Tensor], out: Path, max_shard_size: str) -> None:
    """model.safetensors, or model-0000i-of-0000n.safetensors + the index above the size."""
    from huggingface_hub import save_torch_state_dict

    try:
        save_torch_state_dict(
            tensors, out, max_shard_size=max_shard_size, metadata={"format": "pt"}
        )
    except ValueError as e:  # an unparsable --max-shard-size
        raise LittleLMError(f"--max-shard-size: {e} (write it like 5GB or 500MB)") from None
    for path in out.glob("*.safetensors"):
        ckpt.umask_mode(path)  # safetensors writes 0o600; an export is for others to read


# ----------------------------------------------------------------------------------------------
# Import


def import_model(source: str | Path, out: str | Path) -> dict:
    """Read a Hugging Face model directory into a littlelm run directory `out`."""
    src = Path(source)
    check_out(Path(out))  # before the work
    hf = read_config(src)
    arch = A.check_importable(hf, str(src))
    try:
        m = A.imported_config(hf, arch)
    except (ValueError, KeyError) as e:  # pydantic's ValidationError is a ValueError
        raise CheckpointError(f"{src / 'config.json'}: cannot describe this model ({e})") from None
    weights = read_weights(src)
    if arch == "littlelm":  # the backbone's names are under `model.` (exports before: bare)
        weights = {k.removeprefix(A.REMOTE_PREFIX): v for k, v in weights.items()}
    check_sizes(weights, m, arch, src)  # before anything is built to config.json's sizes
    tok = import_tokenizer(src, hf)
    assert m.vocab_size is not None, "imported_config reads it from config.json"
    if tok.vocab_size > m.vocab_size:
        raise CheckpointError(
            f"{src}: tokenizer.json has {tok.vocab_size} tokens but the model's vocab_size is "
            f"{m.vocab_size}; the tokenizer belongs to another model: copy the right one in"
        )
    if tok.vocab_size < m.vocab_size:  # rows no token reaches: littlelm's vocabulary padding
        m.vocab_pad_multiple = 64 if -(-tok.vocab_size // 64) * 64 == m.vocab_size else m.vocab_size
        m.vocab_size = tok.vocab_size
    tensors = littlelm_tensors(weights, m, arch, src)
    model = GPT(m)
    ckpt.load_model_tensors(model, tensors, src)
    cfg = run_config(m, Path(out))
    with staged(Path(out)) as tmp:
        state = {"tokens": 0, "tokenizer": tok.fingerprint, "config": to_tree(cfg)}
        state["imported_from"] = str(src.resolve())
        path = ckpt.save_checkpoint(tmp / "checkpoints", 0, model, NO_OPTIMIZER, state, {}, tok)
        (tmp / "train.yaml").write_text(train_yaml(cfg, Path(out), path.name, src))
    return {
        "arch": arch,
        "out": Path(out),
        "checkpoint": Path(out) / "checkpoints" / path.name,
        "params": model.param_counts()["total"],
        "config": m,
        "window": A.sliding_window(hf, arch),
        "tokenizer": tokenizer_note(tok),
    }


def tokenizer_note(tok) -> str:
    """What import keeps of the tokenizer's rules, and what littlelm's training does
    differently, in one line for the import's output."""
    eos, eos_id, adds_bos = export_rules(tok)
    bos = f"{tok.bos_token} ({tok.bos_id})"
    kept = f"eos {eos} ({eos_id}), " + (f"BOS {bos} put before a text" if adds_bos else "no BOS")
    if adds_bos:
        return (
            f"tokenizer: {kept}; littlelm trains each document after {bos} too; export keeps both"
        )
    return (
        f"tokenizer: {kept} (it adds none); littlelm's training starts each document with "
        f"{bos}, as it does every document; export writes the tokenizer's own rules back ({kept})"
    )


# An imported model has no optimizer state; the checkpoint format wants a file (of {}).
NO_OPTIMIZER = SimpleNamespace(state_dict=dict)


def read_config(src: Path) -> dict:
    if not src.is_dir():
        raise CheckpointError(
            f"{src} is not a directory; give a model directory (config.json + *.safetensors)"
        )
    path = src / "config.json"
    if not path.is_file():
        raise CheckpointError(
            f"{src} is not a Hugging Face model directory (no config.json); give the directory "
            "that model.save_pretrained(DIR) wrote, or download one with `hf download NAME --local-dir DIR`"
        )
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is unreadable ({e})") from None


def read_weights(src: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards its index lists, on the CPU."""
    from safetensors.torch import load_file

    index = src / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (src / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise CheckpointError(
            f"{src} has no model.safetensors (or index); littlelm reads safetensors only: save "
            "with model.save_pretrained(DIR) (safetensors is its default)"
        )
    out = {}
    for name in files:
        try:
            out.update(load_file(str(src / name), device="cpu"))
        except Exception as e:  # safetensors raises several types for bad files
            raise CheckpointError(f"{src / name}: unreadable safetensors file ({e})") from None
    return out


def check_sizes(weights: dict[str, torch.Tensor], m: GPTConfig, arch: str, src: Path) -> None:
    """config.json's layer count and vocabulary against the weights, before building anything
    from them: a config claiming 1,000,000 layers would otherwise build a million modules (minutes
    and gigabytes) before the shape check said no."""
    prefix, embed = ("blocks.", "wte.weight") if arch == "littlelm" else LAYERS
    found = {int(k.split(".")[prefix.count(".")]) for k in weights if _in_layer(k, prefix)}
    layers = max(found) + 1 if found else 0
    rows = weights[embed].shape[0] if embed in weights else None
    # littlelm's exports hold the vocabulary's rows (before: with the padding rows too)
    want = {m.vocab, m.padded_vocab} if arch == "littlelm" else {m.vocab}
    want_rows = rows if rows in want else max(want)
    problems = []
    if layers != m.n_layer or len(found) != layers:
        problems.append(f"it says {m.n_layer} layers, the weights hold layers {_spans(found)}")
    if rows is not None and rows != want_rows:
        problems.append(f"it says a vocabulary of {want_rows}, {embed} has {rows} rows")
    if problems:
        raise CheckpointError(
            f"{src}: config.json does not describe these weights ({'; '.join(problems)}); the "
            "directory mixes two models: re-save it with model.save_pretrained(DIR)"
        )


LAYERS = ("model.layers.", "model.embed_tokens.weight")  # the stock architectures' names


def _in_layer(name: str, prefix: str) -> bool:
    return name.startswith(prefix) and name[len(prefix) :].split(".", 1)[0].isdigit()


def _spans(found: set[int]) -> str:
    if not found:
        return "none"
    if len(found) == max(found) + 1:
        return f"0-{max(found)}" if len(found) > 1 else "0"
    return ", ".join(map(str, sorted(found)[:8])) + (", ..." if len(found) > 8 else "")


def littlelm_tensors(hf: dict[str, torch.Tensor], m: GPTConfig, arch: str, src: Path) -> dict:
    """Rename to littlelm's names, pad the vocabulary rows, check every name and shape."""
    table = A.names(arch, m)
    theirs = {v: k for k, v in table.items()} if table else {k: k for k in hf}
    extra = sorted(k for k in hf if k not in theirs and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise CheckpointError(
            f"{src}: tensors littlelm's {arch} mapping does not know ({', '.join(extra[:4])}"
            f"{', ...' if len(extra) > 4 else ''}); this checkpoint has a feature littlelm lacks"
        )
    t = {theirs[k]: v.float() for k, v in hf.items() if k in theirs}
    if m.tie_embeddings:
        t.pop("lm_head.weight", None)
    expected = _shapes(m)
    for name in ("wte.weight", "lm_head.weight"):
        if name in t and t[name].size(0) < expected[name][0]:
            t[name] = torch.cat(
                [t[name], t[name].new_zeros(expected[name][0] - t[name].size(0), t[name].size(1))]
            )
    _check_shapes(t, expected, table, src)
    return t


def _shapes(m: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT(m) loads, with its shape (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = GPT(m)
    tied = {"lm_head.weight"} if m.tie_embeddings else set()
    return {n: tuple(p.shape) for n, p in model.state_dict().items() if n not in tied}


def _check_shapes(t: dict, expected: dict, table: dict, src: Path) -> None:
    hf_name = table or {}
    missing = [hf_name.get(k, k) for k in expected if k not in t]
    wrong = [
        f"{hf_name.get(k, k)} is {tuple(v.shape)}, config.json implies {expected[k]}"
        for k, v in t.items()
        if k in expected and tuple(v.shape) != expected[k]
    ]
    if missing or wrong:
        what = "; ".join(
            [*(f"missing {', '.join(missing[:3])}" for _ in [0] if missing), *wrong[:3]]
        )
        raise CheckpointError(
            f"{src}: the weights do not match its config.json ({what}); the directory mixes two "
            "models: re-save it with model.save_pretrained(DIR)"
        )


def run_config(m: GPTConfig, out: Path) -> RunConfig:
    """The run config recorded in the imported checkpoint (its model and tokenizer)."""
    ck = out / "checkpoints" / "step_000000"
    tree = {
        "run": {"name": out.name, "out_dir": str(out.parent)},
        "model": {"name": "gpt", **m.model_dump(exclude={"name"})},
        "data": {"tokenizer": {"name": "saved", "path": str(ck / "tokenizer")}},
    }
    return validate(RunConfig, tree, source="littlelm import")


# Continued pretraining of an imported model: AdamW, the optimizer such models are trained
# with, at lr 3e-4 for every role, not scaled by width, after a 20-step warmup. Decided by
# measurement (benchmarks/continue_import.py, docs/interop.md): a tiny Llama trained with AdamW
# at a 3e-3 peak, exported, imported and continued on its own data, 4 seeds: AdamW at 3e-4 (a
# tenth of that peak) ended at val loss 0.8097 on average after 120 steps, Muon at a thirtieth
# of its defaults (what import wrote before) 0.8111, each lower at 2 of the 4 seeds, neither
# more than 0.0001 above its start in the first 20 steps; AdamW at the parent's own peak rose
# by 0.05, at a third of it by 0.007. The tie goes to the optimizer the checkpoint was trained with, whose lr a
# model card states: a tenth of its peak is the rule the file gives.
CONTINUE_OPTIMIZER = {
    "name": "adamw",
    "lr": 0.0003,
    "scale_lr_by_width": False,  # sqrt(768 / d_model) is for from-scratch lrs
}
CONTINUE_WARMUP = 20  # steps: the optimizers' moments start from zero on trained weights


def train_yaml(cfg: RunConfig, out: Path, step: str, src: Path) -> str:
    """A run file that continues training the imported model (a same-shape grow), with
    continued-pretraining lrs and warmup."""
    tree = to_tree(cfg)
    model = tree["model"]  # nulls included: softcap null is not the default
    doc = {
        "run": {"name": f"{out.name}-train", "out_dir": str(out.parent)},
        "model": model,
        "data": {"tokenizer": tree["data"]["tokenizer"]},
        "grow": {"parent": str(out / "checkpoints" / step), "continue_data": False},
        "optimizer": dict(CONTINUE_OPTIMIZER),
        "schedule": {"name": "trapezoidal", "warmup_steps": CONTINUE_WARMUP, "cooldown_frac": 0.4},
        "train": {"seq_len": min(1024, model["max_seq_len"]), "max_steps": 1000},
    }
    head = (
        f"# written by `littlelm import {src}`: continue training the imported model.\n"
        "# grow.parent of the same shape starts from its weights; change model.n_layer, d_model, ...\n"
        "# to grow it instead (docs/growth.md). The optimizer and schedule are for continued\n"
        "# pretraining: AdamW, as such models are trained, at lr 3e-4 after a 20-step warmup.\n"
        "# Measured against Muon at a thirtieth of its defaults on an AdamW-trained model\n"
        "# (benchmarks/continue_import.py, 4 seeds): final val loss 0.8097 vs 0.8111, each lower\n"
        "# at 2 seeds, at most 0.0001 above the start; AdamW at the model's own peak lr rose 0.05.\n"
        "# So set optimizer.lr to a tenth of your model's peak lr where its card gives it\n"
        "# (docs/interop.md).\n"
        "# Add data sources, e.g. a text file whose paragraphs are its documents:\n"
        f"#   littlelm train {out / 'train.yaml'} data.sources.main.name=text "
        "data.sources.main.path=corpus.txt data.sources.main.split=paragraph\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False)
