"""Cross-entropy from the final hidden states, with the logit soft cap inside.

Three implementations of the same loss (`model.loss`):

- `chunked` (default): rows are processed `model.loss_chunk` at a time; each chunk's logits
  are made, soft-capped, turned into the loss AND its gradient with respect to the logits, and
  dropped before the next chunk. The gradients of x and of the lm_head weight are accumulated
  during the forward pass (the loss is the last node of the graph, so its backward only scales
  them by the incoming gradient). The (B*T, vocab) logits never exist; at small vocabularies
  the chunks also stay in cache, which makes this the fastest path on a CPU.
- `plain`: one lm_head matmul over all rows, then F.cross_entropy (the textbook path).
- `liger`: Liger-Kernel's fused Triton kernel (CUDA only; `pip install liger-kernel`).

The soft cap c·tanh(l/c) is computed as 2c·sigmoid(2l/c) - c (the same function; sigmoid is
faster than tanh on CPUs) and the constant -c cancels inside the softmax. The lm_head weight
is used up to the real vocabulary, so padding rows are never predicted and get zero gradient.
`ignore_index=-1` targets count neither in the loss nor in its mean.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from littlelm.errors import ConfigError
from littlelm.model.ops import compute_dtype

IGNORE = -1
LossImpl = Literal["chunked", "plain", "liger"]
# the chunked loss keeps up to this many bytes of logit gradients for one lm_head-gradient matmul
GROUP_BYTES = 32 * 2**20


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return cap * torch.tanh(logits / cap) if cap else logits


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    cap: float | None,
    reduction: str = "mean",
    impl: LossImpl = "chunked",
    chunk: int = 256,
) -> torch.Tensor:
    """Cross-entropy of softcap(x @ weight[:vocab_size].T) against targets, in fp32.

    x (B, T, C), weight (V_padded, C), targets (B, T). reduction "mean" (over non-ignored
    targets) or "none" (per token, shape (B, T); ignored targets give 0).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if impl == "liger":
        return liger_cross_entropy(x, weight, targets, vocab_size, cap, reduction)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if impl == "plain" or (reduction == "none" and needs_grad):
        return plain_cross_entropy(x, weight, targets, vocab_size, cap, reduction)
    C = x.size(-1)
    x2, t2 = x.reshape(-1, C), targets.reshape(-1)  # (N, C), (N,)
    if reduction == "none" or not needs_grad:  # evaluation: no gradients to make per chunk
        with torch.no_grad():
            losses = chunked_token_losses(x2, weight, t2, vocab_size, cap, chunk)
        if reduction == "none":
            return losses.view(targets.shape)
        return losses.sum() / (t2 != IGNORE).sum().clamp(min=1)
    return _ChunkedCrossEntropy.apply(x2, weight, t2, vocab_size, cap, chunk, compute_dtype(x))


def plain_cross_entropy(x, weight, targets, vocab_size, cap, reduction="mean") -> torch.Tensor:
    """The textbook path: all logits at once, soft cap, F.cross_entropy in fp32."""
    logits = F.linear(x, weight[:vocab_size]).float()  # (B, T, V)
    logits = softcap(logits, cap)
    loss = F.cross_entropy(
        logits.reshape(-1, vocab_size),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction=reduction,
    )
    return loss.view(targets.shape) if reduction == "none" else loss


# ----------------------------------------------------------------------------------------------
# Chunked


def _capped_logits(
    logits: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 logits z (shifted by +cap, which the softmax ignores) and s = sigmoid(2l/cap).
    `logits` is a fresh matmul output and may be overwritten."""
    z = logits.float()
    if not cap:
        return z, None
    s = z.mul_(2.0 / cap).sigmoid_()  # (n, V), in (0, 1)
    return s * (2.0 * cap), s  # z + cap = 2c·s


def _exp_sum(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e = exp(z - max), written over z; its row sums S; lse = log S + max), per row (n, 1)."""
    m = z.amax(1, keepdim=True)  # (n, 1)
    e = z.sub_(m).exp_()
    total = e.sum(1, keepdim=True)
    return e, total, total.log().add_(m)


def chunked_token_losses(x, weight, targets, vocab_size, cap, chunk) -> torch.Tensor:
    """Per-row losses (N,) in fp32, chunk by chunk, without gradients (evaluation)."""
    dt = compute_dtype(x)
    w = weight[:vocab_size].to(dt)  # (V, C)
    out = torch.empty(x.size(0), dtype=torch.float32, device=x.device)
    for s in range(0, x.size(0), chunk):
        t = targets[s : s + chunk]
        z, _ = _capped_logits(x[s : s + chunk].to(dt) @ w.T, cap)  # (n, V)
        zt = z.gather(1, t.clamp(min=0)[:, None]).squeeze(1)
        _, _, lse = _exp_sum(z)
        out[s : s + chunk] = (lse.squeeze(1) - zt) * (t != IGNORE)
    return out


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy whose gradients are computed chunk by chunk in the forward pass."""

    @staticmethod
    def forward(ctx, x, weight, targets, vocab_size, cap, chunk, dt):
        # x (N, C), weight (V_padded, C), targets (N,)
        with torch.autocast(x.device.type, enabled=False):
            valid = targets != IGNORE
            # d(mean loss)/d(row loss): 1/count for counted rows, 0 for ignored ones
            row_scale = valid.float() / valid.sum().clamp(min=1)  # (N,)
            w = weight[:vocab_size].to(dt)  # (V, C)
            xc = x.to(dt)
            dx = torch.empty_like(xc)  # (N, C)
            dw = None  # (V, C) fp32, the sum of the groups' products
            total = torch.zeros((), dtype=torch.float32, device=x.device)
            group = group_rows(x.size(0), chunk, vocab_size, xc.element_size())
            buf = torch.empty(min(group, x.size(0)), vocab_size, dtype=dt, device=x.device)
            for g in range(0, x.size(0), group):
                n = min(group, x.size(0) - g)
                for s in range(0, n, chunk):
                    rows, m = slice(g + s, g + s + chunk), min(chunk, n - s)
                    total += _chunk_forward_backward(
                        xc[rows], w, targets[rows], row_scale[rows], cap, buf[s : s + m]
                    )
                dl, xg = buf[:n], xc[g : g + n]  # (n, V), (n, C)
                torch.mm(dl, w, out=dx[g : g + n])
                part = dl.T @ xg  # (V, C) in dt
                dw = part.float() if dw is None else dw.add_(part)
        ctx.save_for_backward(dx, dw)
        ctx.shapes = (x.dtype, weight.shape, weight.dtype, vocab_size)
        return total

    @staticmethod
    def backward(ctx, grad):
        dx, dw = ctx.saved_tensors
        x_dtype, w_shape, w_dtype, vocab = ctx.shapes
        gx = (dx * grad).to(x_dtype) if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:
            if w_shape[0] == vocab and w_dtype == dw.dtype:  # no padding rows to zero
                gw = dw * grad
            else:
                gw = torch.zeros(w_shape, dtype=w_dtype, device=dw.device)
                gw[:vocab] = dw * grad
        return gx, gw, None, None, None, None, None


def group_rows(n: int, chunk: int, vocab: int, itemsize: int) -> int:
    """Rows whose logits' gradients are kept together for one lm_head-gradient matmul: whole
    chunks filling at most GROUP_BYTES. One larger product instead of one per chunk saves a
    (V, C) fp32 accumulation per chunk (a cast and an add, which cost as much as the product)."""
    fit = max(1, GROUP_BYTES // (vocab * itemsize * chunk)) * chunk
    return min(fit, -(-n // chunk) * chunk)


def _chunk_forward_backward(xc, w, t, row_scale, cap, dl_out) -> torch.Tensor:
    """Loss sum of one chunk; writes d(loss)/d(logits) (n, V) into dl_out.

    With p = softmax(z) = e/S and d = dz/dlogits (1, or 4·s·(1-s) under the cap), the logits'
    gradient is row_scale·(p - onehot)·d = (row_scale/S)·(e·d - S·d[target]·onehot).
    """
    z, s = _capped_logits(xc @ w.T, cap)  # (n, V) fp32
    tc = t.clamp(min=0)[:, None]  # (n, 1)
    zt = z.gather(1, tc)
    e, total, lse = _exp_sum(z)
    loss = ((lse - zt).squeeze(1) * row_scale).sum()
    if s is None:
        d_t = torch.ones_like(total)
    else:
        d = s.addcmul_(s, s, value=-1.0)  # s·(1-s), in place of s
        d_t = d.gather(1, tc)
        e.mul_(d)
    e.scatter_add_(1, tc, -total * d_t)
    scale = row_scale[:, None] * (4.0 if cap else 1.0) / total  # (n, 1)
    torch.mul(e, scale, out=dl_out)  # (n, V)
    return loss


# ----------------------------------------------------------------------------------------------
# Liger (CUDA)


def check_loss_impl(impl: LossImpl, device: torch.device) -> None:
    """Raise a ConfigError when `impl` cannot run on `device` (only liger has requirements)."""
    if impl != "liger":
        return
    if device.type != "cuda":
        raise ConfigError(
            [
                f"model.loss=liger runs on CUDA only, this run is on {device.type}; use model.loss=chunked"
            ]
        )
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError:
        raise ConfigError(
            [
                "model.loss=liger needs liger-kernel: pip install 'littlelm[gpu]' "
                "(or use model.loss=chunked)"
            ]
        ) from None


def liger_cross_entropy(x, weight, targets, vocab_size, cap, reduction="mean") -> torch.Tensor:
    check_loss_impl("liger", x.device)
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    C, dt = x.size(-1), compute_dtype(x)
    loss = liger_fused_linear_cross_entropy(
        x.reshape(-1, C).to(dt),
        weight[:vocab_size].to(dt),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction=reduction,
        softcap=cap,
    )
    loss = loss[0] if isinstance(loss, tuple) else loss
    return loss.float().view(targets.shape) if reduction == "none" else loss.float()
