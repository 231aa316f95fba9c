"""DPO: preference tuning of an SFT'd model on (prompt, chosen, rejected) pairs
(docs/post-training.md, Rafailov et al. 2023).

A DPO run is an SFT run's start (`sft: {base: RUN}`: the base's weights copied in and checked, a
fresh optimizer) with a `dpo:` section for the objective and a `preference` source for the data
(data/preference.py). For each pair the policy's and the reference's log-probabilities of the
chosen and the rejected reply are sums over the reply's tokens (the loss never counts the
prompt); with Δ = (policy - reference log-prob of chosen) - (same of rejected) and ε =
label_smoothing, the loss of a pair is

    (-(1 - ε)·log σ(βΔ) + ε·log σ(-βΔ)) / (1 - 2ε)

which is DPO's -log σ(βΔ) at ε = 0 and, above, the robust DPO of Chowdhury et al. (2024), the
form TRL's DPOTrainer gives label smoothing (its `loss_type: robust`; its `sigmoid` ignores
label_smoothing). `loss: ipo` is IPO's (h - 1/(2β))² instead, h being Δ with each reply's
log-ratio divided by its reply tokens (TRL's normalisation). The loss of a micro-batch is the mean
over its pairs, as in TRL, plus `rpo_alpha` times the chosen replies' negative log-likelihood per
token (one mean over the micro-batch's chosen tokens: TRL 1.x's loss_type "sft" at weight α); a
test runs TRL's own loss code on our exported model and compares loss and gradients
(tests/test_dpo.py).

The reference is the base model itself (its checkpoint, read again at start and on resume, in the
run's precision) and its log-probs are computed on the fly, in the same step, without gradients:
one more forward per micro-batch (about a third more compute than training alone) and one more
copy of the weights in memory (no gradients or optimizer state). Precomputing them once would
save the forward but needs a pass over the data before the first step and a file of log-probs
kept in the run directory for resume to stay exact; on the fly nothing but the base checkpoint is
needed, and a resumed run recomputes exactly what it would have (the base is fixed).

Metrics (metrics.jsonl at each log step, means over the steps since the last record, this rank's
pairs): `reward_margin` β·Δ, `reward_accuracy` the share of pairs with Δ > 0 (a tie, |Δ| within
1e-4 of the four log-probs' summed magnitude, counts half: at step 1 the policy is the reference
and every pair is one, so it reads 0.5), the policy's `logps_chosen` / `logps_rejected`,
`logratio_chosen` (policy - reference log-prob of the chosen reply) and `tokens_chosen` (its
reply tokens). Evaluation over the held-out pairs gives `val_loss` (DPO's),
`val_reward_margin`, `val_reward_accuracy`, `val_logp_margin` (policy chosen - rejected
log-prob), `val_win_rate` (the share of pairs whose chosen reply the policy rates above the
rejected one), `val_logps_chosen`, `val_logps_rejected`, `val_logratio_chosen`,
`val_tokens_chosen` and `val_pairs`.

The warning (`over_optimising`, on the console and in `littlelm report`): a record whose chosen
replies fell more than `warn_chosen_drop` nats (summed over the reply) below the reference while
the reward margin is positive. DPO can raise the margin by making both replies unlikely; then the chosen
reply stops being what greedy decoding produces and replies break, which the margin and the win
rate do not show.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from littlelm.config import RESUMABLE
from littlelm.data.chat import chat_format
from littlelm.data.loader import IGNORE
from littlelm.data.preference import pair_rows, pairs_of
from littlelm.train.objective import ObjectiveConfig, ObjectiveWarning, Setting
from littlelm.train.step import LanguageModelLoss

# nats per chosen reply: the reply at 0.61× its probability under the reference. Measured
# (docs/post-training.md): runs that kept exact match stayed within 0.27, runs that lost it
# went past 0.55
CHOSEN_DROP = 0.5


class DPOConfig(ObjectiveConfig):
    """Direct preference optimisation after SFT: the objective (the run starts from `sft.base`,
    the model being tuned and the reference; the data is a `preference` source)."""

    beta: float = Field(
        0.1,
        description="β: the strength of the pull towards the reference (the reward scale); "
        "smaller lets the policy move further from the base.",
        gt=0,
    )
    label_smoothing: float = Field(
        0.0,
        description="ε, the assumed share of pairs whose preference is flipped (robust DPO, TRL's "
        "loss_type robust); 0 = plain DPO. Below 0.5.",
        ge=0,
        lt=0.5,
    )
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="The preference loss: sigmoid = DPO's -log σ(βΔ) (robust DPO with "
        "label_smoothing); ipo = IPO's (Δ/token - 1/(2β))², Δ per reply token as TRL's "
        "loss_type ipo (β is IPO's τ).",
    )
    rpo_alpha: float = Field(
        1.0,
        description="α: the weight of an SFT term on the chosen replies added to the loss (their "
        "mean negative log-likelihood per token, TRL's rpo_alpha); keeps the chosen reply likely "
        "while the margin grows (measured: docs/post-training.md). 0 = plain DPO, TRL's default.",
        ge=0,
    )
    warn_chosen_drop: float = Field(
        CHOSEN_DROP,
        description="The over-optimisation warning (console, report) fires when the chosen "
        "replies' log-prob falls more than this many nats (summed over a reply) below the "
        "reference's while the reward margin rises; raise it for long replies.",
        gt=0,
    )
    reference: Literal["live"] = Field(
        "live",
        description="How the reference log-probs are computed: live = by the base model (sft.base, "
        "frozen) in each step, without gradients (train/dpo.py says why; the only way offered).",
        json_schema_extra=RESUMABLE,
    )

    def build(self, setting: Setting) -> DPOObjective:
        return DPOObjective(setting, self)


def dpo_problems(dpo: DPOConfig | None, sft: bool, sources: dict[str, str]) -> list[str]:
    """What makes a run's dpo:, sft: and data sources (label -> source name) inconsistent."""
    prefs = [k for k, name in sources.items() if name == "preference"]
    if dpo is None:
        return [
            f"data.sources.{k} is a preference source, which only a DPO run reads; add a dpo: "
            "section (and sft: {base: RUN}), or use a chat source for SFT"
            for k in prefs
        ]
    problems = []
    if not sft:
        problems.append(
            "dpo: needs sft: {base: RUN}, the SFT'd model to tune, which is also the reference; "
            "set sft.base"
        )
    if dpo.loss == "ipo" and dpo.label_smoothing:
        problems.append(
            "dpo.label_smoothing is robust DPO's, a form of the sigmoid loss; the ipo loss has "
            "none (nor has TRL's): set dpo.label_smoothing=0, or dpo.loss=sigmoid"
        )
    if len(prefs) != 1 or len(sources) != 1:
        problems.append(
            f"dpo: needs exactly one data source, a preference source (name: preference); this "
            f"run has {', '.join(f'{k} ({n})' for k, n in sources.items()) or 'none'}: put the "
            "pairs in one dataset (one file, or one directory of files)"
        )
    return problems


def sequence_logps(forward, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(rows,) the summed log-probabilities of each row's counted targets (IGNORE elsewhere)."""
    return -forward(x, y, "none").sum(-1)


def reply_tokens(y: torch.Tensor) -> torch.Tensor:
    """(rows,) how many targets of each row the loss counts (its reply's tokens)."""
    return (y != IGNORE).sum(-1)


def dpo_terms(
    logps: torch.Tensor, ref_logps: torch.Tensor, tokens: torch.Tensor, cfg: DPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's loss and per-pair figures, from (2·B,) log-probs of the policy and the
    reference and the reply tokens of each row, laid out as B chosen rows then their B rejected
    rows: the mean over pairs of the preference loss (`cfg.loss`), plus `cfg.rpo_alpha` times
    the chosen replies' negative log-likelihood per token."""
    chosen, rejected = logps.float().chunk(2)
    ref_chosen, ref_rejected = ref_logps.float().chunk(2)
    n_chosen, n_rejected = tokens.float().clamp(min=1).chunk(2)
    delta = (chosen - ref_chosen) - (rejected - ref_rejected)
    beta, eps = cfg.beta, cfg.label_smoothing
    if cfg.loss == "ipo":
        # IPO's squared loss on the log-ratio per reply token (TRL's normalisation, so β means the
        # same whatever the replies' lengths)
        per_token = (chosen - ref_chosen) / n_chosen - (rejected - ref_rejected) / n_rejected
        per_pair = (per_token - 1 / (2 * beta)) ** 2
    else:
        per_pair = (-(1 - eps) * F.logsigmoid(beta * delta) + eps * F.logsigmoid(-beta * delta)) / (
            1 - 2 * eps
        )
    loss = per_pair.mean()
    if cfg.rpo_alpha:
        # the NLL of every chosen token of the micro-batch, one mean over all of them (TRL's
        # token mean, not a mean of per-pair means)
        loss = loss + cfg.rpo_alpha * (-chosen.sum() / n_chosen.sum())
    d = delta.detach()
    # a Δ within the rounding of its four sums is a tie (the policy is still the reference at
    # step 1, where its sign is noise): half a correct pair, as accuracy counts a coin flip
    tie = d.abs() <= TIE_RTOL * (
        chosen.abs() + rejected.abs() + ref_chosen.abs() + ref_rejected.abs()
    )
    figures = {
        "reward_margin": beta * d,
        "reward_accuracy": torch.where(tie, 0.5, (d > 0).float()),
        "logp_margin": (chosen - rejected).detach(),
        "win_rate": (chosen > rejected).detach().float(),
        "logps_chosen": chosen.detach(),
        "logps_rejected": rejected.detach(),
        "logratio_chosen": (chosen - ref_chosen).detach(),
        "tokens_chosen": n_chosen,
    }
    return loss, figures


TIE_RTOL = 1e-4  # of the log-probs' magnitudes: float32 sums and bf16 autocast's kernels differ
# below it between two forwards of the same weights

TRAIN_FIGURES = (
    "reward_margin",
    "reward_accuracy",
    "logps_chosen",
    "logps_rejected",
    "logratio_chosen",
    "tokens_chosen",
)


class DPOObjective(LanguageModelLoss):
    """A DPO run's objective: the language-model step's micro-batches (a PairLoader's rows,
    chosen then rejected), each one's loss DPO's, of the model and the frozen reference (the
    run's base: `Setting.reference`); keeps the figures of the pairs it saw for the next record."""

    def __init__(self, setting: Setting, cfg: DPOConfig):
        super().__init__(setting)
        self.cfg = cfg
        self.reference = setting.reference()  # resident beside the model, without gradients
        self._sums: dict[str, torch.Tensor] = {}
        self._pairs = 0

    def loss_of(self, forward):
        return lambda x, y: self.pair_loss(forward, x, y)

    def pair_loss(self, forward, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean DPO loss of the pairs in rows (x, y), the policy's log-probs from `forward`."""
        logps = sequence_logps(forward, x, y)
        with torch.no_grad():
            ref = sequence_logps(self.reference, x, y)
        loss, figures = dpo_terms(logps, ref, reply_tokens(y), self.cfg)
        for k in TRAIN_FIGURES:  # summed on the device: no host sync in the step
            s = figures[k].sum()
            self._sums[k] = self._sums[k] + s if k in self._sums else s
        self._pairs += len(x) // 2
        return loss

    def metrics(self) -> dict[str, float]:
        """The mean of each figure over the pairs since the last call (empty when none)."""
        if not self._pairs:
            return {}
        out = {k: float(v) / self._pairs for k, v in self._sums.items()}
        self._sums, self._pairs = {}, 0
        return out

    @torch.no_grad()
    def validate(self) -> dict:
        """DPO's figures over every held-out pair, as `val_*`."""
        st = self.setting
        model, data, cfg, device = st.model, st.data, st.cfg, st.device
        src = data.pairs
        row_len = cfg.train.seq_len + 1
        pairs, _ = pairs_of(src.val, src.label, row_len)
        batch = cfg.eval.batch_size or cfg.train.micro_batch_size
        fmt, bos = chat_format(data.tokenizer), data.tokenizer.bos_id
        was_training = model.training
        model.eval()
        losses, sums = 0.0, dict[str, float]()
        try:
            for i in range(0, len(pairs), batch):
                x, y = pair_rows(pairs[i : i + batch], row_len, bos, fmt)
                x, y = x.to(device), y.to(device)
                with st.autocast:
                    logps = sequence_logps(model, x, y)
                    ref = sequence_logps(self.reference, x, y)
                loss, figures = dpo_terms(logps, ref, reply_tokens(y), self.cfg)
                losses += float(loss) * (len(x) // 2)
                for k, v in figures.items():
                    sums[k] = sums.get(k, 0.0) + float(v.sum())
        finally:
            model.train(was_training)
        n = len(pairs)
        if not n:
            return {"val_loss": float("nan"), "val_pairs": 0}
        return {
            "val_loss": losses / n,
            **{f"val_{k}": v / n for k, v in sums.items()},
            "val_pairs": n,
        }

    def validation_line(self, m: dict) -> str:
        return validation_line(m)

    def warning(self, m: dict) -> ObjectiveWarning | None:
        prefix = "val_" if "val_pairs" in m else ""
        return over_optimising(m, prefix, self.cfg.warn_chosen_drop)


def chosen_drop(m: dict, prefix: str = "") -> float | None:
    """How far the chosen replies fell below the reference in record `m`: minus their mean
    log-ratio to the reference, summed over each reply's tokens (nats per reply; None when `m`
    has no DPO figures)."""
    ratio = m.get(prefix + "logratio_chosen")
    return -ratio if isinstance(ratio, float | int) else None


def over_optimising(
    m: dict, prefix: str = "", limit: float = CHOSEN_DROP
) -> ObjectiveWarning | None:
    """The warning for record `m` (`prefix` "val_" for an evaluation's) when the chosen replies
    fell more than `limit` nats below the reference while the reward margin rose: the
    preference learnt by making both replies unlikely, the failure in which greedy replies
    change and then turn to junk (docs/post-training.md). None otherwise."""
    drop, margin = chosen_drop(m, prefix), m.get(prefix + "reward_margin")
    if drop is None or not isinstance(margin, float | int):
        return None
    if not (margin > 0 and drop > limit):
        return None
    tokens = m.get(prefix + "tokens_chosen")
    per_token = f", {drop / tokens:.3f} per reply token" if tokens else ""
    return ObjectiveWarning(
        f"chosen replies {drop:.2f} nats below the reference while the margin rises",
        f"the chosen reply's log-prob is {-drop:+.2f} against the reference's{per_token} "
        f"(more than dpo.warn_chosen_drop = {limit:g} down) with a reward margin of "
        f"{margin:.3f}: DPO is making both replies unlikely, and greedy replies change, then "
        "break. Lower optimizer.lr or raise dpo.rpo_alpha (docs/post-training.md, Preference "
        "tuning)",
    )


def validation_line(m: dict) -> str:
    """'val loss 0.6012 | reward margin 0.210 | accuracy 0.71 | logp margin 3.20 | win rate 0.80
    | 200 pairs' (a DPO run's evaluation)."""
    if not m.get("val_pairs"):
        return "val loss nan | no held-out pairs"
    return (
        f"val loss {m['val_loss']:.4f} | reward margin {m['val_reward_margin']:.3f} | "
        f"accuracy {m['val_reward_accuracy']:.2f} | logp margin {m['val_logp_margin']:.2f} | "
        f"win rate {m['val_win_rate']:.2f} | {m['val_pairs']:,} pairs"
    )
