"""Running a sweep's variants: one `littlelm train` process each, resumable.

The sweep directory holds sweep.json (the base config, the variants and their status), one run
directory per variant, logs/NAME.log with each variant's output, and report/ (the comparison).
Variants run one after another, or side by side with `--devices 0,1,...` (one variant per GPU,
CUDA_VISIBLE_DEVICES set for each). Run again, the same command skips finished variants (their
run directory holds an end record) and resumes the others from their newest checkpoint, as
`littlelm train` does. A SIGTERM or SIGINT to the sweep reaches every running variant, which
saves and stops; on Linux a variant also gets SIGTERM if the sweep process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from littlelm.sweep.spec import SweepError, Variant

MANIFEST = "sweep.json"
PR_SET_PDEATHSIG = 1


def finished(run_dir: Path) -> bool:
    """True when the run's metrics hold an end record (it trained to its end)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if '"kind": "end"' in line:
                return True
    return False


def read_manifest(path: Path) -> dict:
    """sweep.json as written by `write_manifest`; a hand-edited or cut-short one is an error."""
    why: str | None  # what is wrong with it
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = f"{type(e).__name__}: {e}"
    else:
        why = _manifest_problem(data)
        if why is None:
            return data
    raise SweepError(
        f"{path} is not a sweep manifest this littlelm can read ({why}); it was cut short or "
        "edited. Restore it, or run the sweep under another --name (a new sweep directory)"
    )


def _manifest_problem(data) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, found {type(data).__name__}"
    if not isinstance(data.get("base"), str):
        return "no 'base' config path"
    variants = data.get("variants")
    if not isinstance(variants, list) or not variants:
        return "no 'variants' list"
    for v in variants:
        if not isinstance(v, dict) or not isinstance(v.get("name"), str):
            return "a variant without a name"
        if not isinstance(v.get("overrides"), list):
            return f"variant {v['name']!r} has no 'overrides' list"
    if not isinstance(data.get("shared", []), list):
        return "'shared' is not a list"
    return None


def write_manifest(
    sweep_dir: Path, base: str, args: dict, shared: list[str], variants: list[Variant]
) -> None:
    """sweep.json; a different sweep already in the directory is an error, not overwritten.

    `shared` holds the overrides every variant trains with (the command's key=value and
    --budget): a finished variant trained with those, so a rerun that changes them (or the base,
    or the variants) would label old results with new settings, and is refused."""
    path = sweep_dir / MANIFEST
    data = {"base": base, **args, "shared": shared, "variants": [asdict(v) for v in variants]}
    if path.is_file():
        old = read_manifest(path)
        differ = []
        if old["base"] != base:
            differ.append(f"base config {old['base']} (now {base})")
        if "shared" in old and old["shared"] != shared:
            differ.append(f"shared settings {old['shared']} (now {shared})")
        elif "shared" not in old and (old.get("overrides"), old.get("budget")) != (
            args.get("overrides"),
            args.get("budget"),
        ):  # a manifest from before `shared` was recorded
            differ.append(f"overrides {old.get('overrides')} and --budget {old.get('budget')}")
        if [(v["name"], v["overrides"]) for v in old["variants"]] != [
            (v.name, v.overrides) for v in variants
        ]:
            differ.append("variants (its --set/--zip/--seeds)")
        if differ:
            raise SweepError(
                f"{sweep_dir} holds another sweep; it differs in its {'; '.join(differ)}. Its "
                "finished variants were trained with those settings, so they are not reused "
                "under new ones: pass another --name for a new sweep, or repeat that sweep's "
                "exact arguments to resume it"
            )
    sweep_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


class SweepLock:
    """One sweep process per sweep directory: an exclusive `flock` on SWEEP_DIR/.sweep.lock,
    held from before sweep.json is written until the last variant ends. A second sweep of the
    directory is refused at once, before it touches anything (it would start the same variants,
    append to their logs and report them failed). The kernel drops the lock when the process
    dies, so a killed sweep leaves none behind."""

    def __init__(self, sweep_dir: Path):
        self.path = sweep_dir / ".sweep.lock"
        self._fd: int | None = None

    def __enter__(self) -> SweepLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise SweepError(
                f"cannot use the sweep directory {self.path.parent}: {e.strerror}; point "
                "run.out_dir at a writable directory"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SweepError(
                f"{self.path.parent} is in use by another `littlelm sweep` (pid {holder}); "
                "nothing was started. Wait for it to finish (or stop it), then run the same "
                "command to resume it, or pass another --name for a new sweep"
            ) from None
        except OSError:  # a filesystem without locks: run unguarded, as before
            os.close(fd)
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _die_with_parent() -> None:
    """In the child: SIGTERM when the sweep process dies (Linux), so no variant trains on as an
    orphan holding its run directory's lock."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def launch(cmd: list[str], log: Path, device: str | None) -> subprocess.Popen:
    env = dict(os.environ)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        return subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


def train_command(base: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "littlelm", "train", base, *overrides]


class Pool:
    """Variants on devices: at most one process per device; `start(job, device)` makes one."""

    def __init__(self, devices: Sequence[str | None], start: Callable, say: Callable = print):
        self.free, self.start, self.say = list(devices), start, say
        self.running: dict = {}  # process -> (job, device)
        self.failed: list[str] = []

    def run(self, jobs: list, poll: float = 0.5) -> list[str]:
        pending = list(jobs)
        with self._forwarding_signals():
            while pending or self.running:
                while pending and self.free:
                    job, device = pending.pop(0), self.free.pop(0)
                    self.running[self.start(job, device)] = (job, device)
                self._reap()
                if self.running:
                    time.sleep(poll)
        return self.failed

    def _reap(self) -> None:
        for proc, (job, device) in list(self.running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.running[proc]
            self.free.append(device)
            if not job.done():
                self.failed.append(f"{job.name} (exit {rc}; log: {job.log})")
            self.say(job.summary(rc))

    @contextlib.contextmanager
    def _forwarding_signals(self):
        """SIGTERM/SIGINT: every running variant gets SIGTERM (it saves), then the sweep stops."""

        def stop(signum, _frame):
            for proc in self.running:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
            for proc in self.running:
                proc.wait()
            raise SweepError(
                f"stopped by {signal.Signals(signum).name}; every running variant saved a "
                "checkpoint. Run the same command to resume the sweep"
            )

        old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
