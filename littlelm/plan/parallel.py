"""Memory of data-parallel training, analytic only (littlelm's DDP and FSDP arrive later).

DDP (torch.nn.parallel.DistributedDataParallel, default `gradient_as_bucket_view=False`) copies
every gradient into its communication buckets: one more copy of the gradients (their dtype). FSDP2
(`fully_shard`, bf16 `param_dtype`, reshard after forward) keeps 1/N of the parameters,
gradients and optimizer state per GPU, and gathers the layers it is working on (the current one
and the prefetched next: bf16 weights, fp32 gradients before their reduce-scatter).
"""

from __future__ import annotations

from littlelm.plan import memory as mem
from littlelm.plan.accounting import block_bytes
from littlelm.plan.shapes import Dims


def ddp_bucket_bytes(d: Dims, devices: int) -> int:
    if devices <= 1:
        return 0
    return sum(block_bytes(d.param_bytes * p.numel) for p in d.params)


def layer_param_numel(d: Dims) -> int:
    blocks = [p for p in d.params if p.name.startswith("blocks.")]
    return max(1, sum(p.numel for p in blocks) // d.model.n_layer)


def fsdp_peak(d: Dims, shards: int, kernels: mem.Kernels = "cuda") -> int:
    """Peak tensor bytes per GPU when parameters, gradients and optimizer state are sharded
    over `shards` GPUs (each GPU still runs its own micro-batch)."""
    e = mem.estimate(d, kernels)
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
