"""Device choice, mixed precision, and the peak FLOP/s that MFU is measured against."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from littlelm.data.cache import cache_root
from littlelm.errors import LittleLMError
from littlelm.hardware import auto_precision, native_bf16

# Dense bf16 tensor-core peak (FLOP/s) by a substring of torch.cuda.get_device_name().
# Most specific names first. Sources: vendor datasheets (dense, without sparsity).
CUDA_BF16_PEAK = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("RTX 5090", 209e12),
    ("RTX 4090", 165e12),
    ("A10", 125e12),
    ("L4", 121e12),
    ("T4", 65e12),
]


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise LittleLMError(
            "run.device is cuda but no CUDA device is visible; set run.device=auto or cpu"
        )
    return torch.device(requested)


def with_precision(cfg, device: torch.device):
    """`cfg` (a RunConfig) with train.precision made concrete for `device` (RunConfig.with_precision)."""
    return cfg.with_precision(native_bf16(device.type))


def inference_precision(requested: str, trained: str, device: torch.device) -> str:
    """The precision to evaluate or sample in: `requested`, or for `auto` the one the model
    trained in (its config's train.precision), unless `device` would only emulate bf16, where
    fp32 is faster and at least as exact."""
    if requested != "auto":
        return requested
    if trained == "bf16" and not native_bf16(device.type):
        return "fp32"
    return auto_precision(trained, device.type)


def autocast(device: torch.device, precision: str):
    """bf16 autocast for matmuls (weights stay fp32 unless configured otherwise), or nothing;
    `auto`: bf16 where the device computes it natively."""
    if auto_precision(precision, device.type) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_flops(
    device: torch.device, cache_dir: Path | None = None, precision: str = "bf16"
) -> float:
    """Peak FLOP/s of `device`: the bf16 table for CUDA, a one-off matmul probe (cached) in the
    run's `precision` for CPUs (MFU is then measured against what the run computes in)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in CUDA_BF16_PEAK:
            if key in name:
                return flops
        return float("nan")
    if device.type == "cpu":
        return cpu_peak_flops(cache_dir, auto_precision(precision, "cpu"))
    return float("nan")


def cpu_peak_flops(cache_dir: Path | None = None, precision: str = "bf16") -> float:
    """Matmul FLOP/s this process reaches with its threads in `precision` (bf16 or fp32),
    probed once and cached per (CPU, core count, thread count, torch version, precision) in
    $LITTLELM_CACHE/cpu_peak.json."""
    key, path = _peak_key(precision), (cache_dir or cache_root()) / "cpu_peak.json"
    cached = _read_peaks(path)
    if key in cached:
        return cached[key]
    cached[key] = probe_matmul(dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    _write_peaks(path, cached)
    return cached[key]


def raise_cpu_peak(achieved: float, precision: str, cache_dir: Path | None = None) -> None:
    """Cache `achieved` FLOP/s as this CPU's peak in `precision`: a run computed that fast, so
    the probe read low (a busy machine, kernels not yet warm) and every MFU against it would
    be overstated, above 100%."""
    key, path = _peak_key(precision), (cache_dir or cache_root()) / "cpu_peak.json"
    cached = _read_peaks(path)
    if achieved > cached.get(key, 0.0):
        cached[key] = achieved
        _write_peaks(path, cached)


def _peak_key(precision: str) -> str:
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    key = f"{PROBE_VERSION}-{cpu}-{os.cpu_count()}cpu-{threads}threads-torch{torch.__version__}"
    return key + ("" if precision == "bf16" else f"-{precision}")  # bf16 keys as before


def _read_peaks(path: Path) -> dict:
    if path.is_file():
        with contextlib.suppress(ValueError):
            return json.loads(path.read_text())
    return {}


def _write_peaks(path: Path, peaks: dict) -> None:
    with contextlib.suppress(OSError):  # a cache: a read-only home only costs a re-probe
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(peaks, indent=2))


PROBE_VERSION = "v2"
PROBE_SIZES = (512, 1024, 2048)


def probe_matmul(
    sizes: tuple[int, ...] = PROBE_SIZES, seconds: float = 0.5, dtype: torch.dtype = torch.bfloat16
) -> float:
    """Best FLOP/s in `dtype` over ~`seconds` of repeated n×n×n products for each n in `sizes`.

    The fastest size differs between CPUs (on a 2-core Zen 4, 512 and 1024 reach 0.44 TFLOP/s
    and 2048 0.42), so the peak is the best over a few sizes. A CPU without native bf16 (no
    AVX-512 BF16 or AMX: 1 GFLOP/s on a 2-core EPYC of 2026-12-01, where one 2048 product takes
    17 s) stops after the first size whose product alone takes a tenth of `seconds`: larger ones
    would only take longer to say the same.
    """
    best = 0.0
    # a generator of its own: only a run's first probe (per thread count: 2-rank torchrun runs
    # one thread per rank) draws these, so drawing from torch's RNG would shift a fresh run's
    # later draws (LoRA dropout masks, stochastic rounding) by whether the cache had the peak
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype, generator=gen)
        b = torch.randn(n, n, dtype=dtype, generator=gen)
        t = time.perf_counter()
        a @ b  # warm-up
        last = time.perf_counter() - t
        best = max(best, 2 * n**3 / last)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t = time.perf_counter()
            a @ b
            last = time.perf_counter() - t
            best = max(best, 2 * n**3 / last)
        if last > seconds / 10:
            break
    return best


def tune_cpu_allocator() -> bool:
    """Make glibc's malloc keep freed tensor memory for reuse instead of returning it to the OS.

    By default every activation larger than a few MB is a fresh mmap whose pages the kernel
    zeroes on first touch, every step; keeping them (mmap threshold raised to its 32 MB maximum,
    trim threshold to 1 GB) made CPU training steps about 7% faster here. Memory freed by the
    model is then reused by the next step rather than given back. Linux with glibc only;
    returns whether it applied.
    """
    if sys.platform != "linux":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))
