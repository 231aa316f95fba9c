"""Data-parallel model wrapping: DDP (every rank holds the whole model) or FSDP2 (fully_shard:
every rank holds a 1/world slice of each parameter and gathers whole ones only while a unit
computes). Which modules become FSDP units, and why, the model says (`shard_units`,
model/gpt.py); the memory each rank holds is written out in docs/distributed.md.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel


def ddp_wrap(model: nn.Module, device: torch.device, bucket_cap_mb: int) -> nn.Module:
    """DDP with gradients living in the all-reduce buckets (no second copy of the gradients).
    Buffers (RoPE tables) are identical on every rank, so they are not re-broadcast each step."""
    # torch 2.13 renamed broadcast_buffers to forward_sync_buffers
    new_name = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=True,
        **{"forward_sync_buffers" if new_name else "broadcast_buffers": False},
    )


def fully_shard_model(
    model: nn.Module, world: int, device_type: str, precision: str, cfg
) -> nn.Module:
    """Apply FSDP2 in place: each unit, then the root. Under bf16 the gathered weights are cast
    to bf16 for compute while the sharded fp32 weights stay the master copy, and gradients are
    reduce-scattered in fp32."""
    mesh = init_device_mesh(device_type, (world,))
    if precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for unit in model.shard_units():  # the model says which (LanguageModel.shard_units)
        fully_shard(unit, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=mp)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict of an FSDP model, gathered onto rank 0's CPU (other ranks get an
    empty dict), without tied duplicates. Every rank must call it (a collective)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=opts)
    every = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    unique = {n for n, _ in model.named_parameters()}
    return {k: v for k, v in full.items() if k not in every - unique}


@torch.no_grad()
def load_full_state_dict(model: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy a whole state dict (the same on every rank, e.g. a checkpoint each rank read) into
    an FSDP model in place: each rank keeps its own slice. In place matters: the optimizer holds
    these very parameters (set_model_state_dict may swap in new ones). Tied copies are absent
    from `full` and skipped."""
    for name, t in model.state_dict().items():
        src = full.get(name)
        if src is None:
            continue
        if isinstance(t, DTensor):
            src = distribute_tensor(
                src.to(t.device, t.dtype), t.device_mesh, t.placements, src_data_rank=None
            )
            t.to_local().copy_(src.to_local())
        else:
            t.copy_(src)
