"""RL with verifiable rewards after SFT: a GRPO-style objective (docs/post-training.md).

    sft: {base: runs/rl-sft}          # where the run starts, and the KL reference
    rl:
      prompts: data/rl_example/train.jsonl   # {"question": ..., "answer": ...} per line
      group_size: 8
      prompts_per_step: 8
      reward: numeric                 # or exact, or my_module:my_function

Each optimizer step (the trainer's `train_step` asks `RL.forward_backward` for its loss):

1. prompts: `prompts_per_step` rows of `rl.prompts`, in an order shuffled per pass over the file
   from (run.seed, pass); rendered in the model's chat format with the assistant's header.
2. sampling: `group_size` replies per prompt, side by side through one batched KV cache
   (model/generate.py `sample_group`), at `temperature`, up to `max_new_tokens` or the end token.
   The sampling generator is seeded from (run.seed, step) at each step, so a resumed run (or a
   rolled-back one) draws exactly the replies the uninterrupted run drew: nothing about it needs
   saving in the checkpoint, and RL resumes bitwise (benchmarks/faults.py checks it).
3. rewards: the reward function (train/rewards.py) scores each reply's text against the row's
   answer; the text is parsed, never executed.
4. advantages: per group, (reward - group mean) / (group std + 1e-6). A group whose rewards are
   all equal (all right or all wrong) has advantage 0 everywhere: it contributes nothing to the
   policy gradient (only to the KL term when kl_coef > 0); `rl_flat_frac` counts them.
5. loss, on the sampled reply tokens only (the end token included: stopping is the model's
   choice; the prompt and the filler after a reply are not counted), averaged over every reply
   token of the step:  -A · log π(token) + kl_coef · KL, where log π is at the sampling
   temperature. The step is on-policy (one update per sample, so the PPO ratio is 1 and a
   clipped ratio would change nothing: there are no inner epochs to clip).
   KL is the k3 estimator of KL(π || π_ref) per sampled token, exp(r) - r - 1 with
   r = log π_ref - log π (Schulman, "Approximating KL divergence"): non-negative, unbiased,
   measured against the SFT model (`sft.base`, kept frozen beside the policy) at every step,
   in the loss only when kl_coef > 0.

Metrics per logged record, averaged over the steps since the last one: rl_reward (mean reward),
rl_pass1 (fraction of sampled replies scoring 1 or more: pass@1 of a sample), rl_reply_tokens
(mean reply length), rl_kl (mean KL per reply token), rl_flat_frac (groups with no signal),
rl_sample_s and rl_learn_s (seconds per step sampling, and computing the loss and gradients).
Held-out pass@1 is `littlelm eval RUN --chat DIR` (greedy), as for SFT.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from littlelm.checkpoint_dirs import find_checkpoint
from littlelm.data.chat import chat_format, check_messages, json_lines
from littlelm.errors import CheckpointError, DataError
from littlelm.model.generate import sample_group
from littlelm.model.gpt import GPT
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.checkpoint.save_restore import plain_tensors
from littlelm.train.rewards import reward_function, score

if TYPE_CHECKING:  # for types only: train/ is below the schema's layer
    from littlelm.schema import RunConfig

FIGURES = ("reward", "pass1", "reply_tokens", "kl", "flat_frac", "sample_s", "learn_s")


@dataclass
class Prompt:
    ids: list[int]  # BOS, the conversation, the assistant's header
    answer: str
    where: str  # FILE:LINE


def read_prompts(path: Path, fmt, room: int) -> list[Prompt]:
    """The prompt rows of `path`, encoded; each must leave `room` tokens' worth of context."""
    if not path.is_file():
        raise DataError(f"rl.prompts: no file {path}; make it (e.g. scripts/make_rl_example.py)")
    rows, too_long = [], []
    for where, row in json_lines(path.read_text().splitlines(), str(path)):
        if not isinstance(row, dict) or "answer" not in row:
            raise DataError(f'{where}: a prompt row needs an "answer"')
        messages = row.get("messages") or [{"role": "user", "content": row.get("question")}]
        stand_in = [*messages, {"role": "assistant", "content": "-"}]
        messages = check_messages(stand_in, where)[:-1]
        ids = fmt.encode(messages, add_generation_prompt=True)
        if len(ids) > room:
            too_long.append(f"{where} ({len(ids)} tokens)")
        rows.append(Prompt(ids, str(row["answer"]), where))
    if too_long:
        raise DataError(
            f"rl.prompts: {len(too_long)} prompt(s) leave no room for rl.max_new_tokens in the "
            f"model's context (at most {room} prompt tokens): {', '.join(too_long[:5])}; shorten "
            "them, or lower rl.max_new_tokens"
        )
    if not rows:
        raise DataError(f"rl.prompts: {path} holds no rows")
    return rows


def step_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed from the run's seed and `keys` (the step, or a pass over the prompts)."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(2, np.uint64)[0] >> 1)


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(groups, group_size) rewards -> advantages normalised per group; a group whose rewards
    are all equal gets 0 (no signal)."""
    mean = rewards.mean(1, keepdim=True)
    std = rewards.std(1, keepdim=True, unbiased=False)
    return torch.where(std > 0, (rewards - mean) / (std + 1e-6), torch.zeros_like(rewards))


def mean(values: torch.Tensor) -> float:
    """The mean of `values`, finite for any finite values (1e308s sum past float64's range)."""
    top = float(values.abs().max().clamp(min=1))
    return float((values / top).mean()) * top


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from tokens sampled from π: exp(r) - r - 1."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1


class RL:
    """The RL objective of one run: samples, scores and computes each step's loss."""

    def __init__(self, cfg: RunConfig, model, device: torch.device, autocast, tokenizer):
        assert cfg.rl is not None and cfg.sft is not None, (
            "problems() refuses an rl run without sft"
        )
        self.cfg, self.r = cfg, cfg.rl
        self.model, self.device, self.autocast = model, device, autocast
        self.tok = tokenizer
        self.fmt = chat_format(tokenizer)
        room = cfg.model.max_seq_len - self.r.max_new_tokens
        self.prompts = read_prompts(Path(self.r.prompts).expanduser(), self.fmt, room)
        self.reward = reward_function(self.r.reward)
        self.reference = self._reference(cfg.sft.base)
        self.sums: dict[str, float] = dict.fromkeys(FIGURES, 0.0)
        self.steps = 0

    def _reference(self, base: str) -> GPT:
        """The SFT model, frozen: the KL reference."""
        try:
            path = find_checkpoint(base)
            loaded = ckpt.load_checkpoint(path, with_optimizer=False)
        except CheckpointError as e:
            raise CheckpointError(
                f"rl: the KL reference is the SFT model sft.base ({base}), which cannot be read "
                f"({e}); restore it (a resumed RL run needs it too)"
            ) from None
        with torch.random.fork_rng(devices=[]):  # building it must not move the run's RNG
            ref = GPT(self.cfg.model)
        ckpt.load_model_tensors(ref, plain_tensors(loaded), path)  # a LoRA run's: merged
        ref.requires_grad_(False)
        return ref.to(self.device).eval()

    def prompts_for(self, step: int) -> list[int]:
        """Indices of the prompts of `step` (0-based): the file in an order shuffled per pass."""
        n, k = len(self.prompts), self.r.prompts_per_step
        out = []
        for pos in range(step * k, step * k + k):
            order = np.random.default_rng(step_seed(self.cfg.run.seed, pos // n)).permutation(n)
            out.append(int(order[pos % n]))
        return out

    def sample(self, step: int) -> list[tuple[Prompt, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(prompt, replies (G, L), lengths (G,), rewards (G,)) per prompt of `step`."""
        r = self.r
        gen = torch.Generator(device=self.device).manual_seed(step_seed(self.cfg.run.seed, step))
        groups = []
        for i in self.prompts_for(step):
            p = self.prompts[i]
            with self.autocast:
                tokens, lengths = sample_group(
                    self.model,
                    p.ids,
                    r.group_size,
                    r.max_new_tokens,
                    r.temperature,
                    gen,
                    self.fmt.end,
                )
            rewards = []
            for row, n in zip(tokens.tolist(), lengths.tolist()):
                reply = [t for t in row[:n] if t != self.fmt.end]
                text = self.tok.decode(reply)
                rewards.append(score(self.reward, r.reward, text, p.answer, r.reward_timeout))
            # float64: a reward near float32's limit (1e38 and up) stays finite
            groups.append((p, tokens, lengths, torch.tensor(rewards, dtype=torch.float64)))
        return groups

    def _logp(self, model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """log-probabilities (B, T) of targets y under `model` at the sampling temperature."""
        with self.autocast:
            logits = model(x)
        logp = F.log_softmax(logits.float() / self.r.temperature, dim=-1)
        return logp.gather(-1, y[..., None]).squeeze(-1)

    def forward_backward(self, step: int, forward) -> tuple[torch.Tensor, int]:
        """Sample and score step `step`'s groups, then the loss's gradients into `.grad`
        (`forward`: the trainer's wrapped model). Returns (the loss, detached; the reply tokens
        it counted)."""
        t0 = time.perf_counter()
        groups = self.sample(step)
        t1 = time.perf_counter()
        rewards = torch.stack([g[3] for g in groups])  # (P, G), float64
        # advantages are the same for rewards divided by a positive number: each group by its
        # largest magnitude when above 1, so a huge reward cannot overflow its sums (rewards in
        # [-1, 1] divide by 1 exactly); in float32 as they always were
        scale = rewards.abs().amax(1, keepdim=True).clamp(min=1)
        adv = group_advantages((rewards / scale).float()).to(self.device)
        total_tokens = int(sum(int(g[2].sum()) for g in groups))
        loss_sum = torch.zeros((), device=self.device)
        kl_sum = 0.0
        for (p, tokens, lengths, _), a in zip(groups, adv):
            width = int(lengths.max())
            seq = torch.cat(
                [
                    torch.tensor(p.ids, device=self.device).expand(len(tokens), -1),
                    tokens[:, :width],
                ],
                dim=1,
            )
            x, y = seq[:, :-1], seq[:, 1:]
            start = len(p.ids) - 1  # the target index of the first reply token
            cols = torch.arange(y.size(1), device=self.device)[None, :]
            mask = (cols >= start) & (cols < start + lengths[:, None])
            flat = bool((a == 0).all())
            with torch.no_grad():
                ref = self._logp(self.reference, x, y)
            learn = not flat or self.r.kl_coef > 0  # else nothing to learn: no graph
            with torch.set_grad_enabled(learn):
                logp = self._logp(forward, x, y)
                kl = k3(logp, ref)
                per_token = -a[:, None] * logp + self.r.kl_coef * kl
                loss = (per_token * mask).sum() / total_tokens
            if learn:
                loss.backward()
            loss_sum += loss.detach()
            kl_sum += float((kl.detach() * mask).sum())
        t2 = time.perf_counter()
        flat_groups = float((rewards.std(1, unbiased=False) == 0).float().mean())
        figures = {
            "reward": mean(rewards),
            "pass1": float((rewards >= 1).float().mean()),
            "reply_tokens": total_tokens / rewards.numel(),
            "kl": kl_sum / total_tokens,
            "flat_frac": flat_groups,
            "sample_s": t1 - t0,
            "learn_s": t2 - t1,
        }
        for k, v in figures.items():
            self.sums[k] += v
        self.steps += 1
        return loss_sum, total_tokens

    def figures(self) -> dict[str, float]:
        """rl_* means over the steps since the last call (the trainer's logged records)."""
        if not self.steps:
            return {}
        out = {f"rl_{k}": v / self.steps for k, v in self.sums.items()}
        self.sums, self.steps = dict.fromkeys(FIGURES, 0.0), 0
        return out
