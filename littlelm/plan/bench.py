"""`littlelm bench`: a realistic smoke test of a run on the machine at hand.

Inside one measured window it runs the real Trainer: the data loader with its prefetch thread,
the configured optimizer (its state populated by the first step), compile if configured,
`steps` steps, a checkpoint save, a fresh Trainer that resumes from it (the optimizer state is
loaded), and `steps` more. It reports peak allocated and reserved memory (CUDA) or peak tensor
memory and peak RSS (CPU), tokens/s and MFU, each beside the plan's prediction, and stores the
measurement (plan/speed.py) so that `plan` calibrates its speed on this device with it.

It works in a directory of its own making, `<run.name>-bench` (marked by
`rundir.BENCH_MARKER`), and trains in a private temporary directory inside it, deleted at the
end; it refuses a `<run.name>-bench` it did not make, so the user's run is never touched.
"""

from __future__ import annotations

import contextlib
import gc
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from littlelm.config import to_tree
from littlelm.data.build import build_data
from littlelm.errors import RunDirError
from littlelm.model.gpt import flops_per_token
from littlelm.model.kernels import run_backend
from littlelm.plan import speed
from littlelm.plan.calibration import cuda_calibration
from littlelm.plan.cost import GIB, load_catalog
from littlelm.plan.dims import Dims
from littlelm.plan.planner import current_rss, local_plan, proc_status_bytes, step_memory
from littlelm.plan.trace import PARAMS, STATE, MemoryAccountant, optimizer_tensors
from littlelm.progress import Progress
from littlelm.train.callbacks import Callback
from littlelm.train.checkpoint.rundir import BENCH_MARKER, is_run_dir
from littlelm.train.device import peak_flops, pick_device, with_precision


class StepTimer(Callback):
    """Wall time of every optimizer step (the trainer synchronizes at the end of each)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last: float | None = None

    def on_train_start(self, trainer) -> None:
        self._last = time.perf_counter()

    def on_step_end(self, trainer, metrics: dict) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now


def bench_config(cfg, steps: int):
    """The run, renamed `<name>-bench`, for 2 x steps steps, without evals, samples, periodic
    checkpoints or an end-of-run save (the bench saves once, in the middle)."""
    c = cfg.model_copy(deep=True)
    c.run.name = f"{cfg.run.name}-bench"
    c.train.max_steps = 2 * steps
    c.train.max_tokens = c.train.max_steps * c.train.batch_tokens
    c.train.log_every = max(c.train.log_every, 2 * steps)
    c.eval.every, c.eval.at_end = 0, False
    c.checkpoint.every, c.checkpoint.at_end = 0, False
    # the save blocks, as the trace's step accounts: a background save's staged copy is host
    # memory, which `plan` reports on its checkpoints line, not device memory
    c.checkpoint.async_save = False
    c.callbacks = []
    return c


def run_bench(cfg, steps: int = 4, quiet: bool = True) -> dict:
    c = bench_config(cfg, steps)
    result_dir = c.run_dir()
    with scratch_dir(result_dir) as work:
        c.run.out_dir, c.run.name = str(result_dir), work.name
        result = _bench_in(c, steps, quiet)
    result["run"] = result_dir.name
    result["stored"] = str(speed.save_measurement(result, result_dir))
    return result


def bench_result_dir(path: Path) -> None:
    """Make `path` the bench's own directory, or refuse one the bench did not make."""
    if (path / BENCH_MARKER).is_file():
        return
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        what = "a training run" if path.is_dir() and is_run_dir(path) else "files"
        raise RunDirError(
            f"littlelm bench works in {path}, which holds {what} that bench did not make, so it "
            "refuses to touch it; bench under another run.name (the bench directory is "
            "<run.name>-bench) or move that directory away"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / BENCH_MARKER).write_text("made by littlelm bench; its scratch is deleted\n")
    except OSError as e:
        raise RunDirError(
            f"cannot create the bench directory {path}: {e.strerror}; point run.out_dir at a "
            "writable directory"
        ) from None


@contextlib.contextmanager
def scratch_dir(result_dir: Path):
    """A private temporary directory inside the bench's own directory, deleted afterwards
    (concurrent benches each get their own; nothing else is ever deleted)."""
    bench_result_dir(result_dir)
    work = Path(tempfile.mkdtemp(prefix="scratch-", dir=result_dir))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench_in(c, steps: int, quiet: bool) -> dict:
    from littlelm.train.trainer import Trainer

    device = pick_device(c.run.device)
    c = with_precision(c, device)  # what the Trainer computes in (auto: littlelm/hardware.py)
    build_data(c.data, lambda _: None)  # prepare (cached) before the window
    peak_flops(device, precision=c.train.precision)  # a CPU's probe (cached): not in the window
    compiled = c.train.compiles(device)
    probe = CudaProbe(device) if device.type == "cuda" else CpuProbe(track=not compiled)
    progress = Progress(io.StringIO()) if quiet else Progress()
    timers = [StepTimer(), StepTimer()]
    t0 = time.perf_counter()
    with probe:
        first = Trainer(c, resume="never", progress=progress)
        first.callbacks.append(timers[0])
        first.fit(stop_after=steps)  # stops early, so it saves a checkpoint
        del first
        # the first trainer of a process is not freed by `del` alone: torch imports torch._dynamo
        # lazily in the first optimizer's __init__, and an exception caught there keeps a
        # traceback cycle holding the frames that called it (this trainer's __init__ among them)
        gc.collect()
        second = Trainer(c, resume="auto", progress=progress)
        probe.adopt(second)
        second.callbacks.append(timers[1])
        second.fit(stop_after=steps)
        resumed = second.step
        del second
    wall = time.perf_counter() - t0
    return summarize(c, device, probe, timers, wall, resumed)


def summarize(c, device, probe, timers: list[StepTimer], wall: float, resumed: int) -> dict:
    # the first step of each Trainer warms up (allocations, compile): time the others
    times = timers[0].times[1:] + timers[1].times[1:] or timers[0].times + timers[1].times
    step_s = statistics.median(times)
    tok_s = c.train.batch_tokens / step_s
    fpt = flops_per_token(c.model, c.train.seq_len)
    d = Dims.of(c)
    gpu = load_catalog().identify(probe.device_name) if device.type == "cuda" else None
    # the catalog's peak for a GPU it knows, so that plan's MFU x peak gives back the tokens/s
    peak = speed.peak_flops(gpu, d) if gpu else peak_flops(device, precision=c.train.precision)
    out = {
        "device": probe.device_name,
        "kind": device.type,
        "workload": speed.workload_key(c),
        "run": c.run.name,
        "parameters": d.n_params,
        "micro_batch": c.train.micro_batch_size,
        "seq_len": c.train.seq_len,
        "grad_accum": c.train.grad_accum,
        "precision": c.train.precision,
        "compile": c.train.compiles(device),
        "backend": run_backend(c.model, device).name,
        "steps": 2 * (c.train.max_steps // 2),
        "resumed_to_step": resumed,
        "wall_s": wall,
        "step_s": step_s,
        "tok_s": tok_s,
        "mfu": tok_s * fpt / peak if peak == peak and peak > 0 else None,
        "peak_flops": peak,
        **probe.results(),
        "config": to_tree(c),  # its shapes: plan re-models them to calibrate (planner.py)
    }
    out.update(predictions(c, d, device, probe, out))
    if d.groups is not None:
        # RL's step is mostly sampling, token by token, which the step model does not time: its
        # memory is checked, its speed must not calibrate every later plan on this device
        for k in ("speed_ratio", "predicted_tok_s"):
            out.pop(k, None)
    return out


def predictions(c, d: Dims, device, probe, measured: dict) -> dict:
    """What the plan predicts for this bench, and the step model's ratio to the measurement
    (`speed_ratio`, measured / modelled step time), which `plan` uses on this device."""
    if device.type == "cpu":  # the local plan, uncalibrated: this CPU's trace and rates
        lp = local_plan(c, 1, [], 0.0, base_rss=measured.get("rss_at_start") or 0)
        return {
            "gpu": None,
            "device_key": lp.device,
            "predicted_tensor_peak": lp.tensor_peak,
            "predicted_host_resume": lp.resume,
            "predicted_rss": lp.process_peak,
            "predicted_tok_s": lp.tok_s,
            "speed_ratio": measured["step_s"] / sum(lp.parts.values()),
        }
    catalog = load_catalog()
    gpu = catalog.identify(probe.device_name)
    allocated = step_memory(c)[1].peak + catalog.defaults.workspace_gib * GIB  # cuBLAS's too
    pred = {
        "gpu": gpu.name if gpu else None,
        "device_key": speed.device_key(device),
        "predicted_allocated": allocated,
        "predicted_reserved": allocated * (1 + catalog.defaults.allocator_margin),
    }
    if gpu:
        modelled = speed.step_time(d, speed.catalog_rates(gpu, catalog, d)).raw
        ratio = cuda_calibration(catalog, gpu, d.compile).ratio
        pred["predicted_tok_s"] = d.tokens * d.grad_accum / (modelled * ratio)
        pred["speed_ratio"] = measured["step_s"] / modelled
    return pred


# ----------------------------------------------------------------------------------------------
# Measuring memory


class CudaProbe:
    """torch.cuda peak statistics over the window, and the memory outside PyTorch (context)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.device_name = torch.cuda.get_device_name(device)

    def __enter__(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        self.outside = (total - free) - torch.cuda.memory_reserved(self.device)
        self.total = total
        return False

    def adopt(self, trainer) -> None:
        pass

    def results(self) -> dict:
        return {
            "peak_allocated": torch.cuda.max_memory_allocated(self.device),
            "peak_reserved": torch.cuda.max_memory_reserved(self.device),
            "outside_pytorch": self.outside,
            "total_memory": self.total,
        }


class CpuProbe:
    """Peak tensor memory (every storage PyTorch allocates, counted at the dispatcher) and the
    process's peak resident set size (reset at the start where Linux allows it)."""

    def __init__(self, track: bool = True):
        self.device_name = "cpu"
        self.acct = MemoryAccountant() if track else None
        self.rss_reset = False

    def __enter__(self):
        self.rss_reset = reset_peak_rss()
        self.rss_start = current_rss()
        if self.acct is not None:
            self.acct.__enter__()
        return self

    def __exit__(self, *exc):
        if self.acct is not None:
            self.acct.__exit__(*exc)
        self.rss_peak = peak_rss()
        return False

    def adopt(self, trainer) -> None:
        """Count what a resume loaded behind the dispatcher's back (checkpoint tensors)."""
        if self.acct is None:
            return
        for p in trainer.model.parameters():
            self.acct.track(p, PARAMS)
        for t in optimizer_tensors(trainer.optimizer):
            self.acct.track(t, STATE)

    def results(self) -> dict:
        return {
            "peak_tensor": self.acct.peak.total if self.acct else None,
            "peak_rss": self.rss_peak,
            "rss_at_start": self.rss_start,
            "rss_peak_is_window": self.rss_reset,
        }


def reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) of this process."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    hwm = proc_status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    with contextlib.suppress(ImportError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return None
