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
   temperature. With `rl.iterations` = 1 (the default) the step is on-policy: one update per
   sample, so the PPO ratio is 1 and its clip would change nothing.
   With `rl.iterations` = K > 1 one sampled batch serves K optimizer steps (TRL's
   num_iterations): steps bK .. bK+K-1 reuse batch b (its prompts and seed are batch b's, so the
   prompt file is read at one batch per K steps), and the policy term is PPO's clipped one,
   -min(ρ·A, clip(ρ, 1-ε, 1+ε)·A) with ρ = π(token) / π_old(token), π_old the log-probs taken
   when the batch was sampled (the sampler's own distribution: eval mode, no gradient) and
   ε = `rl.clip_eps`. The batch (replies, lengths, rewards, π_old) is held by the objective
   and saved in each checkpoint's state.json (`objective`), so a resume in the middle of a
   batch's iterations continues with the very batch the uninterrupted run used: the model that
   sampled it is gone by then, and cannot re-derive it.
   KL is the k3 estimator of KL(π || π_ref) per sampled token, exp(r) - r - 1 with
   r = log π_ref - log π (Schulman, "Approximating KL divergence"): non-negative, unbiased,
   measured against the SFT model (`sft.base`, kept frozen beside the policy) at every step,
   in the loss only when kl_coef > 0.

Metrics per logged record, averaged over the steps since the last one: rl_reward (mean reward),
rl_pass1 (fraction of sampled replies scoring 1 or more: pass@1 of a sample), rl_reply_tokens
(mean reply length), rl_kl (mean KL per reply token), rl_flat_frac (groups with no signal),
rl_sample_s and rl_learn_s (seconds per step sampling, and computing the loss and gradients);
with iterations > 1 also rl_clip_frac (the reply tokens whose clipped term was the smaller:
their gradient is zero).
Held-out pass@1 is `littlelm eval RUN --chat DIR` (greedy), as for SFT.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from littlelm.data.chat import chat_format, check_messages, json_lines
from littlelm.errors import DataError
from littlelm.model.generate import sample_group, tempered
from littlelm.model.gpt import GPT
from littlelm.train.objective import Objective, Pass, Setting
from littlelm.train.rewards import reward_function, score, score_batch

FIGURES = ("reward", "pass1", "reply_tokens", "kl", "flat_frac", "sample_s", "learn_s")


@dataclass
class Prompt:
    ids: list[int]  # BOS, the conversation, the assistant's header
    answer: str
    where: str  # FILE:LINE
    messages: list[dict]  # the conversation (a batched reward's `prompts`)
    columns: dict  # the row's other keys, answer included (a batched reward's keywords)


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
        columns = {k: v for k, v in row.items() if k not in ("question", "messages")}
        rows.append(Prompt(ids, str(row["answer"]), where, messages, columns))
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


def step_prompts(n: int, k: int, seed: int, step: int, rank: int, world: int) -> list[int]:
    """Indices (of `n` prompts) of rank `rank`'s `k` prompts of `step` (0-based): the file in an
    order shuffled per pass, read `k · world` prompts a step, each rank its own `k` of them (rank
    0 of one process: the single-process run's)."""
    out = []
    first = (step * world + rank) * k
    for pos in range(first, first + k):
        order = np.random.default_rng(step_seed(seed, pos // n)).permutation(n)
        out.append(int(order[pos % n]))
    return out


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


def clipped(logp: torch.Tensor, old: torch.Tensor, a: torch.Tensor, eps: float):
    """PPO's clipped policy loss per token, -min(ρ·A, clip(ρ, 1-ε, 1+ε)·A) with
    ρ = exp(logp - old), and where the clipped term is the smaller (no gradient flows there).
    `a`: advantages per row (G,), `logp` and `old`: (G, T)."""
    ratio = torch.exp(logp - old)
    a = a[:, None]
    plain, held = ratio * a, ratio.clamp(1 - eps, 1 + eps) * a
    return -torch.min(plain, held), held < plain


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from tokens sampled from π: exp(r) - r - 1."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1


def reply_logps(model, x: torch.Tensor, y: torch.Tensor, temperature: float, autocast):
    """log-probabilities (B, T) of targets y under `model` at the sampling temperature: every
    logit made at once, in fp32 for the log-softmax (what the planner's trace runs too)."""
    with autocast:
        logits = model(x)
    logp = F.log_softmax(tempered(logits, temperature), dim=-1)  # finite at any T > 0
    return logp.gather(-1, y[..., None]).squeeze(-1)


def group_loss(forward, reference, rows, a, old, r, autocast, per_rank: float):
    """One group's loss (the sum over its reply tokens of the policy term plus kl_coef x KL,
    over `per_rank`), its per-token KL and, with `old` (iterations > 1), where the clip held.
    `rows`: (x, y, mask) of the group's prompt + replies (RL._rows); `a`: its advantages (G,);
    `r`: the run's rl section. The reference's log-probs come first, without gradients."""
    x, y, mask = rows
    with torch.no_grad():
        ref = reply_logps(reference, x, y, r.temperature, autocast)
    logp = reply_logps(forward, x, y, r.temperature, autocast)
    kl = k3(logp, ref)
    held = None
    if old is None:
        policy = -a[:, None] * logp
    else:
        policy, held = clipped(logp, old, a, r.clip_eps)
    per_token = policy + r.kl_coef * kl
    return (per_token * mask).sum() / per_rank, kl, held


@dataclass
class Batch:
    """One sampled batch, kept for the `rl.iterations` steps that learn from it."""

    index: int  # step // iterations: its prompts and sampling seed are this index's
    groups: list[tuple[Prompt, torch.Tensor, torch.Tensor, torch.Tensor]]
    old: list[torch.Tensor]  # per group, (G, T) log-probs when it was sampled


TENSORS = ("tokens", "lengths", "rewards")  # a saved batch's per-group tensors besides "old"


def tensor_state(t: torch.Tensor) -> dict:
    """`t` as JSON's numbers (Python floats hold every float32, bf16 and float64 exactly)."""
    return {"dtype": str(t.dtype).removeprefix("torch."), "values": t.tolist()}


def tensor_from(state: dict, device: torch.device) -> torch.Tensor:
    return torch.tensor(state["values"], dtype=getattr(torch, state["dtype"]), device=device)


class RL(Objective):
    """The RL objective of one run: samples, scores and computes each step's loss (its held-out
    figures are the language-model loss's, the default `validate`)."""

    counts_targets = True  # the reply tokens the loss trained on

    # `r`: the run's rl section (train/rl_config.py, whose `build` makes this class: typed Any
    # here, as naming it back would be an import cycle)
    def __init__(self, setting: Setting, r: Any):
        super().__init__(setting)
        cfg = setting.cfg
        assert cfg.sft is not None, "problems() refuses an rl run without sft"
        self.cfg, self.r = cfg, r
        assert isinstance(setting.model, GPT), "schema.problems refuses rl: without sft's GPT"
        self.model, self.device, self.autocast = setting.model, setting.device, setting.autocast
        self.tok = tokenizer = setting.data.tokenizer
        self.fmt = chat_format(tokenizer)
        room = cfg.model.max_seq_len - self.r.max_new_tokens
        self.prompts = read_prompts(Path(self.r.prompts).expanduser(), self.fmt, room)
        # a batched reward is given every column of the rows as a keyword: it must take them all
        names = tuple(dict.fromkeys(k for p in self.prompts for k in p.columns))
        self.reward, self.reward_form = reward_function(self.r.reward, self.r.reward_form, names)
        self.columns = names
        self.reference = setting.reference()  # the SFT model, frozen: the KL reference
        # iterations > 1 also count the clipped tokens
        self.figures = FIGURES + (("clip_frac",) if self.r.iterations > 1 else ())
        self.sums: dict[str, float] = dict.fromkeys(self.figures, 0.0)
        self.steps = 0
        self.batch: Batch | None = None  # iterations > 1: the batch the current steps reuse

    def prompts_for(self, step: int) -> list[int]:
        """Indices of this rank's prompts of `step` (0-based)."""
        p = self.setting.parallel
        return step_prompts(
            len(self.prompts), self.r.prompts_per_step, self.cfg.run.seed, step, p.rank, p.world
        )

    def sample(self, step: int) -> list[tuple[Prompt, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(prompt, replies (G, L), lengths (G,), rewards (G,)) per prompt of `step`."""
        r = self.r
        rank = self.setting.parallel.rank  # rank 0 draws as a single process does
        keys = (step, rank) if rank else (step,)
        gen = torch.Generator(device=self.device).manual_seed(step_seed(self.cfg.run.seed, *keys))
        groups = []
        for i in self.prompts_for(step):
            p = self.prompts[i]
            with self.autocast, self._inference():
                tokens, lengths = sample_group(
                    self.model,
                    p.ids,
                    r.group_size,
                    r.max_new_tokens,
                    r.temperature,
                    gen,
                    self.fmt.end,
                )
            texts = [
                self.tok.decode([t for t in row[:n] if t != self.fmt.end])
                for row, n in zip(tokens.tolist(), lengths.tolist())
            ]
            groups.append((p, tokens, lengths, texts))
        # float64: a reward near float32's limit (1e38 and up) stays finite
        return [
            (p, tokens, lengths, torch.tensor(values, dtype=torch.float64))
            for (p, tokens, lengths, _), values in zip(groups, self._score(groups))
        ]

    def _score(self, groups) -> list[list[float]]:
        """The rewards of each group's reply texts: one call per reply (pair form), or one call
        for the step's replies (batched form, TRL's)."""
        r = self.r
        if self.reward_form == "pair":
            return [
                [score(self.reward, r.reward, text, p.answer, r.reward_timeout) for text in texts]
                for p, _, _, texts in groups
            ]
        rows = [(p, text) for p, _, _, texts in groups for text in texts]
        columns = {k: [p.columns.get(k) for p, _ in rows] for k in self.columns}
        prompts = [p.messages for p, _ in rows]
        replies = [text for _, text in rows]
        values = score_batch(self.reward, r.reward, prompts, replies, columns, r.reward_timeout)
        size = r.group_size
        return [values[i * size : (i + 1) * size] for i in range(len(groups))]

    @contextlib.contextmanager
    def _inference(self):
        """The model in eval mode while it samples: replies from the model itself (LoRA's
        dropout off), and no draw from the global RNG, whose state would differ across ranks."""
        was = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was)

    @contextlib.contextmanager
    def _step_rng(self, step: int):
        """The global RNG, seeded for this step's loss and restored after it."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(step_seed(self.cfg.run.seed, step, self.setting.parallel.rank, 1))
            yield

    def _logp(self, model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return reply_logps(model, x, y, self.r.temperature, self.autocast)

    def _rows(self, p: Prompt, tokens: torch.Tensor, lengths: torch.Tensor):
        """Inputs x, targets y (G, T) of a group's prompt + replies, and the mask of the reply
        tokens among the targets (the end token included, the filler after it not)."""
        width = int(lengths.max())
        seq = torch.cat(
            [torch.tensor(p.ids, device=self.device).expand(len(tokens), -1), tokens[:, :width]],
            dim=1,
        )
        x, y = seq[:, :-1], seq[:, 1:]
        start = len(p.ids) - 1  # the target index of the first reply token
        cols = torch.arange(y.size(1), device=self.device)[None, :]
        return x, y, (cols >= start) & (cols < start + lengths[:, None])

    def _batch(self, index: int) -> Batch:
        """Batch `index` sampled by the model as it is now, with the log-probs of its replies
        under it (π_old of the clipped loss): the sampler's own distribution, so in eval mode."""
        groups = self.sample(index)
        old = []
        for p, tokens, lengths, _ in groups:
            x, y, _ = self._rows(p, tokens, lengths)
            with torch.no_grad(), self._inference():
                old.append(self._logp(self.model, x, y))
        return Batch(index, groups, old)

    def state_dict(self) -> dict:
        """The batch that iterations > 1 reuse (replies, lengths, rewards, π_old), for the
        checkpoint: {} when there is none (iterations = 1 keeps nothing between steps)."""
        b = self.batch
        if b is None:
            return {}
        return {
            "index": b.index,
            "groups": [
                {
                    "tokens": tensor_state(tokens),
                    "lengths": tensor_state(lengths),
                    "rewards": tensor_state(rewards),
                    "old": tensor_state(old),
                }
                for (_, tokens, lengths, rewards), old in zip(b.groups, b.old)
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """The batch of a checkpoint's `state_dict()` ({}: none; the next step samples)."""
        if not state:
            self.batch = None
            return
        index, groups, old = state["index"], [], []
        for i, g in zip(self.prompts_for(index), state["groups"], strict=True):
            tokens, lengths, rewards = (tensor_from(g[k], self.device) for k in TENSORS)
            groups.append((self.prompts[i], tokens, lengths, rewards))
            old.append(tensor_from(g["old"], self.device))
        self.batch = Batch(index, groups, old)

    def forward_backward(self, step: int, batches, forward) -> Pass:
        """Sample and score step `step`'s groups (or, with iterations > 1, reuse its batch),
        then the loss's gradients into `.grad` (`forward`: the trainer's wrapped model; the
        loader's `batches` are not read). Returns the loss (detached) and the reply tokens it
        counted."""
        t0 = time.perf_counter()
        olds: list[torch.Tensor | None]
        if self.r.iterations == 1:  # on-policy: the plain policy gradient, no π_old
            groups = self.sample(step)
            olds = [None] * len(groups)
        else:
            index = step // self.r.iterations
            if self.batch is None or self.batch.index != index:
                self.batch = self._batch(index)
            groups, olds = self.batch.groups, list(self.batch.old)
        t1 = time.perf_counter()
        rewards = torch.stack([g[3] for g in groups])  # (P, G), float64
        # advantages are the same for rewards divided by a positive number: each group by its
        # largest magnitude when above 1, so a huge reward cannot overflow its sums (rewards in
        # [-1, 1] divide by 1 exactly); in float32 as they always were
        scale = rewards.abs().amax(1, keepdim=True).clamp(min=1)
        adv = group_advantages((rewards / scale).float()).to(self.device)
        total_tokens = int(sum(int(g[2].sum()) for g in groups))
        parallel = self.setting.parallel
        world = parallel.world
        # the loss is the mean over every rank's reply tokens: DDP averages the ranks' gradients,
        # so each rank divides its sum by the tokens of all ranks over the number of ranks
        per_rank = total_tokens if world == 1 else parallel.total(total_tokens, self.device) / world
        loss_sum = torch.zeros((), device=self.device)
        kl_sum = clip_sum = 0.0
        # the loss's draws (LoRA's dropout) from a generator of (seed, step, rank): a rank's
        # replies differ in length from the other ranks', so the global RNG would drift apart
        # across ranks, and a checkpoint restores one RNG state for all of them
        with self._step_rng(step):
            for i, ((p, tokens, lengths, _), a, old) in enumerate(zip(groups, adv, olds)):
                rows = self._rows(p, tokens, lengths)
                flat = bool((a == 0).all())
                # else nothing to learn: no graph (under DDP every rank runs every group's backward,
                # which all-reduces the gradients at the last one)
                learn = not flat or self.r.kl_coef > 0 or world > 1
                with torch.set_grad_enabled(learn):
                    loss, kl, held = group_loss(
                        forward, self.reference, rows, a, old, self.r, self.autocast, per_rank
                    )
                mask = rows[2]
                if held is not None:
                    clip_sum += float((held & mask).sum())
                if learn:
                    with parallel.no_sync(skip=i < len(groups) - 1):
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
        if self.r.iterations > 1:
            figures["clip_frac"] = clip_sum / total_tokens
        for k, v in figures.items():
            self.sums[k] += v
        self.steps += 1
        return Pass(loss_sum, total_tokens, None)

    def metrics(self) -> dict[str, float]:
        """rl_* means over the steps since the last call (the trainer's logged records), and
        over the ranks (each samples its own prompts)."""
        if not self.steps:
            return {}
        out = {f"rl_{k}": v / self.steps for k, v in self.sums.items()}
        self.sums, self.steps = dict.fromkeys(self.figures, 0.0), 0
        parallel = self.setting.parallel
        if parallel.world > 1:  # float64: the figures as one process computes them
            means = parallel.mean(torch.tensor(list(out.values()), dtype=torch.float64))
            out = dict(zip(out, means.tolist()))
        return out
