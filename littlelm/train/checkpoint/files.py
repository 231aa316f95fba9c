"""One checkpoint on disk: its files, written atomically and read back safely.

    RUN_DIR/checkpoints/step_000500/
        model.safetensors   weights (+ metadata: origin tags)
        optimizer.pt        optimizer state (read back with weights_only=True)
        rng.pt              torch / numpy / python RNG states (weights_only=True)
        tokenizer/          the run's tokenizer, so a checkpoint is usable on its own
        state.json          step, tokens, loader state, config hash, format version; written last

A checkpoint is written into `step_000500.tmp-PID/`, every file fsynced, then the directory is
renamed into place, so a directory named `step_*` is always complete. Re-saving a step that
exists moves the old directory aside (`step_000500.replaced-PID`) before the rename and deletes it
after, so a kill between the two renames leaves the old copy, which `list_checkpoints` still
finds. Old checkpoints are pruned only after the new one is in place (keep the newest
`keep_last`, plus every step that is a multiple of `keep_every`). A save that fails (disk full,
unwritable directory) removes its temporary directory and raises `CheckpointError`; the previous
checkpoint is untouched. Loading maps tensors to the CPU first; tensors come from safetensors and
everything `torch.load` reads is loaded with `weights_only=True`.

`LITTLELM_FAULT_SAVE_DELAY=SECONDS` (a fault-injection hook for tests and benchmarks/faults.py)
pauses that long between the writes of a save, so a kill can be landed inside the save window.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

# finding checkpoints lives in the bottom layer (every layer needs it); ckpt.* re-exports it
from littlelm.checkpoint_dirs import (  # noqa: F401
    STEP_DIR,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    scan,
    step_dir,
)
from littlelm.errors import CheckpointError

FORMAT_VERSION = 1
FAULT_DELAY_ENV = "LITTLELM_FAULT_SAVE_DELAY"


class UnreadableCheckpoint(CheckpointError):
    """A checkpoint whose files cannot be read (truncated, corrupt, or not a checkpoint)."""


def _fault_pause() -> None:
    """Test hook: sleep LITTLELM_FAULT_SAVE_DELAY seconds (unset: no-op)."""
    delay = float(os.environ.get(FAULT_DELAY_ENV) or 0)
    if delay > 0:
        time.sleep(delay)


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
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write(path: Path, write) -> None:
    write(path)
    _fsync_file(path)
    _fault_pause()


def umask_mode(path: Path) -> None:
    """Give `path` the mode a file created with open() gets (0o666 less the umask): safetensors
    creates its files 0o600, so another account could not read a checkpoint or an export."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_tree(path: Path) -> None:
    for f in sorted(path.rglob("*")):
        if f.is_file():
            _fsync_file(f)
    _fsync_dir(path)


def rng_state() -> dict:
    legacy = np.random.get_state()
    assert isinstance(legacy, tuple), "legacy=True, the default, gives the tuple"
    _, keys, pos, has_gauss, gauss = legacy
    return {
        "torch": torch.get_rng_state(),
        "numpy": [keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "python": list(random.getstate()[1]),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


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
    """Write a complete checkpoint for `step` under `root` and return its directory.

    Raises CheckpointError (after removing the temporary directory) when the disk is full or
    the directory is unwritable; what was there before is untouched."""
    final = step_dir(root, step)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        _check_free_space(root, step)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_files(tmp, step, model, optimizer, state, origin, tokenizer)
        _publish(tmp, final)
    except CheckpointError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as e:  # torch.save and safetensors do not always raise OSError
        problem = _diagnose(root, e)  # before the cleanup frees the space
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_save_failed(root, step, problem)) from e
    except BaseException:  # KeyboardInterrupt: abandon the save, keep the previous checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_files(tmp: Path, step: int, model, optimizer, state, origin, tokenizer) -> None:
    meta = {"format_version": str(FORMAT_VERSION), "origin": json.dumps(origin)}

    def write_model(p: Path) -> None:
        save_file(model_tensors(model), str(p), metadata=meta)
        umask_mode(p)

    _write(tmp / "model.safetensors", write_model)
    _write(tmp / "optimizer.pt", lambda p: torch.save(optimizer.state_dict(), p))
    _write(tmp / "rng.pt", lambda p: torch.save(rng_state(), p))
    if tokenizer is not None:
        tokenizer.save(tmp / "tokenizer")
        _fsync_tree(tmp / "tokenizer")
    full = {"format_version": FORMAT_VERSION, "step": step, **state}
    _write(tmp / "state.json", lambda p: p.write_text(json.dumps(full, indent=1)))  # last
    _fsync_dir(tmp)


def _publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; an existing `final` is moved aside first and deleted after."""
    old = None
    if final.exists():  # the same step saved again (e.g. after a resume or a rollback)
        old = final.with_name(f"{final.name}.replaced-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    _fsync_dir(final.parent)
    _fault_pause()
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _check_free_space(root: Path, step: int) -> None:
    """Refuse to start a save that cannot fit: it needs about as much as the newest one."""
    newest = latest_checkpoint(root, warn=False)
    if newest is None:
        return
    need = sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())
    usage = shutil.disk_usage(root)
    if usage.total and usage.free < need:
        raise CheckpointError(
            _save_failed(
                root,
                step,
                f"the disk is full: {_mb(usage.free)} free, a checkpoint takes {_mb(need)}",
            )
        )


def _diagnose(root: Path, e: Exception) -> str:
    code = getattr(e, "errno", None)
    text = f"{type(e).__name__}: {e}"
    where = _existing_ancestor(root)
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    if code == errno.ENOSPC or "No space left" in str(e) or (free is not None and free < 4 * 2**20):
        return f"the disk is full ({text}; {_mb(free or 0)} free)"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS) or not os.access(where, os.W_OK):
        return f"the directory is not writable ({text})"
    return text


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _save_failed(root: Path, step: int, problem: str) -> str:
    previous = latest_checkpoint(root, warn=False) if root.is_dir() else None
    kept = (
        f"nothing was lost: the previous checkpoint {previous} is intact and "
        "`littlelm train` resumes from it"
        if previous
        else "there is no earlier checkpoint of this run"
    )
    return (
        f"cannot save the checkpoint of step {step} in {root}: {problem}. The partial write was "
        f"removed and {kept}. Free disk space or fix the directory's permissions, or point "
        "run.out_dir at a writable disk with room"
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def clean_incomplete(root: Path) -> list[str]:
    """Remove what interrupted saves left under `root` (call only while holding the run lock):
    temporary directories go, a moved-aside copy is renamed back or removed. Returns messages."""
    done, partial, replaced = scan(root)
    notes = []
    for d in sorted(partial):
        shutil.rmtree(d, ignore_errors=True)
        notes.append(f"removed incomplete checkpoint {d} (left by an interrupted save)")
    for step, d in replaced.items():
        if step in done:
            shutil.rmtree(d, ignore_errors=True)
        else:
            os.replace(d, step_dir(root, step))
            notes.append(f"restored checkpoint {step_dir(root, step)} (a save was interrupted)")
    return notes


def prune(root: Path, keep_last: int, keep_every: int = 0) -> list[Path]:
    """Delete complete checkpoints other than the newest `keep_last` and those whose step is a
    multiple of `keep_every` (0 = none). The newest is never deleted. Returns what was deleted."""
    found = list_checkpoints(root, warn=False)
    keep = set(found[-max(1, keep_last) :])
    if keep_every:
        keep |= {d for d in found if checkpoint_step(d) % keep_every == 0}
    gone = [d for d in found if d not in keep]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


class LazyTensors(Mapping):
    """A checkpoint's weights, each read from its safetensors file when it is asked for: a
    resume copies them into the model one at a time, so the host never holds a second copy of
    the whole model (under torchrun, not one per rank). `shapes` needs no read at all."""

    def __init__(self, path: Path):
        # memory-maps the file; reads nothing yet (None once released)
        self._file: safe_open | None = safe_open(str(path), "pt")
        self.shapes = {k: tuple(self._file.get_slice(k).get_shape()) for k in self._file.keys()}  # noqa: SIM118 (not iterable)
        self.metadata = self._file.metadata() or {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.shapes:
            raise KeyError(key)
        if self._file is None:
            raise RuntimeError("LazyTensors read after release()")
        return self._file.get_tensor(key)

    def release(self) -> None:
        """Unmap the file once its tensors are copied: the pages each read touched count in the
        process's resident memory while the mapping lives (measured: the whole 0.44 GB model
        of a 100M run, kept until the Trainer finished constructing)."""
        self._file = None

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def load_model_tensors(model: torch.nn.Module, tensors: Mapping, source: Path) -> None:
    """Copy checkpoint tensors into `model`; shapes and names must match (tied copies aside)."""
    own = model.state_dict()
    if isinstance(tensors, LazyTensors):
        shapes = tensors.shapes
    else:
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    missing = [k for k in own if k not in shapes and not _is_tied_copy(model, k)]
    unexpected = [k for k in shapes if k not in own]
    wrong = [
        f"{k} {shapes[k]} vs {tuple(own[k].shape)}"
        for k in shapes
        if k in own and shapes[k] != tuple(own[k].shape)
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
    model: LazyTensors  # read one tensor at a time, then released
    origin: dict[str, str] | None
    optimizer: dict | None
    rng: dict | None


def load_checkpoint(path: Path, with_optimizer: bool = True) -> Loaded:
    """Read a checkpoint directory onto the CPU. Raises UnreadableCheckpoint for missing or
    corrupt files, CheckpointError for a checkpoint of a newer format."""
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise UnreadableCheckpoint(f"{path} is not a complete checkpoint (state.json missing)")
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as e:
        raise UnreadableCheckpoint(f"{path}: state.json is unreadable ({e})") from None
    check_state_types(state, path)
    version = state.get("format_version", 0)
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} was written by a newer littlelm (checkpoint format {version}, this one reads "
            f"up to {FORMAT_VERSION}); upgrade littlelm to load it"
        )
    try:
        tensors = LazyTensors(path / "model.safetensors")
        meta = tensors.metadata
        # memory-mapped: pages are read as the optimizer takes its state, shared between the
        # ranks of a node through the page cache, and a sharded optimizer touches only its own
        optim = _torch_load(path / "optimizer.pt", mmap=True) if with_optimizer else None
        rng = _torch_load(path / "rng.pt") if with_optimizer else None
    except UnreadableCheckpoint:
        raise
    except Exception as e:  # safetensors and zip errors have many types
        raise UnreadableCheckpoint(
            f"{path}: cannot read checkpoint files ({type(e).__name__}: {e}); "
            "resume from an earlier checkpoint (--resume PATH)"
        ) from None
    origin = json.loads(meta["origin"]) if "origin" in meta else None
    return Loaded(path, state, tensors, origin, optim, rng)


def fingerprint(path: Path) -> str:
    """What identifies checkpoint `path` cheaply: a hash of its state.json (step, tokens, data
    position, config) and of its weights' layout (the safetensors header: names, dtypes, shapes,
    offsets) and size. It reads no weight, so an in-place edit of the weights passes it: a LoRA
    run records its base's weights_identity too (weights_changed checks it)."""
    h = hashlib.sha256()
    try:
        h.update((path / "state.json").read_bytes())
        weights = path / "model.safetensors"
        with open(weights, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            h.update(head + f.read(min(n, 100_000_000)))
        h.update(str(weights.stat().st_size).encode())
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint {path} ({e.strerror or e})") from None
    return h.hexdigest()[:16]


# a base's weights up to this size are hashed in full at every load (well under a second);
# larger ones when their size, mtime or inode moved since the hash was recorded
FULL_HASH_ALWAYS = 512 * 2**20


def weights_identity(path: Path) -> dict:
    """What a LoRA run keeps of its base checkpoint `path`'s weights besides `fingerprint`: the
    sha256 of model.safetensors (every byte) and the file's size, mtime and inode then."""
    weights = path / "model.safetensors"
    try:
        h = hashlib.sha256()
        with open(weights, "rb") as f:
            while chunk := f.read(1 << 24):  # 16 MiB at a time: hashlib releases the GIL
                h.update(chunk)
        return {"sha256": h.hexdigest(), "stat": _stat(weights)}
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint {path} ({e.strerror or e})") from None


def weights_changed(path: Path, record: dict) -> bool | None:
    """Whether checkpoint `path`'s weights differ from `record` (weights_identity's): hashed in
    full when at most FULL_HASH_ALWAYS bytes or when size, mtime or inode moved; None when
    nothing was checked (a large file whose stat is as recorded, or a record without a hash)."""
    if "sha256" not in record:
        return None
    weights = path / "model.safetensors"
    try:
        stat = _stat(weights)
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint {path} ({e.strerror or e})") from None
    if stat[0] > FULL_HASH_ALWAYS and stat == record.get("stat"):
        return None
    return weights_identity(path)["sha256"] != record["sha256"]


def weights_stat(path: Path) -> list[int]:
    """[size, mtime_ns, inode] of checkpoint `path`'s model.safetensors."""
    try:
        return _stat(path / "model.safetensors")
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint {path} ({e.strerror or e})") from None


def _stat(weights: Path) -> list[int]:
    st = weights.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


# state.json fields resume reads, and their JSON types
STATE_TYPES: dict[str, type | tuple[type, ...]] = {
    "format_version": int,
    "step": int,
    "tokens": int,
    "train_time": (int, float),
    "loader": dict,
    "config": dict,
    "guard": dict,
    "loader_world_size": int,
    "loader_ranks": list,
    "lora_base": dict,
}
REQUIRED_STATE = ("step",)


def check_state_types(state, path: Path) -> None:
    """A state.json whose fields have the wrong types (a hand edit, a foreign tool) is
    unreadable like a corrupt file, so resume falls back to the checkpoint before it."""
    if not isinstance(state, dict):
        raise UnreadableCheckpoint(f"{path}: state.json is not a JSON object")
    for key in REQUIRED_STATE:
        if key not in state:
            raise UnreadableCheckpoint(f"{path}: state.json has no {key!r}")
    for key, kind in STATE_TYPES.items():
        value = state.get(key)
        if key in state and (not isinstance(value, kind) or isinstance(value, bool)):
            raise UnreadableCheckpoint(
                f"{path}: state.json field {key!r} is a {type(value).__name__}, not the "
                f"{getattr(kind, '__name__', 'number')} littlelm writes"
            )


def _torch_load(path: Path, mmap: bool = False):
    """torch.load restricted to tensors and plain containers (never arbitrary pickles); with
    `mmap` the tensors are views of the file (private pages: writing them never changes it)."""
    mmap = mmap and zipfile.is_zipfile(path)  # only torch.save's zip format maps; others refused
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise UnreadableCheckpoint(
            f"{path} holds Python objects other than tensors and plain data{what}; littlelm "
            "never writes such files and refuses to load one, since unpickling it could run "
            "code. Use a checkpoint written by littlelm"
        ) from None
