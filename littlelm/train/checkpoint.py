"""Atomic checkpoints.

    RUN_DIR/checkpoints/step_000500/
        model.safetensors   weights (+ metadata: origin tags)
        optimizer.pt        optimizer state (read back with weights_only=True)
        rng.pt              torch / numpy / python RNG states (weights_only=True)
        tokenizer/          the run's tokenizer, so a checkpoint is usable on its own
        state.json          step, tokens, loader state, config hash, format version; written last

A checkpoint is written into `step_000500.tmp-PID/`, every file fsynced, then the directory is
renamed into place, so a directory named `step_*` is always complete. Old checkpoints are pruned
only after the new one is in place. Loading maps tensors to the CPU first.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from littlelm.errors import CheckpointError

FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """State dict without tied duplicates (safetensors refuses shared storage)."""
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        ptr = t.data_ptr()
        if ptr in seen and t.numel():
            continue
        seen.add(ptr)
        out[name] = t.detach().to("cpu").contiguous()
    return out


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write(path: Path, write) -> None:
    write(path)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state(),
        "python": list(random.getstate()[1]),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _numpy_state() -> list:
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return [keys.tolist(), int(pos), int(has_gauss), float(gauss)]


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate((3, tuple(state["python"]), None))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path, step: int, model, optimizer, state: dict, origin: dict[str, str], tokenizer=None
) -> Path:
    """Write a complete checkpoint for `step` under `root` and return its directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        meta = {"format_version": str(FORMAT_VERSION), "origin": json.dumps(origin)}
        _write(
            tmp / "model.safetensors",
            lambda p: save_file(model_tensors(model), str(p), metadata=meta),
        )
        _write(tmp / "optimizer.pt", lambda p: torch.save(optimizer.state_dict(), p))
        _write(tmp / "rng.pt", lambda p: torch.save(rng_state(), p))
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer")
        full = {"format_version": FORMAT_VERSION, "step": step, **state}
        _write(tmp / "state.json", lambda p: p.write_text(json.dumps(full, indent=1)))
        _fsync_dir(tmp)
        if final.exists():  # a checkpoint of the same step (e.g. re-saved after resume)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first. Leftover temporary directories from a
    killed save are reported and ignored."""
    if not root.is_dir():
        return []
    done, partial = [], []
    for d in root.iterdir():
        m = STEP_DIR.match(d.name)
        if m and (d / "state.json").is_file():
            done.append((int(m.group(1)), d))
        elif d.is_dir() and ".tmp-" in d.name:
            partial.append(d)
    for d in partial:
        warnings.warn(f"ignoring incomplete checkpoint {d} (a save was interrupted)", stacklevel=2)
    return [d for _, d in sorted(done)]


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (never the newest)."""
    found = list_checkpoints(root)
    for d in found[: max(0, len(found) - max(1, keep_last))]:
        shutil.rmtree(d, ignore_errors=True)


def load_model_tensors(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: Path
) -> None:
    """Copy checkpoint tensors into `model`; shapes and names must match (tied copies aside)."""
    own = model.state_dict()
    missing = [k for k in own if k not in tensors and not _is_tied_copy(model, k)]
    unexpected = [k for k in tensors if k not in own]
    wrong = [
        f"{k} {tuple(tensors[k].shape)} vs {tuple(own[k].shape)}"
        for k in tensors
        if k in own and tensors[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        parts = [
            f"missing {missing[:5]}" if missing else "",
            f"unexpected {unexpected[:5]}" if unexpected else "",
            f"shape mismatch {wrong[:5]}" if wrong else "",
        ]
        raise CheckpointError(
            f"{source}: weights do not fit this model ({'; '.join(p for p in parts if p)}); "
            "the model section of the config must match the checkpoint's"
        )
    model.load_state_dict(tensors, strict=False)


def _is_tied_copy(model: torch.nn.Module, key: str) -> bool:
    names = {n for n, _ in model.named_parameters()}
    return key.endswith(".weight") and key not in names


@dataclass
class Loaded:
    path: Path
    state: dict
    model: dict[str, torch.Tensor]
    origin: dict[str, str] | None
    optimizer: dict | None
    rng: dict | None


def load_checkpoint(path: Path, with_optimizer: bool = True) -> Loaded:
    """Read a checkpoint directory onto the CPU."""
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (state.json missing)")
    state = json.loads(state_file.read_text())
    version = state.get("format_version", 0)
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} was written by a newer littlelm (checkpoint format {version}, this one reads "
            f"up to {FORMAT_VERSION}); upgrade littlelm to load it"
        )
    try:
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), "pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path / "model.safetensors"), device="cpu")
        optim = (
            torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
            if with_optimizer
            else None
        )
        rng = (
            torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
            if with_optimizer
            else None
        )
    except (OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: cannot read checkpoint files ({e}); resume from an earlier one"
        ) from None
    origin = json.loads(meta["origin"]) if "origin" in meta else None
    return Loaded(path, state, tensors, origin, optim, rng)
