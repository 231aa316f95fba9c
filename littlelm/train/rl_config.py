"""The `rl:` section (train/rl.py runs it: `build`) and its checks against the rest of the run.

Apart from train/rl.py, which holds the sampler, the rewards' calls and the loss: the schema
composes this section into the run config, and a config section stays light to import.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from littlelm.train.objective import Objective, ObjectiveConfig, Setting
from littlelm.train.rewards import check_spec


class RLConfig(ObjectiveConfig):
    """Reinforcement learning with verifiable rewards after SFT, GRPO-style: replies sampled in
    groups per prompt, scored by a reward function, advantages normalised per group, an optional
    KL penalty to the SFT model (train/rl.py). The run starts from `sft.base` (required), which is
    also the KL reference; the data section's held-out conversations give the validation loss."""

    prompts: str = Field(
        ...,
        description='JSONL file of prompts with reference answers: {"question": str} or '
        '{"messages": [..., user turn]}, and "answer" (what `littlelm eval --chat` reads).',
    )
    group_size: int = Field(
        8, description="Replies sampled per prompt; advantages are normalised within them.", ge=2
    )
    prompts_per_step: int = Field(
        8, description="Prompts per optimizer step (each with group_size replies).", ge=1
    )
    max_new_tokens: int = Field(
        32, description="Longest reply sampled; a reply cut here keeps its tokens.", ge=1
    )
    temperature: float = Field(
        1.0,
        description="Sampling temperature (also the one the loss's log-probabilities use).",
        gt=0,
    )
    kl_coef: float = Field(
        0.0,
        description="Weight of the KL to the SFT model in the loss (k3 estimator per reply "
        "token); 0 = measured and logged (rl_kl) but not in the loss.",
        ge=0,
    )
    iterations: int = Field(
        1,
        description="Optimizer steps per sampled batch (TRL's num_iterations): 1 = on-policy, "
        "one update per sample; K > 1 = each batch serves K steps with PPO's clipped ratio "
        "against the log-probs taken when it was sampled.",
        ge=1,
    )
    clip_eps: float = Field(
        0.2,
        description="PPO's clip (TRL's epsilon): the ratio π/π_old counts within [1-clip_eps, "
        "1+clip_eps]; read only when iterations > 1 (at 1 the ratio is 1).",
        gt=0,
        lt=1,
    )
    reward: str = Field(
        "exact",
        description="Reward function: exact (the answer after ####, else the reply, equals the "
        "reference), numeric (the same, as numbers), or module:function (imported, called as "
        "function(reply, answer) -> float, or in TRL's batched form: rl.reward_form).",
    )

    reward_form: Literal["auto", "pair", "batched"] = Field(
        "auto",
        description="How a module:function reward is called: pair = f(reply, answer) -> float "
        "per reply; batched = TRL's f(prompts, completions, **columns) -> list[float] once per "
        "step; auto = batched when the function has a parameter named completions.",
    )
    reward_timeout: float = Field(
        10.0,
        description="Seconds one reward call (batched: the step's one call) may take; past "
        "them the run stops naming the function and the fix (SIGTERM interrupts a call at any "
        "time).",
        gt=0,
    )

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, v: str) -> str:
        return check_spec(v)

    def build(self, setting: Setting) -> Objective:
        from littlelm.train.rl import RL  # the sampler and the loss: needed by a run, not a config

        return RL(setting, self)


def problems(rl: RLConfig | None, sft: bool, world_size: int | None, strategy: str) -> list[str]:
    """What makes an `rl:` section unusable in this run (the schema's resolve lists them): `sft`,
    whether the run has an sft: section; `world_size`, the processes running (torchrun's
    WORLD_SIZE, or --nproc); `strategy`, distributed.strategy."""
    if rl is None:
        return []
    out = []
    if not sft:
        out.append("rl needs sft: {base: RUN}: the SFT model RL starts from, and its KL reference")
    if world_size not in (None, 1) and strategy == "fsdp":
        out.append(
            "rl with distributed.strategy=fsdp: each rank samples its replies through the whole "
            "model outside the training forward, which FSDP's sharded parameters are not built "
            "for here; use distributed.strategy=ddp (each rank samples its own prompts)"
        )
    return out
