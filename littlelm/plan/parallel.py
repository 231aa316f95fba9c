"""Per-rank memory of data-parallel training, as littlelm runs it (train/model_parallel.py,
optim/optimizer.py; docs/distributed.md has the formulas).

DDP wraps with `gradient_as_bucket_view=True`: the gradients live in the all-reduce buckets, so
DDP adds no copy; sharded Muon and ZeRO-1 shrink the optimizer state (plan/memory.py, through
`Dims.ddp_ranks`). FSDP2 (`fully_shard` per block, bf16 `param_dtype`, reshard after forward)
keeps 1/N of the parameters, gradients and optimizer state per GPU, and gathers the units it is
working on (the current one and the prefetched next: bf16 weights, fp32 gradients before their
reduce-scatter).
"""

from __future__ import annotations

from dataclasses import replace

from littlelm.plan import memory as mem
from littlelm.plan.shapes import Dims


def layer_param_numel(d: Dims) -> int:
    blocks = [p for p in d.params if p.name.startswith("blocks.")]
    return max(1, sum(p.numel for p in blocks) // d.model.n_layer)


def fsdp_peak(d: Dims, shards: int, kernels: mem.Kernels = "cuda") -> int:
    """Peak tensor bytes per GPU when parameters, gradients and optimizer state are sharded
    over `shards` GPUs (each GPU still runs its own micro-batch)."""
    e = mem.estimate(replace(d, strategy="fsdp", world=shards), kernels)  # whole, then / shards
    c = e.categories
    sharded = (c[mem.PARAMS] + c[mem.GRADS] + c[mem.STATE]) // shards
    per = 2 + d.param_bytes  # bf16 weights gathered + gradients (the parameters' dtype)
    gathered = 2 * layer_param_numel(d) * per  # two layers
    head = d.model.padded_vocab * d.model.d_model * per  # lm_head while the loss runs
    forward_backward = (
        sharded + gathered + c[mem.ACT] + max(c[mem.LOSS] + head, c[mem.BWD] + gathered)
    )
    optimizer = sharded + c[mem.SCRATCH] // shards
    return max(forward_backward, optimizer)


def fsdp_categories(d: Dims, shards: int, kernels: mem.Kernels = "cuda") -> dict[str, int]:
    """Bytes per category on one GPU under FSDP over `shards` GPUs: parameters, gradients,
    optimizer state and scratch split, the gathered units counted as weight copies."""
    e = mem.estimate(replace(d, strategy="fsdp", world=shards), kernels)
    c = dict(e.categories)
    for k in (mem.PARAMS, mem.GRADS, mem.STATE, mem.SCRATCH):
        c[k] //= shards
    per = 2 + d.param_bytes
    c[mem.COPIES] += 2 * layer_param_numel(d) * per
    return c
