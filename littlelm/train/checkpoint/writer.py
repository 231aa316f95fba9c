"""Checkpoints written in the background (`checkpoint.async_save`): the training step waits only
while the state is copied to host memory, and a thread writes that copy with the guarantees of a
synchronous save (files.py: the same files in a temporary directory, each fsynced, state.json
last, one rename).

    stage       at the step boundary, on the process that writes (rank 0): weights, optimizer
                state, RNG states and state.json's contents copied into host buffers, kept from
                one save to the next (at most one save is in flight, so they are free again)
    start       a thread writes the copy and prunes old checkpoints
    poll/wait   what it came to: the checkpoint's path or the CheckpointError it raised;
                `wait` gives up after a bound (a stalled filesystem: a hung fsync)

The training loop never touches the filesystem for a save in flight: asking whether it is done,
how long it has run and where it writes reads this object alone, so a filesystem that stalls
stalls the thread and nothing else. A save due while another is still being written is skipped
(said in the log), not queued: waiting would hang the loop on a stalled filesystem.

torchtitan's asynchronous checkpointing (DCP's async_save, staging into reusable CPU buffers,
pinned for a GPU) is the model; this one writes littlelm's own checkpoint format.
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from littlelm.errors import CheckpointError
from littlelm.train.checkpoint import files as ckpt


@dataclass
class Flight:
    """One save being written in the background."""

    step: int
    where: Path  # the temporary directory it writes (files.py names it)
    started: float  # time.monotonic()
    thread: threading.Thread | None = None
    path: Path | None = None  # the checkpoint, once written
    error: CheckpointError | None = None
    done: threading.Event = field(default_factory=threading.Event)
    reported_slow: bool = False

    def age(self) -> float:
        return time.monotonic() - self.started

    def describe(self) -> str:
        return f"the save of step {self.step} ({self.where}), running for {_duration(self.age())}"


class BackgroundWriter:
    """At most one checkpoint write in flight, on a daemon thread (a write stuck in a hung
    filesystem call must not keep the process alive once the run has given up on it)."""

    def __init__(self) -> None:
        self.flight: Flight | None = None
        self._buffers: dict[tuple, torch.Tensor] = {}  # staged copies, reused by each save
        self.staged_bytes = 0
        self.stage_seconds = 0.0  # the last staging's duration: what the step waited

    @property
    def busy(self) -> Flight | None:
        """The save in flight (None once it finished, even before `poll` collects it)."""
        f = self.flight
        return f if f is not None and not f.done.is_set() else None

    def stage(self, tree: Any) -> Any:
        """A copy of `tree` (nested dicts, lists and tuples of tensors and plain values) whose
        tensors live in host buffers owned by this writer. Tensors sharing storage (tied
        weights) stay shared in the copy, so a writer that drops tied duplicates drops them."""
        t0 = time.perf_counter()
        seen: dict[tuple, torch.Tensor] = {}
        out = self._stage(tree, (), seen)
        if any(t.is_cuda for t in seen.values()):  # copies from the GPU were asynchronous
            torch.cuda.synchronize()
        self.staged_bytes = sum(b.numel() * b.element_size() for b in self._buffers.values())
        self.stage_seconds = time.perf_counter() - t0
        return out

    def _stage(self, node: Any, key: tuple, seen: dict) -> Any:
        if isinstance(node, torch.Tensor):
            t = node.detach()
            alias = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.dtype)
            if t.numel() and alias in seen:
                return seen[alias]
            buf = self._buffers.get(key)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                # pinned host memory makes a GPU's copy asynchronous and fast (torchtitan's)
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                self._buffers[key] = buf
            buf.copy_(t, non_blocking=t.is_cuda)
            seen[alias] = buf
            return buf
        if isinstance(node, dict):
            return {k: self._stage(v, (*key, k), seen) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            items = [self._stage(v, (*key, i), seen) for i, v in enumerate(node)]
            return type(node)(items) if isinstance(node, list) else tuple(items)
        return copy.deepcopy(node)  # numbers, strings, None: the loop may change the originals

    def start(self, step: int, where: Path, write: Callable[[], Path]) -> Flight:
        """Run `write` (which returns the checkpoint's path or raises CheckpointError) on a
        thread. The caller makes sure no other save is in flight."""
        assert self.busy is None, "one save in flight at a time (the caller skips)"
        flight = Flight(step, where, time.monotonic())

        def run() -> None:
            try:
                flight.path = write()
            except CheckpointError as e:
                flight.error = e
            except Exception as e:  # a bug must reach the loop, not die with the thread
                flight.error = CheckpointError(
                    f"the background save of step {step} failed: {type(e).__name__}: {e}"
                )
            finally:
                flight.done.set()

        flight.thread = threading.Thread(target=run, name=f"checkpoint-{step}", daemon=True)
        self.flight = flight
        flight.thread.start()
        return flight

    def poll(self) -> Flight | None:
        """The save that finished since the last call (its path or error), else None."""
        f = self.flight
        if f is None or not f.done.is_set():
            return None
        self.flight = None
        return f

    def wait(self, timeout: float) -> Flight | None:
        """Wait up to `timeout` seconds for the save in flight; then as `poll`. The wait is in
        short slices so that a second Ctrl-C (KeyboardInterrupt) ends it at once."""
        f = self.flight
        deadline = time.monotonic() + max(0.0, timeout)
        while f is not None and not f.done.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            f.done.wait(min(left, 0.25))
        return self.poll()

    def slow_note(self, after_minutes: float) -> str | None:
        """Once per save: a line when the save in flight has run past `after_minutes`."""
        f = self.busy
        if f is None or f.reported_slow or not after_minutes or f.age() < after_minutes * 60:
            return None
        f.reported_slow = True
        return (
            f"warning: {f.describe()}, past checkpoint.slow_after_minutes="
            f"{after_minutes:g}; training goes on and checkpoints due meanwhile are skipped. "
            "A slow or stalled filesystem under run.out_dir (a network disk?) is the usual cause"
        )


class SaveStuck(CheckpointError):
    """A background save still running when the run could wait no longer: it always stops the
    run (checkpoint.on_save_error cannot go on past a filesystem that does not answer)."""


class BackgroundSaves:
    """The run's side of background saves, on every rank: rank 0 stages and writes, every rank
    learns the same outcomes at the same points (`start` and `settle` are collectives under
    torchrun: the save's gathering, one broadcast), so a failure or a skip is the same on all.

    `checkpointer`: save_restore.Checkpointer (its snapshot and write); `parallel`:
    train/distributed.py's Parallel (neither imported: save_restore imports this module)."""

    def __init__(self, checkpointer, parallel) -> None:
        self.checkpointer = checkpointer
        self.parallel = parallel
        self.cfg = checkpointer.cfg.checkpoint
        self.writer = BackgroundWriter() if parallel.is_main else None

    def start(self, state, model, optimizer, log: Callable[[str], None]) -> bool:
        """Stage a checkpoint of `state` and start writing it; False (and a line) when the
        previous save is still being written, so this one is skipped."""
        busy = self.writer.busy if self.writer is not None else None
        skip = self.parallel.broadcast_object(None if busy is None else busy.describe())
        if skip is not None:
            log(f"checkpoint of step {state.step} skipped: {skip}, is still being written")
            return False
        snap = self.checkpointer.snapshot(state, model, optimizer)  # every rank gathers
        if self.writer is not None:
            staged = self.writer.stage({"snap": snap, "rng": ckpt.rng_state()})
            step, where = state.step, ckpt.temporary_dir(self.checkpointer.dir, state.step)
            self.writer.start(
                step, where, lambda: self.checkpointer.write(step, staged["snap"], staged["rng"])
            )
        return True

    def settle(self, state, wait: bool = False) -> Path | None:
        """What the save in flight came to, on every rank: its path once written (recorded in
        `state`), None while it runs (or none was in flight). With `wait`, up to
        checkpoint.save_wait_seconds for it first. Raises CheckpointError (every rank) when it
        failed, or is still running after the wait (a stalled filesystem)."""
        outcome: tuple[int, str | None, str | None, bool] | None = None
        if self.writer is not None:
            w = self.writer
            running = w.busy
            done = w.wait(self.cfg.save_wait_seconds) if wait else w.poll()
            if done is not None:
                error = None if done.error is None else str(done.error)
                outcome = (done.step, None if done.path is None else str(done.path), error, False)
            elif wait and running is not None:
                why = _stuck(running, self.cfg.save_wait_seconds, state)
                outcome = (running.step, None, why, True)
        outcome = self.parallel.broadcast_object(outcome)
        if outcome is None:
            return None
        step, path, error, stuck = outcome
        if error is not None:
            raise (SaveStuck if stuck else CheckpointError)(error)
        assert path is not None, "a save that did not fail has a path"
        state.last_checkpoint, state.saved_step = Path(path), step
        return Path(path)

    def slow_note(self) -> str | None:
        """Rank 0, any step: a line once a save in flight runs past the configured minutes."""
        if self.writer is None:
            return None
        return self.writer.slow_note(self.cfg.slow_after_minutes)

    def close(self, log: Callable[[str], None], error: BaseException) -> None:
        """The run ends on `error`: wait for the save in flight, within the bound (it holds
        good steps); on a second Ctrl-C give it up and remove its temporary directory, from a
        thread of its own so that a stalled filesystem cannot hold the exit (what is left, the
        next run removes); after SaveStuck, which waited already, leave it. Rank 0; never
        raises."""
        busy = self.writer.busy if self.writer is not None else None
        if busy is None or isinstance(error, SaveStuck):
            return
        abort = isinstance(error, KeyboardInterrupt)
        if not abort and self.writer is not None:
            self.writer.wait(self.cfg.save_wait_seconds)
            if self.writer.busy is None:
                return
        log(f"abandoned {busy.describe()}; the newest complete checkpoint is kept")
        sweep = threading.Thread(target=_remove, args=(busy.where,), daemon=True)
        sweep.start()
        sweep.join(2.0)


def _remove(where: Path) -> None:
    """Remove an abandoned save's temporary directory. It is renamed first: the writer's own
    rename into place and this one cannot both succeed, so a checkpoint published meanwhile is
    never emptied (the name keeps `.tmp-`: the next run removes what this leaves)."""
    gone = where.with_name(where.name + "-abandoned")
    try:
        os.replace(where, gone)
    except OSError:  # published already, or never created
        return
    shutil.rmtree(gone, ignore_errors=True)


def _stuck(flight: Flight, waited: float, state) -> str:
    previous = state.last_checkpoint
    kept = (
        f"the previous checkpoint {previous} is intact and `littlelm train` resumes from it"
        if previous is not None
        else "there is no earlier checkpoint of this run"
    )
    return (
        f"{flight.describe()}, did not finish within checkpoint.save_wait_seconds={waited:g}: "
        f"the filesystem under it stalls (a hung write or fsync). The run stops without it; "
        f"{kept}. Check the disk or network filesystem, or point run.out_dir at another"
    )


def background_saves(
    checkpointer, parallel, model, optimizer
) -> tuple[BackgroundSaves | None, str]:
    """At the start of training: background saves or not (checkpoint.async_save, and with
    `auto` the host memory rank 0 has), the same on every rank, and the line that says so."""
    setting = checkpointer.cfg.checkpoint.async_save
    need = staged_size(model, optimizer, trained_only=not checkpointer.transform.keeps_every_weight)
    on, note = parallel.broadcast_object(choose(setting, need, available_memory()))
    return (BackgroundSaves(checkpointer, parallel) if on else None), note


def staged_size(model: torch.nn.Module, optimizer, trained_only: bool = False) -> int:
    """Bytes of a checkpoint's staged copy: the weights (a LoRA run's: the trained tensors) and
    the optimizer state, or before the first step has made it, two fp32 moments per trained
    value (AdamW's; Muon keeps one for its matrices, so this bounds it)."""
    params = [p for p in model.parameters() if p.requires_grad or not trained_only]
    weights = sum(p.numel() * p.element_size() for p in params)
    if not trained_only:
        weights += sum(b.numel() * b.element_size() for b in model.buffers())
    moments = sum(
        t.numel() * t.element_size()
        for per_param in optimizer.state.values()
        for t in per_param.values()
        if isinstance(t, torch.Tensor)
    )
    if not moments:
        moments = 2 * 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    return weights + moments


def available_memory() -> int | None:
    """The host's available memory in bytes (Linux's MemAvailable; None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def choose(setting: bool | str, need: int, available: int | None) -> tuple[bool, str]:
    """Whether saves run in the background, and the start-up line saying so. `need`: the bytes
    of the staged copy (weights and optimizer state); `auto` stages only when that leaves half
    the available memory to everything else (data workers, the page cache the writes go
    through)."""
    size = _gb(need)
    if setting is False:
        return False, "checkpoints: written while training waits (checkpoint.async_save=false)"
    if setting is True or (available is not None and need <= available / 2):
        room = "" if available is None else f" of {_gb(available)} available"
        return True, (
            f"checkpoints: written in the background; training waits only while the state is "
            f"copied to host memory ({size}{room}; checkpoint.async_save)"
        )
    known = "an unknown amount" if available is None else _gb(available)
    return False, (
        f"checkpoints: written while training waits: a background save would stage {size} in "
        f"host memory, more than half of the {known} available (checkpoint.async_save=auto; "
        "true forces it)"
    )


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
