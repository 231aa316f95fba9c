"""AdamW's group kind: torch's own AdamW arithmetic (`torch.optim.adam.adam`: the fused kernel
on CPU and CUDA, foreach elsewhere), the stochastic-rounding AdamW of optim/lowp.py for bf16
parameters, or bitsandbytes' 8-bit AdamW. Elementwise: ZeRO-1 steps each rank's flat slice and
FSDP2's DTensor shards step as they are (the optimizer's `step_elementwise`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.optim.adam import adam

from littlelm.optim.base import GroupRule
from littlelm.optim.lowp import stochastic_adamw_

BNB_MIN_8BIT = 4096  # bitsandbytes keeps tensors smaller than this in 32-bit state
BNB_BLOCK = 256  # elements per quantization block (one fp32 absmax each)


@dataclass(frozen=True)
class AdamWRule(GroupRule):
    """AdamW; `betas`, `eps`: a new group's options; `eight_bit`: bitsandbytes' AdamW8bit
    (CUDA), its state kept in the optimizer's."""

    kind: ClassVar[str] = "adamw"
    scalar_state: ClassVar[tuple[str, ...]] = ("step",)

    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    eight_bit: bool = False

    def group_options(self, fused: bool) -> dict[str, Any]:
        return {"betas": self.betas, "eps": self.eps, "fused": fused}

    def prepare(self, opt: Any, groups: list[dict]) -> Any:
        if not self.eight_bit:
            return None
        import bitsandbytes as bnb  # optim/groups.py checked that it is installed

        # it steps these very group dicts (its own options added), its state kept in ours
        return bnb.optim.AdamW8bit(groups, betas=groups[0]["betas"], eps=groups[0]["eps"])

    def step_groups(self, opt: Any, groups: list[dict]) -> None:
        if self.eight_bit:  # load_state_dict replaces both, so hand them over on every step
            helper = opt.helpers[self.kind]
            helper.param_groups, helper.state = groups, opt.state
            helper.step()
        else:
            opt.step_elementwise(groups, self.update)

    def update(
        self,
        opt: Any,
        group: dict,
        keys: list[torch.Tensor],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
    ) -> None:
        if not params:
            return
        states = [_state(opt, k, p, group) for k, p in zip(keys, params)]
        if opt.stochastic_rounding:
            for p, g, s in zip(params, grads, states):
                stochastic_adamw_(p, g, s, group)
            return
        beta1, beta2 = group["betas"]
        adam(
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            foreach=not group["fused"],
            fused=group["fused"],
            decoupled_weight_decay=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    # -- what the planner reads -----------------------------------------------------------------

    def state_bytes(self, numel: int, param_bytes: int) -> tuple[int, ...]:
        """exp_avg + exp_avg_sq in the parameters' dtype and a step counter (torch's fused
        AdamW); 8-bit: one byte each plus an fp32 absmax per block of 256, or fp32 moments for
        a tensor too small to quantize."""
        if self.eight_bit and numel >= BNB_MIN_8BIT:
            absmax = 4 * -(-numel // BNB_BLOCK)
            return (numel, numel, absmax, absmax)
        if self.eight_bit:
            return (4 * numel, 4 * numel)
        return (param_bytes * numel, param_bytes * numel, 4)

    def scratch_bytes(
        self, numel: int, param_bytes: int, stochastic_rounding: bool
    ) -> tuple[int, ...]:
        # fused AdamW none; the stochastic-rounding AdamW three fp32 tensors (optim/lowp.py)
        return (4 * numel,) * 3 if stochastic_rounding else ()

    def traffic(self, param_bytes: int) -> float:
        # foreach AdamW: parameter, gradient and two moments read, three written, in about
        # three passes of torch's multi-tensor kernels
        moments = 2 * 2 if self.eight_bit else param_bytes * 3
        return 3 * (param_bytes * 4 + moments)


def _state(opt: Any, key: torch.Tensor, like: torch.Tensor, group: dict) -> dict:
    state = opt.state[key]
    if not state:  # as torch's AdamW: the fused kernel reads `step` on the device
        on_device = group["fused"] and not opt.stochastic_rounding
        state["step"] = torch.zeros((), device=like.device if on_device else "cpu")
        state["exp_avg"] = torch.zeros_like(like, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.preserve_format)
    return state
