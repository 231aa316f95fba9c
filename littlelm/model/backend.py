"""Kernel backends: the model asks its backend for attention, norm, elementwise and loss kernels.

`model.backend` names one (`auto` picks by the device the model runs on):

- `cpu`: littlelm's kernels tuned on a 2-core CPU (benchmarks/RESULTS.md): blocked causal
  attention (model/attention.py), elementwise ops with hand-written backward passes
  (model/ops.py), the chunked loss with forward-time gradients (model/loss.py); eager.
- `cuda`: PyTorch's own kernels: F.scaled_dot_product_attention (FlashAttention on a GPU),
  F.rms_norm, the same elementwise arithmetic with autograd's backward, the Liger fused loss
  when liger-kernel is installed (else the chunked loss, whose logits stay small: a plain loss
  would make the full logits). (Whether the model is torch.compiled is the train section's
  choice, `train.compile`: on CUDA by default.) No GPU has measured these against the CPU kernels yet: they are PyTorch's defaults until one does.

Both compute the same function: on the same device they agree to rounding (tests/test_backend.py).
On a device other than the CPU `auto` means `cuda`'s kernels only on CUDA; elsewhere (MPS) it
keeps `cpu`'s, whose attention already uses SDPA off the CPU.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from littlelm.model import ops
from littlelm.model.attention import causal_attention

BackendName = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class Backend:
    """One device's kernel set. `loss` is what `model.loss: auto` runs."""

    name: str
    attention: Callable  # causal (q, k, v) (B, H|Hkv, T, D) -> (B, H, T, D)
    rms_norm: Callable  # (x, weight=None, eps=None, out_dtype=None)
    relu_squared: Callable
    residual_mix: Callable  # (x, x0, a, b) -> a·x + b·x0
    gated_add: Callable  # (v, gate, ve) -> v + gate[..., None]·ve
    apply_rope: Callable  # (x, cos, sin)
    loss: str
    kernels: str  # one line for the start-up summary


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's fused causal attention (FlashAttention or memory-efficient on a GPU)."""
    gqa = k.size(1) != q.size(1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def torch_rms_norm(x, weight=None, eps=None, out_dtype=None) -> torch.Tensor:
    """F.rms_norm in x's own dtype (autocast off, so a bf16 q/k is not saved as an fp32 copy),
    then cast to `out_dtype`; eps as in ops.rms_norm."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    with torch.autocast(x.device.type, enabled=False):
        y = F.rms_norm(x, (x.size(-1),), eps=eps)
    y = y.to(out_dtype or x.dtype)
    return y if weight is None else y * weight.to(y.dtype)


def autograd_relu_squared(h: torch.Tensor) -> torch.Tensor:
    return torch.relu(h).square()


def autograd_residual_mix(x, x0, a, b) -> torch.Tensor:
    return torch.addcmul(x * a, x0, b)


def autograd_gated_add(v, gate, ve) -> torch.Tensor:
    return torch.addcmul(v, gate.unsqueeze(-1), ve)


def autograd_rope(x, cos, sin) -> torch.Tensor:
    return ops._rotate(x, cos, sin)


def has_liger() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


CPU = Backend(
    name="cpu",
    attention=causal_attention,
    rms_norm=ops.rms_norm,
    relu_squared=ops.relu_squared,
    residual_mix=ops.residual_mix,
    gated_add=ops.gated_add,
    apply_rope=ops.apply_rope,
    loss="chunked",
    kernels="blocked attention, hand-written backward ops",
)


def cuda_backend() -> Backend:
    """The CUDA kernel set; its loss depends on whether liger-kernel is installed."""
    return Backend(
        name="cuda",
        attention=sdpa_causal,
        rms_norm=torch_rms_norm,
        relu_squared=autograd_relu_squared,
        residual_mix=autograd_residual_mix,
        gated_add=autograd_gated_add,
        apply_rope=autograd_rope,
        loss="liger" if has_liger() else "chunked",
        kernels="SDPA attention, F.rms_norm, autograd backward ops",
    )


CUDA = cuda_backend()
BACKENDS = {"cpu": CPU, "cuda": CUDA}


def backend_name(configured: str, device: torch.device | str) -> str:
    """The backend `configured` (auto|cpu|cuda) means on `device`."""
    if configured != "auto":
        return configured
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    return "cuda" if kind == "cuda" else "cpu"


def select_backend(configured: str, device: torch.device | str) -> Backend:
    return BACKENDS[backend_name(configured, device)]


def run_backend(model_cfg, device: torch.device | str) -> Backend:
    """The backend a run's model uses on `device` (models without a `backend` field: auto)."""
    return select_backend(getattr(model_cfg, "backend", "auto"), device)


def loss_impl(configured: str, backend: Backend) -> str:
    """`model.loss`, with `auto` replaced by the backend's loss."""
    return backend.loss if configured == "auto" else configured
