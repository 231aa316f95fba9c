"""Run by tests/test_distributed.py under torchrun (gloo, CPU): the distributed optimizers against
the single-process one on the same gradients. Every rank computes the single-process reference
itself; rank 0 writes the largest differences to the JSON file named by argv[1].

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/dist_optim_worker.py OUT
"""

from __future__ import annotations

import copy
import gc
import json
import sys

import torch
import torch.distributed as dist
from test_optim_traits import LionConfig  # this script's directory is on sys.path

from littlelm.errors import DistributedError
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.optim.groups import MuonConfig, build_optimizer
from littlelm.train.distributed import DistEnv, DistributedConfig, Parallel

# Odd sizes on purpose: 3 heads of 12, ve_gate (3, 32) and 3-element scalars split unevenly over
# 2 ranks; 12 attention matrices, 3 MLP matrices of each shape, 2 gates per Muon bucket.
MODEL = dict(name="gpt", vocab_size=100, n_layer=3, d_model=36, n_head=3, max_seq_len=16)
OPT = MuonConfig(name="muon", weight_decay=0.1, momentum=0.9)


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(step))


def train_step(model, opt, step: int) -> None:
    idx = batch(step)
    model(idx, idx).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        (x.detach().float() - full(y.detach()).float()).abs().max().item()
        for x, y in zip(a.parameters(), b.parameters())
    )


def state_diff(ref: dict, other: dict) -> float:
    worst = 0.0
    assert ref["state"].keys() == other["state"].keys(), "state of different params"
    for i, s in ref["state"].items():
        for k, v in s.items():
            worst = max(worst, (v.float() - other["state"][i][k].float()).abs().max().item())
    return worst


def old_layout(state: dict) -> dict:
    """`state` as the code up to 22771fd saved it: one part per optimizer (AdamW's groups, then
    Muon's), each numbering its parameters from 0 (optim/migrate.py reads it back)."""
    parts = []
    for kind in ("adamw", "muon"):
        groups = [g for g in state["param_groups"] if g["kind"] == kind]
        renumber = {i: j for j, i in enumerate(i for g in groups for i in g["params"])}
        parts.append(
            {
                "state": {renumber[i]: s for i, s in state["state"].items() if i in renumber},
                "param_groups": [
                    {
                        **{k: v for k, v in g.items() if k != "kind"},
                        "params": [renumber[i] for i in g["params"]],
                    }
                    for g in groups
                ],
            }
        )
    return {"optimizers": parts}


def variants(base: GPT, cfg=OPT) -> dict:
    """name -> (model, optimizer) built from copies of `base`."""
    out = {}
    m = copy.deepcopy(base)
    out["ref"] = (m, build_optimizer(m, cfg))
    m = copy.deepcopy(base)
    out["ddp"] = (m, build_optimizer(m, cfg).shard(False, True, True))
    m = copy.deepcopy(base)
    env = DistEnv(dist.get_rank(), dist.get_world_size())
    fsdp = Parallel(DistributedConfig(strategy="fsdp"), env, torch.device("cpu"))
    fsdp.shard_model(m, "fp32")
    out["fsdp"] = (m, build_optimizer(m, cfg).shard(True, True, False))
    return out


def ddp_accumulation(par: Parallel) -> dict:
    """Two micro-batches per rank through Parallel.wrap (DDP) and Parallel.no_sync: the first
    stays local, the second all-reduces; the result is the gradient of all four micro-batches."""
    torch.manual_seed(1)
    base = GPT(GPTConfig(**MODEL))
    micro = [batch(10 + i) for i in range(4)]  # rank r takes micro[2r], micro[2r + 1]
    ref = copy.deepcopy(base)
    for idx in micro:
        (ref(idx, idx) / 4).backward()
    alone = copy.deepcopy(base)
    mine = micro[2 * par.rank : 2 * par.rank + 2]
    (alone(mine[0], mine[0]) / 2).backward()
    model = copy.deepcopy(base)
    ddp = par.wrap(model)
    with par.no_sync(skip=True):
        (ddp(mine[0], mine[0]) / 2).backward()
    local = max(
        (p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), alone.parameters())
    )
    with par.no_sync(skip=False):
        (ddp(mine[1], mine[1]) / 2).backward()
    return {
        "accum_first_is_local": local,
        "accum_grads": max(
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), ref.parameters())
        ),
    }


def new_optimizer(base: GPT) -> dict:
    """A new optimizer's elementwise rule (Lion, tests/test_optim_traits.py) under ZeRO-1 and
    FSDP2, sharded by what its rule says alone, against its single-process run."""
    runs = variants(base, LionConfig(weight_decay=0.1))
    for step in range(3):
        for model, opt in runs.values():
            train_step(model, opt, step)
    ref_model, ref_opt = runs["ref"]
    ref_state = ref_opt.state_dict()
    result = {
        "lion_params_zero": max_diff(ref_model, runs["ddp"][0]),
        "lion_params_fsdp": max_diff(ref_model, runs["fsdp"][0]),
        "lion_state_zero": state_diff(ref_state, runs["ddp"][1].state_dict()),
        "lion_state_fsdp": state_diff(ref_state, runs["fsdp"][1].state_dict()),
    }
    resumed = variants(ref_model, LionConfig(weight_decay=0.1))
    for _, opt in resumed.values():
        opt.load_state_dict(copy.deepcopy(ref_state))
    train_step(ref_model, ref_opt, 3)
    for model, opt in resumed.values():
        train_step(model, opt, 3)
    result["lion_resumed_zero"] = max_diff(ref_model, resumed["ddp"][0])
    result["lion_resumed_fsdp"] = max_diff(ref_model, resumed["fsdp"][0])
    return result


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    compare(out_path)
    # FSDP modules and DDP reducers hold on to the process group through reference cycles: free
    # them while it still exists, or gloo may abort the process at exit
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def compare(out_path: str) -> None:
    torch.manual_seed(0)
    base = GPT(GPTConfig(**MODEL))
    runs = variants(base)
    for step in range(3):
        for model, opt in runs.values():
            train_step(model, opt, step)
    ref_model, ref_opt = runs["ref"]
    ref_state = ref_opt.state_dict()
    result = {
        "params_ddp": max_diff(ref_model, runs["ddp"][0]),
        "params_fsdp": max_diff(ref_model, runs["fsdp"][0]),
        "state_ddp": state_diff(ref_state, runs["ddp"][1].state_dict()),
        "state_fsdp": state_diff(ref_state, runs["fsdp"][1].state_dict()),
    }
    # a single-process state loads into fresh sharded optimizers, and training continues alike
    resumed = variants(ref_model)
    for _, opt in resumed.values():
        opt.load_state_dict(copy.deepcopy(ref_state))
    migrated = variants(ref_model)  # the same state in the layout written before MuonAdamW
    for _, opt in migrated.values():
        opt.load_state_dict(old_layout(copy.deepcopy(ref_state)))
    for step in (3, 4):
        train_step(ref_model, ref_opt, step)
        for model, opt in [*resumed.values(), *migrated.values()]:
            train_step(model, opt, step)
    result["resumed_ddp"] = max_diff(ref_model, resumed["ddp"][0])
    result["resumed_fsdp"] = max_diff(ref_model, resumed["fsdp"][0])
    result["migrated_ddp"] = max_diff(ref_model, migrated["ddp"][0])
    result["migrated_fsdp"] = max_diff(ref_model, migrated["fsdp"][0])
    result.update(new_optimizer(base))
    env = DistEnv(dist.get_rank(), dist.get_world_size())
    par = Parallel(DistributedConfig(), env, torch.device("cpu"))
    result.update(ddp_accumulation(par))
    try:
        par.agree(dist.get_rank() == 0, "a value that differs")
        result["agree_raised"] = False
    except DistributedError as e:
        result["agree_raised"] = "rank 1 has" in str(e)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
