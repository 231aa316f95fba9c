"""Several processes, one run: the environment, the process group, and what the trainer asks
of the other ranks.

    torchrun --nproc_per_node 8 -m littlelm train run.yaml     # one process per GPU
    littlelm train run.yaml --nproc 8                          # the same; runs torchrun for you

torchrun starts one process per device and sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; `detect_env` reads them and refuses a partial or inconsistent set.
`session` joins the process group (NCCL on GPUs, gloo on CPUs) and leaves it at the end. The
`Parallel` it yields is everything the trainer needs: which rank it is, the device, DDP or FSDP2
wrapping, the optimizer's sharding (optim/optimizer.py), and a few collectives. A single
process gets the same object with every operation a no-op. See docs/distributed.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import inspect
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import torch
import torch.distributed as dist
from pydantic import Field, model_validator

from littlelm.config import Cfg
from littlelm.errors import DistributedError, LittleLMError

T = TypeVar("T")

# Variables torchrun sets for every worker; a process that has some but not all was not started
# by a launcher we understand.
REQUIRED_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal the kernel sends when our parent dies


class DistributedConfig(Cfg):
    """How several processes share a run (ignored by a single process)."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model; fsdp: parameters, gradients and "
        "optimizer state are split across ranks (FSDP2).",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="Collective backend; auto = nccl on CUDA, gloo on the CPU."
    )
    shard_muon: bool = Field(
        True,
        description="Each rank orthogonalises only the Muon matrices it owns and the updates are "
        "gathered; false = every rank repeats every update (ddp only).",
    )
    shard_adamw: bool = Field(
        False,
        description="ddp: split AdamW's moments across ranks (ZeRO-1); fsdp always splits them.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="fsdp: free gathered parameters after forward (ZeRO-3); false keeps them "
        "until backward (ZeRO-2: less communication, more memory).",
    )
    bucket_cap_mb: int = Field(25, description="ddp: gradient all-reduce bucket size in MiB.", ge=1)
    timeout_s: int = Field(
        1800,
        description="Seconds a collective (or joining the group) may wait before the run fails.",
        ge=1,
    )
    world_size: int | None = Field(
        None,
        description="Processes in the run: derived from torchrun's WORLD_SIZE; do not set.",
        ge=1,
    )

    @model_validator(mode="after")
    def _check(self) -> DistributedConfig:
        if self.strategy == "fsdp" and not self.shard_muon:
            raise ValueError(
                "shard_muon=false is ddp-only: under fsdp every rank holds a slice of each "
                "matrix, so Muon always runs on the rank that owns the whole matrix"
            )
        return self


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits among the run's processes (a single process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master: str = ""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(environ: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = environ.get(key)
    if raw is None:
        assert default is not None, key
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"{key}={raw!r} is not an integer; launch with torchrun") from None


def detect_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """The launcher's variables, checked. No variable at all means a single process."""
    environ = os.environ if environ is None else environ
    present = [k for k in REQUIRED_ENV if k in environ]
    if not present:
        procs = environ.get("SLURM_NTASKS")
        if procs and procs.isdigit() and int(procs) > 1:
            raise DistributedError(
                f"SLURM started {procs} tasks but none has RANK/WORLD_SIZE set, so each would "
                "train alone; start one torchrun per node (srun torchrun ... -m littlelm train), "
                "see docs/distributed.md"
            )
        return DistEnv()
    missing = [k for k in REQUIRED_ENV if k not in environ]
    if missing:
        raise DistributedError(
            f"incomplete distributed environment: {', '.join(present)} set but "
            f"{', '.join(missing)} missing; launch with `torchrun --nproc_per_node N -m littlelm "
            "train ...` (or `littlelm train --nproc N`), or unset "
            f"{', '.join(present)} to train in one process"
        )
    world = _int(environ, "WORLD_SIZE")
    rank = _int(environ, "RANK")
    local_rank = _int(environ, "LOCAL_RANK", rank)
    local_world = _int(environ, "LOCAL_WORLD_SIZE", world)
    if world < 1 or not 0 <= rank < world:
        raise DistributedError(f"RANK={rank} is outside WORLD_SIZE={world}; relaunch with torchrun")
    if not 0 <= local_rank < local_world or local_world > world:
        raise DistributedError(
            f"LOCAL_RANK={local_rank} / LOCAL_WORLD_SIZE={local_world} do not fit WORLD_SIZE="
            f"{world}; relaunch with torchrun"
        )
    master = f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    return DistEnv(rank, world, local_rank, local_world, master)


def launch(nproc: int, args: list[str], device: str = "auto") -> NoReturn:
    """Replace this process by torchrun running `littlelm ARGS` on `nproc` local processes."""
    if detect_env().distributed:
        raise DistributedError(
            "--nproc is for starting a run; this process is already one of torchrun's workers: "
            "leave --nproc out"
        )
    if nproc < 1:
        raise DistributedError(f"--nproc {nproc}: give at least 1")
    gpus = torch.cuda.device_count() if device in ("auto", "cuda") else 0
    if gpus and nproc > gpus:
        raise DistributedError(
            f"--nproc {nproc} but {gpus} GPU(s) are visible: use --nproc {gpus} or fewer "
            "(one process per GPU), or run.device=cpu"
        )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a rendezvous on a free local port: runs can share a machine
        f"--nproc_per_node={nproc}",
        "-m",
        "littlelm",
        *args,
    ]
    sys.stdout.flush()
    os.execv(argv[0], argv)


def pick_backend(requested: str, dev_type: str) -> str:
    backend = requested if requested != "auto" else ("nccl" if dev_type == "cuda" else "gloo")
    if backend == "nccl" and dev_type != "cuda":
        raise DistributedError(
            "distributed.backend=nccl needs CUDA devices but this run is on the CPU; "
            "use distributed.backend=gloo (or auto)"
        )
    return backend


@contextlib.contextmanager
def session(
    cfg: DistributedConfig, device: torch.device, env: DistEnv | None = None
) -> Iterator[Parallel]:
    """Join the process group for the duration of the block (nothing to join for one process)."""
    env = env or detect_env()
    if not env.distributed:
        yield Parallel(cfg, env, device)
        return
    stop_with_launcher()
    dev_type = device.type
    if dev_type not in ("cuda", "cpu"):
        raise DistributedError(
            f"run.device {dev_type} cannot be shared by several processes; use cuda or cpu"
        )
    backend = pick_backend(cfg.backend, dev_type)
    if dev_type == "cuda":
        visible = torch.cuda.device_count()
        if env.local_rank >= visible:
            raise DistributedError(
                f"LOCAL_RANK {env.local_rank} but only {visible} GPU(s) are visible on this node; "
                f"start at most {visible} processes per node (--nproc_per_node {visible})"
            )
        torch.cuda.set_device(env.local_rank)
        device = torch.device("cuda", env.local_rank)
    try:
        dist.init_process_group(
            backend,
            timeout=timedelta(seconds=cfg.timeout_s),
            device_id=device if dev_type == "cuda" else None,
        )
    except (RuntimeError, ValueError, TimeoutError) as e:
        raise DistributedError(
            f"rank {env.rank} of {env.world_size} could not join the process group at "
            f"{env.master} within {cfg.timeout_s}s ({str(e).splitlines()[0]}); check that every "
            "node uses the same --rdzv-endpoint / MASTER_ADDR:MASTER_PORT, that the port is "
            "reachable, and that all WORLD_SIZE processes were started"
        ) from None
    par = Parallel(cfg, env, device)
    try:
        par.agree(
            {"torch": torch.__version__, "python": sys.version.split()[0], "device": dev_type},
            "software versions and device type",
        )
        yield par
        # the wrapped model (DDP reducer, FSDP hooks) refers to the group through reference
        # cycles: free it while the group exists, or gloo can abort the process at exit
        gc.collect()
        par.barrier()  # nobody tears its connections down while another rank still uses them
    finally:
        dist.destroy_process_group()


def stop_with_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """Under torchrun on Linux, have the kernel send this worker SIGTERM when torchrun dies.

    torchrun starts every worker in a session of its own and sets no parent-death signal, so a
    torchrun killed alone (SIGKILL from a supervisor or by hand) leaves its workers training on,
    orphaned: rank 0 keeps the run lock (the restarted run is refused as "in use") and the
    devices stay busy. With this, the orphans stop as on any SIGTERM: every rank finishes the
    step, one checkpoint is saved, and they exit. Returns whether the signal was armed."""
    environ = os.environ if environ is None else environ
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in environ:
        return False  # not a torchrun worker (tests and other launchers manage their workers)
    libc = ctypes.CDLL(None, use_errno=True)
    # Armed before joining the group: had torchrun died earlier, its rendezvous store (which
    # --standalone runs in torchrun) is gone and joining fails after distributed.timeout_s.
    return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0


class Parallel:
    """This process's view of the run's processes; every method works for one process too."""

    def __init__(self, cfg: DistributedConfig, env: DistEnv, device: torch.device):
        self.cfg, self.env = cfg, env
        self.rank, self.world, self.local_rank = env.rank, env.world_size, env.local_rank
        self._device = device
        self.ddp: torch.nn.Module | None = None

    @classmethod
    def single(cls, cfg: DistributedConfig) -> Parallel:
        """One process. Refuses to run as a torchrun worker that never joined the group."""
        env = detect_env()
        if env.distributed and not dist.is_initialized():
            raise DistributedError(
                f"this process is rank {env.rank} of {env.world_size} (torchrun) but was given no "
                "distributed session; run `littlelm train` under torchrun, or build the Trainer "
                "inside `with littlelm.train.distributed.session(...) as par: Trainer(cfg, parallel=par)`"
            )
        return cls(cfg, DistEnv(), torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def strategy(self) -> str:
        return self.cfg.strategy if self.world > 1 else "single"

    def device(self, device: torch.device) -> torch.device:
        """The device this rank trains on: its own GPU (cuda:LOCAL_RANK) under torchrun."""
        if device.type == "cuda" and self.world > 1:
            return torch.device("cuda", self.local_rank)
        return device

    # ------------------------------------------------------------------------------------------
    # Collectives (no-ops for one process)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def gather_objects(self, obj: T) -> list[T]:
        """`obj` from every rank, in rank order, on every rank (small picklable data only)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The average of `t` over ranks (a new tensor)."""
        if self.world == 1:
            return t.clone()
        out = t.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / self.world

    def total(self, n: int, device: torch.device) -> int:
        """The sum of `n` over every rank (one all-reduce on `device` under torchrun)."""
        if self.world == 1:
            return n
        return round(self.mean(torch.tensor(float(n), device=device)).item() * self.world)

    def on_main(self, fn: Callable[[], T]) -> T:
        """Run `fn` on rank 0 only (a write, a lock); every rank returns its result, or raises
        the LittleLMError it raised (same class and message, hence the same exit status), so
        the ranks never part ways over something only rank 0 does."""
        result: Any = None
        error: LittleLMError | None = None
        if self.is_main:
            try:
                result = fn()
            except LittleLMError as e:
                error = e
        if self.world > 1:
            failed = None if error is None else (type(error), str(error))
            result, failed = self.broadcast_object((result, failed))
            if failed is not None and error is None:
                error = failed[0].__new__(failed[0])
                Exception.__init__(error, failed[1])
        if error is not None:
            raise error
        return result

    def agree_step(
        self, loss: torch.Tensor, norm: torch.Tensor, signal: int
    ) -> tuple[float, float, int]:
        """One all-gather per step of (loss, gradient norm, signal received): the mean loss over
        ranks (non-finite if any rank's is), the largest norm (non-finite if any is) and the
        largest signal number (0: none). Every rank gets the same three numbers, so the loss
        guard and the stop on SIGTERM decide the same on every rank."""
        sig = torch.tensor(float(signal), device=loss.device)
        mine = torch.stack([loss.detach().float(), norm.detach().float().to(loss.device), sig])
        if self.world == 1:
            rows = [mine]
        else:
            rows = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(rows, mine)
        table = torch.stack(rows).tolist()  # (world, 3)
        losses, norms, signals = zip(*table, strict=True)
        finite = all(map(math.isfinite, norms))
        return sum(losses) / len(losses), max(norms) if finite else math.nan, int(max(signals))

    def agree(self, value: Any, what: str) -> None:
        """Raise on every rank unless every rank has the same `value`."""
        values = self.gather_objects(value)
        for r, v in enumerate(values):
            if v != values[0]:
                raise DistributedError(
                    f"ranks disagree on {what}: rank 0 has {_short(values[0])}, rank {r} has "
                    f"{_short(v)}; every process must run the same software on the same kind of "
                    "device with the same config files and data"
                )

    def agree_config(self, flat: dict[str, Any]) -> None:
        """Every rank must run the same resolved config (the same YAML files and overrides)."""
        values = self.gather_objects(json.dumps(flat, sort_keys=True, default=str))
        base = json.loads(values[0])
        for r, v in enumerate(values[1:], start=1):
            other = json.loads(v)
            keys = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
            if keys:
                raise DistributedError(
                    f"rank {r}'s config differs from rank 0's at {', '.join(keys[:8])}; every "
                    "node must see the same config files and get the same overrides"
                )

    def in_turns(self, fn: Callable[[], T]) -> T:
        """Run `fn` on rank 0, then on the first rank of every other node, then on every other
        rank: the first call fills a cache (prepared data, a trained tokenizer) the rest read."""
        result: Any = None
        done = False
        for turn in (self.rank == 0, self.local_rank == 0, True):
            if turn and not done:
                result, done = fn(), True
            self.barrier()
        return result

    # ------------------------------------------------------------------------------------------
    # Model and optimizer: DDP (every rank holds the whole model) or FSDP2 (fully_shard: every
    # rank holds a 1/world slice of each parameter and gathers whole ones only while a unit
    # computes); which modules become FSDP units, and why, the model says (`shard_units`,
    # model/gpt.py); the memory each rank holds is written out in docs/distributed.md. The
    # optimizer's sharding is optim/optimizer.py's. torch's FSDP, DDP and checkpoint modules
    # are imported only by a run that uses them (they are slow to import).

    def shard_model(self, model: torch.nn.Module, precision: str) -> None:
        """FSDP2: split the model's parameters across ranks, in place: each unit, then the root.
        Under bf16 the gathered weights are cast to bf16 for compute while the sharded fp32
        weights stay the master copy, and gradients are reduce-scattered in fp32. Nothing for
        ddp."""
        if self.strategy != "fsdp":
            return
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if precision == "bf16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            mp = MixedPrecisionPolicy()
        mesh = init_device_mesh(self._device.type, (self.world,))
        reshard = self.cfg.reshard_after_forward
        for unit in [*model.shard_units(), model]:  # the model says which (shard_units)
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to call for training steps: DDP around the model, or the model itself.
        DDP's gradients live in its all-reduce buckets (no second copy of the gradients);
        buffers (RoPE tables) are identical on every rank, so they are not re-broadcast."""
        if self.strategy != "ddp":
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        # torch 2.13 renamed broadcast_buffers to forward_sync_buffers
        new_name = "forward_sync_buffers" in inspect.signature(DDP).parameters
        self.ddp = DDP(
            model,
            device_ids=[self._device.index] if self._device.type == "cuda" else None,
            bucket_cap_mb=self.cfg.bucket_cap_mb,
            gradient_as_bucket_view=True,
            **{"forward_sync_buffers" if new_name else "broadcast_buffers": False},
        )
        return self.ddp

    def no_sync(self, skip: bool):
        """Around a micro-batch's forward and backward: with skip=True, DDP only accumulates
        gradients locally (the last micro-batch of a step all-reduces them)."""
        if skip and self.ddp is not None:
            return self.ddp.no_sync()
        return contextlib.nullcontext()

    def shard_optimizer(self, optimizer):
        """The optimizer stepping and checkpointing across the ranks (optim/optimizer.py)."""
        if self.world == 1:
            return optimizer
        c = self.cfg
        return optimizer.shard(c.strategy == "fsdp", c.shard_muon, c.shard_adamw)

    @torch.no_grad()
    def load_model_state(
        self, model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: Path
    ) -> None:
        """Load whole checkpoint tensors into the (possibly sharded) model: every rank holds the
        same `tensors` and FSDP keeps each rank's slice. In place matters: the optimizer holds
        these very parameters (set_model_state_dict may swap in new ones). Tied copies are
        absent from `tensors` and skipped."""
        from littlelm.train.checkpoint import files as ckpt

        if self.strategy != "fsdp":
            ckpt.load_model_tensors(model, tensors, source)
            return
        from torch.distributed.tensor import DTensor, distribute_tensor

        for name, t in model.state_dict().items():
            src = tensors.get(name)
            if src is None:
                continue
            if isinstance(t, DTensor):
                src = distribute_tensor(
                    src.to(t.device, t.dtype), t.device_mesh, t.placements, src_data_rank=None
                )
                t.to_local().copy_(src.to_local())
            else:
                t.copy_(src)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's state dict on rank 0 (FSDP: gathered onto rank 0's CPU by every
        rank, a collective; the other ranks get an empty dict), without tied duplicates."""
        if self.strategy != "fsdp":
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=opts)
        every = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        unique = {n for n, _ in model.named_parameters()}
        return {k: v for k, v in full.items() if k not in every - unique}


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
