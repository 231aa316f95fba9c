"""Low-precision parameters: stochastic rounding, and an AdamW that uses it.

With bf16 master weights (`train.master_weights: bf16`) an update smaller than half a bf16
step (1/256 of the weight) is lost to round-to-nearest, so long runs at small learning rates
stall. Stochastic rounding (`train.stochastic_rounding: true`) rounds the fp32 result of each
update up or down at random with probabilities that make the rounding unbiased: E[round(x)] = x,
so small updates survive on average.
"""

from __future__ import annotations

import torch


def stochastic_round_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Write fp32 `src` into bf16 `dst`, rounding each element up or down at random.
    `src` is used as scratch space and overwritten.

    A bf16 number is the top 16 bits of an fp32 one: adding uniform noise to the 16 bits that
    are cut off and then cutting them rounds up with probability (cut-off part) / 2^16.
    """
    assert dst.dtype == torch.bfloat16 and src.dtype == torch.float32
    bits = src.view(torch.int32)
    bits.add_(torch.randint_like(bits, 0, 1 << 16)).bitwise_and_(-65536)
    return dst.copy_(src)  # exact: the low 16 bits are zero


class StochasticAdamW(torch.optim.Optimizer):
    """AdamW for bf16 parameters: moments kept in bf16, the update computed in fp32 and
    written back with stochastic rounding. Same hyperparameters and semantics as
    torch.optim.AdamW (decoupled weight decay, bias correction)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "StochasticAdamW does not take a closure"
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)

    def _update(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        (b1, b2), lr = group["betas"], group["lr"]
        state["step"] += 1
        t = state["step"].item()
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.float() / (1 - b2**t)).sqrt_().add_(group["eps"])
        new = p.float().mul_(1 - lr * group["weight_decay"])
        new.addcdiv_(m.float(), denom, value=-lr / (1 - b1**t))
        stochastic_round_(p, new)
