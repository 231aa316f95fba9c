"""The plan's one reference for memory: one whole training step traced under FakeTensorMode.

The model and optimizer come from the function training uses (`train.build.build`) and the step
is the trainer's own `micro_step` + `apply_update`, so a new model feature is planned the day it
exists. Shapes, dtypes and storages are real, no memory is touched, and a 3B model traces in
seconds. In order: build; one optimizer step on zero gradients (so the state exists, as in every
step after the first); `min(grad_accum, 2)` micro-batches of forward + backward; clipping, the
optimizer step and `zero_grad`. A TorchDispatchMode (`MemoryAccountant`) counts every storage an
op returns, rounded up to the CUDA allocator's 512-byte blocks, under the category of the
moment, which hooks at the model's seams switch.

Fake `cuda` tensors do not survive backward on a CPU-only PyTorch, so the step runs the cpu
backend's kernels; for a GPU's plan (`gpu=True`) attention is FlashAttention's footprint instead
of the CPU's blocked kernel. With `gpu=False` the trace is the CPU step exactly (bench on a CPU
measures it to 0.01%). The analytic model (plan/memory.py) is held to this trace.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from littlelm.data.chat import chat_format
from littlelm.errors import DataError
from littlelm.model import kernels
from littlelm.model.generate import tempered
from littlelm.model.gpt import GPT
from littlelm.optim import lowp
from littlelm.train.build import build, build_model, build_objective
from littlelm.train.device import autocast
from littlelm.train.objective import Setting
from littlelm.train.rl import group_loss, read_prompts, reply_logps
from littlelm.train.step import LanguageModelLoss, apply_update, micro_step
from littlelm.train.transform import transform_for

# The memory categories the trace, the analytic model, bench and the report share, in table order
PARAMS, GRADS, STATE = "parameters", "gradients", "optimizer state"
REF = "frozen reference"  # DPO's and RL's reference model beside the one trained (own weights)
KV = "KV cache & sampling"  # RL's sampling: a group's KV cache, the prompt's forward
COPIES, ACT, LOSS = "weight copies", "activations", "logits & loss"
BWD, SCRATCH = "backward temporaries", "optimizer scratch"
CATEGORIES = (PARAMS, REF, GRADS, STATE, KV, COPIES, ACT, LOSS, BWD, SCRATCH)
FB, OPT = "forward/backward", "optimizer step"  # the phases of a step
SAMPLE = "sampling"  # RL's phase before its forward/backward: replies drawn, no gradients
WEIGHT_OPS = (torch.ops.aten._to_copy.default, torch.ops.aten.cat.default)
BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes


def block_bytes(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK if nbytes else 0


@dataclass(frozen=True)
class Memory:
    """Tensor memory of one step on one device: bytes per category (each at its own largest)
    and, per phase, what is alive at that phase's peak by category."""

    categories: dict[str, int]
    breakdowns: dict[str, dict[str, int]]  # phase -> category -> bytes at the phase's peak
    source: str  # where the figures come from, in words
    seconds: float = 0.0  # how long the trace took

    @property
    def phases(self) -> dict[str, int]:
        return {k: sum(v.values()) for k, v in self.breakdowns.items()}

    @property
    def peak_phase(self) -> str:
        phases = self.phases
        return max(phases, key=phases.__getitem__)

    @property
    def peak(self) -> int:
        return self.phases[self.peak_phase]


@dataclass
class Snapshot:
    total: int = 0
    by_category: dict[str, int] = field(default_factory=dict)


class MemoryAccountant(TorchDispatchMode):
    """Live tensor storages by category, on real tensors (bench on a CPU) or fake ones. A new
    storage is counted under `region` and uncounted when freed (a weakref callback); `peaks`
    keeps the breakdown at each `phase`'s peak, `maxima` the highest each category reached."""

    def __init__(self) -> None:
        super().__init__()
        self.region = self.phase = "other"
        self.live: dict[int, tuple[int, str]] = {}  # id(storage) -> (bytes, category)
        self.total = 0
        self.peak = Snapshot()
        self.peaks: dict[str, Snapshot] = {}
        self.at_forward_end: dict[str, int] = {}  # live bytes by category as the forward returned
        self.maxima: Counter[str] = Counter()
        self.param_storages: set[int] = set()
        self._cat: Counter[str] = Counter()  # live bytes per category now
        self._refs: dict[int, weakref.ref] = {}

    def track(self, t: torch.Tensor, category: str) -> None:
        """Count `t`'s storage under `category` (no-op when it is already counted)."""
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return
        nbytes = block_bytes(st.nbytes())
        self.live[key] = (nbytes, category)

        def on_free(_: object, key: int = key) -> None:  # the storage was freed
            self._free(key)

        self._refs[key] = weakref.ref(st, on_free)
        self._add(category, nbytes)

    def relabel(self, t: torch.Tensor, category: str) -> None:
        key = id(t.untyped_storage())
        if key not in self.live:
            self.track(t, category)
        else:
            self.relabel_key(key, category)

    def relabel_key(self, key: int, category: str) -> None:
        nbytes, old = self.live[key]
        if old != category:
            self.live[key] = (nbytes, category)
            self._cat[old] -= nbytes
            self._add(category, nbytes, count_total=False)

    def _add(self, category: str, nbytes: int, count_total: bool = True) -> None:
        self._cat[category] += nbytes
        self.maxima[category] = max(self.maxima[category], self._cat[category])
        self.total += nbytes if count_total else 0
        if self.total > self.peak.total:
            self.peak = self.snapshot()
        best = self.peaks.get(self.phase)
        if best is None or self.total > best.total:
            self.peaks[self.phase] = self.snapshot()

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        self._refs.pop(key, None)
        if entry is not None:
            self._cat[entry[1]] -= entry[0]
            self.total -= entry[0]

    def snapshot(self) -> Snapshot:
        return Snapshot(self.total, {k: v for k, v in self._cat.items() if v})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        category = self.region
        # a weight cast (autocast) or stacked (q, k, v) for a matmul; the optimizer's casts of
        # the weights (bf16 master weights: fp32 updates) are its scratch
        if self.phase != OPT and func in WEIGHT_OPS and self._from_weights(args[0]):
            category = COPIES
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.track(t, category)
        return out

    def _from_weights(self, arg) -> bool:
        """Is `arg` (a tensor, or cat's list) made of parameters or copies of them only?"""
        tensors = arg if isinstance(arg, (list, tuple)) else [arg]
        return bool(tensors) and all(
            isinstance(t, torch.Tensor)
            and (
                id(t.untyped_storage()) in self.param_storages
                or self.live.get(id(t.untyped_storage()), (0, ""))[1] == COPIES
            )
            for t in tensors
        )

    def track_params(self, params, buffers=(), category: str = PARAMS) -> None:
        """Count parameters and buffers (under `category`); casts of parameters become weight
        copies."""
        for t in params:
            self.param_storages.add(id(t.untyped_storage()))
            self.track(t, category)
        for t in buffers:
            self.track(t, category)


class _FlashFootprint(torch.autograd.Function):
    """What FlashAttention-2, SDPA's kernel on a GPU, allocates (flash_api.cpp), on fake
    tensors: the forward returns the output in (B, T, H, D) storage and keeps q, k, v, the output
    and an fp32 log-sum-exp per head and row; the backward makes an fp32 dq accumulator, the
    fp32 row sums of dO·O, dq, and dk and dv (under GQA at the query heads' width first, then
    summed into the key/value heads'). Nothing is computed: only the memory is traced."""

    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        out = q.new_empty(B, T, H, D).transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, q.new_empty(B, H, T, dtype=torch.float32))
        return out

    @staticmethod
    def backward(ctx, g):
        q, k = ctx.saved_tensors[:2]
        B, H, T, D = q.shape
        Hkv = k.size(1)
        # alive until the gradients are made: the fp32 dq accumulator, the row sums of dO·O
        workspace = [q.new_empty(B, T, H, D, dtype=torch.float32)]
        workspace.append(q.new_empty(B, H, T, dtype=torch.float32))
        dq = q.new_empty(B, T, H, D).transpose(1, 2)
        if Hkv == H:
            dk, dv = (k.new_empty(B, T, Hkv, D).transpose(1, 2) for _ in range(2))
        else:  # GQA: per query head, then summed over the heads sharing a key/value head
            dk, dv = (
                q.new_empty(B, T, H, D).unflatten(2, (Hkv, H // Hkv)).sum(3).transpose(1, 2)
                for _ in range(2)
            )
        workspace.clear()
        return dq, dk, dv


flash_footprint = _FlashFootprint.apply


@contextlib.contextmanager
def _traceable(gpu: bool):
    """The cpu backend's kernels, with FlashAttention's footprint for attention on every backend
    name for a GPU's plan; and torch's foreach Adam and the stochastic-rounding AdamW, which
    read their step counters with `.item()` for the bias corrections (a fake tensor cannot
    answer), handed a number."""
    import torch.optim.adam as adam

    saved, real, count = dict(kernels.BACKENDS), adam._get_value, lowp.step_count
    if gpu:
        standin = replace(kernels.CPU, attention=flash_footprint)
        kernels.BACKENDS.update(cpu=standin, cuda=standin)
    adam._get_value = lambda x: 1.0 if isinstance(x, FakeTensor) else real(x)
    lowp.step_count = lambda step: 1.0 if isinstance(step, FakeTensor) else count(step)
    try:
        yield
    finally:
        kernels.BACKENDS.update(saved)
        adam._get_value, lowp.step_count = real, count


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def trace_step(cfg, micro_batch: int | None = None, gpu: bool = True) -> Memory:
    """Trace one optimizer step of `cfg` (at `micro_batch` sequences per micro-batch), with a
    GPU's attention (`gpu`) or as it runs on this CPU."""
    t0, cpu = time.perf_counter(), torch.device("cpu")
    cfg = cfg.with_precision(True)  # `auto` as on the GPU it stands in for (Dims.of does too)
    mb = micro_batch or cfg.train.micro_batch_size
    with FakeTensorMode(), _traceable(gpu):
        model, optimizer = build(cfg, cpu, traced=True)
        step = objective_step(cfg, model, cpu, mb)
        trained = [p for p in model.parameters() if p.requires_grad]  # a LoRA run's adapters
        for p in trained:  # one step on zero gradients: the state exists
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        acct = MemoryAccountant()
        handles = _install_hooks(model, acct)
        try:
            with acct:
                acct.track_params(model.parameters(), model.buffers())
                if step.reference is not None:  # its own weights (LoRA: adapters off, none)
                    acct.track_params(step.reference.parameters(), step.reference.buffers(), REF)
                for t in optimizer_tensors(optimizer):
                    acct.track(t, STATE)
                if step.sample is not None:  # RL: the replies are drawn before any gradient
                    acct.phase, acct.region = SAMPLE, KV
                    step.sample()
                for _ in range(min(step.repeats, 2)):  # the second with the first's gradients
                    acct.phase, acct.region = FB, ACT
                    step.micro()
                acct.phase, acct.region = OPT, SCRATCH
                apply_update(model, optimizer, cfg.train.grad_clip)
                acct.phase = acct.region = "after"
        finally:
            for h in handles:
                h.remove()
    at_fwd = acct.at_forward_end
    categories = {k: acct.maxima[k] for k in CATEGORIES}
    categories[COPIES], categories[ACT] = at_fwd.get(COPIES, 0), at_fwd.get(ACT, 0)
    phases = (SAMPLE, FB, OPT) if step.sample is not None else (FB, OPT)
    return Memory(
        categories=categories,
        breakdowns={k: acct.peaks[k].by_category for k in phases},
        source="trace" + (" (FlashAttention's footprint)" if gpu else " (this CPU's kernels)"),
        seconds=time.perf_counter() - t0,
    )


@dataclass
class TracedStep:
    """What the trace runs of a run's objective: its frozen reference when it has weights of
    its own, RL's sampling (None for the others), and one micro-batch's forward and backward,
    `repeats` of them a step (the trace runs two at most)."""

    reference: torch.nn.Module | None
    micro: Callable[[], None]
    repeats: int
    sample: Callable[[], None] | None = None


def reference_for(cfg, model: torch.nn.Module, cpu: torch.device):
    """The objective's frozen reference as the trainer builds it (Setting.reference): a copy of
    the run's base in train.master_weights' dtype (growth.base_copy's build, its weights not
    read), or under LoRA the model itself with its adapters off (the transform's own)."""

    def copy() -> torch.nn.Module:
        frozen = build_model(cfg, cpu, traced=True)
        assert isinstance(frozen, torch.nn.Module)  # every model is one (model/protocol.py)
        frozen.requires_grad_(False)
        return frozen.eval()

    return lambda: transform_for(cfg.lora, None).reference(model, copy)


def own_weights(reference) -> torch.nn.Module | None:
    """`reference` when it holds weights of its own (a copy), else None (LoRA's adapters off)."""
    if reference is None or not any(True for _ in reference.parameters()):
        return None
    return reference


def objective_step(cfg, model: torch.nn.Module, cpu: torch.device, mb: int) -> TracedStep:
    """The step of the objective the trainer builds for `cfg`: the language-model loss of `mb`
    rows, DPO's of `mb` pairs (two rows each) with its reference resident, or RL's groups."""
    cast = autocast(cpu, cfg.train.precision)
    accum = cfg.train.grad_accum or 1
    if getattr(cfg, "rl", None) is not None:
        return rl_step(cfg, model, cpu)
    loss, rows, reference = model, 1, None
    if getattr(cfg, "dpo", None) is not None:
        setting = Setting(
            cfg,
            model,
            cpu,
            cast,
            SimpleNamespace(masked=True),  # pairs' rows: their replies' targets
            None,
            reference=reference_for(cfg, model, cpu),
        )
        objective = build_objective(cfg, setting)
        assert isinstance(objective, LanguageModelLoss), "DPO's loss is the LM step's, of pairs"
        loss, rows = objective.loss_of(model), 2
        reference = own_weights(getattr(objective, "reference", None))

    def micro() -> None:
        x = torch.zeros(mb * rows, cfg.train.seq_len, dtype=torch.long)  # (B, T) ids
        micro_step(loss, x, x.clone(), accum, cast)

    return TracedStep(reference, micro, accum)


def rl_rows(cfg) -> tuple[int, int, bool]:
    """(prompt tokens, row tokens, measured) an RL run's groups are planned at: its longest
    prompt when rl.prompts and the run's saved tokenizer can be read (measured), else the
    longest the model allows (model.max_seq_len - rl.max_new_tokens, as train/rl.py's
    read_prompts checks); a row is the prompt and rl.max_new_tokens of reply."""
    r = cfg.rl
    room = cfg.model.max_seq_len - r.max_new_tokens
    longest, measured = room, False
    tok = cfg.data.tokenizer
    if getattr(tok, "path", None) is not None and Path(r.prompts).expanduser().is_file():
        try:
            fmt = chat_format(tok.tokenizer_class().from_config(tok))
            prompts = read_prompts(Path(r.prompts).expanduser(), fmt, room)
            longest, measured = max(len(p.ids) for p in prompts), True
        except (DataError, OSError, ValueError):  # not readable yet: the bound plans it
            pass
    return longest, longest + r.max_new_tokens, measured


def rl_step(cfg, model: torch.nn.Module, cpu: torch.device) -> TracedStep:
    """RL's step (train/rl.py) on stand-in tokens: sampling (a group's KV cache sized for the
    longest prompt and reply, the prompt's forward and one token's; with rl.iterations > 1 the
    log-probs of the replies as sampled), then per group the reference's log-probs and the
    policy's with its loss and backward (`group_loss`, the trainer's own), over rows of the
    prompt and the whole reply."""
    r, cast = cfg.rl, autocast(cpu, cfg.train.precision)
    prompt, width = rl_rows(cfg)[:2]
    reference = reference_for(cfg, model, cpu)()
    G = r.group_size
    assert isinstance(model, GPT), "schema.problems refuses rl: without sft's GPT"

    def rows():
        x = torch.zeros(G, width - 1, dtype=torch.long)  # inputs: all but the last token
        return x, x.clone(), torch.ones(G, width - 1, dtype=torch.bool)

    def sample() -> None:
        # sample_group's allocations (model/generate.py): the cache, the prompt, one token
        was = model.training
        model.eval()  # as RL samples: eval mode, no gradients
        with torch.no_grad():
            with cast:
                caches = model.new_caches(G, width)
                logits = model(
                    torch.zeros(1, prompt, dtype=torch.long).expand(G, -1), caches=caches
                )
                probs = torch.softmax(tempered(logits[:, -1], r.temperature), dim=-1)
                del logits, probs
                model(torch.zeros(G, 1, dtype=torch.long), caches=caches)
            del caches
            if r.iterations > 1:  # the replies' log-probs as sampled (π_old), kept a batch
                x, y, _ = rows()
                reply_logps(model, x, y, r.temperature, cast)
        model.train(was)

    def micro() -> None:
        a = torch.zeros(G)
        old = torch.zeros(G, width - 1) if r.iterations > 1 else None
        loss = group_loss(model, reference, rows(), a, old, r, cast, float(G * width))[0]
        loss.backward()

    return TracedStep(own_weights(reference), micro, r.prompts_per_step, sample)


def _install_hooks(model: torch.nn.Module, acct: MemoryAccountant) -> list:
    """Region switches at the model's seams, and gradients labelled as they land. A forward
    without gradients (DPO's reference as the model with its adapters off) switches nothing."""

    def end_of_forward(*_):
        if not torch.is_grad_enabled():
            return
        acct.at_forward_end = acct.snapshot().by_category
        acct.region = LOSS  # the loss's backward comes first

    def blocks_backward(*_args):
        # what the loss leaves alive now (the stream's gradient) is the blocks' to carry
        for key, (_, cat) in list(acct.live.items()):
            if cat == LOSS:
                acct.relabel_key(key, BWD)
        acct.region = BWD

    norm_f, blocks = model.norm_f, model.blocks  # the seams every model has (LanguageModel)
    assert isinstance(norm_f, torch.nn.Module) and isinstance(blocks, torch.nn.ModuleList)
    handles = [
        model.register_forward_hook(end_of_forward),
        norm_f.register_forward_hook(
            lambda *_: setattr(acct, "region", LOSS) if torch.is_grad_enabled() else None
        ),
        blocks[-1].register_full_backward_pre_hook(blocks_backward),
    ]
    for p in model.parameters():
        if p.requires_grad:  # a LoRA run's frozen base gets no gradient
            hook = p.register_post_accumulate_grad_hook(lambda p: acct.relabel(p.grad, GRADS))
            handles.append(hook)
    return handles
