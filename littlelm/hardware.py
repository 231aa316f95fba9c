"""What the hardware computes natively: the answer behind every `auto` precision choice.

`train.precision: auto` and Muon's `optimizer.ns_dtype: auto` compute in bf16 only where the
device has bf16 arithmetic units. Elsewhere bf16 matrix products are emulated in software, which
is slower than fp32, not faster: on a 2-core AMD EPYC without AVX-512 (2026-12-01) a bf16
matmul ran at 1.0 GFLOP/s against 34.6 GFLOP/s in fp32, so the 6-minute demo took hours.

LITTLELM_NATIVE_BF16=1 or 0 overrides the detection for every device: a test suite or CI run
checks the other precision's path on the hardware at hand (forced bf16 is emulated where the
units are missing: slow, but correct), and a user whose CPU the detection misreads fixes it.
"""

from __future__ import annotations

import functools
import os

import torch

from littlelm.errors import LittleLMError

OVERRIDE = "LITTLELM_NATIVE_BF16"


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cuda", "cpu", "mps") multiplies bf16 matrices in hardware:
    $LITTLELM_NATIVE_BF16 (1 or 0) where set, else what the device reports (`detected_bf16`)."""
    forced = os.environ.get(OVERRIDE, "").strip()  # read per call, not cached: tests set it
    if forced == "":
        return detected_bf16(device_type)
    if forced in ("1", "0"):
        return forced == "1"
    raise LittleLMError(
        f"{OVERRIDE}={forced!r}: set it to 1 (compute `auto` precision in bf16) or 0 (in fp32), "
        "or unset it to let littlelm detect the hardware"
    )


@functools.cache
def detected_bf16(device_type: str) -> bool:
    """Whether `device_type` multiplies bf16 matrices in hardware, as the device reports it.

    - cuda: compute capability 8.0 or newer (Ampere on); older GPUs (V100, T4) emulate it.
    - cpu, x86: AVX-512 BF16 (Zen 4, Cooper Lake, Sapphire Rapids on) or AMX. Without them,
      oneDNN has no bf16 matmul kernel worth using and fp32 is the faster choice.
    - cpu on other architectures, mps: assumed native (Apple M2 on, Graviton 3 on, and what
      littlelm did before `auto`); set the precision explicitly if that is wrong for yours.
    """
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device_type == "cpu":
        flags = torch.cpu.get_capabilities()
        if flags.get("architecture") not in ("x86_64", "x86", "i386", "AMD64"):
            return True
        return bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))
    return True


def auto_precision(precision: str, device_type: str) -> str:
    """`precision` ("auto", "bf16", "fp32") made concrete for `device_type`."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device_type) else "fp32"
