"""The CORE harness: score in-context-learning tasks fast, report truncation, aggregate.

    suite = evaluate_suite(model, tokenizer, load_suite(tasks, data_dir), EvalOptions())
    print(format_table(suite))

Scoring (see prompts.py for how prompts are built):
- multiple_choice and schema: the prompt with the lowest mean loss over its scored span wins
  (ties, within float noise, go to the lowest index);
- language_modeling: correct when greedy decoding reproduces every continuation token, i.e.
  when the argmax at every scored position is the continuation's token (one teacher-forced pass
  gives exactly what token-by-token greedy decoding would).

Speed: the prompts of an item share their few-shot prefix, so an item is one *tree row*: the
shared prefix once, then each prompt's remainder as a branch that attends to the prefix and to
itself only, with RoPE positions continuing from the prefix (GPT.hidden takes positions and a
mask). Rows are sorted by length and batched up to `batch_tokens`; only the hidden states at
scored positions go through the lm_head. `reference.py` holds a slow per-prompt scorer that the
tests and benchmarks/eval.py compare this with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from littlelm.eval.prompts import ItemPrompts, PromptBuilder, Truncation, common_prefix
from littlelm.eval.tasks import CORE_TASKS, TaskSpec, load_items, load_task_list, shuffled

TIE_TOLERANCE = 1e-5  # relative; mean losses closer than this count as a tie


@dataclass
class EvalOptions:
    max_per_task: int | None = None  # items scored per task (after a fixed shuffle); None = all
    truncation: Truncation = "crop"  # or drop_shots
    batch_tokens: int = 16384  # tokens per forward (rows x padded length)
    warn_share: float = 0.01  # warn when more than this share of a task's prompts were cut


@dataclass
class TruncationReport:
    """How many of a task's prompts exceeded the context, and how they were made to fit."""

    prompts: int = 0
    prompts_over: int = 0  # prompts of items whose full prompts exceeded the context
    items_over: int = 0
    shots_dropped: int = 0  # few-shot examples removed (drop_shots), over all items
    items_dropped: int = 0  # items that lost at least one example
    items_cropped: int = 0  # items whose prompts were cropped
    tokens_cropped_max: int = 0
    tokens_cropped_sum: int = 0
    items_cut_into_item: int = 0  # crops that reached the item itself, not only its examples
    items_span_cut: int = 0  # crops that reached the scored answer tokens

    @property
    def share(self) -> float:
        return self.prompts_over / self.prompts if self.prompts else 0.0

    def add(self, item: ItemPrompts) -> None:
        n, f = len(item.tokens), item.fit
        self.prompts += n
        if not f.over:
            return
        self.prompts_over += n
        self.items_over += 1
        self.shots_dropped += f.dropped
        self.items_dropped += f.dropped > 0
        if f.cropped:
            self.items_cropped += 1
            self.tokens_cropped_sum += f.cropped
            self.tokens_cropped_max = max(self.tokens_cropped_max, f.cropped)
        self.items_cut_into_item += f.into_item
        self.items_span_cut += f.span_cut

    def describe(self) -> str:
        """'-' when nothing was cut, else e.g. '12.0%: 40 cropped (mean 61, max 140 tokens)'."""
        return f"{100 * self.share:.1f}%: {self.details()}" if self.prompts_over else "-"

    def details(self) -> str:
        """How the items that did not fit were cut (counts are items)."""
        parts = []
        if self.items_dropped:
            parts.append(f"{self.items_dropped} lost {self.shots_dropped} shots")
        if self.items_cropped:
            mean = self.tokens_cropped_sum / self.items_cropped
            parts.append(
                f"{self.items_cropped} cropped (mean {mean:.0f}, max {self.tokens_cropped_max} tokens)"
            )
        if self.items_cut_into_item:
            parts.append(f"{self.items_cut_into_item} into the item")
        if self.items_span_cut:
            parts.append(f"{self.items_span_cut} into the answer")
        return ", ".join(parts)


@dataclass
class TaskResult:
    label: str
    task_type: str
    num_fewshot: int
    items: int
    accuracy: float
    centered: float
    random_baseline: float  # percent
    decisions: list = field(repr=False)  # per item: chosen index, or True/False (language modeling)
    truncation: TruncationReport
    seconds: float

    def record(self) -> dict:
        out = asdict(self)
        out.pop("decisions")
        out["truncation"] = {**asdict(self.truncation), "share": self.truncation.share}
        return out


@dataclass
class SuiteResult:
    tasks: list[TaskResult]
    is_core: bool  # all 22 packaged CORE tasks, every item: the mean is the CORE score

    @property
    def mean_centered(self) -> float:
        return sum(t.centered for t in self.tasks) / len(self.tasks)


# ----------------------------------------------------------------------------------------------
# Tree rows


@dataclass
class Row:
    """One item's prompts packed as a shared prefix plus one branch per prompt."""

    tokens: list[int]
    positions: list[int]
    branch: list[int]  # -1 for the shared prefix, i for prompt i's branch
    pred_at: list[int]  # row index whose logits predict each scored token
    targets: list[int]  # the scored tokens
    owner: list[int]  # the prompt each scored token belongs to


def tree_row(item: ItemPrompts) -> Row:
    prompts = item.tokens
    shared = common_prefix(prompts)
    row = Row(list(prompts[0][:shared]), list(range(shared)), [-1] * shared, [], [], [])
    for i, (p, (start, end)) in enumerate(zip(prompts, item.spans)):
        offset = len(row.tokens) - shared  # row index of position j >= shared is j + offset
        row.tokens += p[shared:]
        row.positions += range(shared, len(p))
        row.branch += [i] * (len(p) - shared)
        for j in range(start, end):
            row.pred_at.append(j - 1 if j - 1 < shared else j - 1 + offset)
            row.targets.append(p[j])
            row.owner.append(i)
    return row


def batches(rows: list[Row], batch_tokens: int) -> list[list[int]]:
    """Row indices grouped by length (longest first), each group within batch_tokens."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].tokens))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * len(rows[groups[-1][0]].tokens) <= batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@torch.no_grad()
def score_rows(model, rows: list[Row], device, batch_tokens: int) -> list[tuple[list, list]]:
    """Per row: (mean loss per prompt, all-argmax-correct per prompt)."""
    out: list = [None] * len(rows)
    for group in batches(rows, batch_tokens):
        part = [rows[i] for i in group]
        nll, hit = _forward(model, part, device)
        for i, row, n, h in zip(group, part, nll, hit):
            out[i] = _per_prompt(row, n, h)
    return out


def _forward(model, rows: list[Row], device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    B, T = len(rows), len(rows[0].tokens)
    idx = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    br = torch.full((B, T), -2, dtype=torch.long)  # -2 marks padding
    for b, r in enumerate(rows):
        n = len(r.tokens)
        idx[b, :n] = torch.tensor(r.tokens)
        pos[b, :n] = torch.tensor(r.positions)
        br[b, :n] = torch.tensor(r.branch)
    idx, pos, br = idx.to(device), pos.to(device), br.to(device)
    if all(max(r.branch) <= 0 for r in rows):  # plain sequences: the causal default is exact
        h = model.hidden(idx)
    else:
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        same = (br[:, :, None] == br[:, None, :]) | (br[:, None, :] == -1)  # (B, T, T)
        h = model.hidden(idx, positions=pos, attn_mask=(causal & same).unsqueeze(1))
    b_idx = torch.cat([torch.full((len(r.pred_at),), b) for b, r in enumerate(rows)])
    p_idx = torch.cat([torch.tensor(r.pred_at) for r in rows])
    tgt = torch.cat([torch.tensor(r.targets) for r in rows]).to(device)
    logits = model.head(h[b_idx.to(device), p_idx.to(device)])  # (N, V) fp32
    nll = F.cross_entropy(logits, tgt, reduction="none").cpu()
    hit = (logits.argmax(-1) == tgt).cpu()
    sizes = [len(r.targets) for r in rows]
    return list(nll.split(sizes)), list(hit.split(sizes))


def _per_prompt(row: Row, nll: torch.Tensor, hit: torch.Tensor) -> tuple[list, list]:
    owner = torch.tensor(row.owner)
    n = int(owner.max()) + 1
    count = torch.zeros(n).index_add_(0, owner, torch.ones(len(owner)))
    mean = torch.zeros(n, dtype=nll.dtype).index_add_(0, owner, nll) / count
    missed = torch.zeros(n).index_add_(0, owner, (~hit).float())
    return mean.tolist(), (missed == 0).tolist()


def decide(task_type: str, means: list[float], all_hit: list[bool]):
    """The item's decision: chosen prompt index, or (language modeling) whether it was right."""
    if task_type == "language_modeling":
        return bool(all_hit[0])
    best = min(means)
    tol = TIE_TOLERANCE * max(1.0, abs(best))
    return next(i for i, m in enumerate(means) if m <= best + tol)


def is_correct(decision, gold: int | None) -> bool:
    return bool(decision) if gold is None else decision == gold


# ----------------------------------------------------------------------------------------------
# Tasks and suites


def task_items(task: TaskSpec, data_dir: Path) -> list[dict]:
    """The task's items in the harness's fixed shuffled order."""
    return shuffled(load_items(Path(data_dir) / task.dataset_uri, task))


def evaluate_task(
    model, tokenizer, task: TaskSpec, data: list[dict], opts: EvalOptions
) -> TaskResult:
    """Score the first `max_per_task` items of `data` (already shuffled; examples come from all)."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    builder = PromptBuilder(task, data, tokenizer, model.cfg.max_seq_len, opts.truncation)
    n = len(data) if opts.max_per_task is None else min(opts.max_per_task, len(data))
    items = [builder.build(i) for i in range(n)]
    report = TruncationReport()
    for it in items:
        report.add(it)
    scored = score_rows(model, [tree_row(it) for it in items], device, opts.batch_tokens)
    decisions = [decide(task.icl_task_type, m, h) for m, h in scored]
    acc = sum(is_correct(d, it.gold) for d, it in zip(decisions, items)) / n
    return TaskResult(
        task.label,
        task.icl_task_type,
        task.num_fewshot,
        n,
        acc,
        task.centered(acc),
        task.random_baseline,
        decisions,
        report,
        time.perf_counter() - t0,
    )


def load_suite(tasks: list[TaskSpec], data_dir: Path) -> list[tuple[TaskSpec, list[dict]]]:
    """Every task's items, read and checked up front: a bad file fails before any scoring."""
    return [(task, task_items(task, data_dir)) for task in tasks]


def evaluate_suite(
    model,
    tokenizer,
    suite: list[tuple[TaskSpec, list[dict]]],
    opts: EvalOptions,
    log: Callable[[str], None] = print,
) -> SuiteResult:
    """Every task of `load_suite` in turn (model in eval mode; the caller chooses autocast)."""
    was_training = model.training
    model.eval()
    results = []
    try:
        for task, data in suite:
            res = evaluate_task(model, tokenizer, task, data, opts)
            results.append(res)
            for line in truncation_warnings(res, model.cfg.max_seq_len, opts):
                log(line)
    finally:
        model.train(was_training)
    every_item = all(r.items == len(data) for r, (_, data) in zip(results, suite))
    return SuiteResult(results, every_item and is_full_core([task for task, _ in suite]))


def is_full_core(tasks: list[TaskSpec]) -> bool:
    """The 22 packaged CORE task definitions exactly (in any order)."""
    core = load_task_list(CORE_TASKS)
    return len(tasks) == len(core) and all(t in core for t in tasks)


def truncation_warnings(res: TaskResult, context: int, opts: EvalOptions) -> list[str]:
    rep = res.truncation
    if rep.share <= opts.warn_share:
        return []
    hint = (
        "; truncation mode drop_shots drops whole examples instead"
        if opts.truncation == "crop" and res.num_fewshot
        else ""
    )
    return [
        f"warning: {res.label}: {100 * rep.share:.1f}% of prompts exceed the model's "
        f"{context}-token context: {rep.items_over} of {res.items} items; {rep.details()}{hint}"
    ]


def format_table(suite: SuiteResult) -> str:
    """Per-task table plus the CORE line (or the mean centered score of a partial suite)."""
    head = f"{'task':<34} {'type':<6} {'shots':>5} {'items':>6} {'acc':>7} {'centered':>9} {'secs':>6}  truncated"
    lines = [head, "-" * len(head)]
    short = {"multiple_choice": "mc", "schema": "schema", "language_modeling": "lm"}
    for t in suite.tasks:
        lines.append(
            f"{t.label:<34} {short[t.task_type]:<6} {t.num_fewshot:>5} {t.items:>6} "
            f"{t.accuracy:>7.4f} {t.centered:>9.4f} {t.seconds:>6.1f}  {t.truncation.describe()}"
        )
    lines.append("-" * len(head))
    if suite.is_core:
        lines.append(f"CORE {suite.mean_centered:.4f}")
    else:
        lines.append(
            f"mean centered {suite.mean_centered:.4f} over {len(suite.tasks)} task(s) "
            "(CORE needs all 22 CORE tasks, every item)"
        )
    return "\n".join(lines)
